"""Rekeyed inputs (`JoinInput(topic, key=...)`) through the test driver, which runs the worker's
own rekeyer (tables/runtime/rekeyer.py) and join task: both join kinds, either side or both;
the declaration checks; the dead letters of records whose key cannot be found; what the
assignor is told (the repartition topic in the join's co-partition group). The real-worker
run through a SIGKILL: tests/test_rekey_e2e.py."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import faust
import pytest

from assignor.faust_adapter.partition_assignor import tandem
from tables import JoinDeclarationError, JoinInput, JoinResults, TandemAssignor, join, join_table
from tables.records.partitioners import partition_for
from tables.runtime.startup import join_topics
from tables.testing import JoinTestDriver

counter = itertools.count()


class Order(faust.Record, serializer="json"):
    order_id: int
    customer_id: str
    ts: int


class Customer(faust.Record, serializer="json"):
    name: str


class Click(faust.Record, serializer="json"):
    user: str
    auction: str
    ts: int


class Impression(faust.Record, serializer="json"):
    auction: str
    ad: str
    ts: int


def new_app() -> faust.App:
    return faust.App(f"rekey-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)


def shop(key: Any = "customer_id", partitions: int = 4, prefix: str = "") -> tuple[Any, dict[str, Any]]:
    """Orders keyed by order id (3 partitions) enriched with customers keyed by customer id."""
    app = new_app()
    orders = app.topic(f"{prefix}orders", key_type=int, key_serializer="json", value_type=Order, partitions=3)
    customers = app.topic(
        f"{prefix}customers", key_type=str, key_serializer="json", value_type=Customer, partitions=partitions
    )
    out = app.topic("out", key_type=int, key_serializer="json", partitions=partitions)

    @join_table(
        app, JoinInput(orders, key=key, id="order_id"), customers, grace=timedelta(seconds=1),
        how="left", timestamp=None,
    )  # fmt: skip
    async def enrich(results: JoinResults[str, Order, Customer]) -> None:
        async for customer_id, order, customer, ts in results:
            await out.send(
                key=order.order_id, value={"c": customer_id, "name": customer and customer.name, "ts": ts}
            )

    return enrich, {"app": app, "orders": orders, "customers": customers, "out": out}


async def test_an_order_stream_rekeyed_by_customer_is_enriched_as_of_each_order() -> None:
    enrich, t = shop()
    assert enrich.input_topics == (f"{t['app'].conf.id}-enrich-left-repartition", "customers")
    async with JoinTestDriver(enrich) as d:
        await d.send(t["customers"], key="alice", value=Customer(name="Alice"), timestamp=1_000)
        await d.send(t["orders"], key=1, value=Order(order_id=1, customer_id="alice", ts=0), timestamp=2_000)
        await d.send(t["customers"], key="alice", value=Customer(name="Alice B."), timestamp=3_000)
        await d.send(t["orders"], key=2, value=Order(order_id=2, customer_id="alice", ts=0), timestamp=4_000)
        await d.send(t["orders"], key=3, value=Order(order_id=3, customer_id="bob", ts=0), timestamp=4_500)
        await d.close_inputs()
        assert sorted((s.key, s.value["name"], s.value["ts"]) for s in d.sent(t["out"])) == [
            (1, "Alice", 2_000),  # the name as of the order's time (the source record's timestamp)
            (2, "Alice B.", 4_000),
            (3, None, 4_500),  # no such customer: a left join
        ]
        # Each order went to its customer's partition of the repartition topic, keyed as the
        # customers are, with its source record's timestamp.
        copies = [(p, r.key, r.timestamp) for (topic, p), rows in d.log.records.items() for r in rows
                  if topic == enrich.repartitions[0].name]  # fmt: skip
        wanted = [(partition_for(b'"alice"', 4, "murmur2"), b'"alice"', 2_000),
                  (partition_for(b'"alice"', 4, "murmur2"), b'"alice"', 4_000),
                  (partition_for(b'"bob"', 4, "murmur2"), b'"bob"', 4_500)]  # fmt: skip
        assert sorted(copies) == sorted(wanted)
        assert d.counters()["rekeyed"] == {"left": 3, "right": 0}


async def test_a_key_function_and_the_records_it_cannot_key_are_dead_lettered() -> None:
    def customer_of(order: Order) -> str | None:
        if order.customer_id == "boom":
            raise ValueError("no such customer")
        return None if order.customer_id == "nobody" else order.customer_id.lower()

    enrich, t = shop(key=customer_of)
    async with JoinTestDriver(enrich) as d:
        await d.send(t["customers"], key="alice", value=Customer(name="Alice"), timestamp=1_000)
        await d.send(t["orders"], key=1, value=Order(order_id=1, customer_id="ALICE", ts=0), timestamp=2_000)
        await d.send(t["orders"], key=2, value=Order(order_id=2, customer_id="boom", ts=0), timestamp=2_000)
        await d.send(t["orders"], key=3, value=Order(order_id=3, customer_id="nobody", ts=0), timestamp=2_000)
        await d.send(t["orders"], key=4, value=None, timestamp=2_000)
        await d.send(t["orders"], key=b"5", value=b"{not json", timestamp=2_000, raw=True)
        await d.close_inputs()
        assert [(s.key, s.value["name"]) for s in d.sent(t["out"])] == [(1, "Alice")]
        letters = {letter["key"]: letter for letter in d.dead_letters()}
        assert {k: (v["category"], v["topic"]) for k, v in letters.items()} == {
            "2": ("wrong_type", "orders"),
            "3": ("null_key", "orders"),
            "4": ("null_key", "orders"),
            "5": ("undecodable", "orders"),
        }
        assert "the key function raised ValueError: no such customer" in letters["2"]["reason"]
        assert d.counters()["dead_letters"] == {"wrong_type": 1, "null_key": 2, "undecodable": 1}


def clicks_app(rekey_left: bool, rekey_right: bool) -> tuple[Any, dict[str, Any]]:
    """Clicks keyed by user and impressions keyed by ad, joined by auction within 10 s."""
    app = new_app()
    clicks = app.topic("clicks", key_type=str, value_type=Click, partitions=2)
    impressions = app.topic("impressions", key_type=str, value_type=Impression, partitions=4)
    out = app.topic("out", partitions=4)

    @join(
        app,
        JoinInput(clicks, key="auction") if rekey_left else clicks,
        JoinInput(impressions, key=lambda i: i.auction) if rekey_right else impressions,
        within=timedelta(seconds=10),
        how="inner",
        timestamp="ts",
    )
    async def attributed(results: JoinResults[str, Click, Impression]) -> None:
        async for auction, click, impression, _ts in results:
            await out.send(key=auction, value={"user": click.user, "ad": impression.ad})

    return attributed, {"clicks": clicks, "impressions": impressions, "out": out}


@pytest.mark.parametrize(("rekey_left", "rekey_right"), [(True, False), (False, True), (True, True)])
async def test_a_windowed_join_with_either_input_or_both_rekeyed(rekey_left: bool, rekey_right: bool) -> None:
    attributed, t = clicks_app(rekey_left, rekey_right)
    assert len(attributed.repartitions) == rekey_left + rekey_right
    async with JoinTestDriver(attributed, partitions=4) as d:
        for n, auction in enumerate(["a1", "a2", "a3"]):
            ts = 1_000 * n
            impression = Impression(auction=auction, ad=f"ad{n}", ts=ts)
            click = Click(user=f"u{n}", auction=auction, ts=ts + 500)
            await d.send(
                t["impressions"], key=f"ad{n}" if rekey_right else auction, value=impression, timestamp=ts
            )
            await d.send(t["clicks"], key=f"u{n}" if rekey_left else auction, value=click, timestamp=ts)
        late = Click(user="u9", auction="a1", ts=60_000)  # outside the window
        await d.send(t["clicks"], key="u9" if rekey_left else "a1", value=late, timestamp=0)
        await d.close_inputs()
        assert sorted((s.value["user"], s.value["ad"]) for s in d.sent(t["out"])) == [
            ("u0", "ad0"),
            ("u1", "ad1"),
            ("u2", "ad2"),
        ]


def test_a_key_field_the_record_type_lacks_is_refused_at_declaration() -> None:
    with pytest.raises(JoinDeclarationError, match=r"key='customer' is not a field of Order .*'orders'"):
        shop(key="customer")
    with pytest.raises(
        JoinDeclarationError, match=r"key=42 for 'orders': give a value field's name or a function"
    ):
        shop(key=42)


def test_two_inputs_rekeyed_from_one_topic_are_a_self_join() -> None:
    app = new_app()
    clicks = app.topic("clicks", key_type=str, value_type=Click)
    with pytest.raises(JoinDeclarationError, match="self-join of 'clicks'"):

        @join(app, JoinInput(clicks, key="auction"), JoinInput(clicks, key="user"), within=1)
        async def itself(results: JoinResults[str, Click, Click]) -> None:
            async for _ in results:
                pass


def test_the_repartition_topic_is_an_input_of_the_co_partition_group_and_made_like_the_changelog() -> None:
    attributed, t = clicks_app(True, False)
    app = attributed.app
    repartition = f"{app.conf.id}-attributed-left-repartition"
    declared = [j for j in tandem(app).joins if j.changelog == attributed.changelog_topic]
    assert len(declared) == 1
    assert repartition in declared[0].all_topics and "impressions" in declared[0].all_topics
    assert "clicks" not in declared[0].all_topics  # the source is only consumed: placed on its own
    assert attributed.source_topics == ["clicks"]
    topics = {topic.name: topic.partitions for topic in join_topics(attributed, 4)}
    assert topics[repartition] == topics[attributed.changelog_topic] == 4
