"""What the metrics add to a batch of the join, against the join operator's own work on the
same batch, measured in the same run (one process, timeit; no broker).

    .venv/bin/python -m benchmarks.bench_metrics [--batch 4000] [--partitions 4]

The runtime's hot-path additions (tables/runtime/task.py, `_process`): per partition of a batch,
the event time of its last result; per batch, one latency observation per partition
(`LatencyBuckets.observe_since`), and for left, right and outer joins the count of
unmatched results. Everything else is read when Prometheus scrapes. The baseline is
`WindowedJoin.process` on an in-memory store for the same records (the operator alone:
the real batch also decodes, aligns, produces and writes RocksDB, so the real share is
smaller still).
"""

from __future__ import annotations

import argparse
import timeit

import orjson

from tables.operators.keys import Side
from tables.operators.kv import MemoryKV
from tables.operators.windowed import JoinType, JoinWindow, Match, WindowedJoin
from tables.web.metrics import LatencyBuckets

Row = tuple[int, Side, bytes, int, bytes, bytes]  # partition, side, key, ts, record id, value


def batch(size: int, partitions: int, base_ts: int) -> list[Row]:
    """Impressions and a click for every other one, spread over the partitions."""
    rows: list[Row] = []
    for n in range(size // 2 + size // 4):
        ts = base_ts + n * 10
        value = orjson.dumps({"event_id": f"i{n}", "auction_id": f"a{n}", "ts": ts})
        rows.append((n % partitions, "left", f"a{n}".encode(), ts, f"i{n}".encode(), value))
        if n % 2 == 0:
            rows.append((n % partitions, "right", f"a{n}".encode(), ts + 5, f"k{n}".encode(), value))
    return rows[:size]


def operator_seconds(
    rows: list[Row], partitions: int, join_type: JoinType
) -> tuple[float, list[list[Match]]]:
    """The operator's time for the batch (fresh state per run), and its results per partition."""
    window = JoinWindow(0, 600_000, 60_000)
    results: list[list[Match]] = []

    def run() -> None:
        joins = [WindowedJoin(MemoryKV(), window, join_type, ids=True) for _ in range(partitions)]
        results.clear()
        by_partition: list[list[Match]] = [[] for _ in range(partitions)]
        for partition, side, key, ts, record_id, value in rows:
            by_partition[partition] += joins[partition].process(side, key, ts, record_id, value)
        results.extend(by_partition)

    return min(timeit.repeat(run, number=1, repeat=5)), results


def added_seconds(results: list[list[Match]], unmatched_possible: bool) -> float:
    """The runtime's added work for one batch with these results."""
    buckets = LatencyBuckets()
    feed = [(p, m) for p, ms in enumerate(results) for m in ms]

    def run() -> None:
        latest: list[int] = []
        for matches in results:
            if matches:
                latest.append(matches[-1].timestamp)
        if unmatched_possible:
            sum(1 for _, m in feed if m.left is None or m.right is None)
        buckets.observe_since(latest)

    repeat = 2000
    return min(timeit.repeat(run, number=repeat, repeat=5)) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    print(f"Batch of {args.batch:,} records over {args.partitions} partitions; best of 5.\n")
    print("| join | operator µs per batch | added µs per batch | added / operator |")
    print("| --- | ---: | ---: | ---: |")
    for join_type in (JoinType.INNER, JoinType.OUTER):
        rows = batch(args.batch, args.partitions, 1_700_000_000_000)
        base, results = operator_seconds(rows, args.partitions, join_type)
        added = added_seconds(results, bool(join_type.unmatched_sides))
        print(f"| {join_type.value} | {base * 1e6:,.0f} | {added * 1e6:,.2f} | {added / base:.4%} |")


if __name__ == "__main__":
    main()
