"""What a join handler's output value costs to serialize when the batch keeps it (issue 15):
`orjson.dumps` as it returns, against the same bytes copied into an object of their own
size (tables/runtime/results.py `_dumps`). Prints a Markdown table.

    .venv/bin/python -m benchmarks.bench_serializers [--results 10000] [--rounds 7]

Each round serializes one batch of reference-app results (app.records.ad_join values, ~190
bytes of JSON each) and keeps them in a list until the batch ends, as the runtime's outbox
does; the two ways alternate round by round; the median CPU time per result counts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from tables.runtime.results import _dumps


def values(n: int) -> list[dict[str, Any]]:
    return [
        {
            "join_id": f"i{i}|k{i}",
            "auction_id": f"auction-{i}",
            "campaign_id": f"c{i % 97}",
            "impression_id": f"i{i}",
            "click_id": f"k{i}",
            "impression_ts": 1_700_000_000_000 + i,
            "click_ts": 1_700_000_100_000 + i,
            "ts": 1_700_000_100_000 + i,
            "kind": "inner",
        }
        for i in range(n)
    ]


def batch_cost(dumps: Callable[[Any], bytes], batch: list[dict[str, Any]]) -> float:
    """CPU seconds per value to serialize a batch whose bytes are kept until it ends."""
    start = time.process_time()
    kept = [dumps(value) for value in batch]
    spent = time.process_time() - start
    del kept
    return spent / len(batch)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=int, default=10_000, help="results per batch")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    batch = values(args.results)
    ways: dict[str, Callable[[Any], bytes]] = {
        "orjson.dumps, kept as returned": orjson.dumps,
        "copied (_dumps)": _dumps,
    }
    spent: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, dumps in ways.items():
            spent[name].append(batch_cost(dumps, batch) * 1e6)
    first = statistics.median(spent["orjson.dumps, kept as returned"])
    print(f"{args.results:,} values a batch, median of {args.rounds} rounds\n")
    print("| serialization | us CPU per result | vs orjson.dumps |")
    print("| --- | ---: | ---: |")
    for name, runs in spent.items():
        print(f"| {name} | {statistics.median(runs):.2f} | {statistics.median(runs) / first:.2f} |")


if __name__ == "__main__":
    main()
