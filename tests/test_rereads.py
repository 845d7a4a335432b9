"""Records read again are told apart from duplicates (tables/records/positions.py).

A worker that restarts, or takes a partition over, reads from the group's committed offset,
which lags behind what its state holds: those records are *re-reads*, skipped and counted
apart; `duplicates` counts only records whose declared id the state already held (what a
producer sent twice). Here on a real worker that never gets to commit its offsets before a
SIGKILL, its successor restoring the state from the changelog alone, and through the test
driver (a restart, a restore from the changelog, a record sent again at its own offset)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from assignor import clients
from tables.testing import JoinTestDriver, LocalCluster, uncommitted
from tables.testing.workers import wait_for
from tests.apps import rereads
from tests.workers import _read

REPO = Path(__file__).resolve().parent.parent
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)
ORDERS = 60
GROUP, INPUTS = rereads.app.conf.id, ["orders", "payments"]


def rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    orders = [{"order_id": f"o{n}", "ts": T0 + n * 1000} for n in range(ORDERS)]
    payments = [
        {"payment_id": f"p{n}", "order_id": f"o{n}", "ts": T0 + n * 1000 + 500} for n in range(ORDERS)
    ]
    return orders, payments


async def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    try:
        for row in records:
            await producer.send(topic, json.dumps(row).encode(), key=row["order_id"].encode())
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.broker
@pytest.mark.timeout(400)
def test_a_takeover_counts_what_it_reads_again_apart_from_a_producers_duplicate(tmp_path: Path) -> None:
    orders, payments = rows()
    resent = dict(orders[7])  # the producer sends one order twice: same id, another offset
    env = {"BROKER_COMMIT_INTERVAL": "3600", "BROKER_COMMIT_EVERY": "1000000"}  # no commit before the kill
    with LocalCluster("tests.apps.rereads", 1, partitions=2, run_dir=tmp_path, cwd=REPO, env=env) as c:
        c.wait_ready()
        asyncio.run(produce(c.bootstrap, "orders", [*orders, resent]))
        asyncio.run(produce(c.bootstrap, "payments", payments))
        expected = {f"o{n}:p{n}" for n in range(ORDERS)}
        first = asyncio.run(_read(c.bootstrap, "paid", lambda rs: set(rs) >= expected, 120))
        c.wait_caught_up()
        victim = c.workers[0]
        join = victim.view()["joins"]["paid-orders"]  # type: ignore[index]
        assert join["duplicates"] == 1 and join["rereads"] == 0, join
        victim.kill()

        c.env = {}  # the successor commits as usual
        successor = c.add_worker("worker-2")  # no files: the state comes from the changelog
        c.wait_ready(timeout=180)
        c.wait_caught_up(timeout=180)
        join = successor.view()["joins"]["paid-orders"]  # type: ignore[index]
        # Everything was read again (nothing committed), and everything was done already.
        assert join["rereads"] == 2 * ORDERS + 1, join
        assert join["duplicates"] == 1, join  # the producer's, kept with the state
        assert sum(join["read"].values()) == 0, join
        metrics = successor.html("/metrics", timeout=10)
        found = [line for line in metrics.splitlines() if line.startswith("tandem_reread_records_total{")]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in found) == 2 * ORDERS + 1, found
        # Nothing joined twice: the output holds each result once.
        after = asyncio.run(_read(c.bootstrap, "paid", lambda rs: set(rs) >= expected, 60))
        assert len(after) == len(first) == ORDERS, (len(first), len(after))

        # Every input offset gets committed, though no record was joined after the takeover
        # (every fetch held re-reads only) and no new input comes.
        def left() -> int:
            return asyncio.run(uncommitted(c.bootstrap, GROUP, INPUTS, 2))

        assert wait_for(lambda: left() == 0, 120), f"input records never committed: {left()}"


def test_the_driver_skips_a_record_sent_again_at_its_offset_and_counts_a_duplicate_id() -> None:
    async def scenario() -> dict[str, Any]:
        async with JoinTestDriver("paid-orders", rereads.app) as t:
            order = rereads.Order(order_id="o1", ts=T0)
            payment = rereads.Payment(payment_id="p1", order_id="o1", ts=T0 + 10)
            await t.send("orders", key="o1", value=order)  # offset 0
            await t.send("payments", key="o1", value=payment)
            await t.send("orders", key="o1", value=order)  # a producer's duplicate: offset 1
            await t.restart()
            await t.send("orders", key="o1", value=order, offset=0)  # read again after the crash
            await t.restore()  # a takeover: the state from the changelog alone
            await t.send("orders", key="o1", value=order, offset=1)
            await t.send("payments", key="o1", value=payment, offset=0)
            assert [s.value for s in t.sent("paid")] == ["o1:p1"]
            return t.counters()

    counters = asyncio.run(scenario())
    assert counters["duplicates"] == 1, counters
    assert counters["rereads"] == 3, counters
