"""`JoinTask`'s batch (tables/runtime/task.py) without a broker: the worker's own task and intake
on the in-memory ports the test driver gives it (tables/testing/memory.py). What a batch
releases, in what order, and what it lets the group commit; what the view and /metrics say of
its input."""

from __future__ import annotations

from pathlib import Path

from faust.types import TP

from tables.records.alignment import MAX_WAIT_UNHEARD_S
from tables.records.partitioners import partition_for
from tables.testing import JoinTestDriver
from tables.testing.memory import MemoryRecord
from tables.web.metrics import _collect_join, _Families
from tables.web.view import join_view
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


class _Clock:
    """The aligner's clock, moved by hand: a minute of silence without waiting for it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_an_input_let_go_for_its_silence_is_counted_in_the_view_and_metrics(tmp_path: Path) -> None:
    """Payments have a record on the broker that never comes (not fetched): once their wait
    runs out the order goes on without them, and the view and /metrics say so for that side."""
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:
        task = d._running()
        clock = _Clock()
        task.intake.aligner.clock = clock
        orders, payments = TP("orders", 0), TP("payments", 0)
        _, key, raw_payment = d._serializers.for_topic(t["payments"])
        d.inputs.append(payments, MemoryRecord(key(2), raw_payment(payment(2)), 1_500, [], 0))
        _, key, raw_order = d._serializers.for_topic(t["orders"])
        d.inputs.append(orders, MemoryRecord(key(2), raw_order(order(2)), 1_000, [], 0))
        await task.batch([d.inputs.fetch(paused={payments})])
        assert task.input_snapshot().held == 1 and join_view(task)["let_go"] == {"left": 0, "right": 0}
        clock.now = MAX_WAIT_UNHEARD_S
        await task.batch([d.inputs.fetch(paused={payments})])
        assert task.input_snapshot().held == 0
        assert join_view(task)["let_go"] == {"left": 0, "right": 1}
        families = _Families("w1")
        _collect_join(families, "paid", task, tmp_path)
        samples = {s.labels["side"]: s.value for s in families.by_name["tandem_align_let_go"].samples}
        assert samples == {"left": 0, "right": 1}


async def test_records_fetched_while_their_partition_restores_are_read_again_once_it_is_ready() -> None:
    """A fetch in flight when an assignment comes can hold records of a partition the new
    assignment holds back for its restore. The batch leaves them out, and its input is set
    back to them: once the partition is restored they are read again and joined (they were
    lost, the partition stalled for good, when they were only left out)."""
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:
        task = d._running()
        assert task.state is not None
        orders, payments = TP("orders", 0), TP("payments", 0)
        _, key, raw_order = d._serializers.for_topic(t["orders"])
        _, key_p, raw_payment = d._serializers.for_topic(t["payments"])
        d.inputs.append(orders, MemoryRecord(key(2), raw_order(order(2)), 1_000, [], 0))
        d.inputs.append(payments, MemoryRecord(key_p(2), raw_payment(payment(2)), 1_500, [], 0))
        task.state.ready.discard(0)  # restoring, as a newly assigned partition is
        await task.batch([d.inputs.fetch(paused=set())])
        assert d.results() == [] and task.commit_offset(orders) is None  # not joined, nothing to commit
        assert d.inputs.pending()  # set back to the records left out
        task.state.ready.add(0)  # restored (as JoinState.restore hands it over)
        task._ready(0)
        await task.batch([d.inputs.fetch(paused=set())])
        assert [(r.key, r.left.order_id, r.right.payment_id) for r in d.results()] == [(2, 2, "p2")]
        assert (task.commit_offset(orders), task.commit_offset(payments)) == (1, 1)


async def test_the_view_shows_each_input_partition_read_commit_and_committed_offsets() -> None:
    """`offsets` in the join's view: where each input partition is read to, what the join
    lets the group commit (not past a record it holds) and what was committed."""
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:
        task = d._running()
        orders, payments = TP("orders", 0), TP("payments", 0)
        _, key, raw_order = d._serializers.for_topic(t["orders"])
        _, key_p, raw_payment = d._serializers.for_topic(t["payments"])
        d.inputs.append(payments, MemoryRecord(key_p(2), raw_payment(payment(2)), 1_500, [], 0))
        d.inputs.append(orders, MemoryRecord(key(1), raw_order(order(1)), 1_000, [], 0))
        d.inputs.append(orders, MemoryRecord(key(2), raw_order(order(2)), 1_200, [], 1))
        await task.batch([d.inputs.fetch(paused={payments})])  # the orders alone: held
        offsets = join_view(task)["offsets"]
        assert set(offsets) == {"orders:0", "payments:0"}
        assert offsets["orders:0"] == {"read_next": 2, "commit_at": 0, "committed": None}
        await task.batch([d.inputs.fetch(paused=set())])  # then the payment: all joined
        d.inputs.commit({orders: task.commit_offset(orders), payments: task.commit_offset(payments)})
        offsets = join_view(task)["offsets"]
        assert offsets["orders:0"] == {"read_next": 2, "commit_at": 2, "committed": 2}
        assert offsets["payments:0"] == {"read_next": 1, "commit_at": 1, "committed": 1}


async def test_a_cooperative_revoke_hands_over_its_partitions_and_the_kept_ones_go_on_as_they_are() -> None:
    """`quiesce(partitions)` (a cooperative revoke) drops what the join holds of the revoked
    partitions only; the next assignment keeps what the kept partition holds and its position
    (nothing read again), and its held order joins when its payment comes. (Before, a
    cooperative round dropped what every partition held, and read it all again.)"""
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=2) as d:
        task = d._running()
        _, key, raw_order = d._serializers.for_topic(t["orders"])
        _, key_p, raw_payment = d._serializers.for_topic(t["payments"])
        ids = {partition_for(key(i), 2, "murmur2"): i for i in range(1, 20)}  # an order id per partition
        payments = {TP("payments", p) for p in (0, 1)}
        for p, i in ids.items():  # each payment on the broker, not fetched yet: the orders wait for it
            d.inputs.append(TP("payments", p), MemoryRecord(key_p(i), raw_payment(payment(i)), 1_500, [], 0))
            d.inputs.append(TP("orders", p), MemoryRecord(key(i), raw_order(order(i)), 1_000, [], 0))
        await task.batch([d.inputs.fetch(paused=payments)])  # both orders held
        assert task.input_snapshot().held == 2
        await task.quiesce({1})  # partition 1 goes to another worker
        assert task.intake.aligner.held(0) == 1 and task.intake.aligner.held(1) == 0
        await task.assign({0}, set(), epoch=2)
        assert task.input_snapshot().held == 1 and not d.inputs.pending(paused=payments)  # nothing read again
        await task.batch([d.inputs.fetch(paused={TP("payments", 1)})])
        assert [r.key for r in d.results()] == [ids[0]]
        assert join_view(task)["rereads"] == 0 and task.counters()["duplicates"] == 0
