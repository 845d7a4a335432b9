"""The broker-free test driver (tables/testing/driver.py) on real apps: the real codecs and
dead letters, the real operator over RocksDB files, the real handler with its sends and
Faust tables; what comes out is what a worker would produce."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import faust
import pytest

from tables import JoinInput, JoinResults, TandemAssignor, join
from tables.testing import JoinTestDriver

pytestmark = pytest.mark.usefixtures("join_loop")  # the compiled loop and the pure-Python one
counter = itertools.count()


class Order(faust.Record, serializer="json"):
    order_id: int
    customer: str
    cents: int


class Payment(faust.Record, serializer="json"):
    payment_id: str
    order_id: int
    cents: int


def orders_app(
    how: str = "left", fail_on: int | None = None, store: str = "memory://"
) -> tuple[faust.App, Any, dict[str, Any]]:
    """An app with one join of orders and payments (int keys, Records), a handler that sends
    each result and counts paid cents per customer in a table, and may raise on one order."""
    app = faust.App(
        f"driver-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False, store=store
    )
    orders = app.topic("orders", key_type=int, key_serializer="json", value_type=Order, partitions=2)
    payments = app.topic("payments", key_type=int, key_serializer="json", value_type=Payment, partitions=2)
    out = app.topic("paid", key_type=int, key_serializer="json", partitions=2)
    totals = app.Table("totals", default=int, partitions=2)

    @join(
        app, JoinInput(orders, id="order_id"), payments, before=0, after=timedelta(seconds=10),
        grace=timedelta(seconds=1), how=how, tables=[totals],  # type: ignore[arg-type]
    )  # fmt: skip
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for order_id, order, payment, ts in results:
            if order_id == fail_on:
                raise ValueError(f"order {order_id} makes the handler fail")
            await out.send(key=order_id, value={"paid": payment is not None, "ts": ts})
            if order is not None and payment is not None:
                totals[f"{order.customer}@{results.partition}"] += payment.cents

    return app, paid, {"orders": orders, "payments": payments, "out": out, "totals": totals}


def order(n: int, customer: str = "ann") -> Order:
    return Order(order_id=n, customer=customer, cents=100 * n)


def payment(n: int) -> Payment:
    return Payment(payment_id=f"p{n}", order_id=n, cents=100 * n)


async def test_results_sends_and_tables_as_a_worker_makes_them() -> None:
    app, paid, t = orders_app()
    async with JoinTestDriver(paid) as d:
        await d.send(t["orders"], key=1, value=order(1), timestamp=1_000)
        await d.send(t["payments"], key=1, value=payment(1), timestamp=3_000)
        await d.send(t["orders"], key=2, value=order(2, "bob"), timestamp=4_000)
        assert [(s.key, s.value) for s in d.sent(t["out"])] == [(1, {"paid": True, "ts": 3_000})]
        await d.advance(stream_time=20_000)  # order 2's window and grace are past: unmatched
        assert [(s.key, s.value) for s in d.sent(t["out"])][1:] == [(2, {"paid": False, "ts": 4_000})]
        results = d.results()
        assert [(r.key, r.left.order_id, r.right and r.right.payment_id) for r in results] == [
            (1, 1, "p1"),
            (2, 2, None),
        ]
        partition = d.sent(t["out"])[0].partition
        assert d.table(t["totals"]) == {f"ann@{partition}": 100}
        assert d.counters()["results"] == 2 and d.counters()["unmatched"] == 1
        assert d.changelog(partition)  # the state went to its changelog before the files


async def test_bad_records_are_dead_lettered_with_their_category() -> None:
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid) as d:
        await d.send("orders", key=b"1", value=b"{not json", timestamp=1, raw=True)
        await d.send("orders", key=None, value=order(3), timestamp=1)
        await d.send("orders", key=4, value={"order_id": 4, "customer": "x"}, timestamp=1)
        wrong = 1 - d._partition(b"5")  # the other partition than key 5's
        await d.send("payments", key=5, value=payment(5), timestamp=1, partition=wrong)
        await d.send("payments", key=6, value=None, timestamp=1)
        categories = [letter["category"] for letter in d.dead_letters()]
        assert categories == ["undecodable", "null_key", "wrong_type", "wrong_partition"]
        assert all(letter["join"] == "paid" for letter in d.dead_letters())
        counts = d.counters()
        assert counts["null_values"] == {"left": 0, "right": 1}
        assert counts["dead_letters"] == {
            "undecodable": 1,
            "null_key": 1,
            "wrong_type": 1,
            "wrong_partition": 1,
        }


async def test_a_result_that_makes_the_handler_raise_is_dead_lettered_and_the_rest_go_on() -> None:
    app, paid, t = orders_app(how="inner", fail_on=7)
    async with JoinTestDriver(paid) as d:
        for n in (7, 8):
            await d.send(t["orders"], key=n, value=order(n), timestamp=1_000)
            await d.send(t["payments"], key=n, value=payment(n), timestamp=2_000)
        assert [s.key for s in d.sent(t["out"])] == [8]
        (letter,) = d.dead_letters()
        assert letter["category"] == "handler_error" and "order 7 makes the handler fail" in letter["reason"]
        assert d.counters()["handler_restarts"] == 1


async def test_late_records_and_duplicates_are_counted_not_joined() -> None:
    app, paid, t = orders_app(how="inner")
    async with JoinTestDriver(paid, partitions=1) as d:  # one partition: one stream time
        await d.send(t["orders"], key=1, value=order(1), timestamp=100_000)
        await d.send(t["orders"], key=1, value=order(1), timestamp=100_000)  # the same order id
        await d.send(t["orders"], key=2, value=order(2), timestamp=1_000)  # its window is long closed
        await d.send(t["payments"], key=2, value=payment(2), timestamp=1_500)
        counts = d.counters()
        assert counts["duplicates"] == 1 and counts["late"] == 2
        assert d.sent(t["out"]) == []


@pytest.mark.parametrize("how_it_comes_back", ["restart", "restore"])
async def test_state_survives_a_restart_and_a_restore_from_the_changelog(how_it_comes_back: str) -> None:
    app, paid, t = orders_app()
    async with JoinTestDriver(paid) as d:
        await d.send(t["orders"], key=1, value=order(1), timestamp=1_000)
        await d.send(t["orders"], key=2, value=order(2), timestamp=2_000)
        await getattr(d, how_it_comes_back)()
        await d.send(t["payments"], key=1, value=payment(1), timestamp=3_000)
        await d.close_inputs()
        assert sorted((s.key, s.value["paid"]) for s in d.sent(t["out"])) == [(1, True), (2, False)]


async def test_the_same_sends_give_the_same_output() -> None:
    runs = []
    for _ in range(2):
        app, paid, t = orders_app()
        async with JoinTestDriver(paid) as d:
            for n in range(20):
                topic, value = (t["orders"], order(n % 7)) if n % 3 else (t["payments"], payment(n % 7))
                await d.send(topic, key=n % 7, value=value, timestamp=1_000 * (n % 5) + n)
            await d.close_inputs()
            runs.append(([(s.key, s.value, s.partition) for s in d.sent(t["out"])], d.counters()))
    assert runs[0] == runs[1] and runs[0][0]


async def test_the_tables_are_in_memory_with_a_rocksdb_store_on_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where Faust would put RocksDB files (the app's datadir)
    app, paid, t = orders_app(store="rocksdb://")
    async with JoinTestDriver(paid) as d:
        await d.send(t["orders"], key=1, value=order(1), timestamp=1_000)
        await d.send(t["payments"], key=1, value=payment(1), timestamp=2_000)
        partition = d.sent(t["out"])[0].partition
        assert d.table(t["totals"]) == {f"ann@{partition}": 100}
    assert list(tmp_path.iterdir()) == []  # nothing written to disk by the tables


async def test_each_driver_starts_the_tables_of_a_module_level_app_empty() -> None:
    app, paid, t = orders_app()  # one app for both drivers, as a test module imports it
    for _ in range(2):
        async with JoinTestDriver(paid) as d:
            await d.send(t["orders"], key=1, value=order(1), timestamp=1_000)
            await d.send(t["payments"], key=1, value=payment(1), timestamp=2_000)
            partition = d.sent(t["out"])[0].partition
            assert d.table(t["totals"]) == {f"ann@{partition}": 100}
