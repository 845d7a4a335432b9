"""The compiled per-record loop of the join (tables/operators/_fastjoin.pyx) against the Python loop it
mirrors (`WindowedJoin._process_many_python`), side by side over the same random streams, on
real RocksDB files and on the other kinds of state: after every batch the matches (order,
types), the changelog, counters, stream time, the whole index and what the state holds must
be the same. A third operator takes either loop batch by batch (the two take turns on one
operator); operators are made again over their state and restored from the changelog
mid-stream; a record lost from the state behind the index must fail alike."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.operators import keys
from tables.operators import windowed as operator_module
from tables.operators.keys import Side
from tables.operators.kv import KV, MemoryKV, Overlay
from tables.operators.windowed import JoinType, JoinWindow, Match, WindowedJoin
from tables.state.store import PartitionStore, open_store
from tests.tables_helpers import compiled_at_import

fastjoin = pytest.importorskip(
    "tables.operators._fastjoin",
    reason="tables.operators._fastjoin is not built (python setup.py build_ext --inplace)",
)
# The compiled loop whatever TANDEM_PURE_PYTHON says: the one under test here.
compiled: Callable[[WindowedJoin, Any], list[Match]] = fastjoin.bind(Match, operator_module._unmatched)
python: Callable[[WindowedJoin, Any], list[Match]] = WindowedJoin._process_many_python

Event = tuple[Side, Any, int, bytes, Any]  # side, key, ts, id, value
Kind = Literal["partition", "overlay", "memory"]
Step = Literal["go on", "made again", "restored", "lose a record"]
# Past the compiled loop's range (tables/operators/_fastjoin.pyx, LIMIT): such events take the Python loop.
FAR = (1 << 61) + 3


@dataclass
class Twin:
    """One operator over its own state: a RocksDB store behind the runtime's overlay
    (`partition`), behind an overlay that indexes every pending key (`overlay`), or a
    MemoryKV (a KV that is no Overlay: the loop calls its methods)."""

    kind: Kind
    root: Path
    window: JoinWindow
    join_type: JoinType
    ids: bool
    loop: Callable[[WindowedJoin, Any], list[Match]] | None  # None: draw one per batch
    store: PartitionStore | None = None
    state: KV = field(init=False)
    join: WindowedJoin = field(init=False)
    made: int = 0

    def __post_init__(self) -> None:
        self.state = MemoryKV()
        self.open()

    def open(self, fresh: bool = False) -> None:
        """The operator over the state (the same files, or new ones if `fresh`)."""
        if self.kind == "memory":
            if fresh:
                self.state = MemoryKV()
        else:
            if self.store is not None:
                self.store.close()
            self.made += fresh
            self.store = open_store(self.root / f"{self.kind}-{self.made}")
            unscanned = (keys.RECORD, keys.META) if self.kind == "partition" else ()
            self.state = Overlay(self.store, unscanned=unscanned)
        self.join = WindowedJoin(self.state, self.window, self.join_type, self.ids)

    def commit(self, checkpoint: int) -> list[tuple[bytes, bytes]]:
        changes = self.join.take_changes()
        if isinstance(self.state, Overlay):
            assert self.store is not None
            self.store.write(self.state.pending, checkpoint)
            self.state.clear()
        return changes

    def restore(self, changelog: list[tuple[bytes, bytes]]) -> None:
        """A new state from the changelog, as recovery.py does (written every few records)."""
        self.open(fresh=True)
        for applied, (key, value) in enumerate(changelog, 1):
            self.join.restore(key, value)
            if applied % 5 == 0:
                self.commit(applied)
        self.join.finish_restore()
        self.commit(len(changelog))

    def lose(self, record_key: bytes) -> None:
        """Delete a record from the state, not from the index (a bug the operator reports)."""
        if isinstance(self.state, Overlay):
            self.state.expire(record_key)
        else:
            self.state.delete(record_key)

    def observed(self) -> dict[str, Any]:
        join, index = self.join, self.join.index
        held: Any
        if isinstance(self.state, Overlay):
            assert self.store is not None
            held = (
                list(self.state.pending.items()),
                list(self.state._pending_keys),
                list(self.store.scan(b"", b"\xff")),
            )
        else:
            held = list(self.state.scan(b"", b"\xff"))
        return {
            "stream_time": join.stream_time,
            "counters": (join.late, join.duplicates),
            "dirty": set(join._dirty_meta),
            "changes": list(join._changes.items()),
            "by_prefix": {prefix: list(records) for prefix, records in index.by_prefix.items()},
            # The due times as a multiset, then as held (the same operations in the same order).
            "due": sorted([*index.due, *index.late_due]),
            "queue": (list(index.due), list(index.late_due)),
            "ids": None if index.ids is None else set(index.ids),
            "state": held,
        }

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Both sides, a few join keys (hot ones, partners), times that go back (late records,
    ties), duplicates (with ids: resent at another time too), in batches of 1 to all; between
    batches, maybe an operator made again over its state, a restore, or a lost record."""
    ids = draw(st.booleans())
    events: list[Event] = []
    for n in range(draw(st.integers(1, 70))):
        kind = draw(st.integers(0, 29))
        if events and kind < 4:  # a duplicate
            side, key, ts, record_id, value = draw(st.sampled_from(events))
            if ids and kind == 0:
                ts = n * 2 + draw(st.integers(-40, 10))
            events.append((side, key, ts, record_id, value))
            continue
        side: Side = draw(st.sampled_from(["left", "right"]))
        key = draw(st.sampled_from([b"a", b"b", b"ab", b"", b"\x00\xff"]))
        ts = n * 2 + draw(st.integers(-40, 10))
        value: Any = b"v%d" % n
        if kind == 4:  # not exactly bytes: this event takes the Python loop
            value = bytearray(value)
        elif kind == 5 and draw(st.integers(0, 3)) == 0:  # past the compiled loop's range
            ts = draw(st.sampled_from([FAR, -FAR]))
        events.append((side, key, ts, b"e%d" % n, value))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(events) - 1)), max_size=8)))
    batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True) if events[a:b]]
    steps: list[Step] = ["go on", "go on", "go on", "made again", "restored", "lose a record"]
    return {
        "join_type": draw(st.sampled_from(list(JoinType))),
        "window": JoinWindow(draw(st.integers(0, 30)), draw(st.integers(0, 30)), draw(st.integers(0, 20))),
        "ids": ids,
        "kind": draw(st.sampled_from(["partition", "overlay", "memory"])),
        "batches": batches,
        "steps": [draw(st.sampled_from(steps)) for _ in batches],
        "mixed": [draw(st.booleans()) for _ in batches],  # the third operator's loop per batch
        "lost": draw(st.integers(0, 1 << 16)),
    }


def run_batch(twin: Twin, batch: list[Event], compiled_loop: bool) -> tuple[list[Any], str | None]:
    """The matches with their types, or the error the batch ended with."""
    loop = twin.loop or (compiled if compiled_loop else python)
    try:
        got = loop(twin.join, batch)
    except RuntimeError as error:
        return [], str(error)
    return [(match, type(match), tuple(map(type, match))) for match in got], None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_compiled_loop_does_what_the_python_loop_does(case: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        twins = [
            Twin(case["kind"], Path(tmp) / name, case["window"], case["join_type"], case["ids"], loop)
            for name, loop in (("python", python), ("compiled", compiled), ("mixed", None))
        ]
        changelog: list[tuple[bytes, bytes]] = []
        try:
            for number, (batch, step, mixed) in enumerate(
                zip(case["batches"], case["steps"], case["mixed"], strict=True)
            ):
                if step == "lose a record":  # the same record from each state: maybe a partner
                    held = sorted(r for records in twins[0].join.index.by_prefix.values() for r in records)
                    if held:
                        for twin in twins:
                            twin.lose(held[case["lost"] % len(held)])
                reference, *others = [run_batch(twin, batch, mixed) for twin in twins]
                for got in others:
                    assert got == reference, batch
                seen = twins[0].observed()
                for twin in twins[1:]:
                    assert twin.observed() == seen, (twin.loop, batch)
                changes = [twin.commit(number) for twin in twins]
                assert changes[1] == changes[0] and changes[2] == changes[0]
                changelog += changes[0]
                seen = twins[0].observed()
                for twin in twins[1:]:
                    assert twin.observed() == seen
                if step == "made again":
                    for twin in twins:
                        twin.open()
                elif step == "restored":
                    for twin in twins:
                        twin.restore(changelog)
                    seen = twins[0].observed()
                    for twin in twins[1:]:
                        assert twin.observed() == seen
        finally:
            for twin in twins:
                twin.close()


# -- the cases the random streams make rarely, spelled out ------------------------------


@pytest.fixture
def twins() -> Iterator[Callable[..., list[Twin]]]:
    made: list[Twin] = []
    with tempfile.TemporaryDirectory() as tmp:

        def make(
            kind: Kind = "partition", join_type: JoinType = JoinType.LEFT, ids: bool = False
        ) -> list[Twin]:
            window = JoinWindow(before=5, after=10, grace=2)
            pair = [
                Twin(kind, Path(tmp) / f"{n}-{len(made)}", window, join_type, ids, loop)
                for n, loop in enumerate((python, compiled))
            ]
            made.extend(pair)
            return pair

        yield make
        for twin in made:
            twin.close()


@pytest.mark.parametrize("kind", ["partition", "memory"])
def test_a_lost_partner_fails_alike_after_the_partners_before_it(
    twins: Callable[..., list[Twin]], kind: Kind
) -> None:
    """The RuntimeError names the record, and what the batch did before it (an earlier
    partner flagged matched, the stream time) is the same in both."""
    pair = twins(kind, JoinType.OUTER)
    for twin in pair:
        twin.loop(twin.join, [("left", b"k", 100, b"1", b"a"), ("left", b"k", 101, b"2", b"b")])
        twin.commit(0)
        twin.lose(sorted(twin.join.index.by_prefix[keys.key_prefix("left", b"k")])[1])
    errors = []
    for twin in pair:
        with pytest.raises(RuntimeError, match="join state lost record") as raised:
            twin.loop(twin.join, [("right", b"k", 105, b"3", b"c")])
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert pair[0].observed() == pair[1].observed()
    assert pair[0].join._changes  # the first partner's flag, written before the error


def test_events_out_of_range_take_the_python_loop_alike(twins: Callable[..., list[Twin]]) -> None:
    """Values that are not bytes, times past the fast range and malformed events give what
    the Python loop gives, error included."""
    batches: list[list[Any]] = [
        [("left", b"k", 10, b"1", bytearray(b"x")), ("right", b"k", 12, b"2", b"y")],
        [("right", bytearray(b"k"), 13, b"3", b"z"), ("left", b"k", True, b"4", b"w")],
        [("left", b"k", FAR, b"5", b"far"), ("right", b"k", FAR + 1, b"6", b"farther")],
        [("right", b"k", FAR + 20, b"7", b"after")],
    ]
    pair = twins("partition", JoinType.OUTER, ids=True)
    for batch in batches:
        got = [twin.loop(twin.join, batch) for twin in pair]
        assert [[tuple(map(type, m)) for m in g] for g in got] == [[tuple(map(type, m)) for m in got[0]]] * 2
        assert got[0] == got[1]
        assert pair[0].observed() == pair[1].observed()
    odd: list[list[Any]] = [
        [("left", b"k", 1.5, b"8", b"v")],  # struct.error
        [("middle", b"k", FAR + 30, b"9", b"v")],  # a right record, then a KeyError on its partners
        [("left", b"k", 1)],  # ValueError
        [("left", b"k", -FAR, b"10", b"v")],  # late
    ]
    for batch in odd:
        outcomes = [outcome(twin, batch) for twin in pair]
        assert outcomes[0] == outcomes[1]
        assert pair[0].observed() == pair[1].observed()


def outcome(twin: Twin, batch: list[Any]) -> tuple[Any, ...]:
    assert twin.loop is not None
    try:
        return ("done", twin.loop(twin.join, batch))
    except Exception as error:
        return (type(error), str(error))


def test_process_many_selects_the_loop() -> None:
    """Compiled unless TANDEM_PURE_PYTHON=1 (read once, at import) or switched off; a subclass
    always runs the Python loop (the compiled one inlines the hooks it may override)."""
    assert not compiled_at_import("tables.operators.windowed.LOOP", "1")
    assert compiled_at_import("tables.operators.windowed.LOOP", "0")
    if operator_module.LOOP.built is None:
        pytest.skip("TANDEM_PURE_PYTHON=1 in this process")
    was = operator_module.LOOP.active
    calls: list[str] = []

    class Counting(WindowedJoin):
        def _expire(self, emit: bool) -> list[Match]:
            calls.append("expire")
            return super()._expire(emit)

    try:
        operator_module.LOOP.use(True)
        assert operator_module.LOOP.active
        Counting(MemoryKV(), JoinWindow(0, 1, 0), JoinType.LEFT).process_many(
            [("left", b"k", 1, b"1", b"v"), ("left", b"k", 10, b"2", b"v")]
        )
        assert calls == ["expire"]
        operator_module.LOOP.use(False)
        assert not operator_module.LOOP.active
    finally:
        operator_module.LOOP.use(was)
