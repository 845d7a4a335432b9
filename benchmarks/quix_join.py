"""One Quix Streams join over two topics, timed: the peer pipeline of bench_worker.py and
bench_enrich.py. Runs in Quix's own virtual environment (benchmarks/quix_env.py makes it:
quixstreams pins its own confluent-kafka and rocksdict), so it imports nothing of the project.

    benchmarks/out/quix-venv/bin/python benchmarks/quix_join.py '{"mode": "interval", ...}'

Modes, as a user would write them (Quix's docs):

- `interval`: `left.join_interval(right, backward_ms=..., forward_ms=..., grace_ms=...)`,
  an inner join (the windowed join of bench_worker.py: a click within `forward_ms` after its
  impression; records kept `grace_ms`, the window plus its grace);
- `asof`: `left.join_asof(right, how=..., grace_ms=...)` (the enrichment join of
  bench_enrich.py: each stream record with the table's latest value at or before its time).

Event time is the value's `ts` field (a timestamp extractor), values are JSON, results are
produced to `output` as JSON, one per join result. The group reads from the earliest offset,
with `session.timeout.ms` 6000 (the embedded broker holds a JoinGroup for half of it).

Counts every input record and result; once `total` input records are processed and
`expected` results out (or the input is done and `expected` is None), it stops and prints one
JSON line: records, wall and CPU seconds from the first record processed to the last, results,
peak RSS (kB). With `restore_only`, it times the state's restore instead (no input).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from quixstreams import Application


def peak_rss_kb() -> int:
    """VmHWM: ru_maxrss would carry the parent's peak over the exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def extract_ts(value: Any, headers: Any, timestamp: int, timestamp_type: Any) -> int:
    return int(value["ts"])


def merge(left: Any, right: Any) -> dict[str, Any]:
    """The result: both sides as they are (their field names overlap, so no dict merge)."""
    return {"left": left, "right": right}


def main(config: dict[str, Any]) -> dict[str, Any]:
    app = Application(
        broker_address=config["bootstrap"],
        consumer_group=config["group"],
        auto_offset_reset="earliest",
        state_dir=config["state_dir"],
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING",
    )
    left_topic = app.topic(config["left"], key_deserializer="bytes", timestamp_extractor=extract_ts)
    right_topic = app.topic(config["right"], key_deserializer="bytes", timestamp_extractor=extract_ts)
    output = app.topic(config["output"], key_serializer="bytes", value_serializer="json")
    total, expected = int(config["total"]), config.get("expected")
    seen = {"records": 0, "results": 0}
    clock: dict[str, float] = {}

    def done() -> bool:
        return seen["records"] >= total and (expected is None or seen["results"] >= expected)

    def finish() -> None:
        if "wall" not in clock:
            clock["wall"] = time.perf_counter() - clock["wall0"]
            clock["cpu"] = time.process_time() - clock["cpu0"]
            app.stop()

    def count_input(value: Any) -> None:
        if not seen["records"]:
            clock["wall0"], clock["cpu0"] = time.perf_counter(), time.process_time()
        seen["records"] += 1
        if done():
            finish()

    def count_result(value: Any) -> None:
        seen["results"] += 1
        if done():
            finish()

    left = app.dataframe(left_topic).update(count_input)
    right = app.dataframe(right_topic).update(count_input)
    if config["mode"] == "interval":
        joined = left.join_interval(
            right,
            how="inner",
            on_merge=merge,
            backward_ms=int(config["backward_ms"]),
            forward_ms=int(config["forward_ms"]),
            grace_ms=int(config["grace_ms"]),
        )
    else:
        joined = left.join_asof(right, how=config["how"], on_merge=merge, grace_ms=int(config["grace_ms"]))
    joined.update(count_result).to_topic(output)
    started = time.perf_counter()
    app.run()
    if "wall" not in clock:
        raise SystemExit(f"stopped before the end: {seen}")
    return {
        **seen,
        "wall": clock["wall"],
        "cpu": clock["cpu"],
        "run_to_first_record_s": clock["wall0"] - started,
        "peak_rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
