"""An `@app.agent` on a topic a join reads (issue 39, item 4): the agent gets every record,
the join every result, and an input offset is committed only once both are done with it.
Real workers (tests/apps/agent_beside_join.py) on the embedded broker."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tables.testing import (
    EmbeddedBroker,
    WorkerProcess,
    create_topics,
    embedded_env,
    high_watermarks,
    read_records,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 2


def _worker(broker: EmbeddedBroker, unique: str, tmp_path: Path, name: str, **env: str) -> WorkerProcess:
    worker = WorkerProcess(name, "tests.apps.agent_beside_join", tmp_path, cwd=REPO)
    worker.extra_env = {
        **embedded_env(),
        "AGENT_APP_BROKER": f"kafka://{broker.bootstrap}",
        "AGENT_APP_ID": f"agents-{unique}",
        "AGENT_APP_PREFIX": f"ag{unique}-",
        "AGENT_APP_GATE": str(tmp_path / "gate"),
        "APP_DATADIR": str(tmp_path / name),
        "WEB_PORT": str(worker.port),
        **env,
    }
    return worker


def _topics(unique: str) -> dict[str, str]:
    return {name: f"ag{unique}-{name}" for name in ("orders", "payments", "paid", "counted")}


async def _produce(
    bootstrap: str, topics: dict[str, str], orders: dict[str, str]
) -> dict[str, tuple[int, int]]:
    """Each order and its payment; returns where each order landed (partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        landed = {}
        for order_id, order in orders.items():
            sent = await producer.send_and_wait(
                topics["orders"], f'"{order}"'.encode(), key=order_id.encode()
            )
            landed[order_id] = (sent.partition, sent.offset)
            await producer.send_and_wait(
                topics["payments"], f'"pay-{order_id}"'.encode(), key=order_id.encode()
            )
        return landed
    finally:
        await producer.stop()


def _values(broker: EmbeddedBroker, topic: str) -> list[tuple[str, str]]:
    records = asyncio.run(read_records(broker.bootstrap, topic, PARTITIONS))
    return [(r.key.decode(), r.value.decode().strip('"')) for r in records]


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        await consumer.stop()


def _ends(broker: EmbeddedBroker, topic: str) -> dict[int, int]:
    return dict(asyncio.run(high_watermarks(broker.bootstrap, topic, PARTITIONS)))


def test_the_commit_waits_for_an_agent_on_a_joined_topic_and_the_agent_gets_every_record(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topics = _topics(unique)
    asyncio.run(create_topics(broker.bootstrap, dict.fromkeys(topics.values(), PARTITIONS)))
    orders = {f"o{i}": ("gate" if i == 7 else f"order{i}") for i in range(20)}
    landed = asyncio.run(_produce(broker.bootstrap, topics, orders))
    expected_paid = {(o, f"{v}+pay-{o}") for o, v in orders.items()}
    group = f"agents-{unique}"
    worker = _worker(broker, unique, tmp_path, "w1").start()
    try:
        # The join is not held up by the agent waiting at the gate: every result comes.
        assert wait_for(
            lambda: worker.check() or set(_values(broker, topics["paid"])) >= expected_paid, 120
        ), expected_paid - set(_values(broker, topics["paid"]))
        # Commits happen: the payments (read by the join alone) are committed to their end.
        payments_end = _ends(broker, topics["payments"])
        assert wait_for(
            lambda: asyncio.run(_committed(broker.bootstrap, group, topics["payments"])) == payments_end, 60
        ), (asyncio.run(_committed(broker.bootstrap, group, topics["payments"])), payments_end)
        # ... but the orders never past what the agent has not acked: the gate order.
        gate_partition, gate_offset = landed["o7"]
        for _ in range(3):  # over several commit intervals (1 s each)
            committed = asyncio.run(_committed(broker.bootstrap, group, topics["orders"]))
            assert (committed[gate_partition] or 0) <= gate_offset, (committed, landed["o7"])
            asyncio.run(asyncio.sleep(1.0))
        assert "o7" not in {key for key, _ in _values(broker, topics["counted"])}
        (tmp_path / "gate").touch()
        # Once the agent is through, it has counted every order, and both inputs are committed.
        assert wait_for(lambda: {k for k, _ in _values(broker, topics["counted"])} >= set(orders), 60)
        orders_end = _ends(broker, topics["orders"])
        assert wait_for(
            lambda: asyncio.run(_committed(broker.bootstrap, group, topics["orders"])) == orders_end, 60
        ), (asyncio.run(_committed(broker.bootstrap, group, topics["orders"])), orders_end)
        assert set(_values(broker, topics["paid"])) == expected_paid
        assert set(_values(broker, topics["counted"])) == set(orders.items())
    finally:
        worker.stop(15)


def test_through_a_sigkill_and_a_restart_every_join_result_and_every_count_comes(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topics = _topics(unique)
    asyncio.run(create_topics(broker.bootstrap, dict.fromkeys(topics.values(), PARTITIONS)))
    orders = {f"o{i}": f"order{i}" for i in range(200)}
    asyncio.run(_produce(broker.bootstrap, topics, orders))
    expected_paid = {(o, f"{v}+pay-{o}") for o, v in orders.items()}
    worker = _worker(broker, unique, tmp_path, "w1", AGENT_APP_PAUSE_S="0.03").start()
    try:
        assert wait_for(lambda: worker.check() or len(_values(broker, topics["counted"])) >= 30, 120, 0.1)
        worker.kill()
        counted_at_kill = {k for k, _ in _values(broker, topics["counted"])}
        assert counted_at_kill < set(orders), "the agent was through before the kill: the test proves nothing"
        worker = _worker(broker, unique, tmp_path, "w1").start()  # the same data dir
        assert wait_for(
            lambda: worker.check() or {k for k, _ in _values(broker, topics["counted"])} >= set(orders), 120
        ), set(orders) - {k for k, _ in _values(broker, topics["counted"])}
        assert wait_for(lambda: set(_values(broker, topics["paid"])) >= expected_paid, 60)
        # At least once, and nothing spurious.
        assert set(_values(broker, topics["paid"])) == expected_paid
        assert set(_values(broker, topics["counted"])) == set(orders.items())
        orders_end = _ends(broker, topics["orders"])
        group = f"agents-{unique}"
        assert wait_for(
            lambda: asyncio.run(_committed(broker.bootstrap, group, topics["orders"])) == orders_end, 60
        ), (asyncio.run(_committed(broker.bootstrap, group, topics["orders"])), orders_end)
    finally:
        worker.stop(15)


def test_through_a_scale_out_every_join_result_and_every_count_comes(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """A second worker joins mid-way: the rebalance moves a partition, whose agent's buffered
    orders Faust drops; they are read again from the committed offset, for the agent and the
    join alike (Runtime.rewind)."""
    topics = _topics(unique)
    asyncio.run(create_topics(broker.bootstrap, dict.fromkeys(topics.values(), PARTITIONS)))
    orders = {f"o{i}": f"order{i}" for i in range(200)}
    asyncio.run(_produce(broker.bootstrap, topics, orders))
    expected_paid = {(o, f"{v}+pay-{o}") for o, v in orders.items()}
    workers = [_worker(broker, unique, tmp_path, "w1", AGENT_APP_PAUSE_S="0.03").start()]
    try:
        assert wait_for(lambda: workers[0].check() or len(_values(broker, topics["counted"])) >= 30, 120, 0.1)
        workers.append(_worker(broker, unique, tmp_path, "w2", AGENT_APP_PAUSE_S="0.03").start())
        assert {k for k, _ in _values(broker, topics["counted"])} < set(orders), "w1 was through: no test"
        took_a_partition = re.compile(r"join 'paid' assigned actives \[\d")
        assert wait_for(lambda: took_a_partition.search(workers[1].log_path.read_text(errors="replace")), 120)

        def counted_all() -> bool:
            for worker in workers:
                worker.check()
            return {k for k, _ in _values(broker, topics["counted"])} >= set(orders)

        assert wait_for(counted_all, 180), set(orders) - {k for k, _ in _values(broker, topics["counted"])}
        assert wait_for(lambda: set(_values(broker, topics["paid"])) >= expected_paid, 60)
        assert set(_values(broker, topics["paid"])) == expected_paid
        assert set(_values(broker, topics["counted"])) == set(orders.items())
    finally:
        for worker in workers:
            worker.stop(15)
