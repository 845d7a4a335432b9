"""An agent beside a join, in Faust's own objects (no broker): the join's subscription gets no
records from Faust's conductor while an agent's channel on the same topic does, and the
agent's position counts only what it acked with no gap. End to end: test_app_agent_beside_join.py."""

from __future__ import annotations

import itertools

import faust
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP

from tables import JoinResults, TandemAssignor, join
from tables.kafka.consumer import JoinConsumer, agent_topics, shared_topics

counter = itertools.count()


def _app() -> tuple[faust.App, faust.TopicT]:
    app = faust.App(f"agents-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    orders, payments = app.topic("orders"), app.topic("payments")

    @join(app, orders, payments, within=60)
    async def paid(results: JoinResults[str, str, str]) -> None:
        async for _ in results:
            pass

    return app, orders


def _acked(consumer: JoinConsumer, tp: TP, *offsets: int) -> None:
    for offset in offsets:
        consumer._acked[tp].append(offset)
        consumer._acked_index[tp].add(offset)


def test_faust_delivers_a_joined_topic_to_an_agent_and_not_to_the_join() -> None:
    app, orders = _app()
    assert agent_topics(app) == frozenset()  # the join's own subscription is no reader
    agent_channel = orders.clone(is_iterator=True)  # what `@app.agent(orders)` iterates
    app.topics.add(agent_channel)
    assert agent_topics(app) == {"orders"}
    app.topics._update_tp_index({TP("orders", 0), TP("payments", 0)})
    assert app.topics._tp_index[TP("orders", 0)] == {agent_channel}
    assert TP("payments", 0) not in app.topics._tp_index  # nobody but the join reads it
    assert shared_topics(app) == frozenset()  # computed by the consumer at each fetch


def test_the_agent_position_moves_only_over_acked_offsets_with_no_gap() -> None:
    app, _ = _app()
    consumer = app.consumer
    assert isinstance(consumer, JoinConsumer)
    tp = TP("orders", 0)
    consumer._committed_offset[tp] = 10
    _acked(consumer, tp, 11, 12)  # 10 is not acked yet
    assert consumer._agent_position(tp) == 10
    _acked(consumer, tp, 10)
    assert consumer._agent_position(tp) == 13
    _acked(consumer, tp, 9, 13)  # 9 read again and acked again: below the position, ignored
    assert consumer._agent_position(tp) == 14
    consumer._gap[tp].addi(14, 20)  # offsets compacted away (or transaction markers)
    _acked(consumer, tp, 20)
    assert consumer._agent_position(tp) == 21


def test_faust_alone_would_pass_one_record_the_agent_has_not_acked() -> None:
    """Why the position is Tandem's own: Faust's `_new_offset` lets one unacked record at the
    head go (committed 10, acked 11 and 12: it says 13)."""
    app, _ = _app()
    consumer = app.consumer
    tp = TP("orders", 0)
    consumer._committed_offset[tp] = 10
    _acked(consumer, tp, 11, 12)
    assert FaustConsumer._new_offset(consumer, tp) == 13


async def test_a_revocation_forgets_the_agent_position() -> None:
    app, _ = _app()
    consumer = app.consumer
    tp = TP("orders", 0)
    consumer._committed_offset[tp] = 5
    _acked(consumer, tp, 5, 6)
    assert consumer._agent_position(tp) == 7
    await consumer.on_partitions_revoked({tp})
    consumer._committed_offset[tp] = 3  # its next owner committed less: it goes on from there
    assert consumer._agent_position(tp) == 3
