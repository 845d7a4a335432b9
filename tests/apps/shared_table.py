"""Two enrichment joins reading one table: orders and payments, each enriched with the
customer's profile as of its time (`faust -A tests.apps.shared_table worker`). The topic
`customers` is fetched once and handed to both joins; partition p of all three inputs and
both changelogs lives on one worker."""

from __future__ import annotations

import faust

from tables import JoinInput, JoinResults, TandemAssignor, join_table

app = faust.App("shared-table", PartitionAssignor=TandemAssignor, topic_partitions=4)


class Customer(faust.Record, serializer="json"):
    tier: str
    ts: int


class Event(faust.Record, serializer="json"):
    event_id: str
    ts: int


customers = app.topic("customers", key_type=str, value_type=Customer, partitions=4)
orders = app.topic("orders", key_type=str, value_type=Event, partitions=4)
payments = app.topic("payments", key_type=str, value_type=Event, partitions=4)
out = app.topic("enriched", key_type=str, partitions=4)
table = JoinInput(customers, timestamp="ts")


@join_table(app, JoinInput(orders, timestamp="ts"), table, grace=2, history=3600, how="left")
async def order_tiers(results: JoinResults[str, Event, Customer]) -> None:
    async for key, order, customer, _ts in results:
        await out.send(key=key, value={"event": order.event_id, "tier": customer and customer.tier})


@join_table(app, JoinInput(payments, timestamp="ts"), table, grace=2, history=3600, how="left")
async def payment_tiers(results: JoinResults[str, Event, Customer]) -> None:
    async for key, payment, customer, _ts in results:
        await out.send(key=key, value={"event": payment.event_id, "tier": customer and customer.tier})
