"""A join with declared ids, for the re-read test: `faust -A tests.apps.rereads worker`.

Orders and payments keyed by order id (JSON), each with its own `id`; the result goes to
`paid` with the order's id. The tests run it on the embedded broker (tables.testing.LocalCluster,
whose environment sets the broker, the web port and the data dir).
"""

from __future__ import annotations

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinInput, JoinResults, join


class Order(faust.Record, serializer="json"):
    order_id: str
    ts: int


class Payment(faust.Record, serializer="json"):
    payment_id: str
    order_id: str
    ts: int


app = faust.App("rereads", PartitionAssignor=TandemAssignor, topic_partitions=2)
orders = app.topic("orders", key_type=str, value_type=Order)
payments = app.topic("payments", key_type=str, value_type=Payment)
paid = app.topic("paid", key_type=str, value_type=str)


@join(
    app,
    JoinInput(orders, timestamp="ts", id="order_id"),
    JoinInput(payments, timestamp="ts", id="payment_id"),
    within=60,
    name="paid-orders",
)
async def paid_orders(results: JoinResults[str, Order, Payment]) -> None:
    async for key, order, payment, _ts in results:
        results.send_soon(paid, key=key, value=f"{order.order_id}:{payment.payment_id}")
