"""The join with its index in memory (tables/operators/window_index.py), a batch at a time, against
the join as it was with its index stored in RocksDB (tests/stored_index_join.py), both over real
RocksDB stores: same matches, counters, changelog and stored records after every batch, after a
restart (the index loaded again from the files) and after a restore from the changelog. And a store of
the old format, opened by this code, drops the old index and carries on alike."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Rdict

from tables.operators import keys
from tables.operators.keys import Side
from tables.operators.kv import Overlay
from tables.operators.windowed import JoinType, JoinWindow, Match
from tables.operators.windowed_kind import WindowedKind
from tables.state import store as store_module
from tables.state.partition import StatePartition
from tables.state.store import FORMAT_KEY, open_store
from tests.stored_index_join import StoredIndexJoin

# Every test here with each loop of the operator (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("join_loop")

Event = tuple[Side, bytes, int, bytes, bytes]  # side, key, ts, id, value
Run = tuple[JoinType, JoinWindow, bool, list[list[Event]], int | None, int | None]


@dataclass
class StoredIndexPartition(StatePartition):
    """A partition whose operator keeps its index in the state, as before."""

    def reset(self) -> None:
        self.overlay = Overlay(self.store, unscanned=(b"i", keys.META))
        self.operator = StoredIndexJoin(self.overlay, self.kind.window, self.kind.join_type, self.ids)  # type: ignore[assignment]


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """Both sides, two join keys, times that go back (late records), records delivered twice
    (and, with ids, resent at another time), in batches; maybe a restart and a restore."""
    join_type = draw(st.sampled_from(list(JoinType)))
    window = JoinWindow(draw(st.integers(0, 30)), draw(st.integers(0, 30)), draw(st.integers(0, 20)))
    ids = draw(st.booleans())
    events: list[Event] = []
    for n in range(draw(st.integers(1, 60))):
        if events and draw(st.integers(0, 7)) == 0:
            side, key, ts, record_id, value = draw(st.sampled_from(events))
            events.append((side, key, draw(st.integers(0, 160)) if ids else ts, record_id, value))
            continue
        side: Side = draw(st.sampled_from(["left", "right"]))
        key = draw(st.sampled_from([b"a", b"b", b"ab"]))
        ts = n * 2 + draw(st.integers(-40, 10))
        events.append((side, key, ts, b"e%d" % n, b"v%d" % n))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(events) - 1)), max_size=6)))
    batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True) if events[a:b]]
    after = st.one_of(st.none(), st.integers(0, len(batches) - 1))
    return join_type, window, ids, batches, draw(after), draw(after)


def records(partition: StatePartition) -> dict[bytes, bytes]:
    """What both layouts store alike: records and counters (not the old index)."""
    return {k: v for k, v in partition.store.scan(b"", b"\xff") if k[:1] == b"r" or k[:2] == b"m:"}


def restored(
    cls: type[StatePartition], path: Path, like: StatePartition, changelog: list[tuple[bytes, bytes]]
) -> StatePartition:
    """A partition restored from its changelog into a new store, as recovery.py does."""
    partition = cls(open_store(path), like.kind, "active", like.ids)
    for applied, (key, value) in enumerate(changelog, 1):
        partition.operator.restore(key, value)
        if applied % 7 == 0:
            partition.write(applied)
    partition.operator.finish_restore()
    partition.write(len(changelog))
    return partition


def reopened(partition: StatePartition) -> StatePartition:
    """The same files opened again, as a restarted worker does."""
    partition.store.close()
    store = open_store(partition.store.path)
    return type(partition)(store, partition.kind, "active", partition.ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_join_does_what_it_did_with_its_index_in_rocksdb(run: Run) -> None:
    join_type, window, ids, batches, restart_after, restore_after = run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        new = StatePartition(open_store(root / "new"), WindowedKind(window, join_type), "active", ids)
        old: StatePartition = StoredIndexPartition(
            open_store(root / "old"), WindowedKind(window, join_type), "active", ids
        )
        changelog: list[tuple[bytes, bytes]] = []
        try:
            for number, batch in enumerate(batches):
                # A batch in one call, as the runtime joins them; the old one record by record.
                got: list[Match] = new.operator.process_many(batch)
                assert got == [m for event in batch for m in old.operator.process(*event)], batch
                changes = new.operator.take_changes()
                assert changes == old.operator.take_changes()
                changelog += changes
                new.write(number)
                old.write(number)
                assert (new.operator.late, new.operator.duplicates) == (
                    old.operator.late,
                    old.operator.duplicates,
                )
                assert records(new) == records(old)
                if number == restart_after:
                    new, old = reopened(new), reopened(old)
                if number == restore_after:
                    new.store.close()
                    old.store.close()
                    new = restored(StatePartition, root / f"new-{number}", new, changelog)
                    old = restored(StoredIndexPartition, root / f"old-{number}", old, changelog)
                    assert records(new) == records(old)
        finally:
            new.store.close()
            old.store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_a_store_of_format_1_is_migrated_and_the_join_carries_on(run: Run) -> None:
    """A store the old operator wrote (format 1: with its `x` and `i` keys), opened by this
    code: the old index keys are gone, the records stay, and the join carries on as the
    old operator would have."""
    join_type, window, ids, batches, _, _ = run
    first, rest = batches[0], [e for batch in batches[1:] for e in batch]
    with tempfile.TemporaryDirectory() as tmp:
        old_path, twin_path = Path(tmp) / "old", Path(tmp) / "twin"
        for path in (old_path, twin_path):
            old = StoredIndexPartition(open_store(path), WindowedKind(window, join_type), "active", ids)
            for event in first:
                old.operator.process(*event)
            old.operator.take_changes()
            old.write(0)
            old.store.write({FORMAT_KEY: store_module._FORMAT.pack(1)}, None)
            old.store.close()
        migrated = StatePartition(open_store(old_path), WindowedKind(window, join_type), "active", ids)
        try:
            assert migrated.store.damage is None
            assert migrated.store.get(FORMAT_KEY) == store_module._FORMAT.pack(store_module.FORMAT_VERSION)
            stored = dict(migrated.store.scan(b"", b"\xff"))
            assert not [k for k in stored if k[:1] in (b"x", b"i")]
            reference = _old_store(twin_path, window, join_type, ids)
            try:
                assert records(migrated) == records(reference)
                for event in rest:
                    assert migrated.operator.process(*event) == reference.operator.process(*event), event
                assert migrated.operator.take_changes() == reference.operator.take_changes()
            finally:
                reference.store.close()
        finally:
            migrated.store.close()


def _old_store(path: Path, window: JoinWindow, join_type: JoinType, ids: bool) -> StatePartition:
    """The old operator over its own format-1 files (the format key set back to this code's,
    so that the store opens them as they are)."""
    db = Rdict(str(path), store_module._options())
    db.put(FORMAT_KEY, store_module._FORMAT.pack(store_module.FORMAT_VERSION))
    db.close()
    return StoredIndexPartition(open_store(path), WindowedKind(window, join_type), "active", ids)
