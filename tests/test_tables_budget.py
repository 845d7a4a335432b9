"""The windowed join's default index (`TANDEM_WINDOW_INDEX=budget`, tables/operators/budgeted_window.py):
in memory within the budget, spilled to the state (RocksDB) beyond it. Over real RocksDB stores it
gives what the in-memory join and the join with its index always in RocksDB give, batch by batch,
whenever it spills (before any record, mid-stream, mid-restore), through restarts and restores;
a spilled state stays spilled when opened again unless it fits the budget again."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.operators import keys
from tables.operators.budgeted_window import BudgetedJoin, IndexBudget
from tables.operators.kv import MemoryKV, Overlay
from tables.operators.stored_window import StoredIndexJoin
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.operators.windowed_kind import WindowedKind, index_budget_from_env
from tables.state.partition import StatePartition
from tables.state.store import open_store
from tests.test_tables_index import Run, records, runs

# Every test here with each loop of the in-memory operator (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("join_loop")


def _partition(
    path: Path, window: JoinWindow, join_type: JoinType, index: str, ids: bool, budget: int
) -> StatePartition:
    kind = WindowedKind(window, join_type, index=index, filter_bytes=256, budget=IndexBudget(budget))
    return StatePartition(open_store(path), kind, "active", ids)


def _restored(
    path: Path, like: StatePartition, changelog: list[tuple[bytes, bytes | None]]
) -> StatePartition:
    """A partition restored from its changelog into a new store, as recovery.py does: fetches
    of 5 records, the overlay written every 3 and at the end of each fetch, which is finished."""
    partition = StatePartition(open_store(path), like.kind, "active", like.ids)
    for start in range(0, len(changelog), 5):
        for applied, (key, value) in enumerate(changelog[start : start + 5], start + 1):
            partition.restore(key, value)
            if applied % 3 == 0:
                partition.write(applied)
        partition.operator.finish_restore()
        partition.write(start + 5)
    return partition


def _reopened(partition: StatePartition) -> StatePartition:
    partition.store.close()
    return StatePartition(open_store(partition.store.path), partition.kind, "active", partition.ids)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(0, 4000))
def test_the_budgeted_join_gives_what_both_other_indexes_give(run: Run, budget: int) -> None:
    """A budget of 0 to 4,000 bytes: spilled before any record, after a few, or never."""
    join_type, window, ids, batches, restart_after, restore_after = run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parts = {
            name: _partition(
                root / name, window, join_type, name if name != "budgeted" else "budget", ids, budget
            )
            for name in ("memory", "budgeted", "rocksdb")
        }
        changelog: list[tuple[bytes, bytes | None]] = []
        try:
            for number, batch in enumerate(batches):
                got = {name: part.operator.process_many(batch) for name, part in parts.items()}
                assert got["budgeted"] == got["memory"] == got["rocksdb"], batch
                changes = {name: part.operator.take_changes() for name, part in parts.items()}
                assert changes["budgeted"] == changes["memory"] == changes["rocksdb"]
                changelog += changes["memory"]
                for part in parts.values():
                    part.write(number)
                budgeted, memory = parts["budgeted"].operator, parts["memory"].operator
                assert budgeted.counters() == memory.counters()
                assert budgeted.live_records == memory.live_records
                assert records(parts["budgeted"]) == records(parts["memory"])
                if number == restart_after:
                    parts = {name: _reopened(part) for name, part in parts.items()}
                if number == restore_after:
                    for name, part in list(parts.items()):
                        part.store.close()
                        parts[name] = _restored(root / f"{name}-{number}", part, changelog)
                    assert records(parts["budgeted"]) == records(parts["memory"])
        finally:
            for part in parts.values():
                part.store.close()


def _events(first: int, count: int) -> list[tuple[str, bytes, int, bytes, bytes]]:
    """Left records of 50 join keys in time order (all live in a long window), and a right one
    now and then that matches the latest of its key."""
    out: list[tuple[str, bytes, int, bytes, bytes]] = []
    for n in range(first, first + count):
        out.append(("left", b"k%d" % (n % 50), 1_000 + n, b"L%d" % n, b"l%d" % n))
        if n % 7 == 0:
            out.append(("right", b"k%d" % (n % 50), 1_000 + n, b"R%d" % n, b"r%d" % n))
    return out


def test_the_index_spills_when_it_crosses_the_budget_and_carries_on_alike() -> None:
    """Records in batches, each written: in memory while under the budget (30 KB here: about
    100 live records), spilled at the next batch once over it, its index keys written to the
    store and its memory freed; the results never differ from the in-memory join's."""
    window = JoinWindow(0, 10**6, 0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        budget = IndexBudget(30_000)
        kind = WindowedKind(window, JoinType.LEFT, index="budget", filter_bytes=256, budget=budget)
        budgeted = StatePartition(open_store(root / "b"), kind, "active", True)
        reference = _partition(root / "m", window, JoinType.LEFT, "memory", True, 0)
        operator = budgeted.operator
        assert isinstance(operator, BudgetedJoin)
        sizes = []
        try:
            for number in range(12):
                batch = _events(number * 25, 25)
                assert operator.process_many(batch) == reference.operator.process_many(batch)
                assert operator.take_changes() == reference.operator.take_changes()
                budgeted.write(number)
                reference.write(number)
                assert records(budgeted) == records(reference)
                sizes.append((operator.spilled, operator.index_memory()["bytes"], budget.total))  # type: ignore[index]
            spilled_at = [spilled for spilled, _, _ in sizes].index(True)
            assert 1 <= spilled_at < 11, sizes  # not at once, not never
            # Over the budget at the batch before the spill (the one that asked for it), not before.
            assert (
                sizes[spilled_at - 1][2] > 30_000 >= sizes[spilled_at - 2][2] if spilled_at > 1 else True
            ), sizes
            assert budget.total == 0 and budget.spills == 1 and budget.in_memory == 0
            assert isinstance(operator.inner, StoredIndexJoin)
            assert all(size <= 256 + 2 * 256 * 128 for spilled, size, _ in sizes if spilled), sizes
            stored = {k[:1] for k, _ in budgeted.store.scan(b"", b"\xff")}
            assert {keys.EXPIRY_INDEX, keys.ID_INDEX} <= stored
            assert budgeted.store.get(keys.INDEX_MARK) == b"rocksdb"
            assert operator.live_records == reference.operator.live_records == 300 + 43  # and the right ones
        finally:
            budgeted.store.close()
            reference.store.close()


def test_a_spilled_state_stays_spilled_when_opened_again_unless_it_fits() -> None:
    """Real RocksDB files: reopened with the same budget, the join reads its stored index (no
    rebuild, nothing in memory); with a budget it fits four times over, the in-memory join
    takes it back and the stored index is dropped; both carry on as the in-memory join."""
    window = JoinWindow(0, 10**6, 0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        part = _partition(root / "b", window, JoinType.OUTER, "budget", False, 0)
        reference = _partition(root / "m", window, JoinType.OUTER, "memory", False, 0)
        try:
            for number, batch in enumerate([_events(0, 40), _events(40, 40)]):
                assert part.operator.process_many(batch) == reference.operator.process_many(batch)
                part.operator.take_changes()
                reference.operator.take_changes()
                part.write(number)
                reference.write(number)
            assert part.operator.spilled  # type: ignore[attr-defined]
            part = _reopened(part)
            assert part.operator.spilled and part.operator.live_records == reference.operator.live_records  # type: ignore[attr-defined]
            batch = _events(80, 10)
            assert part.operator.process_many(batch) == reference.operator.process_many(batch)
            part.operator.take_changes()
            reference.operator.take_changes()
            part.write(2)
            reference.write(2)
            part.store.close()
            roomy = WindowedKind(window, JoinType.OUTER, index="budget", budget=IndexBudget(10 << 20))
            part = StatePartition(open_store(root / "b"), roomy, "active", False)
            assert not part.operator.spilled and part.operator.live_records == reference.operator.live_records  # type: ignore[attr-defined]
            batch = _events(90, 10)
            assert part.operator.process_many(batch) == reference.operator.process_many(batch)
            assert part.operator.advance(10**8) == reference.operator.advance(10**8)
            part.operator.take_changes()
            part.write(3)
            left = {k[:1] for k, _ in part.store.scan(b"", b"\xff")}
            assert not left & {keys.EXPIRY_INDEX, keys.ID_INDEX, keys.INDEX_MARK[:1]}, left
        finally:
            part.store.close()
            reference.store.close()


def test_a_restore_spills_midway_and_the_join_carries_on() -> None:
    """A changelog restored into a new store (a promotion's or a standby's path) with a small
    budget: in memory for the first fetches, spilled between two fetches, and then the same
    state and results as the in-memory join restored from the same changelog."""
    window = JoinWindow(0, 10**6, 0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = _partition(root / "source", window, JoinType.LEFT, "memory", False, 0)
        changelog: list[tuple[bytes, bytes | None]] = []
        for number in range(8):
            source.operator.process_many(_events(number * 25, 25))
            changelog += source.operator.take_changes()
            source.write(number)
        source.store.close()
        budget = IndexBudget(20_000)
        kind = WindowedKind(window, JoinType.LEFT, index="budget", filter_bytes=256, budget=budget)
        memory_kind = WindowedKind(window, JoinType.LEFT, index="memory")
        spilled = StatePartition(open_store(root / "s"), kind, "active", False)
        reference = StatePartition(open_store(root / "r"), memory_kind, "active", False)
        seen = []
        try:
            for start in range(0, len(changelog), 40):  # fetches of 40, written every 16
                for applied, (key, value) in enumerate(changelog[start : start + 40], start + 1):
                    for part in (spilled, reference):
                        part.restore(key, value)
                        if applied % 16 == 0:
                            part.write(applied)
                for part in (spilled, reference):
                    part.operator.finish_restore()
                    part.write(start + 40)
                seen.append(spilled.operator.spilled)  # type: ignore[attr-defined]
            assert seen[0] is False and seen[-1] is True, seen
            assert records(spilled) == records(reference)
            assert spilled.operator.live_records == reference.operator.live_records > 200
            batch = _events(200, 30)
            assert spilled.operator.process_many(batch) == reference.operator.process_many(batch)
            assert spilled.operator.take_changes() == reference.operator.take_changes()
        finally:
            spilled.store.close()
            reference.store.close()


def test_the_budget_spills_the_largest_first() -> None:
    budget = IndexBudget(1000)
    a, b, c = budget.join(), budget.join(), budget.join()
    assert not budget.report(a, 600) and not budget.report(b, 300)
    assert not budget.report(c, 200)  # over (1,100), but 200 is under the average (367)
    assert budget.report(a, 610)  # the largest
    budget.leave(a)
    assert budget.total == 500 and budget.in_memory == 2
    assert not budget.report(c, 700)  # 1,000: at the budget, not over
    assert budget.report(b, 900)  # 1,600 > 1.5 x the budget: whoever grows spills
    with pytest.raises(ValueError, match="budget of -1 bytes"):
        IndexBudget(-1)


def test_the_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    window = JoinWindow(0, 10, 0)
    monkeypatch.delenv("TANDEM_WINDOW_INDEX", raising=False)
    monkeypatch.delenv("TANDEM_WINDOW_INDEX_BUDGET_MB", raising=False)
    kind = WindowedKind(window, JoinType.INNER)
    assert kind.index == "budget" and kind.budget.limit == 32 << 20
    assert type(kind.operator(MemoryKV(), False)) is BudgetedJoin
    assert kind.describe()["window_index_budget_mb"] == 32
    assert WindowedKind(window, JoinType.LEFT).budget is kind.budget  # one per process
    monkeypatch.setenv("TANDEM_WINDOW_INDEX_BUDGET_MB", "0.5")
    assert index_budget_from_env().limit == 1 << 19
    for bad, said in (("lots", "is not a number"), ("-1", "must be 0 or more"), ("nan", "must be 0 or more")):
        monkeypatch.setenv("TANDEM_WINDOW_INDEX_BUDGET_MB", bad)
        with pytest.raises(ValueError, match=f"TANDEM_WINDOW_INDEX_BUDGET_MB.*{said}"):
            WindowedKind(window, JoinType.INNER)


def test_an_overlay_told_to_scan_records_finds_those_pending() -> None:
    """The in-memory join's overlay does not index record keys for scans; a spill mid-batch
    has it index them (kv.Overlay.set_unscanned), or the stored join would miss this batch's."""
    base = MemoryKV()
    base.put(b"r1", b"base")
    overlay = Overlay(base, unscanned=(keys.RECORD, keys.META))
    overlay.put(b"r2", b"pending")
    assert [k for k, _ in overlay.scan(b"r", b"s")] == [b"r1"]
    overlay.set_unscanned((keys.META, keys.ID_INDEX))
    assert [k for k, _ in overlay.scan(b"r", b"s")] == [b"r1", b"r2"]
    overlay.put(b"r0", b"later")
    assert [k for k, _ in overlay.scan(b"r", b"s")] == [b"r0", b"r1", b"r2"]


def test_a_spill_mid_batch_finds_the_batch_records() -> None:
    """The overlay holds unwritten records when the spill cannot wait (SPILL_WAITS calls):
    the stored join indexes them too."""
    window = JoinWindow(0, 10**6, 0)
    with tempfile.TemporaryDirectory() as tmp:
        part = _partition(Path(tmp) / "b", window, JoinType.INNER, "budget", False, 0)
        reference = WindowedJoin(MemoryKV(), window, JoinType.INNER)
        try:
            operator = part.operator
            assert isinstance(operator, BudgetedJoin)
            for event in _events(0, 200):  # one call each, never written: the spill waits, then goes
                assert operator.process_many([event]) == reference.process_many([event])  # type: ignore[list-item]
            assert operator.spilled and operator.live_records == reference.live_records
        finally:
            part.store.close()
