"""The temporal join's latest-version keys (`l`, docs/tables.md "The temporal join's state"):
the common lookups and updates are point reads with no scan; a state written before them
(every version under `v`, no layout mark) is moved to them before the first batch, with the
same results as the model; and a state rebuilt from the changelog in real RocksDB files holds
them, with the same lookups."""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.operators import keys
from tables.operators.base import Match
from tables.operators.kv import MemoryKV
from tables.operators.temporal import (
    LATEST,
    LAYOUT_KEY,
    PENDING,
    VERSION,
    TemporalEvent,
    TemporalJoin,
    TemporalKind,
)
from tables.state.partition import StatePartition
from tables.state.store import open_store
from tests.test_tables_temporal import (
    HUGE,
    CrashingDriver,
    MemoryDriver,
    Model,
    RocksDriver,
    Run,
    Step,
    check,
    offset,
    order,
    quote,
    runs,
)


class CountingKV(MemoryKV):
    """A MemoryKV that counts the scans of each one-byte prefix, and the gets."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: dict[bytes, int] = {}
        self.gets = 0

    def get(self, key: bytes) -> bytes | None:
        self.gets += 1
        return super().get(key)

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.scans[lo[:1]] = self.scans.get(lo[:1], 0) + 1
        return super().scan(lo, hi)


def test_lookups_newer_than_the_latest_version_and_updates_of_new_keys_scan_nothing() -> None:
    """bench_enrich's case: a table of keys with one version each, then stream records newer
    than it. Neither the updates nor the lookups scan the versions (a RocksDB iterator and a
    seek each: ~5 us, growing with the store); each is a point read."""
    state = CountingKV()
    join = TemporalJoin(state, "left", 5, 3_600_000)
    join.process_many([])  # its first batch looks for versions of an earlier layout: one scan
    state.scans.clear()
    table = [quote(f"k{n}", n, n, f"Q{n}") for n in range(1_000)]
    join.process_many(table)
    stream = [order(f"k{n}", 2_000 + n, 10_000 + n) for n in range(1_000)]
    out = join.process_many(stream) + join.advance(HUGE)
    assert [(m.key, m.right) for m in out] == [(b"k%d" % n, b"Q%d" % n) for n in range(1_000)]
    assert state.scans.get(VERSION, 0) == 0, state.scans


def test_a_lookup_into_history_finds_the_older_version_and_updates_still_prune() -> None:
    """The out-of-order cases that do scan: a stream record older than its key's latest
    version, and an update whose key has older versions the prune point passed."""
    state = CountingKV()
    join = TemporalJoin(state, "left", 0, 100)
    join.process_many([quote("a", 10, 1, "A10"), quote("a", 50, 2, "A50"), quote("a", 30, 3, "A30")])
    out = join.process_many([order("a", 40, 4), order("a", 20, 5), order("a", 60, 6), order("a", 5, 7)])
    out += join.advance(61)  # (o6 waits out its grace; the others are past it on arrival)
    expected = [(b"o4", b"A30"), (b"o5", b"A10"), (b"o7", None), (b"o6", b"A50")]
    assert [(m.left, m.right) for m in out] == expected
    assert state.scans.get(VERSION, 0) >= 2  # o4 and o5 looked into history
    for n in range(1, 30):  # the prune point passes every version but the latest
        join.process_many([quote("a", 60 + 10 * n, 10 + n, f"A{60 + 10 * n}")])
    older = [k for k, _ in state.scan(VERSION, b"w")]
    assert 9 <= len(older) <= 11, len(older)  # those within history (100 ms, one per 10 ms)
    assert [k for k, _ in state.scan(LATEST, b"m")] == [LATEST + keys.LEN.pack(1) + b"a"]


# -- a state written before the latest-version keys --------------------------------------


def to_legacy(contents: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The same state as the operator wrote it before the `l` keys: every version under `v`
    (the latest with the others), and no layout mark."""
    legacy = {}
    for key, value in contents.items():
        if key == LAYOUT_KEY:
            continue
        if key[:1] == LATEST:
            order_bytes = value[:16]
            complement = bytes(255 - byte for byte in order_bytes)
            legacy[VERSION + key[1:] + complement] = value[24:]
        else:
            legacy[key] = value
    return legacy


def feed(join: TemporalJoin, batch: list[Step]) -> list[Match]:
    if isinstance(batch[0], int):
        return join.advance(batch[0])
    return join.process_many(batch)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.data())
def test_a_state_written_before_the_latest_keys_is_moved_to_them_with_the_same_results(
    run: Run, data: st.DataObject
) -> None:
    """Any point of a run: the state rewritten as the earlier layout, a new operator over it,
    the rest of the run: the model's results, and a state the changelog alone rebuilds."""
    cut = data.draw(st.integers(0, len(run.batches)))
    model = Model(run.how, run.grace, run.history, run.ids)
    state = MemoryKV()
    join = TemporalJoin(state, run.how, run.grace, run.history, run.ids)
    for batch in run.batches[:cut]:
        assert feed(join, batch) == [m for step in batch for m in model.step(step)]
    join.take_changes()
    legacy = MemoryKV()
    for key, value in to_legacy(dict(state.scan(b"", b"\xff"))).items():
        legacy.put(key, value)
    join = TemporalJoin(legacy, run.how, run.grace, run.history, run.ids)
    replayed = MemoryKV()
    for key, value in dict(legacy.scan(b"", b"\xff")).items():
        replayed.put(key, value)
    for batch in run.batches[cut:] + [[HUGE]]:
        assert feed(join, batch) == [m for step in batch for m in model.step(step)], batch
        for changed, new in join.take_changes():
            if new is None:
                replayed.delete(changed)
            else:
                replayed.put(changed, new)
    assert dict(replayed.scan(b"", b"\xff")) == dict(legacy.scan(b"", b"\xff"))
    assert legacy.get(LAYOUT_KEY) is not None  # marked by its first batch (the last one's at least)


def test_a_restore_of_an_earlier_layouts_changelog_moves_it_on_the_first_batch(tmp_path: Path) -> None:
    """A changelog written before the `l` keys restored into real RocksDB files: the first
    batch after it moves the versions, and the lookups are the same."""
    legacy_changelog = [
        (VERSION + keys.LEN.pack(1) + b"a" + _complement(keys.encode_time(t) + offset(n)), b"\x01A%d" % t)
        for n, t in enumerate((100, 200, 300), 1)
    ] + [(keys.meta_key("stream_time"), keys.encode_int(300))]
    kind = TemporalKind("left", 0, 1_000)
    partition = StatePartition(open_store(tmp_path / "0"), kind, "active")
    try:
        for key, value in legacy_changelog:
            partition.restore(key, value)
        partition.operator.finish_restore()
        partition.write(len(legacy_changelog))
        partition.reset()
        out = partition.operator.process_many([order("a", 150, 10), order("a", 250, 11)])
        out += partition.operator.process_many([order("a", 350, 12)]) + partition.operator.advance(400)
        assert [(m.left, m.right) for m in out] == [(b"o10", b"A100"), (b"o11", b"A200"), (b"o12", b"A300")]
        partition.operator.take_changes()
        partition.write(len(legacy_changelog) + 1)
        stored = dict(partition.store.scan(b"", b"\xff"))
        assert stored[LAYOUT_KEY] == keys.encode_int(1)
        assert [k for k in stored if k[:1] == LATEST] == [LATEST + keys.LEN.pack(1) + b"a"]
        assert len([k for k in stored if k[:1] == VERSION]) == 2
    finally:
        partition.store.close()


def _complement(raw: bytes) -> bytes:
    return bytes(255 - byte for byte in raw)


# -- a restore from the changelog into real RocksDB files ------------------------------------


def test_a_state_rebuilt_from_the_changelog_in_rocksdb_holds_the_latest_keys(tmp_path: Path) -> None:
    """2,000 keys with a few versions each (some deleted), stream records at every age, in
    real RocksDB files committed per batch; the changelog alone restored into new files: the
    same keys and values (`l` keys, their `oldest`, older versions), and the same results for
    the same further input."""
    kind = TemporalKind("left", 10, 5_000)
    first = StatePartition(open_store(tmp_path / "first"), kind, "active", ids=True)
    changelog: list[tuple[bytes, bytes | None]] = []

    def run_batch(partition: StatePartition, events: list[TemporalEvent], checkpoint: int) -> list[Match]:
        out = partition.operator.process_many(events)
        changelog.extend(partition.operator.take_changes())
        partition.write(checkpoint)
        return out

    try:
        number = 0
        for version in range(4):
            events: list[TemporalEvent] = []
            for n in range(2_000):
                number += 1
                value = None if (n + version) % 7 == 0 else b"v%d-%d" % (n, version)
                events.append(("right", b"k%d" % n, version * 1_000 + n % 500, offset(number), value))
                if n % 3 == 0:  # a stream record, sometimes older than its key's latest
                    ts = version * 1_000 + n % 500 - (n % 2) * 600
                    events.append(("left", b"k%d" % n, ts, b"s%d-%d" % (n, version), b"o"))
            run_batch(first, events, version)
        stored = dict(first.store.scan(b"", b"\xff"))
        rebuilt = StatePartition(open_store(tmp_path / "rebuilt"), kind, "active", ids=True)
        try:
            for applied, (key, value) in enumerate(changelog, 1):
                rebuilt.restore(key, value)
                if applied % 5_000 == 0:
                    rebuilt.write(applied)
            rebuilt.operator.finish_restore()
            rebuilt.write(len(changelog))
            again = dict(rebuilt.store.scan(b"", b"\xff"))
            assert {k: v for k, v in again.items() if k != b"checkpoint"} == {
                k: v for k, v in stored.items() if k != b"checkpoint"
            }
            assert sum(1 for k in again if k[:1] == LATEST) > 1_500
            assert any(k[:1] == PENDING for k in again)
            rebuilt.reset()
            first.reset()
            later: list[TemporalEvent] = [
                ("left", b"k%d" % n, 3_000 + n % 700 - 400, b"t%d" % n, b"o") for n in range(0, 2_000, 5)
            ]
            assert run_batch(rebuilt, later, 10) + rebuilt.operator.advance(HUGE) == run_batch(
                first, later, 10
            ) + first.operator.advance(HUGE)
        finally:
            rebuilt.store.close()
    finally:
        first.store.close()


def test_the_latest_key_holds_the_versions_order_oldest_and_value() -> None:
    """The `l` value as docs/tables.md gives it: ts, offset, oldest (8 bytes each), body."""
    state = MemoryKV()
    join = TemporalJoin(state, "left", 0, 1_000)
    join.process_many([quote("a", 7, 3, "A7"), quote("a", 9, 4, "A9")])
    latest = state.get(LATEST + keys.LEN.pack(1) + b"a")
    assert latest == keys.encode_time(9) + struct.pack(">Q", 4) + keys.encode_time(7) + b"\x01A9"


# -- the pending records read ahead --------------------------------------------------------


class ReadsOneAhead(TemporalJoin):
    READ_AHEAD = 1


class ReadsTwoAhead(TemporalJoin):
    READ_AHEAD = 2


@settings(max_examples=200, deadline=None)
@given(runs(), st.sampled_from([ReadsOneAhead, ReadsTwoAhead]))
def test_pending_records_read_a_few_ahead_are_the_model(run: Run, cls: type[TemporalJoin]) -> None:
    """Read-ahead small enough that every run refills it and lets records go past twice it."""
    check(run, MemoryDriver(run, cls))


@settings(max_examples=150, deadline=None)
@given(runs(), st.sampled_from([ReadsOneAhead, ReadsTwoAhead]), st.data())
def test_pending_records_read_ahead_behind_an_overlay_committed_now_and_then_and_crashing(
    run: Run, cls: type[TemporalJoin], data: st.DataObject
) -> None:
    batches = st.sets(st.integers(0, len(run.batches) - 1))
    check(run, CrashingDriver(run, cls, data.draw(batches), data.draw(batches)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(max_events=40))
def test_pending_records_read_ahead_on_rocksdb_are_the_model(run: Run) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        check(run, RocksDriver(run, ReadsTwoAhead, Path(tmp)))


def test_emission_one_record_at_a_time_reads_the_state_once_per_read_ahead() -> None:
    """bench_enrich's stream: each record moves stream time past the grace of one earlier.
    The pending records are scanned once per READ_AHEAD emitted, not once each."""
    state = CountingKV()
    join = TemporalJoin(state, "left", 50, 3_600_000)
    join.process_many([quote(f"k{n}", n, n, f"Q{n}") for n in range(100)])
    join.take_changes()
    state.scans.clear()
    for n in range(2_000):
        join.process_many([order(f"k{n % 100}", 1_000 + 10 * n, 10_000 + n)])
    assert state.scans.get(PENDING, 0) <= 2_000 // TemporalJoin.READ_AHEAD + 2, state.scans
