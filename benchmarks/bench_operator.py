"""CPU per input record of the join operator and its state path (issue 15); prints a Markdown table.

    .venv/bin/python -m benchmarks.bench_operator [--impressions 50000] [--rounds 3] [--profile]

The ad events of app/traffic.py go through one StatePartition on real RocksDB (inner join,
ids on, as the reference app), 2,000 records a batch, each batch committed to the store
(`take_changes` + `write`, no broker). Two operators, alternated round by round so a
busy machine slows both alike:

- `index in memory`: the join as it is (tables/index.py: partners, duplicates and due
  records found in memory; the state read only for partners' values);
- `index in RocksDB`: the join as it was (tests/stored_index_join.py: a time index and an
  id index stored with the records, partners read by a range scan of the state).

Reports the median CPU time (process_time: RocksDB's threads included) per record.
Then what the in-memory index costs: the records of one run, none expired, in one
store; a new operator indexes them (as at a start or a promotion), with and without
ids: bytes per live record (tracemalloc) and CPU per record to build it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import orjson

from app.traffic import ad_events
from tables import keys
from tables.kv import Overlay
from tables.operator import JoinType, JoinWindow, WindowedJoin
from tables.partition import StatePartition
from tables.store import open_store
from tests.stored_index_join import StoredIndexJoin

BATCH = 2000
WINDOW = JoinWindow(before=0, after=600_000, grace=60_000)
Event = tuple[str, bytes, int, bytes, bytes]


@dataclass
class StoredIndexPartition(StatePartition):
    def reset(self) -> None:
        self.overlay = Overlay(self.store, unscanned=(b"i", keys.META))
        self.join = StoredIndexJoin(self.overlay, self.window, self.join_type, self.ids)  # type: ignore[assignment]


PATHS: dict[str, type[StatePartition]] = {
    "index in memory": StatePartition,
    "index in RocksDB": StoredIndexPartition,
}


def events(impressions: int) -> list[Event]:
    return [
        (side, e["auction_id"].encode(), e["ts"], e["event_id"].encode(), orjson.dumps(e))
        for side, e in ad_events(impressions)
    ]


def run(kind: type[StatePartition], records: list[Event], profile: bool = False) -> tuple[float, int]:
    """(CPU seconds, results) of the records through a new partition store."""
    with tempfile.TemporaryDirectory() as tmp:
        part = kind(open_store(Path(tmp) / "p0"), WINDOW, JoinType.INNER, "active", True)
        profiler = cProfile.Profile() if profile else None
        results = 0
        start = time.process_time()
        if profiler:
            profiler.enable()
        for at in range(0, len(records), BATCH):
            join = part.join
            if isinstance(join, StoredIndexJoin):  # one call per record, as the runtime did then
                for record in records[at : at + BATCH]:
                    results += len(join.process(*record))
            else:  # a batch per call, as the runtime does
                results += len(join.process_many(records[at : at + BATCH]))
            join.take_changes()
            part.write(at)
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
        spent = time.process_time() - start
        part.store.close()
    return spent, results


def index_cost(records: list[Event]) -> None:
    """Memory and build time of the index of a store holding every record (a window that
    outlasts the run), with the join's ids and without."""
    everything = JoinWindow(before=0, after=1 << 40, grace=0)
    print("\n| index | live records | bytes / record (tracemalloc) | us CPU / record to build |")
    print("| --- | ---: | ---: | ---: |")
    for ids in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            part = StatePartition(open_store(Path(tmp) / "p0"), everything, JoinType.INNER, "active", ids)
            for at in range(0, len(records), BATCH):
                for record in records[at : at + BATCH]:
                    part.join.process(*record)
                part.join.take_changes()
                part.write(at)
            start = time.process_time()
            WindowedJoin(part.overlay, everything, JoinType.INNER, ids)
            build = time.process_time() - start
            tracemalloc.start()
            indexed = WindowedJoin(part.overlay, everything, JoinType.INNER, ids)  # kept while measured
            size = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            live = len(indexed.index)
            part.store.close()
        name = "with ids" if ids else "by offset"
        print(f"| {name} | {live:,} | {size / live:.0f} | {build / live * 1e6:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impressions", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one run of the join as it is")
    args = parser.parse_args()
    records = events(args.impressions)
    if args.profile:
        run(StatePartition, records, profile=True)
        return
    spent: dict[str, list[float]] = {name: [] for name in PATHS}
    results: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, kind in PATHS.items():
            seconds, results[name] = run(kind, records)
            spent[name].append(seconds / len(records) * 1e6)
    if len(set(results.values())) != 1:
        raise SystemExit(f"the paths disagree: {results}")
    base = statistics.median(spent["index in RocksDB"])
    found = results["index in memory"]
    print(f"{len(records):,} records, {found:,} results, median of {args.rounds} rounds\n")
    print("| operator | us CPU / record | runs | vs index in RocksDB |")
    print("| --- | --- | --- | --- |")
    for name, runs in spent.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.1f} | {' '.join(f'{r:.1f}' for r in runs)} | {median / base:.2f} |")
    index_cost(records)


if __name__ == "__main__":
    main()
