"""CPU per input record of the join operator and its state path (issue 15); prints a Markdown table.

    .venv/bin/python -m benchmarks.bench_operator [--impressions 50000] [--rounds 3] [--profile]
        [--gc-threshold N]

The ad events of app/traffic.py go through one StatePartition on real RocksDB (inner join,
ids on, as the reference app), 2,000 records a batch, each batch committed to the store
(`take_changes` + `write`, no broker). Three operators, alternated round by round so a
busy machine slows them alike:

- `compiled`: the join as it runs when its extension is built (tables/operators/_fastjoin.pyx: the
  per-record loop in Cython, over the same index in memory);
- `pure Python`: the same join's Python loop (`TANDEM_PURE_PYTHON=1`, or no extension);
- `index in RocksDB`: `TANDEM_WINDOW_INDEX=rocksdb` (tables/operators/stored_window.py: a time
  index and an id index stored with the records, partners read by a range scan of the state),
  its Python loop; `index in RocksDB, compiled`: its compiled loop (_fastwindow.pyx);
- `budget (default)`: the default, `TANDEM_WINDOW_INDEX=budget` (tables/operators/budgeted_window.py)
  with its default budget, which these records fit: the compiled join behind the budget's wrapper;
- `budget, spilled`: the same with a budget of 0 MB, spilled to RocksDB after the first batch.

Reports the median CPU time (process_time: RocksDB's threads included) per record: in all
(operator and commit) and in the operator alone (`process_many`, or `process` per record
for the old one: its reads of RocksDB included, the commit not). Python's garbage collector
runs at its default thresholds unless `--gc-threshold` sets the youngest generation's (a
worker runs with 50,000, and 1,000,000 during a batch: tables/runtime/gcpacing.py).
Then what the in-memory index costs: the records of one run, none expired, in one
store; a new operator indexes them (as at a start or a promotion), with and without
ids: bytes per live record (tracemalloc) and CPU per record to build it.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

from app.traffic import ad_events
from tables.operators import stored_window
from tables.operators import windowed as operator_module
from tables.operators.budgeted_window import IndexBudget
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.operators.windowed_kind import WindowedKind, index_budget_from_env
from tables.state.partition import StatePartition
from tables.state.store import open_store

BATCH = 2000
WINDOW = JoinWindow(before=0, after=600_000, grace=60_000)
Event = tuple[str, bytes, int, bytes, bytes]


# name: (where the join keeps its index, compiled loop on, its budget in MB: None for the
# default); those with the compiled loop are left out when it is not built.
PATHS: dict[str, tuple[str, bool, float | None]] = {
    "compiled": ("memory", True, None),
    "budget (default)": ("budget", True, None),
    "pure Python": ("memory", False, None),
    "index in RocksDB, compiled": ("rocksdb", True, None),
    "index in RocksDB": ("rocksdb", False, None),
    "budget, spilled": ("budget", True, 0.0),
}


def events(impressions: int) -> list[Event]:
    return [
        (side, e["auction_id"].encode(), e["ts"], e["event_id"].encode(), orjson.dumps(e))
        for side, e in ad_events(impressions)
    ]


def run(
    index: str, records: list[Event], profile: bool = False, budget_mb: float | None = None
) -> tuple[float, float, int]:
    """(CPU seconds in all, CPU seconds in the operator, results) of the records through a
    new partition store, the join's index kept in `index` (TANDEM_WINDOW_INDEX)."""
    clock = time.process_time
    budget = index_budget_from_env() if budget_mb is None else IndexBudget(int(budget_mb * (1 << 20)))
    with tempfile.TemporaryDirectory() as tmp:
        kind = WindowedKind(WINDOW, JoinType.INNER, index=index, budget=budget)
        part = StatePartition(open_store(Path(tmp) / "p0"), kind, "active", True)
        profiler = cProfile.Profile() if profile else None
        results = 0
        operator = 0.0
        start = clock()
        if profiler:
            profiler.enable()
        for at in range(0, len(records), BATCH):
            join = part.operator
            began = clock()
            results += len(join.process_many(records[at : at + BATCH]))  # a batch a call, as in a worker
            operator += clock() - began
            join.take_changes()
            part.write(at)
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
        spent = clock() - start
        part.store.close()
    return spent, operator, results


def index_cost(records: list[Event]) -> None:
    """Memory and build time of the index of a store holding every record (a window that
    outlasts the run), with the join's ids and without."""
    everything = JoinWindow(before=0, after=1 << 40, grace=0)
    print("\n| index | live records | bytes / record (tracemalloc) | us CPU / record to build |")
    print("| --- | ---: | ---: | ---: |")
    for ids in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            part = StatePartition(
                open_store(Path(tmp) / "p0"), WindowedKind(everything, JoinType.INNER), "active", ids
            )
            for at in range(0, len(records), BATCH):
                part.operator.process_many(records[at : at + BATCH])
                part.operator.take_changes()
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
    parser.add_argument("--gc-threshold", type=int, help="the youngest generation's GC threshold")
    args = parser.parse_args()
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    records = events(args.impressions)
    if args.profile:
        run("memory", records, profile=True)
        return
    paths = dict(PATHS)
    if not (operator_module.LOOP.active and stored_window.STORED_LOOP.active):
        print(
            "tables.operators._fastjoin or _fastwindow is not built (or TANDEM_PURE_PYTHON=1): "
            "no compiled rows\n"
        )
        paths = {name: path for name, path in paths.items() if not path[1]}
    spent: dict[str, list[float]] = {name: [] for name in paths}
    in_operator: dict[str, list[float]] = {name: [] for name in paths}
    results: dict[str, int] = {}
    was = operator_module.LOOP.active, stored_window.STORED_LOOP.active
    try:
        for _ in range(args.rounds):
            for name, (index, compiled, budget_mb) in paths.items():
                operator_module.LOOP.use(compiled)
                stored_window.STORED_LOOP.use(compiled)
                seconds, operator, results[name] = run(index, records, budget_mb=budget_mb)
                spent[name].append(seconds / len(records) * 1e6)
                in_operator[name].append(operator / len(records) * 1e6)
    finally:
        operator_module.LOOP.use(was[0])
        stored_window.STORED_LOOP.use(was[1])
    if len(set(results.values())) != 1:
        raise SystemExit(f"the paths disagree: {results}")
    print(f"{len(records):,} records, {results['pure Python']:,} results, median of {args.rounds} rounds\n")
    print(
        "| operator | us CPU / record | runs | in the operator | runs "
        "| vs pure Python (all / operator) | vs index in RocksDB (all / operator) |"
    )
    print("| --- | ---: | --- | ---: | --- | ---: | ---: |")
    python_all = statistics.median(spent["pure Python"])
    python_op = statistics.median(in_operator["pure Python"])
    old_all = statistics.median(spent["index in RocksDB"])
    old_op = statistics.median(in_operator["index in RocksDB"])
    for name in paths:
        total, operator = statistics.median(spent[name]), statistics.median(in_operator[name])
        print(
            f"| {name} | {total:.2f} | {' '.join(f'{r:.1f}' for r in spent[name])} "
            f"| {operator:.2f} | {' '.join(f'{r:.2f}' for r in in_operator[name])} "
            f"| {total / python_all:.2f} / {operator / python_op:.2f} "
            f"| {total / old_all:.2f} / {operator / old_op:.2f} |"
        )
    index_cost(records)


if __name__ == "__main__":
    main()
