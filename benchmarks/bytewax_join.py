"""One Bytewax window join over two topics, timed: the Bytewax peer pipeline of
bench_worker.py. Runs in Bytewax's own virtual environment (benchmarks/bytewax_env.py makes
it: bytewax pins its own confluent-kafka), so it imports nothing of the project.

    benchmarks/out/bytewax-venv/bin/python benchmarks/bytewax_join.py '{"bootstrap": ..., ...}'

The join, as a user would write it with Bytewax's own operators (its docs): both topics read
with `bytewax.connectors.kafka` from the earliest offset to their end (`tail=False`), each
value decoded (orjson) and keyed by the record key, then `join_window` of the two keyed
streams on a `SessionWindower(gap=after_ms)` with an `EventClock` on the value's `ts`
(`wait_for_system_duration` = the window plus its grace, no wake-up for a close: `no_wake_up`),
`insert_mode="product"`,
`emit_mode="complete"`, `ordered=False`: a result as soon as both sides of a key are in one
session, as Tandem and Quix emit theirs; results produced to `output` as JSON. One process,
one worker (`cli_main`, `workers_per_process=1`).

Bytewax has no interval join; a session window is the one of its windows that pairs records
by their distance in time (a tumbling window misses pairs across its edge, a sliding one pairs
them once per window they share). How it differs from the interval join of Tandem and Quix
(a click from 0 to `after_ms` after its impression): a session pairs records at most
`after_ms` apart either way (a click before its impression too), a session grows with each
record within the gap (a third record can link two that are further apart), and `complete`
clears a key's session once it emits (a second click of one impression is not joined).
In the benchmark's input each auction has one impression and at most one click, from 0 to
5 minutes after it, so the three give the same pairs; each result is checked against the
interval join's condition all the same (`outside`: results it would not make).

Counts every input record and result; once `total` input records are read and `expected`
results out, it takes the time and CPU from the first record read, and prints one JSON line
at the end of the input: records, wall and CPU seconds, results, outside, peak RSS (kB).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage, KafkaSourceMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, SessionWindower, join_window
from bytewax.run import cli_main


def peak_rss_kb() -> int:
    """VmHWM: ru_maxrss would carry the parent's peak over the exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def event_time(value: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(value["ts"] / 1000, tz=UTC)


def no_wake_up(window_close: datetime) -> None:
    """No system time to wake up at for a window's close: the input's event time is in the
    past, and the default (the close time as is) has every key's session due at once, its
    logic called on every activation (measured: 100,000 impressions not done in 300 s, against
    8,000 records/s at 20,000). Sessions close on a key's next record or at the input's end;
    `complete` emits each result as its pair meets, not at the close."""
    return None


class Tally:
    """Records read and results out, and the clock from the first record to the moment both
    reach their totals."""

    def __init__(self, total: int, expected: int, after_ms: int) -> None:
        self.total, self.expected, self.after_ms = total, expected, after_ms
        self.records = self.results = self.outside = 0
        self.clock: dict[str, float] = {}

    def keyed(self, message: KafkaSourceMessage) -> tuple[str, dict[str, Any]]:
        if not self.records:
            self.clock["wall0"], self.clock["cpu0"] = time.perf_counter(), time.process_time()
        self.records += 1
        self._check_done()
        return message.key.decode(), orjson.loads(message.value)

    def result(self, keyed_row: tuple[str, tuple[int, tuple[Any, Any]]]) -> KafkaSinkMessage:
        key, (_window, (left, right)) = keyed_row
        if not 0 <= right["ts"] - left["ts"] <= self.after_ms:
            self.outside += 1  # a pair the interval join would not make
        self.results += 1
        self._check_done()
        return KafkaSinkMessage(key.encode(), orjson.dumps({"left": left, "right": right}))

    def _check_done(self) -> None:
        if "wall" not in self.clock and self.records >= self.total and self.results >= self.expected:
            self.clock["wall"] = time.perf_counter() - self.clock["wall0"]
            self.clock["cpu"] = time.process_time() - self.clock["cpu0"]


def dataflow(config: dict[str, Any], tally: Tally) -> Dataflow:
    brokers = [config["bootstrap"]]
    flow = Dataflow("bytewax-join")
    sides = []
    for side in ("left", "right"):
        read = kop.input(f"read-{side}", flow, brokers=brokers, topics=[config[side]], tail=False)
        sides.append(op.map(f"keyed-{side}", read.oks, tally.keyed))
    after = timedelta(milliseconds=int(config["after_ms"]))
    wait = after + timedelta(milliseconds=int(config["grace_ms"]))
    joined = join_window(
        "join",
        EventClock(event_time, wait_for_system_duration=wait, to_system_utc=no_wake_up),
        SessionWindower(gap=after),
        *sides,
        insert_mode="product",
        emit_mode="complete",
        ordered=False,
    )
    out = op.map("result", joined.down, tally.result)
    kop.output("write", out, brokers=brokers, topic=config["output"])
    return flow


def main(config: dict[str, Any]) -> dict[str, Any]:
    tally = Tally(int(config["total"]), int(config["expected"]), int(config["after_ms"]))
    started = time.perf_counter()
    cli_main(dataflow(config, tally), workers_per_process=1)
    if "wall" not in tally.clock:
        raise SystemExit(f"input ended before the end: {tally.records} records, {tally.results} results")
    return {
        "records": tally.records,
        "results": tally.results,
        "outside": tally.outside,
        "wall": tally.clock["wall"],
        "cpu": tally.clock["cpu"],
        "run_to_first_record_s": tally.clock["wall0"] - started,
        "peak_rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
