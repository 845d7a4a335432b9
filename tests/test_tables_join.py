"""Semantics of the windowed join (docs/join-semantics.md), table-driven and property-based."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.join import JoinType, JoinWindow, WindowedJoin, output_record
from tables.kv import MemoryKV, Overlay
from tables.records import Side
from tables.store import PartitionStore

INNER, LEFT, OUTER = JoinType.INNER, JoinType.LEFT, JoinType.OUTER
W = JoinWindow(before=0, after=100, grace=10)


def imp(event_id: str, ts: int, key: str = "a") -> tuple[Side, dict[str, Any]]:
    return "left", {
        "event_id": event_id,
        "auction_id": key,
        "campaign_id": f"c-{event_id}",
        "ts": ts,
    }


def click(event_id: str, ts: int, key: str = "a") -> tuple[Side, dict[str, Any]]:
    return "right", {"event_id": event_id, "auction_id": key, "ts": ts}


@dataclass
class Case:
    name: str
    join_type: JoinType
    events: list[tuple[Side, dict[str, Any]]]
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


def run(join: WindowedJoin, events: list[tuple[Side, dict[str, Any]]]) -> list[list[str]]:
    return [[out["join_id"] for out in join.process(side, record)] for side, record in events]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_join_semantics(case: Case) -> None:
    join = WindowedJoin(MemoryKV(), case.window, case.join_type)
    assert run(join, case.events) == case.emitted
    assert join.late == case.late


def test_output_record_fields_and_later_timestamp() -> None:
    join = WindowedJoin(MemoryKV(), W, OUTER)
    join.process(*imp("i1", 1000))
    (result,) = join.process(*click("k1", 1040))
    assert result == {
        "join_id": "i1|k1",
        "auction_id": "a",
        "campaign_id": "c-i1",
        "impression_id": "i1",
        "click_id": "k1",
        "impression_ts": 1000,
        "click_ts": 1040,
        "ts": 1040,
        "kind": "inner",
    }
    (right,) = join.process(*click("k2", 1200, "b"))[1:] or [None]  # i1 is matched: nothing
    assert right is None
    assert join.process(*imp("i8", 1310, "z")) == []  # not before 1200 + 0 + 100 + 10
    emitted = join.process(*imp("i9", 1311, "z"))
    assert emitted == [output_record("b", None, ("k2", 1200))]
    assert emitted[0]["kind"] == "right" and emitted[0]["campaign_id"] is None


def test_expired_state_is_deleted_by_time() -> None:
    state = MemoryKV()
    join = WindowedJoin(state, W, LEFT)
    for i in range(50):
        join.process(*imp(f"i{i}", 1000 + i, key=f"k{i}"))
    assert len(state) > 100
    # retained until ts + before + after + grace = 1159 for the last one
    join.process(*click("far", 1160 + 50, key="z"))
    keys = [k for k, _ in state.scan(b"", b"\xff")]
    assert not any(k.startswith(b"rL") for k in keys)
    assert not any(k.startswith((b"e", b"u")) and b"far" not in k for k in keys)


# -- a reference model written straight from docs/join-semantics.md ----------------


def reference(
    join_type: JoinType, window: JoinWindow, events: list[tuple[Side, dict[str, Any]]]
) -> tuple[list[set[str]], int]:
    """O(n^2) simulation of the contract, no expiry: per event, the set of join_ids emitted."""
    emits_unmatched = {INNER: set(), LEFT: {"left"}, OUTER: {"left", "right"}}[join_type]
    accepted: list[tuple[Side, dict[str, Any]]] = []
    matched: set[str] = set()
    emitted_unmatched: set[str] = set()
    stream_time: int | None = None
    late = 0
    out: list[set[str]] = []
    for side, rec in events:
        closes = rec["ts"] + (window.after if side == "left" else window.before) + window.grace
        if stream_time is not None and closes < stream_time:
            late += 1
            out.append(set())
            continue
        if any(s == side and r["event_id"] == rec["event_id"] for s, r in accepted):
            out.append(set())
            continue
        step: set[str] = set()
        for other_side, other in accepted:
            if other_side == side or other["auction_id"] != rec["auction_id"]:
                continue
            left, right = (rec, other) if side == "left" else (other, rec)
            if left["ts"] - window.before <= right["ts"] <= left["ts"] + window.after:
                step.add(f"{left['event_id']}|{right['event_id']}")
                matched.update({(side, rec["event_id"]), (other_side, other["event_id"])})
        accepted.append((side, rec))
        stream_time = rec["ts"] if stream_time is None else max(stream_time, rec["ts"])
        for s, r in accepted:
            ident = (s, r["event_id"])
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
    events: list[tuple[Side, dict[str, Any]]] = []
    for n in range(draw(st.integers(1, 40))):
        if events and draw(st.integers(0, 9)) == 0:  # a record delivered twice
            events.append(draw(st.sampled_from(events)))
            continue
        side: Side = draw(st.sampled_from(["left", "right"]))
        key, ts = draw(st.sampled_from("ab")), draw(st.integers(0, 120))
        events.append(imp(f"e{n}", ts, key) if side == "left" else click(f"e{n}", ts, key))
    return join_type, window, events


@settings(max_examples=200, deadline=None)
@given(streams())
def test_join_matches_reference_model(case: tuple[JoinType, JoinWindow, list[Any]]) -> None:
    join_type, window, events = case
    join = WindowedJoin(MemoryKV(), window, join_type)
    got = [set(ids) for ids in run(join, events)]
    expected, late = reference(join_type, window, events)
    assert got == expected
    assert join.late == late
    # No spurious result: a record emitted unmatched never appears in a pair.
    pairs = [ident.split("|") for ident in set().union(*got)]
    for side in (0, 1):
        lonely = {p[side] for p in pairs if p[side] and not p[1 - side]}
        assert not lonely & {p[side] for p in pairs if p[0] and p[1]}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.integers(1, 7))
def test_rocksdb_state_behaves_like_memory(
    case: tuple[JoinType, JoinWindow, list[Any]], commit_every: int
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
            join = WindowedJoin(overlay, window, join_type)
            for n, (side, record) in enumerate(part, 1):
                got.append([out["join_id"] for out in join.process(side, record)])
                if n % commit_every == 0:
                    store.write(overlay.pending, n)
                    overlay.clear()
            store.write(overlay.pending, len(part))
            store.close()
    assert got == expected


def test_window_rejects_negative_bounds() -> None:
    with pytest.raises(ValueError):
        JoinWindow(before=-1)


# -- the merged time index, and databases written before it -------------------------


def _legacy_unmatched(state: MemoryKV, window: JoinWindow, at: int) -> None:
    """Add the `u` entries an older version wrote for every left record, due at `at(ts)`."""
    from tables import keys

    for key, _ in list(state.scan(b"rL", b"rM")):
        ts = keys.parse_record_key(key).ts
        state.put(keys.index_key(keys.UNMATCHED, at(ts), key), b"")


@pytest.mark.parametrize("legacy_due", ["retained_until", "closes_at", None])
def test_unmatched_emitted_once_with_or_without_legacy_index(legacy_due: str | None) -> None:
    state = MemoryKV()
    join = WindowedJoin(state, W, LEFT)
    join.process(*imp("i1", 1000))
    join.process(*imp("i2", 1001, key="b"))
    join.process(*click("k2", 1002, key="b"))  # i2 matched
    if legacy_due == "retained_until":
        _legacy_unmatched(state, W, W.retained_until)
    elif legacy_due == "closes_at":
        _legacy_unmatched(state, W, lambda ts: W.closes_at("left", ts))
    join = WindowedJoin(state, W, LEFT)  # reopened: the legacy index is found by its scan
    emitted = [r["join_id"] for t in range(1100, 1300, 7) for r in join.process(*click(f"z{t}", t, "z"))]
    assert emitted.count("i1|") == 1 and "i2|" not in emitted
    assert not [k for k, _ in state.scan(b"u", b"v")]  # legacy entries consumed
    assert not [k for k, _ in state.scan(b"rL", b"rM")]  # and the records expired


def test_left_record_has_three_state_entries() -> None:
    state = MemoryKV()
    WindowedJoin(state, W, LEFT).process(*imp("i1", 1000))
    prefixes = sorted(k[:1] for k, _ in state.scan(b"", b"\xff") if not k.startswith(b"m:"))
    assert prefixes == [b"e", b"r", b"x"]


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


# -- validation: the fast path agrees with the full checks ---------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "a", "b", "é"]),
    st.lists(st.integers(0, 9), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["left", "right"]),
    st.fixed_dictionaries(
        {},
        optional={f: _values for f in ("event_id", "auction_id", "campaign_id", "ts", "extra")},
    ),
    st.sampled_from([b"a", b"b", b"\xc3\xa9", b"\xff"]),
    st.sampled_from([None, 0, 10**13]),
)
def test_validate_fast_path_agrees_with_full_checks(
    side: Side, record: dict[str, Any], key: bytes, now: int | None
) -> None:
    import orjson

    from tables.records import _checked, validate

    assert validate(side, key, orjson.dumps(record), now) == _checked(side, key, record, now)


@pytest.mark.parametrize("ts", [-1, 2**63 - 1, 2**63 + 5, 2**64 - 1, 253_402_300_800_000])
def test_timestamps_outside_the_epoch_to_year_9999_are_rejected_even_in_a_backfill(ts: int) -> None:
    """Without the wall-clock check (now_ms None) a huge timestamp used to pass and then
    overflow the state's 64-bit time keys, crashing the join instead of dead-lettering."""
    import orjson

    from tables.records import Rejected, validate

    value = orjson.dumps({"event_id": "e", "auction_id": "a", "ts": ts})
    assert validate("right", b"a", value, None) == Rejected(
        "timestamp out of range (0 to year 9999 in ms since the epoch)"
    )
    last = {"event_id": "e", "auction_id": "a", "ts": 253_402_300_799_999}
    assert validate("right", b"a", orjson.dumps(last), None) == last


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from([1, 2, 3]))
def test_short_expiry_read_ahead_matches_reference_model(
    case: tuple[JoinType, JoinWindow, list[Any]], read_ahead: int
) -> None:
    """The expiry read-ahead, refilled and trimmed every few entries, changes nothing."""
    import tables.join

    join_type, window, events = case
    saved, tables.join.READ_AHEAD = tables.join.READ_AHEAD, read_ahead
    try:
        got = [set(ids) for ids in run(WindowedJoin(MemoryKV(), window, join_type), events)]
    finally:
        tables.join.READ_AHEAD = saved
    assert got == reference(join_type, window, events)[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3), unique=True, max_size=60), st.binary(max_size=3))
def test_sorted_keys_in_small_chunks(keys_: list[bytes], probe: bytes) -> None:
    from bisect import bisect_left, bisect_right

    from tables.kv import SortedKeys

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


@settings(max_examples=100, deadline=None)
@given(streams(), st.integers(1, 7))
def test_overlay_in_small_chunks_behaves_like_memory(
    case: tuple[JoinType, JoinWindow, list[Any]], commit_every: int
) -> None:
    """The overlay's pending keys split into many chunks; committed every few records."""
    from tables.kv import SortedKeys

    join_type, window, events = case
    expected = run(WindowedJoin(MemoryKV(), window, join_type), events)
    base = MemoryKV()
    saved, SortedKeys.CHUNK = SortedKeys.CHUNK, 2
    try:
        overlay = Overlay(base)
        join = WindowedJoin(overlay, window, join_type)
        got = []
        for n, (side, record) in enumerate(events, 1):
            got.append([out["join_id"] for out in join.process(side, record)])
            if n % commit_every == 0:
                for key, value in overlay.pending.items():
                    base.put(key, value) if value is not None else base.delete(key)
                overlay.clear()
    finally:
        SortedKeys.CHUNK = saved
    assert got == expected


def test_counters_kept_in_memory_follow_restore() -> None:
    from tables import keys

    state = MemoryKV()
    join = WindowedJoin(state, W, LEFT)
    assert [join.add_counter("a"), join.add_counter("a", 2)] == [1, 3]
    join.restore(keys.meta_key("count:a"), keys.encode_int(10))  # a changelog record
    assert join.add_counter("a") == 11
    assert WindowedJoin(state, W, LEFT).add_counter("a") == 12  # reopened: read from state
    assert WindowedJoin(state, W, LEFT).counters() == {"a": 12}
