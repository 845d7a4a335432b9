"""Where the windowed join keeps its index of live records (TANDEM_WINDOW_INDEX): in memory
(tables/operators/window_index.py) or in the state (tables/operators/stored_window.py), over
real RocksDB stores. A state written with one index and opened with the other carries on with
the same results as a state that never changed (the in-memory join drops the stored index it
would not keep current; the stored one builds its index from the records), and what each one
says it holds in memory (the view's and /metrics' `window_index`) is what it holds."""

from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tables.operators import keys, kv
from tables.operators.kv import MemoryKV
from tables.operators.stored_window import READ_AHEAD, KeyFilter, StoredIndexJoin
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.operators.windowed_kind import WindowedKind
from tables.state.partition import StatePartition
from tables.state.store import open_store, rocksdb_budgets
from tests.test_tables_index import Run, records, runs

# Every test here with each loop of the in-memory operator (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("join_loop")


def _partition(
    path: Path, window: JoinWindow, join_type: JoinType, index: str, ids: bool, filter_bytes: int = 4096
) -> StatePartition:
    kind = WindowedKind(window, join_type, index=index, filter_bytes=filter_bytes)
    return StatePartition(open_store(path), kind, "active", ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_a_state_opened_with_the_other_window_index_carries_on_alike(run: Run) -> None:
    join_type, window, ids, batches, _, _ = run
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv, "DERIVED_CHUNK", 3)  # the index built and dropped in several writes
        reference = _partition(Path(tmp) / "reference", window, join_type, "memory", ids)
        switched = _partition(Path(tmp) / "switched", window, join_type, "rocksdb", ids)
        try:
            for number, batch in enumerate(batches):
                got = switched.operator.process_many(batch)
                assert got == reference.operator.process_many(batch), batch
                assert switched.operator.take_changes() == reference.operator.take_changes()
                switched.write(number)
                reference.write(number)
                assert switched.operator.counters() == reference.operator.counters()
                assert switched.operator.live_records == reference.operator.live_records
                assert records(switched) == records(reference)
                # The other index from the next batch on: the same files, opened again.
                index = "memory" if switched.kind.index == "rocksdb" else "rocksdb"  # type: ignore[attr-defined]
                switched.store.close()
                switched = _partition(switched.store.path, window, join_type, index, ids)
                if index == "memory":  # the stored index and its mark are gone with the next write
                    switched.write(number)
                    left = {k[:1] for k, _ in switched.store.scan(b"", b"\xff")}
                    assert not left & {keys.EXPIRY_INDEX, keys.ID_INDEX, keys.INDEX_MARK[:1]}, left
        finally:
            reference.store.close()
            switched.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_a_key_filter_of_one_slot_changes_nothing(run: Run) -> None:
    """Every key in one counter (each side's keys collide, counts saturate on long runs):
    the filter only ever lets a scan or a read happen that finds nothing."""
    join_type, window, ids, batches, restart_after, _ = run
    with tempfile.TemporaryDirectory() as tmp:
        reference = _partition(Path(tmp) / "reference", window, join_type, "memory", ids)
        crowded = _partition(Path(tmp) / "crowded", window, join_type, "rocksdb", ids, filter_bytes=1)
        try:
            for number, batch in enumerate(batches):
                assert crowded.operator.process_many(batch) == reference.operator.process_many(batch), batch
                assert crowded.operator.take_changes() == reference.operator.take_changes()
                crowded.write(number)
                reference.write(number)
                assert records(crowded) == records(reference)
                if number == restart_after:
                    crowded.store.close()
                    crowded = _partition(crowded.store.path, window, join_type, "rocksdb", ids, 1)
        finally:
            reference.store.close()
            crowded.store.close()


def test_the_key_filter_counts_exactly_until_it_saturates() -> None:
    one = KeyFilter(1)
    assert len(one.counts) == 1 and not one.may_hold(b"rLa")
    one.add(b"rLa")
    one.add(b"rRb")  # the same slot
    one.remove(b"rLa")
    assert one.may_hold(b"rLa")  # rRb's count: a scan that finds nothing, never a scan missed
    one.remove(b"rRb")
    assert not one.may_hold(b"rLa")
    for _ in range(300):
        one.add(b"rLa")
    for _ in range(300):
        one.remove(b"rLa")
    assert one.may_hold(b"rLa")  # saturated at 255: never decremented, never falsely empty
    assert len(KeyFilter(5000).counts) == 4096
    with pytest.raises(ValueError, match="key filter of 0 bytes"):
        KeyFilter(0)


def test_the_window_index_setting() -> None:
    window = JoinWindow(0, 10, 0)
    default, memory, stored = (
        WindowedKind(window, JoinType.INNER),
        WindowedKind(window, JoinType.INNER, index="memory"),
        WindowedKind(window, JoinType.INNER, index="rocksdb"),
    )
    assert memory.index == "memory" and keys.RECORD in memory.unscanned
    # The default starts in memory: its overlay indexes records only once it spills.
    assert default.index == "budget" and default.unscanned == memory.unscanned
    # Records and due times are range-scanned through the batch overlay: it must index them.
    assert keys.RECORD not in stored.unscanned and keys.EXPIRY_INDEX not in stored.unscanned
    assert type(stored.operator(MemoryKV(), False)) is StoredIndexJoin
    assert type(memory.operator(MemoryKV(), False)) is WindowedJoin
    assert stored.describe()["window_index"] == "rocksdb"
    with pytest.raises(ValueError, match="window index 'disk'"):
        WindowedKind(window, JoinType.INNER, index="disk")


def test_the_window_index_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    window = JoinWindow(0, 10, 0)
    monkeypatch.setenv("TANDEM_WINDOW_INDEX", " RocksDB ")
    assert WindowedKind(window, JoinType.INNER).index == "rocksdb"
    monkeypatch.setenv("TANDEM_WINDOW_INDEX", "")
    assert WindowedKind(window, JoinType.INNER).index == "budget"
    monkeypatch.setenv("TANDEM_WINDOW_INDEX", "Memory")
    assert WindowedKind(window, JoinType.INNER).index == "memory"
    monkeypatch.setenv("TANDEM_WINDOW_INDEX", "lmdb")
    with pytest.raises(ValueError, match="TANDEM_WINDOW_INDEX='lmdb'"):
        WindowedKind(window, JoinType.INNER)
    monkeypatch.setenv("TANDEM_WINDOW_INDEX", "rocksdb")
    assert WindowedKind(window, JoinType.INNER).filter_bytes == 4 << 20
    monkeypatch.setenv("TANDEM_WINDOW_INDEX_FILTER_MB", "0.5")
    assert WindowedKind(window, JoinType.INNER).filter_bytes == 1 << 19
    monkeypatch.setenv("TANDEM_WINDOW_INDEX_FILTER_MB", "-1")
    with pytest.raises(ValueError, match="TANDEM_WINDOW_INDEX_FILTER_MB must be positive"):
        WindowedKind(window, JoinType.INNER)


def _events(count: int, keys_per: int) -> list[tuple[str, bytes, int, bytes, bytes]]:
    return [("left", b"auction-%d" % (n // keys_per), 1_000 + n, b"%08d" % n, b"v") for n in range(count)]


@pytest.mark.parametrize(("ids", "keys_per"), [(False, 1), (True, 1), (False, 10)])
def test_the_in_memory_index_says_what_it_holds(ids: bool, keys_per: int) -> None:
    """index_memory()'s bytes within 15 % of what tracemalloc counts the index allocating
    (the records' keys included: the state is RocksDB's in a worker, not Python objects)."""
    join = WindowedJoin(MemoryKV(), JoinWindow(0, 10**9, 0), JoinType.LEFT, ids)
    join.process_many(_events(10, keys_per))
    count = 20_000
    added = [
        (keys.record_key("left", b"auction-%d" % (n // keys_per), 2_000 + n, b"%08d" % n), 2_000 + n)
        for n in range(count)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for record_key, ts in added:
            prefix = record_key[: keys.KEY_AT + keys.LEN.unpack_from(record_key, 2)[0]]
            join.index.add(prefix, record_key, ts, record_key[len(prefix) + 8 :])
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The keys were made before tracing began: count them as the index's, as in a worker.
    allocated += sum((record_key.__sizeof__() + 7) // 8 * 8 for record_key, _ in added)
    measured = join.index_memory()
    assert measured["entries"] == count + 10
    assert abs(measured["bytes"] - allocated) <= 0.15 * allocated, (measured, allocated)


def test_the_stored_index_holds_no_record_in_memory() -> None:
    """Its memory is its read-ahead of the time index, whatever the window holds."""
    with tempfile.TemporaryDirectory() as tmp:
        kind = WindowedKind(JoinWindow(0, 50, 0), JoinType.LEFT, index="rocksdb")
        partition = StatePartition(open_store(Path(tmp) / "s"), kind, "active", False)
        try:
            sizes = []
            for batch in range(6):
                partition.operator.process_many(_events(20_000, 1)[batch * 3_000 : (batch + 1) * 3_000])
                partition.operator.take_changes()
                partition.write(batch)
                sizes.append(partition.operator.index_memory())  # type: ignore[attr-defined]
            assert sizes[-1]["entries"] == partition.operator.live_records > 0
            assert all(size["bytes"] <= kind.filter_bytes + 2 * READ_AHEAD * 128 for size in sizes), sizes
            # The same files opened again count what they hold.
            partition.store.close()
            partition = StatePartition(open_store(Path(tmp) / "s"), kind, "active", False)
            assert partition.operator.live_records == sizes[-1]["entries"]
        finally:
            partition.store.close()


def test_a_store_keeps_its_index_and_filter_in_partitions() -> None:
    """One filter block per file outgrew its shard of the block cache past a few hundred
    thousand keys, and every point read of the index in RocksDB parsed it again (2 -> 270 us):
    the store's files hold their index and filter in cacheable partitions instead."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "s")
        try:
            store.write({b"r%08d" % n: b"v" * 50 for n in range(50_000)}, 1)
            store._db.flush()
            raw = store._db.property_value("rocksdb.aggregated-table-properties")
            properties = dict(item.split("=", 1) for item in raw.split("; ") if "=" in item)
            assert int(properties["# index partitions"]) > 1, properties
            assert int(properties["# entries for filter"]) >= 50_000  # the store's own keys too
        finally:
            store.close()


def test_the_rocksdb_budgets_from_the_environment() -> None:
    """What bounds a worker's memory with the index in RocksDB is configurable (docs/operations.md)."""
    assert rocksdb_budgets({}) == (64 << 20, 128 << 20)
    env = {"TANDEM_ROCKSDB_BLOCK_CACHE_MB": "32", "TANDEM_ROCKSDB_MEMTABLES_MB": " 48 "}
    assert rocksdb_budgets(env) == (32 << 20, 48 << 20)
    with pytest.raises(ValueError, match="TANDEM_ROCKSDB_MEMTABLES_MB='lots' is not a number"):
        rocksdb_budgets({"TANDEM_ROCKSDB_MEMTABLES_MB": "lots"})
    with pytest.raises(ValueError, match="TANDEM_ROCKSDB_BLOCK_CACHE_MB must be at least 1"):
        rocksdb_budgets({"TANDEM_ROCKSDB_BLOCK_CACHE_MB": "0"})
