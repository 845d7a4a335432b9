"""The orders/payments example (examples/orders.py) end to end: two real worker processes
on the embedded broker, a left join by integer order id with faust.Record values, and a
Faust table of totals per customer read through Faust's routed web view."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
MINUTE = 60_000
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)


def orders_and_payments(n: int, seed: int = 3) -> tuple[list[tuple[int, int, dict[str, Any]]], ...]:
    """(ts, order id, value) of n orders a second apart; 70 % paid 0-5 minutes later, a few
    paid too late (after the 10-minute window); some orders sent twice."""
    rng = random.Random(seed)
    orders, payments = [], []
    for i in range(1, n + 1):
        ts = T0 + i * 1000
        order = {"order_id": i, "customer": f"c{i % 7}", "amount_cents": 100 + i}
        orders.append((ts, i, order))
        if i % 9 == 0:
            orders.append((ts, i, order))  # a duplicate delivery
        roll = rng.random()
        if roll < 0.7:
            payments.append(
                (
                    ts + rng.randint(0, 5 * MINUTE),
                    i,
                    {"payment_id": f"p{i}", "order_id": i, "amount_cents": 100 + i},
                )
            )
        elif roll < 0.8:
            payments.append(
                (ts + 10 * MINUTE + 5000, i, {"payment_id": f"p{i}", "order_id": i, "amount_cents": 1})
            )
    return orders, payments


async def produce(bootstrap: str, rows: list[tuple[str, int, int, dict[str, Any]]]) -> None:
    """(topic, ts, key, value) rows, sent in event-time order as live producers would."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)  # Kafka's murmur2 partitioner
    await producer.start()
    try:
        for topic, ts, key, value in sorted(rows, key=lambda r: r[1]):
            await producer.send(
                topic, json.dumps(value).encode(), key=json.dumps(key).encode(), timestamp_ms=ts
            )
        await producer.flush()
    finally:
        await producer.stop()


def test_orders_left_join_payments_and_totals_per_customer(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    orders, payments = orders_and_payments(120)
    # Far later orders on every partition move each partition's stream time past every
    # window: orders that were never paid come out unmatched (they are never emitted early).
    late_ids = range(10_001, 10_041)
    ticks = [(T0 + 60 * MINUTE, i, {"order_id": i, "customer": "tick", "amount_cents": 0}) for i in late_ids]
    asyncio.run(
        create_topics(
            broker.bootstrap, ["orders", "payments", "paid-orders", "customer-payments"], PARTITIONS
        )
    )
    env = {
        **embedded_env(),
        "ORDERS_BROKER": f"kafka://{broker.bootstrap}",
        "ORDERS_APP_ID": f"orders-{unique}",
        "ORDERS_PARTITIONS": str(PARTITIONS),
        "TANDEM_STANDBY_REPLICAS": "1",
    }
    workers = [
        WorkerProcess(
            name, "examples.orders", tmp_path, {**env, "ORDERS_DATA_DIR": str(tmp_path / name)}, cwd=REPO
        )
        for name in ("w1", "w2")
    ]
    for worker in workers:
        worker.extra_env["ORDERS_WEB_PORT"] = str(worker.port)
        worker.start()
    try:
        assert wait_for(lambda: _covered(workers), 60), "the workers did not share the partitions"
        distinct = {i for _, i, _ in orders}
        paid_in_time = {i: v for ts, i, v in payments if v["amount_cents"] > 1}
        # In three waves, each in the broker before the next is sent: one produced at once
        # could reach a worker's fetch orders first while the payments were not yet written,
        # and the join (rightly, as Kafka Streams) takes payments for caught up, runs its
        # stream time through two minutes of orders and drops payments that then come in
        # late (seen once under a loaded machine). Payments first: their orders still find
        # them in the window; the late payments last, after every order.
        in_time = [("payments", *p) for p in payments if p[1] in paid_in_time]
        too_late = [("payments", *p) for p in payments if p[1] not in paid_in_time]
        for wave in (in_time, [("orders", *o) for o in orders], too_late):
            asyncio.run(produce(broker.bootstrap, wave))
        # The paid orders come out as the orders arrive; only then does (event) time move on,
        # as it would live: an hour later orders on every partition close every window.
        asyncio.run(
            _read(
                broker.bootstrap,
                "paid-orders",
                lambda rs: {r["order_id"] for r in rs} >= set(paid_in_time),
                60,
            )
        )
        asyncio.run(produce(broker.bootstrap, [("orders", *t) for t in ticks]))

        results = asyncio.run(
            _read(broker.bootstrap, "paid-orders", lambda rs: {r["order_id"] for r in rs} >= distinct, 60)
        )
        by_order = {r["order_id"]: r for r in results}
        assert set(by_order) - set(late_ids) == distinct  # every order once (the ticks' windows are open)
        assert {i for i, r in by_order.items() if r["paid"]} == set(paid_in_time)
        assert all(by_order[i]["payment_id"] == f"p{i}" for i in paid_in_time)
        assert len([r for r in results if r["order_id"] in distinct]) == len(
            distinct
        )  # duplicates joined once

        expected: dict[str, int] = {}
        for i, payment in paid_in_time.items():
            customer = f"c{i % 7}"
            expected[customer] = expected.get(customer, 0) + payment["amount_cents"]
        asker = workers[0]
        assert wait_for(lambda: _totals(asker, expected) == expected, 30), (
            _totals(asker, expected),
            expected,
        )
    finally:
        for worker in workers:
            worker.stop(15)


def _covered(workers: list[WorkerProcess]) -> bool:
    actives: list[int] = []
    for worker in workers:
        worker.check()
        view = worker.view()
        if view is None:
            return False
        join = view["joins"]["paid"]
        if join["restoring"] or join["last_rebalance"]["seconds"] is None:
            return False
        actives += join["actives"]
    return sorted(actives) == list(range(PARTITIONS))


def _totals(worker: WorkerProcess, expected: dict[str, int]) -> dict[str, int]:
    """Each customer's total, asked of one worker: Faust routes it to the table's owner."""
    found = {}
    for customer in expected:
        try:
            url = f"http://127.0.0.1:{worker.port}/totals/{customer}/"
            with urllib.request.urlopen(url, timeout=5) as response:
                found[customer] = json.loads(response.read())["cents"]
        except OSError:
            return {}
    return found
