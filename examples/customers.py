"""Orders enriched with their customer, though the two topics are keyed differently:
`faust -A examples.customers worker`.

`shop-orders` is keyed by order id; `customers` (a table: each record is the customer's latest
details, a null value deletes it) is keyed by customer id. `JoinInput(orders,
key="customer_id")` joins each order on the customer id in its value: Tandem repartitions the
orders through `{app id}-enrich-left-repartition` (keyed by customer id, with the customers'
partition count and partitioner, each order's timestamp kept), and the enrichment join reads
that. Each order is written to `enriched-orders` (keyed by order id again) with the customer's
name and tier as of the order's time, or none when the customer is not known (a left join).

Each enriched order is then priced with a **global table**: `tiers` (keyed by tier name, any
partition count) holds each tier's discount, every worker holds all of it, and `join_global`
looks each enriched order up by its `tier` field (no rekeying, no co-partitioning): the order
is written to `priced-orders` with its discount, or none when its tier has no entry (a left
join).

The batch side needs nothing more: `python -m pipeline join --app examples.customers --join
enrich` rekeys and joins the same on Spark, and `python -m pipeline reconcile --app
examples.customers --join enrich` checks the workers' results against it (through the join's
audit topic); `--join price` does the same for the global lookup.

Settings from the environment: SHOP_BROKER (kafka://localhost:9092), SHOP_APP_ID (shop),
SHOP_DATA_DIR (shop-data), SHOP_WEB_PORT (6066), SHOP_PARTITIONS (4: the customers' and the
join's), SHOP_ORDER_PARTITIONS (3: the orders' own, any count), SHOP_TIER_PARTITIONS (1: the tiers').
"""

from __future__ import annotations

import os
from datetime import timedelta

import faust

from tables import JoinInput, JoinResults, TandemAssignor, join_global, join_table

PARTITIONS = int(os.environ.get("SHOP_PARTITIONS", "4"))
ORDER_PARTITIONS = int(os.environ.get("SHOP_ORDER_PARTITIONS", "3"))
TIER_PARTITIONS = int(os.environ.get("SHOP_TIER_PARTITIONS", "1"))

app = faust.App(
    os.environ.get("SHOP_APP_ID", "shop"),
    broker=os.environ.get("SHOP_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    store="rocksdb://",
    datadir=os.environ.get("SHOP_DATA_DIR", "shop-data"),
    web_port=int(os.environ.get("SHOP_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
)


class Order(faust.Record, serializer="json"):
    order_id: int
    customer_id: str
    amount_cents: int


class Customer(faust.Record, serializer="json"):
    name: str
    tier: str


class EnrichedOrder(faust.Record, serializer="json"):
    order_id: int
    customer_id: str
    amount_cents: int
    name: str | None = None
    tier: str | None = None


class Tier(faust.Record, serializer="json"):
    discount_percent: int


class PricedOrder(faust.Record, serializer="json"):
    order_id: int
    tier: str | None
    amount_cents: int
    discount_percent: int | None = None


orders = app.topic(
    "shop-orders", key_type=int, key_serializer="json", value_type=Order, partitions=ORDER_PARTITIONS
)
customers = app.topic(
    "customers", key_type=str, key_serializer="json", value_type=Customer, partitions=PARTITIONS
)
enriched_orders = app.topic(
    "enriched-orders", key_type=int, key_serializer="json", value_type=EnrichedOrder, partitions=PARTITIONS
)
tiers = app.topic("tiers", key_type=str, key_serializer="json", value_type=Tier, partitions=TIER_PARTITIONS)
priced_orders = app.topic(
    "priced-orders", key_type=int, key_serializer="json", value_type=PricedOrder, partitions=PARTITIONS
)


@join_table(
    app,
    # Joined on the customer id in the order, not on the order id the topic is keyed by.
    JoinInput(orders, key="customer_id", id="order_id"),  # an order sent twice is joined once
    customers,
    grace=timedelta(seconds=5),  # a customer update up to 5 s late (event time) is still seen
    how="left",  # an order of an unknown customer comes out too, with customer None
    audit=True,  # an audit record per result: `python -m pipeline reconcile --app examples.customers`
)
async def enrich(results: JoinResults[str, Order, Customer]) -> None:
    async for customer_id, order, customer, _ts in results:
        await enriched_orders.send(
            key=order.order_id,
            value=EnrichedOrder(
                order_id=order.order_id,
                customer_id=customer_id,
                amount_cents=order.amount_cents,
                name=customer.name if customer else None,
                tier=customer.tier if customer else None,
            ),
        )


@join_global(
    app,
    enriched_orders,
    tiers,
    key="tier",  # looked up by the tier the enrichment found (None: no customer, no discount)
    how="left",  # an order whose tier has no discount comes out too, with discount None
    name="price",
)
async def price(results: JoinResults[int, EnrichedOrder, Tier]) -> None:
    async for order_id, order, tier, _ts in results:
        await priced_orders.send(
            key=order_id,
            value=PricedOrder(
                order_id=order_id,
                tier=order.tier,
                amount_cents=order.amount_cents,
                discount_percent=tier.discount_percent if tier else None,
            ),
        )
