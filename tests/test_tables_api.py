"""Declaring joins (tables.join): what a user may write, and the errors that name the problem."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import faust
import orjson
import pytest

import tables
from assignor.faust_adapter.partition_assignor import TandemAssignor, tandem
from tables import JoinDeclarationError, JoinInput, JoinResults, join, runtime_of
from tables.operators import keys
from tables.operators.base import Match, fingerprint
from tables.operators.windowed import JoinType, JoinWindow
from tables.runtime.output import audit_value
from tables.runtime.startup import join_topics
from tables.testing import JoinTestDriver

counter = itertools.count()


def new_app(**conf: Any) -> faust.App:
    return faust.App(
        f"api-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor, **conf
    )


async def handler(results: JoinResults[Any, Any, Any]) -> None:
    async for _ in results:
        pass


def test_a_join_declares_its_topics_window_and_co_partition_group() -> None:
    app = new_app()
    orders, payments = app.topic("orders", key_type=int), app.topic("payments", key_type=int)
    totals = app.Table("totals", default=int)

    @join(app, orders, payments, within=timedelta(minutes=10), grace=60, how="left", tables=[totals])
    async def paid_orders(results: JoinResults[int, Any, Any]) -> None:
        async for _ in results:
            pass

    assert paid_orders.name == "paid-orders"
    assert paid_orders.kind.window == JoinWindow(before=600_000, after=600_000, grace=60_000)
    assert paid_orders.kind.join_type is JoinType.LEFT
    assert paid_orders.changelog_topic == f"{app.conf.id}-paid-orders-changelog"
    assert paid_orders.dead_letter_topic == f"{app.conf.id}-paid-orders-dead-letters"
    (declared,) = tandem(app).joins
    assert declared.changelog == paid_orders.changelog_topic
    assert set(declared.topics) == {"orders", "payments", f"{app.conf.id}-totals-changelog"}
    assert runtime_of(app).takes("orders") and not runtime_of(app).takes("totals")


def test_audit_names_its_topic_created_with_the_join_partition_count() -> None:
    app = new_app()
    plain = join(app, app.topic("a"), app.topic("b"), within=1, name="plain")(handler)
    audited = join(app, app.topic("c"), app.topic("d"), within=1, name="audited", audit=True)(handler)
    assert not plain.audit and audited.audit
    assert audited.audit_topic == f"{app.conf.id}-audited-audit"
    names = [t.name for t in join_topics(plain, 3)]
    assert names == ["a", "b", plain.changelog_topic, plain.dead_letter_topic]
    assert {t.name: t.partitions for t in join_topics(audited, 3)}[audited.audit_topic] == 3


def test_the_audit_fingerprint_tells_every_part_apart() -> None:
    """Each part length-prefixed, a missing partner marked: no two results share an encoding."""
    base = fingerprint(b"k", b"l", b"r", 5)
    others = [
        fingerprint(b"kl", b"", b"r", 5), fingerprint(b"k", b"lr", b"", 5), fingerprint(b"k", b"l", None, 5),
        fingerprint(b"k", None, b"r", 5), fingerprint(b"k", b"", b"r", 5), fingerprint(b"k", b"l", b"r", 6),
    ]  # fmt: skip
    assert len({base, *others}) == 7 and len(base) == 16
    assert fingerprint(b"k", b"l", b"r", 5) == base  # deterministic, across processes too (no salt)
    value = orjson.loads(audit_value(2, Match(b"k", b"l", b"r", 5), "w.1"))
    assert value == {"partition": 2, "ts": 5, "fingerprint": base.hex(), "writer": "w.1"}


def test_before_and_after_are_relative_to_the_left_record() -> None:
    app = new_app()
    spec = join(app, app.topic("a"), app.topic("b"), before=0, after=timedelta(seconds=5), name="x")(handler)
    assert spec.kind.window == JoinWindow(before=0, after=5000, grace=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "a join needs a window"),
        ({"within": 1, "after": 2}, "not both"),
        ({"within": -1}, "must not be negative"),
        ({"within": "10m"}, "timedelta or seconds"),
        ({"within": 1, "how": "cross"}, "how='cross'"),
        ({"within": 1, "name": "has space"}, "join name 'has space'"),
        ({"within": 1, "partitioner": "fnv"}, "partitioner='fnv'"),
    ],
)
def test_bad_declarations_say_what_is_wrong(options: dict[str, Any], message: str) -> None:
    app = new_app()
    with pytest.raises(JoinDeclarationError, match=message):
        join(app, app.topic("a"), app.topic("b"), **options)(handler)


def test_inputs_that_cannot_be_joined_are_refused() -> None:
    app = new_app()
    with pytest.raises(JoinDeclarationError, match="a self-join is 'inner' or 'left'"):
        join(app, app.topic("a"), app.topic("a"), within=1, how="outer")(handler)
    with pytest.raises(JoinDeclarationError, match="one partition count"):
        join(app, app.topic("a", partitions=4), app.topic("b", partitions=8), within=1)(handler)
    with pytest.raises(JoinDeclarationError, match="one topic"):
        join(app, app.topic("a", "b"), app.topic("c"), within=1)(handler)
    join(app, app.topic("a"), app.topic("b"), within=1, name="first")(handler)
    # Several joins may read one topic: fetched once, handed to each, placed as one group.
    join(app, app.topic("a"), app.topic("c"), within=1, name="second")(handler)
    groups = [sorted(j.topics) for j in tandem(app).joins]
    assert groups == [["a", "b"], ["a", "c"]]
    with pytest.raises(JoinDeclarationError, match="two joins named"):
        join(app, app.topic("x"), app.topic("y"), within=1, name="first")(handler)
    with pytest.raises(JoinDeclarationError, match="global"):
        join(app, app.topic("x"), app.topic("y"), within=1, tables=[app.GlobalTable("g")])(handler)


def test_per_input_options_win_over_join_wide_ones() -> None:
    app = new_app()
    spec = join(
        app,
        JoinInput(app.topic("a"), timestamp="created"),
        app.topic("b"),
        within=1,
        timestamp="ts",
        id="id",
    )(handler)
    assert (spec.left.timestamp, spec.right.timestamp) == ("created", "ts")
    assert spec.left.id == spec.right.id == "id"


def test_joins_need_tandems_assignor() -> None:
    app = faust.App(f"stock-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1")
    with pytest.raises(Exception, match="PartitionAssignor"):
        join(app, app.topic("a"), app.topic("b"), within=1)(handler)


class Order(faust.Record, serializer="json"):
    order_id: int
    ts: int


def test_mistakes_in_a_declaration_are_refused_at_once_naming_them() -> None:
    """A field that does not exist, a handler that is not async, a field on raw values: each
    refused at the declaration (it would otherwise dead-letter everything, or crash the
    worker at start)."""
    app = new_app()
    orders = app.topic("orders", key_type=int, value_type=Order)
    raw = app.topic("raw", key_type=int, value_type=bytes, value_serializer="raw")
    payments = app.topic("payments", key_type=int, value_serializer="json")  # JSON objects
    cases = [
        ({"timestamp": "created"}, orders, "timestamp='created' is not a field of Order (the values of "
         "'orders'); its fields are order_id, ts"),
        ({"id": "order"}, orders, "id='order' is not a field of Order"),
        ({"timestamp": "ts"}, raw, "timestamp='ts' names a field, but the values of 'raw' are not "
         "JSON objects"),
    ]  # fmt: skip
    for options, left, message in cases:
        with pytest.raises(JoinDeclarationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            join(app, JoinInput(left, **options), payments, within=1)(handler)

    def not_async(results: JoinResults[Any, Any, Any]) -> None:
        pass

    with pytest.raises(JoinDeclarationError, match="handler 'not_async' must be an `async def`"):
        join(app, orders, payments, within=1)(not_async)  # type: ignore[arg-type]
    spec = join(
        app, JoinInput(orders, timestamp="ts", id="order_id"), JoinInput(payments, id="any"), within=1
    )(handler)
    assert spec.left.timestamp == "ts"  # fields that exist, and any key of a JSON object, pass


class _LatestKind:
    """A third kind of join, written from the public interface only (docs/tables.md, "Adding a
    join kind"): each left record with the right side's latest value for its key, whatever its
    time (a lookup of a table, with no versions)."""

    name, how, table_side, unscanned = "latest", "left", "right", ()

    def operator(self, state: tables.KV, ids: bool) -> tables.Operator:
        return _LatestOperator(state)

    def emits_unmatched(self) -> bool:
        return True

    def retention_ms(self) -> int | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "how": self.how}


class _LatestOperator(tables.StateMeta):
    live_records = None

    def __init__(self, state: tables.KV) -> None:
        self.state, self._dirty_meta = state, set()
        self.stream_time: int | None = None
        self.changes: list[tuple[bytes, bytes | None]] = []
        self.lookups = self._meta("lookups") or 0

    def process_many(self, events: Iterable[tables.Event]) -> list[tables.Match]:
        matches = []
        for side, key, ts, _, value in events:
            self.stream_time = max(ts, self.stream_time or ts)
            if side == "right":
                self.restore(b"v" + key, value)
                self.changes.append((b"v" + key, value))
            else:
                self._count("lookups")
                matches.append(tables.Match(key, value, self.state.get(b"v" + key), ts))
        return matches

    def advance(self, stream_time: int) -> list[tables.Match]:
        return []

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        changes, self.changes = self.changes, []
        return changes + [(keys.meta_key(n), self.state.get(keys.meta_key(n))) for n in self._dirty_meta]

    def restore(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.state.delete(key)
        else:
            self.state.put(key, value)

    def finish_restore(self) -> None:
        self.lookups = self._meta("lookups") or 0

    def counters(self) -> dict[str, int]:
        return {"lookups": self.lookups}


async def test_a_join_kind_written_from_the_public_interface_runs_as_the_others() -> None:
    app = faust.App(f"kind-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    clicks = app.topic("clicks", key_type=str, value_type=bytes, value_serializer="raw", partitions=1)
    users = app.topic("users", key_type=str, value_type=bytes, value_serializer="raw", partitions=1)
    seen: list[tuple[str, bytes | None, bytes | None]] = []

    @tables.join_of_kind(app, clicks, users, _LatestKind(), name="latest-user")
    async def latest(results: tables.JoinResults[str, bytes, bytes]) -> None:
        async for key, click, user, _ in results:
            seen.append((key, click, user))

    async with JoinTestDriver(latest) as t:
        await t.send(users, key="ann", value=b"Ann", timestamp=5_000)
        await t.send(clicks, key="ann", value=b"c1", timestamp=1_000)  # the latest value, whatever its time
        await t.send(users, key="ann", value=None, timestamp=6_000)  # a delete: the table side's null
        await t.restore()  # the state and the counter from the changelog alone
        await t.send(clicks, key="ann", value=b"c2", timestamp=7_000)
        assert seen == [("ann", b"c1", b"Ann"), ("ann", b"c2", None)]
        assert t.counters()["lookups"] == 2


def test_an_unknown_join_option_is_named() -> None:
    app = faust.App(f"kind-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    left, right = app.topic("a", partitions=1), app.topic("b", partitions=1)
    with pytest.raises(TypeError, match=r"unknown join option\(s\) \['grace_ms'\]"):
        join(app, left, right, within=1, grace_ms=5)  # type: ignore[call-arg]
