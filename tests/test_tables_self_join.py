"""Self-joins (`join(app, t, t, ...)`, issue 39 item 3): the operator against a reference
model written from docs/join-semantics.md ("Self-joins"), with hypothesis; a few cases by
hand; the declaration's rules; the test driver."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import faust
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables import JoinInput, JoinResults, TandemAssignor, join, join_table
from tables.operators.base import Match, Side
from tables.operators.kv import MemoryKV
from tables.operators.self_join import SelfJoin, SelfJoinKind
from tables.operators.windowed import JoinType, JoinWindow
from tables.spec import JoinDeclarationError
from tables.testing import JoinTestDriver

pytestmark = pytest.mark.usefixtures("join_loop")  # the compiled loop and the pure-Python one
INNER, LEFT = JoinType.INNER, JoinType.LEFT
Record = tuple[bytes, int, bytes]  # key, ts, id (the value is the id: a result names both)
counter = itertools.count()


def operator(how: JoinType, window: JoinWindow, ids: bool = False, index: str = "memory") -> SelfJoin:
    return SelfJoinKind(window, how, index=index).operator(MemoryKV(), ids)


def ident(match: Match) -> str:
    return f"{(match.left or b'').decode()}|{(match.right or b'').decode()}"


def run(join: SelfJoin, records: list[Record]) -> list[set[str]]:
    return [{ident(m) for m in join.process_many([("left", k, ts, i, i)])} for k, ts, i in records]


# -- a reference model written from docs/join-semantics.md, "Self-joins" ----------------


@dataclass(eq=False)
class Role:
    """One accepted record in one of its two roles."""

    side: Side
    key: bytes
    ts: int
    id: str
    record: object  # the arrival it came with: a record is never its own partner
    matched: bool = False
    emitted: bool = False


@dataclass
class Counts:
    late: int = 0
    duplicates: int = 0
    out: list[set[str]] = field(default_factory=list)


def reference(how: JoinType, window: JoinWindow, records: list[Record], by_id: bool = False) -> Counts:
    """O(n^2), no expiry but by the rules: per record, the set of results it brings out."""
    roles: list[Role] = []
    stream_time: int | None = None
    widest = max(window.before, window.after)
    retention = 2 * widest + window.grace  # a record is held this long after its time
    counts = Counts()
    for key, ts, raw_id in records:
        record_id, arrival, step, reasons = raw_id.decode(), object(), set(), set()
        for side in ("left", "right"):
            # A duplicate while its first copy is held (with ids: whatever its time).
            if any(
                r.side == side and r.key == key and r.id == record_id and (by_id or r.ts == ts)
                and (stream_time is None or r.ts + retention >= stream_time)
                for r in roles
            ):  # fmt: skip
                reasons.add("duplicates")
                continue
            closes = ts + widest + window.grace  # both roles alike
            if stream_time is not None and closes < stream_time:
                reasons.add("late")
                continue
            role = Role(side, key, ts, record_id, arrival)
            for other in roles:
                if other.side == side or other.key != key or other.record is arrival:
                    continue
                left, right = (role, other) if side == "left" else (other, role)
                if left.ts - window.before <= right.ts <= left.ts + window.after:
                    step.add(f"{left.id}|{right.id}")
                    left.matched = right.matched = True
            roles.append(role)
            stream_time = ts if stream_time is None else max(stream_time, ts)
            for r in roles:  # a left record no partner can meet any more: (record, None)
                due = r.ts + retention < stream_time
                if how is LEFT and r.side == "left" and due and not r.matched and not r.emitted:
                    r.emitted = True
                    step.add(f"{r.id}|")
        counts.late += "late" in reasons
        counts.duplicates += "duplicates" in reasons
        counts.out.append(step)
    return counts


@st.composite
def self_streams(draw: st.DrawFn) -> tuple[JoinType, JoinWindow, list[Record]]:
    how = draw(st.sampled_from([INNER, LEFT]))
    window = JoinWindow(draw(st.integers(0, 30)), draw(st.integers(0, 30)), draw(st.integers(0, 20)))
    records: list[Record] = []
    for n in range(draw(st.integers(1, 40))):
        if records and draw(st.integers(0, 9)) == 0:  # a record delivered twice
            records.append(draw(st.sampled_from(records)))
            continue
        records.append((draw(st.sampled_from([b"a", b"b"])), draw(st.integers(0, 120)), f"e{n}".encode()))
    return how, window, records


def _check(join: SelfJoin, how: JoinType, window: JoinWindow, records: list[Record], by_id: bool) -> None:
    got = run(join, records)
    expected = reference(how, window, records, by_id)
    assert got == expected.out
    assert dict(join.counters()) == {"late": expected.late, "duplicates": expected.duplicates}
    for pair in set().union(*got):  # never a record with itself
        left, right = pair.split("|")
        assert left != right


@settings(max_examples=120, deadline=None)
@given(self_streams(), st.sampled_from(["memory", "rocksdb"]))
def test_the_self_join_matches_the_reference_model(
    case: tuple[JoinType, JoinWindow, list[Record]], index: str
) -> None:
    how, window, records = case
    _check(operator(how, window, index=index), how, window, records, by_id=False)


@settings(max_examples=100, deadline=None)
@given(self_streams(), st.data())
def test_with_ids_a_record_resent_at_another_time_is_a_duplicate(
    case: tuple[JoinType, JoinWindow, list[Record]], data: st.DataObject
) -> None:
    how, window, records = case
    resent = [(k, data.draw(st.integers(0, 120)), i) for k, _, i in records if data.draw(st.booleans())]
    _check(operator(how, window, ids=True), how, window, records + resent, by_id=True)


@settings(max_examples=60, deadline=None)
@given(self_streams(), st.sets(st.integers(0, 40), max_size=6))
def test_an_operator_made_again_over_its_state_carries_on(
    case: tuple[JoinType, JoinWindow, list[Record]], cuts: set[int]
) -> None:
    """A restart (a new operator over the same state, after a commit) changes nothing."""
    how, window, records = case
    state = MemoryKV()
    kind = SelfJoinKind(window, how)
    join, whole = kind.operator(state, False), kind.operator(MemoryKV(), False)
    for n, (k, ts, i) in enumerate(records):
        if n in cuts:
            join.take_changes()
            join = kind.operator(state, False)
        event = [("left", k, ts, i, i)]
        assert join.process_many(event) == whole.process_many(event)  # type: ignore[arg-type]
    assert join.counters() == whole.counters()


# -- by hand ------------------------------------------------------------------------------

W = JoinWindow(before=10, after=10, grace=0)


def test_a_pair_within_the_window_comes_in_both_orders_and_never_a_record_with_itself() -> None:
    join = operator(INNER, W)
    assert run(join, [(b"u", 100, b"a"), (b"u", 105, b"b"), (b"v", 105, b"c")]) == [
        set(),
        {"a|b", "b|a"},
        set(),
    ]


def test_a_window_that_looks_back_pairs_each_record_with_the_earlier_ones_only() -> None:
    """A retry joined with its original attempt: before=30, after=0."""
    join = operator(INNER, JoinWindow(before=30, after=0, grace=0))
    assert run(join, [(b"u", 100, b"first"), (b"u", 120, b"retry")]) == [set(), {"retry|first"}]


def test_a_left_self_join_emits_a_record_alone_in_its_window_once_it_closes() -> None:
    join = operator(LEFT, W)
    got = run(join, [(b"u", 100, b"a"), (b"u", 105, b"b"), (b"u", 200, b"c"), (b"u", 300, b"d")])
    assert got == [set(), {"a|b", "b|a"}, set(), {"c|"}]
    assert {ident(m) for m in join.advance(1_000)} == {"d|"}


def test_a_record_read_twice_is_one_duplicate_and_joins_nothing() -> None:
    join = operator(INNER, W)
    assert run(join, [(b"u", 100, b"a"), (b"u", 105, b"b"), (b"u", 105, b"b")])[2] == set()
    assert join.counters() == {"late": 0, "duplicates": 1}


# -- the declaration and the test driver ---------------------------------------------------


def _app() -> tuple[faust.App, Any]:
    app = faust.App(
        f"self-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False, store="memory://"
    )
    return app, app.topic("clicks", key_type=str, value_type=str, partitions=2)


def test_a_self_join_is_inner_or_left_windowed_and_reads_its_topic_one_way() -> None:
    app, clicks = _app()
    for how in ("right", "outer"):
        with pytest.raises(JoinDeclarationError, match="a self-join is 'inner' or 'left'"):
            join(app, clicks, clicks, within=10, how=how)
    with pytest.raises(JoinDeclarationError, match="is a windowed join"):
        join_table(app, clicks, clicks)(_handler)
    with pytest.raises(JoinDeclarationError, match="give its timestamp once"):
        join(app, JoinInput(clicks, timestamp=lambda v: 1), clicks, within=10)(_handler)


async def _handler(results: JoinResults[str, str, str]) -> None:
    async for _ in results:
        pass


async def test_the_test_driver_runs_a_self_join() -> None:
    app, clicks = _app()
    out = app.topic("sessions", key_type=str, value_type=str, partitions=2)

    @join(app, clicks, clicks, within=60, how="left")
    async def sessions(results: JoinResults[str, str, str]) -> None:
        async for user, first, second, _ts in results:
            await out.send(key=user, value=f"{first}+{second}")

    async with JoinTestDriver(sessions) as driver:
        await driver.send(clicks, key="ann", value="home", timestamp=1_000)
        await driver.send(clicks, key="ann", value="cart", timestamp=20_000)
        await driver.send(clicks, key="bob", value="home", timestamp=30_000)
        await driver.advance(stream_time=1_000_000)
        assert sorted((s.key, s.value) for s in driver.sent(out)) == [
            ("ann", "cart+home"), ("ann", "home+cart"), ("bob", "home+None"),
        ]  # fmt: skip
