"""CPU of a windowed join's restore and promotion with each window index (issue 37: restores
no slower with the index budgeted); prints a Markdown table.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_restore [--impressions 20000] [--rounds 3]

The changelog of the ad events of app/traffic.py joined as the reference app does (inner, ids
on, 2,000 records a batch), restored into a new RocksDB store as tables/state/recovery.py does
(`StatePartition.restore` per record, the overlay written every FLUSH_RECORDS, `finish_restore`
and a write at the end of each fetch of FETCH records); then the operator made over the
restored files, as a promotion or a restart does. Each index alternated round by round, so a
busy machine slows them alike:

- `memory`: TANDEM_WINDOW_INDEX=memory, the default before the budget;
- `budget (default)`: the default, within its budget (these records fit);
- `budget, spilled`: a budget of 0 MB: spilled after the first fetch;
- `rocksdb`: the index in the state from the start.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_operator import BATCH, WINDOW, events
from tables.operators.budgeted_window import IndexBudget
from tables.operators.windowed import JoinType
from tables.operators.windowed_kind import WindowedKind, index_budget_from_env
from tables.state.partition import StatePartition
from tables.state.recovery import FLUSH_RECORDS
from tables.state.store import open_store

FETCH = 10_000  # changelog records of one fetch (a fetch holds up to 4 MB)
# name: (index, budget in MB: None for the default)
INDEXES: dict[str, tuple[str, float | None]] = {
    "memory": ("memory", None),
    "budget (default)": ("budget", None),
    "budget, spilled": ("budget", 0.0),
    "rocksdb": ("rocksdb", None),
}
Changelog = list[tuple[bytes, bytes | None]]


def changelog_of(impressions: int, root: Path) -> Changelog:
    kind = WindowedKind(WINDOW, JoinType.INNER, index="memory")
    part = StatePartition(open_store(root / "source"), kind, "active", True)
    records = events(impressions)
    out: Changelog = []
    for at in range(0, len(records), BATCH):
        part.operator.process_many(records[at : at + BATCH])
        out += part.operator.take_changes()
        part.write(at)
    part.store.close()
    return out


def kind_of(index: str, budget_mb: float | None) -> WindowedKind:
    budget = index_budget_from_env() if budget_mb is None else IndexBudget(int(budget_mb * (1 << 20)))
    return WindowedKind(WINDOW, JoinType.INNER, index=index, budget=budget)


def restore(kind: WindowedKind, path: Path, changelog: Changelog) -> tuple[float, float, int]:
    """(CPU seconds of the restore, of the operator made over the files after, live records)."""
    clock = time.process_time
    gc.collect()  # each measure starts with no garbage of the previous one (its collections are its own)
    start = clock()
    part = StatePartition(open_store(path), kind, "active", True)
    for fetched in range(0, len(changelog), FETCH):
        restore_one = part.operator.restore
        for applied, (key, value) in enumerate(changelog[fetched : fetched + FETCH], fetched + 1):
            restore_one(key, value)
            if applied % FLUSH_RECORDS == 0:
                part.write(applied)
        part.operator.finish_restore()
        part.write(min(fetched + FETCH, len(changelog)))
    restored = clock() - start
    part.store.close()
    del part
    gc.collect()
    start = clock()
    promoted = StatePartition(open_store(path), kind, "active", True)
    made = clock() - start
    live = promoted.operator.live_records or 0
    promoted.store.close()
    return restored, made, live


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impressions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    per_record: dict[str, list[float]] = {name: [] for name in INDEXES}
    made_ms: dict[str, list[float]] = {name: [] for name in INDEXES}
    lives: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        changelog = changelog_of(args.impressions, root)
        for number in range(args.rounds):
            for name, (index, budget_mb) in INDEXES.items():
                path = root / f"{name}-{number}".replace(" ", "_").replace(",", "")
                restored, made, lives[name] = restore(kind_of(index, budget_mb), path, changelog)
                per_record[name].append(restored / len(changelog) * 1e6)
                made_ms[name].append(made * 1e3)
    if len(set(lives.values())) != 1:
        raise SystemExit(f"the indexes disagree on what was restored: {lives}")
    print(f"{len(changelog):,} changelog records, {lives['memory']:,} live, median of {args.rounds} rounds\n")
    print(
        "| index | us CPU / changelog record | runs | vs memory | operator made over the files, ms | runs |"
    )
    print("| --- | ---: | --- | ---: | ---: | --- |")
    base = statistics.median(per_record["memory"])
    for name in INDEXES:
        median = statistics.median(per_record[name])
        runs = " ".join(f"{r:.2f}" for r in per_record[name])
        print(
            f"| {name} | {median:.2f} | {runs} | {median / base:.2f} "
            f"| {statistics.median(made_ms[name]):.0f} | {' '.join(f'{r:.0f}' for r in made_ms[name])} |"
        )


if __name__ == "__main__":
    main()
