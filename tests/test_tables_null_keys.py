"""Null-keyed records (docs/join-semantics.md, "Keys, values and nulls"): in a join whose `how`
emits a side's lone records, that side's null-keyed record is a result with no partner, at
once (Kafka Streams 3.7+, KIP-962); anywhere else it is dead-lettered (`null_key`). Through the
test driver: the real codecs, runtime task, operator over RocksDB files and handler."""

from __future__ import annotations

import itertools
from typing import Any

import faust
import orjson
import pytest

from tables import JoinResults, TandemAssignor, join, join_table
from tables.operators.base import Match, fingerprint, join_events, null_key_sides
from tables.records.codecs import DROPPED, Rejected
from tables.testing import JoinTestDriver

pytestmark = pytest.mark.usefixtures("join_loop")  # the compiled loop and the pure-Python one
counter = itertools.count()


def _app() -> faust.App:
    return faust.App(f"nullkeys-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)


def enrichment(how: str, grace: float = 30) -> tuple[Any, dict[str, Any]]:
    """Orders (JSON) enriched with customers (JSON), keyed by customer id (str); `audit` on."""
    app = _app()
    orders = app.topic("orders", key_type=str, value_serializer="json", partitions=2)
    customers = app.topic("customers", key_type=str, value_serializer="json", partitions=2)

    @join_table(app, orders, customers, how=how, grace=grace, timestamp="ts", audit=True)
    async def enrich(results: JoinResults[str, dict[str, Any], dict[str, Any]]) -> None:
        async for _ in results:
            pass

    return enrich, {"orders": orders, "customers": customers}


def windowed(how: str) -> tuple[Any, dict[str, Any]]:
    app = _app()
    clicks = app.topic("clicks", key_type=str, value_serializer="json", partitions=2)
    views = app.topic("views", key_type=str, value_serializer="json", partitions=2)

    @join(app, clicks, views, within=10, grace=1, how=how, timestamp="ts")
    async def paired(results: JoinResults[str, dict[str, Any], dict[str, Any]]) -> None:
        async for _ in results:
            pass

    return paired, {"left": clicks, "right": views}


def lone(d: JoinTestDriver) -> list[tuple[Any, Any, Any, int]]:
    return [(r.key, r.left, r.right, r.timestamp) for r in d.results() if r.key is None]


async def test_a_null_keyed_stream_record_of_a_left_enrichment_is_a_result_at_once() -> None:
    enrich, t = enrichment("left")
    async with JoinTestDriver(enrich) as d:
        await d.send(t["customers"], key="c1", value={"name": "ann", "ts": 1_000}, timestamp=1_000)
        await d.send(t["orders"], key="c1", value={"order": 1, "ts": 2_000}, timestamp=2_000)
        await d.send(t["orders"], key=None, value={"order": 2, "ts": 3_000}, timestamp=3_000)
        # At once, within its grace (no version could ever answer it), with no table value.
        assert lone(d) == [(None, {"order": 2, "ts": 3_000}, None, 3_000)]
        assert d.dead_letters() == []
        # It does not move stream time: order 1 (pending until S passes 2 s + 30 s) still waits.
        await d.send(t["orders"], key=None, value={"order": 3, "ts": 99_000}, timestamp=99_000)
        assert [r.left["order"] for r in d.results()] == [2, 3]
        await d.close_inputs()
        assert [(r.key, r.left["order"], r.right) for r in d.results()][2:] == [
            ("c1", 1, {"name": "ann", "ts": 1_000})
        ]
        counts = d.counters()
        assert counts["results"] == 3 and counts["unmatched"] == 2 and counts["dead_letters"] == {}
        # The audit has them, fingerprinted with the null key marked.
        audit = [orjson.loads(s.value)["fingerprint"] for s in d.sent(enrich.audit_topic)]
        raw = enrich.app.serializers.dumps_value(None, {"order": 2, "ts": 3_000}, serializer="json")
        assert audit[0] == fingerprint(None, raw, None, 3_000).hex()


async def test_a_null_keyed_result_is_not_given_twice_after_a_restart() -> None:
    enrich, t = enrichment("left")
    async with JoinTestDriver(enrich) as d:
        await d.send(t["orders"], key=None, value={"order": 1, "ts": 1_000}, timestamp=1_000, partition=1)
        await d.restart()
        # Read again from an offset the state had taken (as after a crash before Faust's commit).
        await d.send(
            t["orders"], key=None, value={"order": 1, "ts": 1_000}, timestamp=1_000, partition=1, offset=0
        )
        assert len(lone(d)) == 1 and d.counters()["rereads"] == 1


@pytest.mark.parametrize("how", ["inner"])
async def test_an_inner_enrichment_dead_letters_a_null_keyed_stream_record(how: str) -> None:
    enrich, t = enrichment(how)
    async with JoinTestDriver(enrich) as d:
        await d.send(t["orders"], key=None, value={"order": 1, "ts": 1_000}, timestamp=1_000)
        assert d.results() == []
        assert [letter["category"] for letter in d.dead_letters()] == ["null_key"]


async def test_a_null_keyed_table_record_is_dead_lettered_in_a_left_enrichment() -> None:
    enrich, t = enrichment("left")
    async with JoinTestDriver(enrich) as d:
        await d.send(t["customers"], key=None, value={"name": "x", "ts": 1_000}, timestamp=1_000)
        assert d.results() == []
        assert [letter["category"] for letter in d.dead_letters()] == ["null_key"]


@pytest.mark.parametrize(
    ("how", "results_of", "letters_of"),
    [
        ("left", {"left"}, {"right"}),
        ("right", {"right"}, {"left"}),
        ("outer", {"left", "right"}, set()),
        ("inner", set(), {"left", "right"}),
    ],
)
async def test_windowed_joins_give_null_keyed_records_of_their_lone_sides(
    how: str, results_of: set[str], letters_of: set[str]
) -> None:
    paired, t = windowed(how)
    async with JoinTestDriver(paired) as d:
        # As Kafka's RelaxedNullKeyRequirementJoinTest: the right one first, then the left.
        await d.send(t["right"], key=None, value={"v": "r", "ts": 1}, timestamp=1)
        await d.send(t["left"], key=None, value={"v": "l", "ts": 2}, timestamp=2)
        expected = []
        if "right" in results_of:
            expected.append((None, None, {"v": "r", "ts": 1}, 1))
        if "left" in results_of:
            expected.append((None, {"v": "l", "ts": 2}, None, 2))
        assert lone(d) == expected  # at once, not after the window
        topics = {"left": t["left"].get_topic_name(), "right": t["right"].get_topic_name()}
        assert {letter["topic"] for letter in d.dead_letters()} == {topics[s] for s in letters_of}
        assert all(letter["category"] == "null_key" for letter in d.dead_letters())


def test_join_events_keeps_the_order_of_keyed_and_null_keyed_records() -> None:
    seen: list[Any] = []

    def operator(events: Any) -> list[Match]:
        seen.append([e[1] for e in events])
        return [Match(e[1], e[4], None, e[2]) for e in events]

    events: list[Any] = [("left", b"a", 1, b"1", b"x"), ("left", None, 2, b"2", b"y"),
                         ("right", b"b", 3, b"3", b"z"), ("right", None, 4, b"4", b"w")]  # fmt: skip
    found = join_events(operator, events)
    assert [(m.key, m.left, m.right, m.timestamp) for m in found] == [
        (b"a", b"x", None, 1), (None, b"y", None, 2), (b"b", b"z", None, 3), (None, None, b"w", 4)
    ]  # fmt: skip
    assert seen == [[b"a"], [b"b"]]  # the operator never sees a null key


def test_the_sides_that_take_null_keys() -> None:
    paired, _ = windowed("outer")
    enrich, _ = enrichment("left")
    assert null_key_sides(paired.kind) == {"left", "right"}
    assert null_key_sides(enrich.kind) == {"left"}  # never the table


def test_the_codecs_accept_a_null_key_only_on_the_sides_that_take_it() -> None:
    enrich, _ = enrichment("left")
    codecs = enrich.codecs()
    stream, table = codecs["left"], codecs["right"]
    value = b'{"order": 1, "ts": 5}'
    for accept in (stream.accept, stream.python_accept):  # compiled (where built) and the reference
        found = accept(None, value, 3, 0)
        assert type(found) is tuple and found[:2] == (5, (3).to_bytes(8, "big"))
        assert accept(None, None, 4, 0) is DROPPED  # a null value is dropped, whatever the key
        assert accept(None, b"{not json", 5, 0) == Rejected("malformed JSON: JSONDecodeError", "undecodable")
    assert table.accept(None, value, 3, 0) == Rejected("null Kafka key", "null_key")
    inner, _ = enrichment("inner")
    assert inner.codecs()["left"].accept(None, value, 3, 0) == Rejected("null Kafka key", "null_key")
