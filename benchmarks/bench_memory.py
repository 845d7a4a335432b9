"""Peak RSS of one windowed-join worker against the number of records live in its window
(issue 32, item 3): `faust -A app worker` reading N impressions whose event times all lie
within the join's window, so that every one of them is held (none has expired, none matched).

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_memory --live 1000000,10000000
    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_memory --live 1000000 --window-index memory

For each N: the impressions on the embedded broker (4 partitions, N over five minutes of
event time, keyed by auction id), one worker from an empty state until it has read
them all; its peak RSS (VmHWM) and its RSS then, and the join's view (records read, late,
duplicates, the window index's entries and memory). The in-memory index of live records
(tables/operators/window_index.py) is the part that grows with N: by default (`budget`,
TANDEM_WINDOW_INDEX) it stays in memory within TANDEM_WINDOW_INDEX_BUDGET_MB (`--budget-mb`)
and moves to the state beyond it; with `--window-index rocksdb` it is kept in the state from
the start, with `memory` always in memory. In the state, RocksDB's memory is bounded by its
shared cache and memtable budget.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from app.cluster import WorkerProcess
from app.settings import JOIN_NAME, create_topics, from_env
from assignor import clients
from benchmarks.bench_worker import PARTITIONS, cpu_seconds, peak_rss_kb
from tables.kafka.batches import send_records
from tables.records.partitioners import partitions_for
from tables.testing import EmbeddedBroker

SPAN_MS = 300_000  # every impression within five minutes: all live in a 10-minute window
CHUNK = 100_000


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def load(bootstrap: str, topic: str, count: int) -> None:
    """`count` impressions over SPAN_MS of event time, ending an hour ago."""
    base = int(time.time() * 1000) - 3_600_000 - SPAN_MS
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    try:
        for start in range(0, count, CHUNK):
            rows = []
            for n in range(start, min(count, start + CHUNK)):
                key = b"auction-%d" % n
                ts = base + n * SPAN_MS // count
                value = {"event_id": f"i{n}", "auction_id": key.decode(), "campaign_id": f"c{n % 97}"}
                rows.append((key, orjson.dumps({**value, "ts": ts})))
            per_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
            placed = partitions_for([k for k, _ in rows], PARTITIONS, "murmur2")
            for row, partition in zip(rows, placed, strict=True):
                per_partition.setdefault(int(partition), []).append(row)
            for partition, records in per_partition.items():
                await send_records(producer, topic, partition, records)
    finally:
        await producer.stop()


async def measure(
    live: int, timeout: float, window_index: str = "budget", budget_mb: float | None = None
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        settings = dataclasses.replace(
            from_env(), broker=f"kafka://{broker.bootstrap}", topic_prefix="wm-", partitions=PARTITIONS,
            app_id="wm-join",
        )  # fmt: skip
        await create_topics(broker.bootstrap, settings)
        await load(broker.bootstrap, settings.impressions, live)
        worker = WorkerProcess(
            "tandem", "host-1", "rack-1", broker.bootstrap, settings.app_id, Path(tmp),
            standby_replicas=0, partitions=PARTITIONS, topic_prefix=settings.topic_prefix,
            extra_env={"TANDEM_WINDOW_INDEX": window_index}
            | ({} if budget_mb is None else {"TANDEM_WINDOW_INDEX_BUDGET_MB": str(budget_mb)}),
        ).start()  # fmt: skip
        started = time.monotonic()
        try:
            while time.monotonic() - started < timeout:
                worker.check()
                view = worker.view()
                join = None if view is None else view["joins"].get(JOIN_NAME)
                if join is not None and sum(join["read"].values()) >= live and not join["held"]:
                    assert worker.process is not None
                    pid = worker.process.pid
                    return {
                        "live": live, "read": sum(join["read"].values()), "late": join["late"],
                        "duplicates": join["duplicates"], "peak_rss_kb": peak_rss_kb(pid),
                        "rss_kb": rss_kb(pid), "cpu_s": cpu_seconds(pid),
                        "seconds": time.monotonic() - started, "load": os.getloadavg()[0],
                        "index": join.get("window_index") or {},
                    }  # fmt: skip
                await asyncio.sleep(0.5)
            raise RuntimeError(f"not done in {timeout} s (log {worker.log_path})")
        finally:
            worker.stop(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", default="1000000", help="comma-separated counts of live records")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--window-index",
        default="budget",
        choices=("budget", "memory", "rocksdb"),
        help="TANDEM_WINDOW_INDEX",
    )
    parser.add_argument("--budget-mb", type=float, default=None, help="TANDEM_WINDOW_INDEX_BUDGET_MB")
    args = parser.parse_args()
    print(
        "| window index | records live in the window | peak RSS MB | RSS at the end MB | peak RSS per record "
        "| index entries | index in memory MB | seconds | CPU s | load |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    label = args.window_index
    if args.window_index == "budget":
        label += f" ({args.budget_mb:g} MB)" if args.budget_mb is not None else " (default)"
    for live in (int(n) for n in args.live.split(",")):
        run = asyncio.run(measure(live, args.timeout, args.window_index, args.budget_mb))
        assert run["late"] == 0 and run["duplicates"] == 0, run
        index, peak_mb, end_mb = run["index"], run["peak_rss_kb"] / 1024, run["rss_kb"] / 1024
        print(
            f"| {label} | {live:,} | {peak_mb:,.0f} | {end_mb:,.0f} | "
            f"{run['peak_rss_kb'] * 1024 / live:,.0f} B | {index.get('entries', 0):,} | "
            f"{index.get('bytes', 0) / 1e6:,.1f} | {run['seconds']:,.0f} | {run['cpu_s']:,.0f} | "
            f"{run['load']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
