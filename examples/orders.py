"""Orders joined with their payments: `faust -A examples.orders worker`.

A left join by order id: an order paid within 10 minutes (event time) is written to
`paid-orders` with its payment; an order still unpaid once no payment can arrive any
more is written there with `paid=False`. Payments are then totalled per customer in a
Faust table, through a topic keyed by customer (Faust's repartitioning idiom).

The batch side needs nothing more: `python -m pipeline join --app examples.orders` computes the
same join on Spark from the topics, and `python -m pipeline reconcile --app examples.orders`
checks what the workers produced against it (through the join's audit topic).

Settings from the environment: ORDERS_BROKER (kafka://localhost:9092), ORDERS_APP_ID
(orders), ORDERS_DATA_DIR (orders-data), ORDERS_WEB_PORT (6066), ORDERS_PARTITIONS (4).
"""

from __future__ import annotations

import os
from datetime import timedelta

import faust
from faust.web import Request, Response, View

from tables import JoinInput, JoinResults, TandemAssignor, join

PARTITIONS = int(os.environ.get("ORDERS_PARTITIONS", "4"))

app = faust.App(
    os.environ.get("ORDERS_APP_ID", "orders"),
    broker=os.environ.get("ORDERS_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,  # co-partitioned placement of the join, with standbys
    store="rocksdb://",
    datadir=os.environ.get("ORDERS_DATA_DIR", "orders-data"),
    web_port=int(os.environ.get("ORDERS_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
)


class Order(faust.Record, serializer="json"):
    order_id: int
    customer: str
    amount_cents: int


class Payment(faust.Record, serializer="json"):
    payment_id: str
    order_id: int
    amount_cents: int


class PaidOrder(faust.Record, serializer="json"):
    order_id: int
    customer: str
    amount_cents: int
    paid: bool
    payment_id: str | None = None


# Integer keys as JSON (b"42"): Faust's default "raw" key serializer takes only bytes and str.
orders = app.topic("orders", key_type=int, key_serializer="json", value_type=Order, partitions=PARTITIONS)
payments = app.topic(
    "payments", key_type=int, key_serializer="json", value_type=Payment, partitions=PARTITIONS
)
paid_orders = app.topic(
    "paid-orders", key_type=int, key_serializer="json", value_type=PaidOrder, partitions=PARTITIONS
)
# Keyed like the table's keys (Faust tables serialize keys as JSON): a customer's payments and
# its total are on the same partition, and a web request for it is routed to their owner.
customer_payments = app.topic(
    "customer-payments", key_type=str, key_serializer="json", value_type=int, partitions=PARTITIONS
)
totals = app.Table("customer-totals", key_type=str, default=int, partitions=PARTITIONS)  # cents paid


@join(
    app,
    JoinInput(orders, id="order_id"),  # an order sent twice is joined once
    JoinInput(payments, id="payment_id"),
    before=0,
    after=timedelta(minutes=10),  # a payment up to 10 minutes after its order
    grace=timedelta(minutes=1),  # how late (in event time) a record may still arrive
    how="left",  # orders without a payment come out too, with payment None
    audit=True,  # an audit record per result: `python -m pipeline reconcile --app examples.orders`
)
async def paid(results: JoinResults[int, Order, Payment]) -> None:
    async for order_id, order, payment, _ts in results:
        assert order is not None  # a left join: every result has its order
        await paid_orders.send(
            key=order_id,
            value=PaidOrder(
                order_id=order_id,
                customer=order.customer,
                amount_cents=order.amount_cents,
                paid=payment is not None,
                payment_id=payment.payment_id if payment else None,
            ),
        )
        if payment is not None:
            await customer_payments.send(key=order.customer, value=payment.amount_cents)


@app.agent(customer_payments)
async def add_to_totals(stream: faust.StreamT[int]) -> None:
    async for customer, cents in stream.items():
        totals[customer] += cents


@app.page("/totals/{customer}/")
@app.table_route(table=totals, match_info="customer")
async def total(web: View, request: Request, customer: str) -> Response:
    """A customer's total, answered by the worker that owns it (Faust routes the request)."""
    return web.json({"customer": customer, "cents": totals[customer]})
