"""`find`, the join's partner scan: PartitionStore.find reads a short range from one iterator
reused until the next write, and gives way to a fresh bounded scan when a seek would step over
too many tombstones. It must read exactly what `scan` reads, and the join over it must do
exactly what it did over `scan`: same matches, counters, changelog and RocksDB contents."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables import keys
from tables import store as store_module
from tables.keys import Side
from tables.kv import Overlay
from tables.operator import JoinType, JoinWindow, Match, WindowedJoin
from tables.partition import StatePartition
from tables.store import CHECKPOINT_KEY, PartitionStore, encode_checkpoint, open_store

Event = tuple[Side, bytes, int, bytes, bytes]  # side, key, ts, id, value
KEYS = [b"", b"a", b"a\x00", b"a\x01", b"ab", b"b", b"b\xff", b"ba", b"c"]


@contextlib.contextmanager
def skippable(limit: int) -> Iterator[None]:
    """find() with another FIND_SKIPPABLE (read when its iterator is made, after each write)."""
    saved, store_module.FIND_SKIPPABLE = store_module.FIND_SKIPPABLE, limit
    try:
        yield
    finally:
        store_module.FIND_SKIPPABLE = saved


class CountingStore(PartitionStore):
    """A real store that counts the bounded scans find() fell back to."""

    scans = 0

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.scans += 1
        return super().scan(lo, hi)


def _in_range(model: dict[bytes, bytes], lo: bytes, hi: bytes) -> list[tuple[bytes, bytes]]:
    return sorted((k, v) for k, v in model.items() if lo <= k < hi)


writes = st.lists(
    st.dictionaries(st.sampled_from(KEYS[1:]), st.one_of(st.none(), st.binary(max_size=3)), max_size=8),
    min_size=1,
    max_size=6,
)
ranges = st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([*KEYS, b"\xff"])), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes, ranges, st.sampled_from([1, 2, 64]))
def test_find_reads_what_scan_reads(
    history: list[dict[bytes, bytes | None]], looks: list[tuple[bytes, bytes]], limit: int
) -> None:
    """After each write, find() over ranges in any order (one iterator serves them all) equals
    a fresh bounded scan and the model, whatever tombstones lie between the keys."""
    with tempfile.TemporaryDirectory() as tmp, skippable(limit):
        store = PartitionStore(Path(tmp) / "t" / "0")
        model = dict(store.scan(b"", b"\xff"))  # the store's own format key
        try:
            for checkpoint, changes in enumerate(history):
                store.write(changes, checkpoint)
                model[CHECKPOINT_KEY] = encode_checkpoint(checkpoint)
                for key, value in changes.items():
                    if value is None:
                        model.pop(key, None)
                    else:
                        model[key] = value
                for lo, hi in looks + looks[::-1]:
                    expected = _in_range(model, lo, hi)
                    assert store.find(lo, hi) == expected
                    assert list(store.scan(lo, hi)) == expected
        finally:
            store.close()


def test_a_seek_over_many_tombstones_falls_back_to_a_bounded_scan() -> None:
    """Past FIND_SKIPPABLE tombstones the shared iterator gives up (RocksDB's Incomplete) and the
    range is read by scan; below it no scan is made. Both give the live keys only. After
    FIND_FALLBACKS fallbacks every find is a scan, until the next write."""
    with tempfile.TemporaryDirectory() as tmp:
        store = CountingStore(Path(tmp) / "t" / "0")
        try:
            store.write({b"a%03d" % i: b"v" for i in range(200)} | {b"b": b"B"}, 1)
            store.write({b"a%03d" % i: None for i in range(199)}, 2)
            assert store.find(b"a", b"a199") == []
            assert store.scans == 1
            assert store.find(b"a", b"c") == [(b"a199", b"v"), (b"b", b"B")]
            assert store.scans == 2
            assert store.find(b"a199", b"c") == [(b"a199", b"v"), (b"b", b"B")]
            assert store.find(b"b", b"c") == [(b"b", b"B")]
            assert store.scans == 2
            for _ in range(store_module.FIND_FALLBACKS - 2):  # too many fallbacks: scans until a write
                assert store.find(b"a", b"a199") == []
            assert store.scans == store_module.FIND_FALLBACKS
            assert store.find(b"b", b"c") == [(b"b", b"B")]
            assert store.scans == store_module.FIND_FALLBACKS + 1
            store.write({b"b1": b"C"}, 3)
            assert store.find(b"b", b"c") == [(b"b", b"B"), (b"b1", b"C")]
            assert store.scans == store_module.FIND_FALLBACKS + 1
        finally:
            store.close()


def test_find_sees_each_write_and_close_releases_the_database() -> None:
    """The reused iterator is dropped by write (it would miss it) and by close (it would hold
    RocksDB's LOCK): a store reopened at the same path after a find() opens."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t" / "0"
        store = PartitionStore(path)
        store.write({b"k1": b"1"}, 1)
        assert store.find(b"k", b"l") == [(b"k1", b"1")]
        store.write({b"k2": b"2", b"k1": None}, 2)
        assert store.find(b"k", b"l") == [(b"k2", b"2")]
        store.close()
        again = PartitionStore(path)
        assert again.find(b"k", b"l") == [(b"k2", b"2")]
        again.close()


# -- the join over find() against the join over scan() ----------------------------------


class ScanningOverlay(Overlay):
    """The overlay as it was before find() and expire(): the partner scan reads a fresh
    bounded iterator, and an expired key is deleted like any other (in the sorted index of
    pending keys, so that every scan is told)."""

    def find(self, lo: bytes, hi: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.scan(lo, hi))

    def expire(self, key: bytes) -> None:
        self.delete(key)


@dataclass
class ScanningPartition(StatePartition):
    def reset(self) -> None:
        self.overlay = ScanningOverlay(self.store, unscanned=(keys.ID, keys.META))
        self.join = WindowedJoin(self.overlay, self.window, self.join_type, self.ids)


@st.composite
def runs(draw: st.DrawFn) -> tuple[JoinType, JoinWindow, bool, list[list[Event]], int | None]:
    """Both sides, two join keys, times that go back (late records), records delivered twice
    (and, with ids, resent at another time), in batches; maybe a restore between two."""
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
    restore_after = draw(st.one_of(st.none(), st.integers(0, len(batches) - 1)))
    return join_type, window, ids, batches, restore_after


def _contents(partition: StatePartition) -> dict[bytes, bytes]:
    return dict(partition.store.scan(b"", b"\xff"))


def _restored(
    cls: type[StatePartition], path: Path, like: StatePartition, changelog: list[tuple[bytes, bytes]]
) -> StatePartition:
    """A partition restored from its changelog into a new store, as recovery.py does."""
    partition = cls(open_store(path), like.window, like.join_type, "active", like.ids)
    for applied, (key, value) in enumerate(changelog, 1):
        partition.join.restore(key, value)
        if applied % 7 == 0:
            partition.write(applied)
    partition.join.finish_restore()
    partition.write(len(changelog))
    return partition


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.sampled_from([1, 3, 64]))
def test_join_over_find_does_what_it_did_over_scan(
    run: tuple[JoinType, JoinWindow, bool, list[list[Event]], int | None], limit: int
) -> None:
    join_type, window, ids, batches, restore_after = run
    with tempfile.TemporaryDirectory() as tmp, skippable(limit):
        root = Path(tmp)
        new: StatePartition = StatePartition(open_store(root / "new"), window, join_type, "active", ids)
        old: StatePartition = ScanningPartition(open_store(root / "old"), window, join_type, "active", ids)
        changelog: list[tuple[bytes, bytes]] = []
        try:
            for number, batch in enumerate(batches):
                for event in batch:
                    got: list[Match] = new.join.process(*event)
                    assert got == old.join.process(*event), event
                changes = new.join.take_changes()
                assert changes == old.join.take_changes()
                changelog += changes
                new.write(number)
                old.write(number)
                assert (new.join.late, new.join.duplicates) == (old.join.late, old.join.duplicates)
                assert _contents(new) == _contents(old)
                if number == restore_after:
                    new.store.close()
                    old.store.close()
                    new = _restored(StatePartition, root / "new-restored", new, changelog)
                    old = _restored(ScanningPartition, root / "old-restored", old, changelog)
                    assert _contents(new) == _contents(old)
        finally:
            new.store.close()
            old.store.close()
