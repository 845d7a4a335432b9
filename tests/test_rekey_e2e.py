"""A rekeyed input end to end (examples/customers.py): orders keyed by order id (3 partitions)
enriched with a customer table keyed by customer id (4 partitions), the orders rekeyed by the
customer id in their value through the join's repartition topic. Two real worker processes on
the embedded broker; one is SIGKILLed while the orders stream in, and restarted.

Judged by every expected result present, each as of its order's time (the customer's tier
before or after its update; no customer for unknown ids), and none spurious; the records whose
key cannot be found are dead-lettered with their reason. Then the batch twin, which reads the
source topic and rekeys it the same way: `python -m pipeline join --app examples.customers`
counts the same results and `reconcile` finds nothing missing or spurious."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from faust.types import TP
from pyspark.sql import SparkSession

from assignor import clients
from assignor.faust_adapter import broker_partition_counts
from pipeline import join as batch_join
from pipeline import reconcile
from tables.records.partitioners import partition_for
from tables.runtime.rekeyer import Rekeyer
from tables.runtime.startup import JoinStartupError, prepare_topics
from tables.runtime.stats import JoinStats
from tables.testing import EmbeddedBroker, LocalCluster, WorkerProcess, create_topics, embedded_env, wait_for
from tables.testing.memory import MemoryRecord
from tests import pipeline_e2e
from tests.spark_fixtures import spark_session
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
ORDER_PARTITIONS = 3
T0 = int(time.time() // 3600 * 3600 * 1000)  # a record over a day ahead of the clock is refused
HOUR = 3_600_000
KNOWN = [f"c{i}" for i in range(12)]  # c12 and c13 are never sent: their orders get no customer
UPDATED = KNOWN[:4]  # their tier changes at UPDATE_TS
UPDATE_TS = T0 + 50_000
ORDERS = 240


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def customers() -> list[tuple[str, int, Any, dict[str, Any] | None]]:
    """(topic, ts, key, value): every known customer a minute before the first order, and a new
    tier for some at UPDATE_TS."""
    rows: list[tuple[str, int, Any, dict[str, Any] | None]] = [
        ("customers", T0 - 60_000, c, {"name": f"name-{c}", "tier": "bronze"}) for c in KNOWN
    ]
    rows += [("customers", UPDATE_TS, c, {"name": f"name-{c}", "tier": "gold"}) for c in UPDATED]
    return rows


def orders(first: int, last: int) -> list[tuple[str, int, Any, dict[str, Any] | None]]:
    """Orders `first`..`last` half a second apart, their customers in turn (c12, c13 unknown)."""
    return [
        (
            "shop-orders",
            T0 + i * 500,
            i,
            {"order_id": i, "customer_id": f"c{i % 14}", "amount_cents": 100 + i},
        )
        for i in range(first, last + 1)
    ]


def bad_orders() -> list[tuple[str, int, Any, dict[str, Any] | bytes | None]]:
    """Records with no customer id to rekey by: dead-lettered by the rekeyer."""
    return [
        ("shop-orders", T0 + 1_000, 90_001, {"order_id": 90_001, "amount_cents": 1}),  # no customer_id
        ("shop-orders", T0 + 1_000, 90_002, None),  # a null value
    ]


def ticks() -> list[tuple[str, int, Any, dict[str, Any] | None]]:
    """An order an hour later on every repartition partition: every order's grace passes."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        customer = f"tick-{n}"
        found.setdefault(partition_for(json.dumps(customer).encode(), PARTITIONS, "murmur2"), customer)
        n += 1
    return [
        ("shop-orders", T0 + HOUR, 80_000 + p, {"order_id": 80_000 + p, "customer_id": c, "amount_cents": 0})
        for p, c in found.items()
    ]


def expected() -> dict[int, tuple[str, str | None, str | None]]:
    """order id -> (customer id, name, tier) as of the order's time."""
    out: dict[int, tuple[str, str | None, str | None]] = {}
    for _, ts, order_id, value in orders(1, ORDERS):
        assert value is not None
        customer = value["customer_id"]
        if customer not in KNOWN:
            out[order_id] = (customer, None, None)
        else:
            tier = "gold" if customer in UPDATED and ts >= UPDATE_TS else "bronze"
            out[order_id] = (customer, f"name-{customer}", tier)
    return out


async def produce(
    bootstrap: str, rows: list[tuple[str, int, Any, Any]], pause_every: int = 0, pause_s: float = 0.05
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)  # Kafka's murmur2 partitioner
    await producer.start()
    try:
        for n, (topic, ts, key, value) in enumerate(rows):
            raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
            await producer.send(topic, raw, key=json.dumps(key).encode(), timestamp_ms=ts)
            if pause_every and n % pause_every == 0:
                await producer.flush()
                await asyncio.sleep(pause_s)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.spark
def test_orders_rekeyed_by_customer_enriched_through_a_kill(spark: SparkSession, tmp_path: Path) -> None:
    want = expected()
    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        asyncio.run(create_topics(broker.bootstrap, ["shop-orders"], ORDER_PARTITIONS))
        asyncio.run(create_topics(broker.bootstrap, ["customers", "enriched-orders"], PARTITIONS))
        asyncio.run(produce(broker.bootstrap, customers()))
        env = {
            **embedded_env(),
            "SHOP_BROKER": f"kafka://{broker.bootstrap}",
            "TANDEM_STANDBY_REPLICAS": "1",
            "TANDEM_ALIGN_MAX_WAIT_MS": "30000",
        }
        workers = [
            WorkerProcess(
                name, "examples.customers", tmp_path, {**env, "SHOP_DATA_DIR": str(tmp_path / name)}, cwd=REPO
            )
            for name in ("w1", "w2")
        ]
        for worker in workers:
            worker.extra_env["SHOP_WEB_PORT"] = str(worker.port)
            worker.start()
        try:
            assert wait_for(lambda: pipeline_e2e.covered(workers, "enrich", PARTITIONS), 120), "not shared"
            asyncio.run(produce(broker.bootstrap, bad_orders()))
            # The orders stream in over several seconds; one worker is killed among them.
            # (4 orders every 0.1 s or more: 6 s at least)
            sender = threading.Thread(
                target=lambda: asyncio.run(
                    produce(broker.bootstrap, orders(1, ORDERS), pause_every=4, pause_s=0.1)
                )
            )
            sender.start()
            time.sleep(2.5)
            assert sender.is_alive(), "the orders were all sent before the kill"
            workers[0].kill()  # what it produced or handed over but did not commit is done again
            sender.join(120)
            time.sleep(2.0)
            workers[0].start()
            assert wait_for(lambda: pipeline_e2e.covered(workers, "enrich", PARTITIONS), 120), "not shared"
            assert wait_for(
                lambda: pipeline_e2e.drained(
                    broker.bootstrap, "shop", workers, ["shop-orders"], ORDER_PARTITIONS
                ),
                120,
            ), "the orders were not all repartitioned"
            asyncio.run(produce(broker.bootstrap, ticks()))
            out = asyncio.run(
                _read(
                    broker.bootstrap,
                    "enriched-orders",
                    lambda rs: {r["order_id"] for r in rs} >= set(want),
                    120,
                )
            )
            letters = asyncio.run(
                _read(broker.bootstrap, "shop-enrich-dead-letters", lambda rs: len(rs) >= 2, 30)
            )
            spark_args = [
                "--app",
                "examples.customers",
                "--join",
                "enrich",
                "--bootstrap",
                broker.bootstrap,
                "--master",
                "local[2]",
            ]
            batch_path, report_path = tmp_path / "batch.json", tmp_path / "report.json"
            batch_status = batch_join.main([*spark_args, "--json", str(batch_path)])
            status = reconcile.main([*spark_args, "--examples", "10", "--json", str(report_path)])
            batch, report = json.loads(batch_path.read_text()), json.loads(report_path.read_text())
        finally:
            for worker in workers:
                worker.stop(15)

    found = {(r["order_id"], r["customer_id"], r["name"], r["tier"]) for r in out}
    wanted = {(order_id, *details) for order_id, details in want.items()}
    assert wanted - found == set(), f"missing: {sorted(wanted - found)[:10]}"
    assert found - wanted == set(), f"spurious: {sorted(found - wanted)[:10]}"
    assert {r["order_id"] for r in out} == set(want)  # the ticks' grace never passes
    reasons = {json.loads(r["key"]): (r["category"], r["topic"]) for r in letters}
    assert reasons == {90_001: ("wrong_type", "shop-orders"), 90_002: ("null_key", "shop-orders")}, letters

    # The batch twin: the same results from the source topic, the same dead letters.
    print(json.dumps({"batch": batch, "report": report}, indent=1))
    known = sum(1 for _, name, _ in want.values() if name is not None)
    assert batch_status == 0
    assert batch["results"] == {"matched": known, "left_only": len(want) - known, "right_only": 0}
    assert batch["dead_letters"] == {"null_key": 1, "wrong_type": 1}
    results, letters_found = report["results"], report["letters"]
    assert status == 0 and report["ok"], report["failures"]
    assert results["missing"] == results["spurious"] == results["misplaced"] == 0
    assert results["matched"] == len(want)
    assert letters_found["matched"] == 2 and letters_found["missing"] == letters_found["spurious"] == 0


def test_the_repartition_topic_is_made_with_the_joins_count_or_checked_with_creation_off(
    broker: EmbeddedBroker, unique: str
) -> None:
    from tests.test_rekey import shop  # a join declared in an app of its own, not started

    enrich, _ = shop(prefix=f"{unique}-")
    orders_topic, customers_topic = f"{unique}-orders", f"{unique}-customers"
    enrich.app.conf.topic_allow_declare = False  # inputs are never made by the join
    repartition = enrich.repartitions[0].name
    asyncio.run(create_topics(broker.bootstrap, [customers_topic], PARTITIONS))
    settings = clients.settings_of(broker.bootstrap)
    with pytest.raises(JoinStartupError, match=rf"input topic\(s\) \['{orders_topic}'\] do not exist"):
        asyncio.run(prepare_topics(enrich, settings))
    asyncio.run(create_topics(broker.bootstrap, [orders_topic], ORDER_PARTITIONS))
    with pytest.raises(JoinStartupError) as off:
        asyncio.run(prepare_topics(enrich, settings, create=False))
    assert (
        f"{repartition} is missing: kafka-topics.sh --bootstrap-server {broker.bootstrap} --create "
        f"--topic {repartition} --partitions {PARTITIONS} --replication-factor 1"
    ) in str(off.value)
    assert asyncio.run(prepare_topics(enrich, settings)) == PARTITIONS
    counts = asyncio.run(broker_partition_counts(settings, {repartition, orders_topic}))
    assert counts == {repartition: PARTITIONS, orders_topic: ORDER_PARTITIONS}


class _Worker:
    """What a rekeyer needs of its worker (`RekeyWorker`): a real producer on the broker."""

    quiesce_timeout_s = 10.0

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self.crashed: list[Exception] = []

    def producer(self) -> Any:
        return self._producer

    async def rewind(self, restart: dict[TP, int]) -> None:
        raise AssertionError(f"nothing is dropped here: {restart}")

    async def crash(self, exc: Exception) -> None:
        self.crashed.append(exc)


def test_a_source_offset_moves_only_once_its_repartitioned_records_are_acknowledged(
    unique: str, tmp_path: Path
) -> None:
    """The broker paused (SIGSTOP) while a fetch is repartitioned: the source offset stays
    where it was until the broker answers; then it moves past the fetch."""
    from tests.test_rekey import Order, shop

    enrich, _ = shop(prefix=f"{unique}-")
    repartition = enrich.repartitions[0]
    source = TP(repartition.source.name, 1)

    def fetch(first: int, last: int) -> list[MemoryRecord]:
        return [
            MemoryRecord(
                str(n).encode(),
                Order(order_id=n, customer_id=f"c{n}", ts=0).dumps(),
                T0 + n,
                [("seq", b"1")],
                n,
            )
            for n in range(first, last + 1)
        ]

    async def run(broker: EmbeddedBroker) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            worker = _Worker(producer)
            rekeyer = Rekeyer(enrich, repartition, worker, JoinStats())
            rekeyer.partitions = PARTITIONS
            await rekeyer.take({source: fetch(0, 2)})
            assert rekeyer.commit_offset(source) == 3
            broker.pause()
            assert wait_for(lambda: _stopped(broker), 10), "the broker did not stop"
            try:
                taking = asyncio.create_task(rekeyer.take({source: fetch(3, 4)}))
                await asyncio.sleep(2.0)
                assert not taking.done() and rekeyer.commit_offset(source) == 3, "committed before the ack"
            finally:
                broker.resume()
            await asyncio.wait_for(taking, 60)
            assert rekeyer.commit_offset(source) == 5 and not worker.crashed
            # A record the producer cannot send (over its max_request_size, 1 MB) is dead-lettered.
            huge = Order(order_id=5, customer_id="c5" + "x" * 1_100_000, ts=0).dumps()
            await rekeyer.take({source: [MemoryRecord(b"5", huge, T0, [], 5), *fetch(6, 6)]})
            assert rekeyer.commit_offset(source) == 7 and not worker.crashed
        finally:
            await producer.stop()

    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        asyncio.run(create_topics(broker.bootstrap, [repartition.name, enrich.dead_letter_topic], PARTITIONS))
        asyncio.run(run(broker))
        copies = asyncio.run(_read(broker.bootstrap, repartition.name, lambda rs: len(rs) >= 6, 30))
        letters = asyncio.run(_read(broker.bootstrap, enrich.dead_letter_topic, lambda rs: len(rs) >= 1, 30))
    assert sorted(r["order_id"] for r in copies) == [0, 1, 2, 3, 4, 6]
    assert [(r["category"], r["partition"], r["offset"]) for r in letters] == [("too_large", 1, 5)]


def _stopped(broker: EmbeddedBroker) -> bool:
    """Every thread of the broker stopped: SIGSTOP reaches a busy thread a little later (an
    ack was seen 0.6 ms after the signal)."""
    tasks = Path(f"/proc/{broker.pid}/task")
    return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks.iterdir())


DISCOUNTS = {"bronze": 5, "gold": 10}  # the tiers' global table in the example's cluster


def _tiers_held(c: LocalCluster) -> bool:
    view = c.workers[0].view() or {}
    return (view.get("global_tables", {}).get("tiers") or {}).get("entries", 0) >= len(DISCOUNTS)


def test_the_customers_example_runs_in_a_local_cluster(tmp_path: Path) -> None:
    """`python -m tables.dev examples.customers`'s cluster: the source topic is created with
    the join's topics (its own count), an order comes out with its customer, and then priced
    from the tiers' global table (every tier's discount, none for an order without a tier)."""
    with LocalCluster("examples.customers", 1, partitions=PARTITIONS, run_dir=tmp_path, cwd=REPO) as c:
        c.wait_ready()
        counts = asyncio.run(
            broker_partition_counts(clients.settings_of(c.bootstrap), {"shop-orders", "tiers"})
        )
        assert counts == {"shop-orders": ORDER_PARTITIONS, "tiers": 1}
        tiers = [("tiers", T0 - 60_000, tier, {"discount_percent": d}) for tier, d in DISCOUNTS.items()]
        asyncio.run(produce(c.bootstrap, tiers))
        deadline = time.monotonic() + 90
        while not _tiers_held(c):  # the worker's reader follows the table while it runs
            assert time.monotonic() < deadline, "the tiers never reached the worker's global table"
            time.sleep(0.5)
        asyncio.run(produce(c.bootstrap, customers()))
        asyncio.run(produce(c.bootstrap, [*orders(1, 20), *ticks()]))
        out = asyncio.run(_read(c.bootstrap, "enriched-orders", lambda rs: len(rs) >= 20, 90))
        priced = asyncio.run(
            _read(
                c.bootstrap, "priced-orders", lambda rs: {r["order_id"] for r in rs} >= set(range(1, 21)), 90
            )
        )
        view = c.workers[0].view()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{c.workers[0].port}/metrics", timeout=10).read()
    assert view is not None
    rekeyed = view["joins"]["enrich"]["rekeyed"]
    assert rekeyed == {
        "left": {"source": "shop-orders", "topic": "shop-enrich-left-repartition", "records": 24}
    }
    assert b'tandem_rekeyed_records_total{join="enrich",side="left"' in metrics
    want = expected()
    assert {(r["order_id"], r["customer_id"], r["name"], r["tier"]) for r in out} == {
        (order_id, *want[order_id]) for order_id in range(1, 21)
    }
    discounts = {r["order_id"]: (r["tier"], r["discount_percent"]) for r in priced if r["order_id"] <= 20}
    assert discounts == {
        order_id: (want[order_id][2], DISCOUNTS.get(want[order_id][2] or "")) for order_id in range(1, 21)
    }
