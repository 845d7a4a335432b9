"""`JoinTask`'s batch (tables/runtime/task.py) without a broker: the worker's own task and intake
on the in-memory ports the test driver gives it (tables/testing/memory.py). What a batch
releases, in what order, and what it lets the group commit."""

from __future__ import annotations

from faust.types import TP

from tables.testing import JoinTestDriver
from tables.testing.memory import MemoryRecord
from tests.test_tables_driver import order, orders_app, payment


async def test_a_batch_joins_each_partition_in_event_time_order_across_the_inputs() -> None:
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:  # one partition: one stream time
        async with d.batched():
            await d.send(t["orders"], key=1, value=order(1), timestamp=100_000)
            await d.send(t["orders"], key=2, value=order(2), timestamp=1_000)  # older: joined first
            await d.send(t["payments"], key=2, value=payment(2), timestamp=1_500)
        assert [s.key for s in d.sent(t["out"])] == [2]
        assert d.counters()["late"] == 0
    async with JoinTestDriver(paid, partitions=1) as d:  # the same sends, each a batch of its own
        await d.send(t["orders"], key=1, value=order(1), timestamp=100_000)
        await d.send(t["orders"], key=2, value=order(2), timestamp=1_000)
        await d.send(t["payments"], key=2, value=payment(2), timestamp=1_500)
        assert d.sent(t["out"]) == [] and d.counters()["late"] == 2


async def test_a_record_is_held_while_its_partner_input_has_more_to_read_and_not_committed() -> None:
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:
        task = d._running()
        orders, payments = TP("orders", 0), TP("payments", 0)
        _, key, raw_payment = d._serializers.for_topic(t["payments"])
        # A payment on the broker, not fetched yet: the payments input is behind.
        d.inputs.append(payments, MemoryRecord(key(2), raw_payment(payment(2)), 1_500, [], 0))
        _, key, raw_order = d._serializers.for_topic(t["orders"])
        d.inputs.append(orders, MemoryRecord(key(2), raw_order(order(2)), 1_000, [], 0))
        await task.batch([d.inputs.fetch(paused={payments})])  # the order alone
        assert d.results() == [] and task.input_snapshot().held == 1
        assert task.commit_offset(orders) == 0  # never past a record still held
        await task.batch([d.inputs.fetch(paused=set())])  # then the payment
        assert [(r.key, r.left.order_id, r.right.payment_id) for r in d.results()] == [(2, 2, "p2")]
        assert task.input_snapshot().held == 0
        assert (task.commit_offset(orders), task.commit_offset(payments)) == (1, 1)


async def test_a_bad_record_is_dead_lettered_and_committed_past() -> None:
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:
        await d.send("orders", key=b"1", value=b"{not json", timestamp=1, raw=True)
        await d.send(t["orders"], key=2, value=order(2), timestamp=1_000)
        assert [letter["offset"] for letter in d.dead_letters()] == [0]
        assert d.inputs.committed() == {TP("orders", 0): 2}
        assert d.changelog(0)  # the good record's state went to the changelog
