"""Semantics of the windowed join (docs/join-semantics.md), table-driven and property-based."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.operators.keys import Side
from tables.operators.kv import MemoryKV, Overlay
from tables.operators.windowed import JoinType, JoinWindow, Match, WindowedJoin
from tables.state.store import PartitionStore

# Every test here with each loop of the operator (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("join_loop")

INNER, LEFT, RIGHT, OUTER = JoinType.INNER, JoinType.LEFT, JoinType.RIGHT, JoinType.OUTER
W = JoinWindow(before=0, after=100, grace=10)
Event = tuple[Side, bytes, int, bytes, bytes]  # side, key, ts, id, value


def imp(event_id: str, ts: int, key: str = "a") -> Event:
    """A left record whose value is its id (so a result names both sides)."""
    return "left", key.encode(), ts, event_id.encode(), event_id.encode()


def click(event_id: str, ts: int, key: str = "a") -> Event:
    return "right", key.encode(), ts, event_id.encode(), event_id.encode()


def ident(match: Match) -> str:
    return f"{(match.left or b'').decode()}|{(match.right or b'').decode()}"


@dataclass
class Case:
    name: str
    join_type: JoinType
    events: list[Event]
    # join_ids emitted by each event, in order
    emitted: list[list[str]]
    late: int = 0
    window: JoinWindow = W


CASES = [
    Case(
        "inner pair, click after impression",
        INNER,
        [imp("i1", 1000), click("k1", 1050)],
        [[], ["i1|k1"]],
    ),
    Case(
        "inner pair, click first (out of order)",
        INNER,
        [click("k1", 1050), imp("i1", 1000)],
        [[], ["i1|k1"]],
    ),
    Case(
        "after bound is inclusive",
        INNER,
        [imp("i1", 1000), click("k1", 1100), click("k2", 1101)],
        [[], ["i1|k1"], []],
    ),
    Case(
        "before bound: click before impression does not match when before=0",
        INNER,
        [imp("i1", 1000), click("k1", 999)],
        [[], []],
    ),
    Case(
        "before bound inclusive when before>0",
        INNER,
        [imp("i1", 1000), click("k1", 980), click("k2", 979)],
        [[], ["i1|k1"], []],
        window=JoinWindow(before=20, after=100, grace=10),
    ),
    Case(
        "different keys never match",
        INNER,
        [imp("i1", 1000, "a"), click("k1", 1001, "b")],
        [[], []],
    ),
    Case(
        "one click, two impressions: two results",
        INNER,
        [imp("i1", 1000), imp("i2", 1010), click("k1", 1050)],
        [[], [], ["i1|k1", "i2|k1"]],
    ),
    Case(
        "duplicate click makes no second result",
        INNER,
        [imp("i1", 1000), click("k1", 1050), click("k1", 1050)],
        [[], ["i1|k1"], []],
    ),
    Case("inner never emits unmatched", INNER, [imp("i1", 1000), click("k9", 5000, "z")], [[], []]),
    Case(
        "left: unmatched impression waits for ts+after+grace, strictly",
        LEFT,
        [imp("i1", 1000), click("k8", 1110, "z"), click("k9", 1111, "z")],
        [[], [], ["i1|"]],
    ),
    Case(
        "left: matched impression is never emitted unmatched",
        LEFT,
        [imp("i1", 1000), click("k1", 1001), click("k9", 9000, "z")],
        [[], ["i1|k1"], []],
    ),
    Case(
        "left: unmatched clicks are not emitted",
        LEFT,
        [click("k1", 1000), imp("i9", 9000, "z")],
        [[], []],
    ),
    Case(
        "outer: unmatched click emitted after ts+before+after+grace",
        OUTER,
        [click("k1", 1000), imp("i8", 1110, "z"), imp("i9", 1111, "z")],
        [[], [], ["|k1"]],
    ),
    Case(
        "outer: both sides unmatched, emitted in time order",
        OUTER,
        [imp("i1", 1000), click("k1", 990, "b"), imp("i9", 1200, "z")],
        [[], [], ["|k1", "i1|"]],
    ),
    Case(
        # An impression is accepted until its own ts+after+grace, so a click waits until
        # ts+before+after+grace: no "|k1" that the later pair would contradict.
        "outer: no spurious unmatched click when a later, non-late impression matches it",
        OUTER,
        [click("k1", 1000), imp("i8", 1011, "z"), imp("i1", 950)],
        [[], [], ["i1|k1"]],
    ),
    Case(
        "late impression dropped: ts+after+grace < stream time",
        INNER,
        [click("k0", 2000, "z"), imp("i1", 1889), imp("i2", 1890), click("k1", 1990)],
        [[], [], [], ["i2|k1"]],
        late=1,
    ),
    Case(
        "late click dropped: ts+before+grace < stream time",
        OUTER,
        [imp("i0", 2000, "z"), click("k1", 1989), click("k2", 1990)],
        [[], [], []],
        late=1,
    ),
    Case(
        "out of order within grace still matches",
        INNER,
        [imp("i0", 1200, "z"), imp("i1", 1100), click("k1", 1195)],
        [[], [], ["i1|k1"]],
    ),
]


def run(join: WindowedJoin, events: list[Event]) -> list[list[str]]:
    return [[ident(m) for m in join.process(*event)] for event in events]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_join_semantics(case: Case, window_join: Any) -> None:
    join = window_join(MemoryKV(), case.window, case.join_type)
    assert run(join, case.events) == case.emitted
    assert join.late == case.late


def test_matches_carry_key_values_and_the_later_timestamp(window_join: Any) -> None:
    join = window_join(MemoryKV(), W, OUTER)
    join.process(*imp("i1", 1000))
    assert join.process(*click("k1", 1040)) == [Match(b"a", b"i1", b"k1", 1040)]
    assert join.process(*click("k2", 1200, "b")) == []  # i1 is matched: nothing
    assert join.process(*imp("i8", 1310, "z")) == []  # not before 1200 + 0 + 100 + 10
    assert join.process(*imp("i9", 1311, "z")) == [Match(b"b", None, b"k2", 1200)]


def test_right_join_emits_unmatched_right_records_only(window_join: Any) -> None:
    join = window_join(MemoryKV(), W, RIGHT)
    join.process(*imp("i1", 1000))
    join.process(*click("k1", 1000, "b"))
    emitted = join.process(*imp("i9", 1300, "z"))
    assert emitted == [Match(b"b", None, b"k1", 1000)]


def test_keys_of_any_bytes_and_length(window_join: Any) -> None:
    """Keys are the Kafka key's bytes: binary, empty-prefixed, long (4-byte length)."""
    join = window_join(MemoryKV(), W, INNER)
    long_key = bytes(range(256)) * 300
    for key in (b"\x00\xff", long_key, b"a", b"ab"):
        join.process("left", key, 1000, b"i", b"L" + key[:2])
    found = join.process("right", long_key, 1001, b"k", b"R")
    assert found == [Match(long_key, b"L" + long_key[:2], b"R", 1001)]
    assert join.process("right", b"a", 1001, b"k", b"R") == [Match(b"a", b"La", b"R", 1001)]


def test_expired_state_is_deleted_by_time() -> None:
    state = MemoryKV()
    join = WindowedJoin(state, W, LEFT)
    for i in range(50):
        join.process(*imp(f"i{i}", 1000 + i, key=f"k{i}"))
    assert len(state) == 50 and len(join.index) == 50  # one entry each; the index in memory
    # retained until ts + before + after + grace = 1159 for the last one
    join.process(*click("far", 1160 + 50, key="z"))
    keys = [k for k, _ in state.scan(b"", b"\xff")]
    assert not any(k.startswith(b"rL") for k in keys)
    assert len(join.index) == 1 and list(join.index.by_prefix) == [b"rR\x00\x00\x00\x01z"]


# -- a reference model written straight from docs/join-semantics.md ----------------


def reference(
    join_type: JoinType, window: JoinWindow, events: list[Event], by_id: bool = False
) -> tuple[list[set[str]], int]:
    """O(n^2) simulation of the contract, no expiry: per event, the set of results emitted."""
    emits_unmatched = {INNER: set(), LEFT: {"left"}, RIGHT: {"right"}, OUTER: {"left", "right"}}[join_type]
    accepted: list[tuple[Side, dict[str, Any]]] = []
    # By accepted copy, not by event id: with ids, an event resent after its first copy
    # expired is accepted again as a new record, and emitted unmatched again.
    matched: set[int] = set()
    emitted_unmatched: set[int] = set()
    stream_time: int | None = None
    late = 0
    out: list[set[str]] = []
    for side, key, ts, event_id, _ in events:
        rec = {"auction_id": key, "ts": ts, "event_id": event_id.decode()}
        closes = rec["ts"] + (window.after if side == "left" else window.before) + window.grace
        retention = window.before + window.after + window.grace
        # A duplicate while its first copy is held (by id: the same event whatever its time);
        # checked before lateness, as the operator does.
        if any(
            s == side
            and r["event_id"] == rec["event_id"]
            and (r["ts"] == ts if not by_id else r["auction_id"] == key)
            and (stream_time is None or r["ts"] + retention >= stream_time)
            for s, r in accepted
        ):
            out.append(set())
            continue
        if stream_time is not None and closes < stream_time:
            late += 1
            out.append(set())
            continue
        step: set[str] = set()
        for other_side, other in accepted:
            if other_side == side or other["auction_id"] != rec["auction_id"]:
                continue
            left, right = (rec, other) if side == "left" else (other, rec)
            if left["ts"] - window.before <= right["ts"] <= left["ts"] + window.after:
                step.add(f"{left['event_id']}|{right['event_id']}")
                matched.update({id(rec), id(other)})
        accepted.append((side, rec))
        stream_time = rec["ts"] if stream_time is None else max(stream_time, rec["ts"])
        for s, r in accepted:
            ident = id(r)
            # No accepted partner can arrive once stream time passes this: emit then.
            emit_after = r["ts"] + window.before + window.after + window.grace
            if (
                s in emits_unmatched
                and ident not in matched
                and ident not in emitted_unmatched
                and emit_after < stream_time
            ):
                emitted_unmatched.add(ident)
                step.add(f"{r['event_id']}|" if s == "left" else f"|{r['event_id']}")
        out.append(step)
    return out, late


@st.composite
def streams(draw: st.DrawFn) -> tuple[JoinType, JoinWindow, list[tuple[Side, dict[str, Any]]]]:
    join_type = draw(st.sampled_from(list(JoinType)))
    window = JoinWindow(draw(st.integers(0, 30)), draw(st.integers(0, 30)), draw(st.integers(0, 20)))
    events: list[Event] = []
    for n in range(draw(st.integers(1, 40))):
        if events and draw(st.integers(0, 9)) == 0:  # a record delivered twice
            events.append(draw(st.sampled_from(events)))
            continue
        side: Side = draw(st.sampled_from(["left", "right"]))
        key, ts = draw(st.sampled_from("ab")), draw(st.integers(0, 120))
        events.append(imp(f"e{n}", ts, key) if side == "left" else click(f"e{n}", ts, key))
    return join_type, window, events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams())
def test_join_matches_reference_model(window_join: Any, case: tuple[JoinType, JoinWindow, list[Any]]) -> None:
    join_type, window, events = case
    join = window_join(MemoryKV(), window, join_type)
    _check_against_reference(join, join_type, window, events)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(), st.data())
def test_ids_make_a_record_with_a_known_id_a_duplicate_whatever_its_time(
    window_join: Any, case: tuple[JoinType, JoinWindow, list[Any]], data: st.DataObject
) -> None:
    """With the join's `id` option a redelivered event may carry another timestamp (a
    producer resent it): it is still one event. The reference model keys duplicates by id."""
    join_type, window, events = case
    resent = [
        (s, k, data.draw(st.integers(0, 120)), i, v) for s, k, _, i, v in events if data.draw(st.booleans())
    ]
    events = events + resent
    join = window_join(MemoryKV(), window, join_type, ids=True)
    _check_against_reference(join, join_type, window, events, by_id=True)


def _check_against_reference(
    join: WindowedJoin, join_type: JoinType, window: JoinWindow, events: list[Any], by_id: bool = False
) -> None:
    got = [set(ids) for ids in run(join, events)]
    expected, late = reference(join_type, window, events, by_id)
    assert got == expected
    assert join.late == late
    if by_id:
        return  # an event resent with a later time after its first copy expired is new again
    # No spurious result: a record emitted unmatched never appears in a pair.
    pairs = [ident.split("|") for ident in set().union(*got)]
    for side in (0, 1):
        lonely = {p[side] for p in pairs if p[side] and not p[1 - side]}
        assert not lonely & {p[side] for p in pairs if p[0] and p[1]}


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(streams(), st.integers(1, 7))
def test_rocksdb_state_behaves_like_memory(
    window_join: Any, case: tuple[JoinType, JoinWindow, list[Any]], commit_every: int
) -> None:
    """The operator over RocksDB plus a write overlay, committed every few records, and
    reopened from its files half way, gives the same output as over a plain map."""
    join_type, window, events = case
    expected = run(WindowedJoin(MemoryKV(), window, join_type), events)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t" / "0"
        got: list[list[str]] = []
        for part in (events[: len(events) // 2], events[len(events) // 2 :]):
            store = PartitionStore(path)
            overlay = Overlay(store)
            join = window_join(overlay, window, join_type)
            for n, event in enumerate(part, 1):
                got.append([ident(m) for m in join.process(*event)])
                if n % commit_every == 0:
                    join.take_changes()  # as a commit does: the stream time goes into the state
                    store.write(overlay.pending, n)
                    overlay.clear()
            join.take_changes()
            store.write(overlay.pending, len(part))
            store.close()
    assert got == expected


def test_window_rejects_negative_bounds() -> None:
    with pytest.raises(ValueError):
        JoinWindow(before=-1)


# -- state layout -----------------------------------------------------------------


@pytest.mark.parametrize("ids", [False, True])
def test_a_record_has_one_state_entry(ids: bool) -> None:
    """The record with its value; its index entries live in memory, with ids too."""
    state = MemoryKV()
    WindowedJoin(state, W, LEFT, ids=ids).process(*imp("i1", 1000))
    prefixes = sorted(k[:1] for k, _ in state.scan(b"", b"\xff") if not k.startswith(b"m:"))
    assert prefixes == [b"r"]


def test_interleaved_scans_of_one_store_and_overlay() -> None:
    """Overlay scans walk the pending keys in place: interleaving scans,
    and writing between their steps, still gives each its own range."""
    with tempfile.TemporaryDirectory() as tmp:
        store = PartitionStore(Path(tmp) / "t" / "0")
        store.write({b"a%d" % i: b"A" for i in range(5)} | {b"b%d" % i: b"B" for i in range(5)}, 1)
        overlay = Overlay(store)
        overlay.put(b"a2x", b"new")
        overlay.delete(b"a3")
        first, second = overlay.scan(b"a", b"b"), overlay.scan(b"b", b"c")
        got_a, got_b = [next(first)], [next(second)]
        overlay.put(b"a9", b"late")  # sorts after what `first` yielded: seen
        overlay.put(b"a0x", b"early")  # sorts before: not seen by `first`
        got_a += list(first)
        got_b += list(second)
        assert [k for k, _ in got_a] == [b"a0", b"a1", b"a2", b"a2x", b"a4", b"a9"]
        assert [k for k, _ in got_b] == [b"b%d" % i for i in range(5)]
        plain = [store.scan(b"a", b"b"), store.scan(b"b", b"c")]
        rows = [[], []]
        for _ in range(5):
            for n in (0, 1):
                rows[n].append(next(plain[n])[0])
        assert rows == [[b"a%d" % i for i in range(5)], [b"b%d" % i for i in range(5)]]
        store.write({b"a5": b"A"}, 2)  # the next scan sees a write
        assert [k for k, _ in store.scan(b"a", b"b")][-1] == b"a5"
        store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(), st.booleans(), st.sets(st.integers(0, 60), max_size=8))
def test_an_operator_made_again_over_its_state_carries_on(
    window_join: Any, case: tuple[JoinType, JoinWindow, list[Any]], ids: bool, cuts: set[int]
) -> None:
    """A new operator over the state (a restart, a reset) indexes the stored records again
    (tables/operators/window_index.py): made again before any record, it gives the output of one that never
    stopped, with or without ids."""
    join_type, window, events = case
    state = MemoryKV()
    join = window_join(state, window, join_type, ids=ids)
    whole = WindowedJoin(MemoryKV(), window, join_type, ids=ids)
    for n, event in enumerate(events):
        if n in cuts:
            join.take_changes()  # as a commit does: the stream time goes into the state
            join = window_join(state, window, join_type, ids=ids)
        assert join.process(*event) == whole.process(*event)
    assert (join.late, join.duplicates) == (whole.late, whole.duplicates)
    assert join.live_records == whole.live_records
    if window_join.mode != "memory":
        return
    due = [sorted([*j.index.due, *j.index.late_due]) for j in (join, whole)]
    assert due[0] == due[1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3), unique=True, max_size=60), st.binary(max_size=3))
def test_sorted_keys_in_small_chunks(keys_: list[bytes], probe: bytes) -> None:
    from bisect import bisect_left, bisect_right

    from tables.operators.kv import SortedKeys

    saved, SortedKeys.CHUNK = SortedKeys.CHUNK, 2
    try:
        sk = SortedKeys()
        for key in keys_:
            sk.add(key)
    finally:
        SortedKeys.CHUNK = saved
    flat = sorted(keys_)
    assert list(sk) == flat and len(sk) == len(flat)
    for after, bisect in ((False, bisect_left), (True, bisect_right)):
        n = bisect(flat, probe)
        assert sk.at(*sk.position(probe, after)) == (flat[n] if n < len(flat) else None)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(), st.integers(1, 7))
def test_overlay_in_small_chunks_behaves_like_memory(
    window_join: Any, case: tuple[JoinType, JoinWindow, list[Any]], commit_every: int
) -> None:
    """The overlay's pending keys split into many chunks; committed every few records."""
    from tables.operators.kv import SortedKeys

    join_type, window, events = case
    expected = run(WindowedJoin(MemoryKV(), window, join_type), events)
    base = MemoryKV()
    saved, SortedKeys.CHUNK = SortedKeys.CHUNK, 2
    try:
        overlay = Overlay(base)
        join = window_join(overlay, window, join_type)
        got = []
        for n, event in enumerate(events, 1):
            got.append([ident(m) for m in join.process(*event)])
            if n % commit_every == 0:
                for key, value in overlay.pending.items():
                    base.put(key, value) if value is not None else base.delete(key)
                overlay.clear()
    finally:
        SortedKeys.CHUNK = saved
    assert got == expected


def test_counters_follow_restore(window_join: Any) -> None:
    from tables.operators import keys

    join = window_join(MemoryKV(), W, LEFT)
    join.process(*imp("i1", 1000))
    join.process(*imp("i1", 1000))  # a duplicate
    changes = dict(join.take_changes())
    assert keys.decode_int(changes[keys.meta_key("duplicates")]) == 1
    replica = window_join(MemoryKV(), W, LEFT)
    for key, value in changes.items():
        replica.restore(key, value)
    assert replica.duplicates == 1
    assert replica.process(*imp("i1", 1000)) == [] and replica.duplicates == 2
