"""CPU per input record of the join operator and its state path (issue 15); prints a Markdown table.

    .venv/bin/python -m benchmarks.bench_operator [--impressions 50000] [--rounds 3] [--profile]

The ad events of app/traffic.py go through one StatePartition on real RocksDB (inner join,
ids on, as the reference app), 2,000 records a batch, each batch committed to the store
(`take_changes` + `write`, no broker). Two state paths, alternated round by round so a
busy machine slows both alike:

- `find`: the partner scan as it is, PartitionStore.find (one iterator per batch);
- `scan`: the partner scan as it was, a fresh bounded iterator per record (Overlay.scan).

Reports the median CPU time (process_time: RocksDB's threads included) per record.
Then find's worst case: probes of empty ranges, each followed by a run of tombstones
(deleted keys not yet compacted away), find against scan per probe.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from app.traffic import ad_events
from tables import keys
from tables.kv import Overlay
from tables.operator import JoinType, JoinWindow, WindowedJoin
from tables.partition import StatePartition
from tables.store import open_store

BATCH = 2000
WINDOW = JoinWindow(before=0, after=600_000, grace=60_000)
Event = tuple[str, bytes, int, bytes, bytes]


class ScanningOverlay(Overlay):
    """The partner scan before find(): a fresh bounded iterator per record."""

    def find(self, lo: bytes, hi: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.scan(lo, hi))


@dataclass
class ScanningPartition(StatePartition):
    def reset(self) -> None:
        self.overlay = ScanningOverlay(self.store, unscanned=(keys.ID, keys.META))
        self.join = WindowedJoin(self.overlay, self.window, self.join_type, self.ids)


PATHS: dict[str, type[StatePartition]] = {"find": StatePartition, "scan": ScanningPartition}


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
            for record in records[at : at + BATCH]:
                results += len(join.process(*record))
            join.take_changes()
            part.write(at)
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
        spent = time.process_time() - start
        part.store.close()
    return spent, results


def tombstone_probes(runs: tuple[int, ...] = (10, 60, 200), groups: int = 1000) -> None:
    """Per probe: 1,000 empty ranges, each just before `run` tombstones and then a live key."""
    print("\n| tombstones after each probed range | find us / probe | scan us / probe | find / scan |")
    print("| ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "p0")
        for checkpoint, run in enumerate(runs):
            dead = [b"g%04d-%04d" % (g, i) for g in range(groups) for i in range(run)]
            live = {b"g%04d-zzzz" % g: b"L" for g in range(groups)}
            store.write(dict.fromkeys(dead, b"v") | live, 3 * checkpoint)
            store.write(dict.fromkeys(dead), 3 * checkpoint + 1)
            probes = [(b"g%04d-" % g, b"g%04d-0000" % g) for g in range(groups)]
            cost = {}
            for name, read in (("find", store.find), ("scan", lambda lo, hi: list(store.scan(lo, hi)))):
                rounds = []
                for _ in range(5):
                    start = time.process_time()
                    for lo, hi in probes:
                        read(lo, hi)
                    rounds.append((time.process_time() - start) / groups * 1e6)
                cost[name] = statistics.median(rounds)
            print(f"| {run} | {cost['find']:.2f} | {cost['scan']:.2f} | {cost['find'] / cost['scan']:.2f} |")
            store.write(dict.fromkeys(live), 3 * checkpoint + 2)
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impressions", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one `find` run")
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
    base = statistics.median(spent["scan"])
    print(f"{len(records):,} records, {results['find']:,} results, median of {args.rounds} rounds\n")
    print("| partner scan | us CPU / record | runs | vs scan |")
    print("| --- | --- | --- | --- |")
    for name, runs in spent.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.1f} | {' '.join(f'{r:.1f}' for r in runs)} | {median / base:.2f} |")
    tombstone_probes()


if __name__ == "__main__":
    main()
