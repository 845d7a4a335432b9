"""examples/orders.py end to end with its batch twin: an input with late records, duplicates,
null values, bad records and records that never match, produced with `pipeline.produce`
(the join's partitioner, seq headers) to a broker of its own; two real worker processes, one
SIGKILLed mid-run and restarted; then `python -m pipeline reconcile --app examples.orders`
(in this process, on the shared SparkSession) over the topics and the join's audit.

Expected: nothing missing or spurious, no copy by one writer twice (duplicates only from the
at-least-once window), the dead letters alike, and the counters as sent, the stream's equal to
the twin's (`--strict-counters`: re-read records are skipped, not counted). Run with
`-s` to see the report and the counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import reconcile
from pipeline.apps import find_join
from pipeline.produce import produce
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, wait_for
from tests import pipeline_e2e
from tests.pipeline_e2e import encoded
from tests.spark_fixtures import spark_session

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4  # examples/orders.py's default (ORDERS_PARTITIONS)
MINUTE = 60_000
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def order(i: int) -> dict[str, Any]:
    return {"order_id": i, "customer": f"c{i % 7}", "amount_cents": 100 + i}


def payment(i: int, cents: int | None = None) -> dict[str, Any]:
    return {"payment_id": f"p{i}", "order_id": i, "amount_cents": 100 + i if cents is None else cents}


# Bad records, each with the category both sides must give it.
BAD = [
    ({"side": "left", "key": 1, "value_raw": '{"order_id": 1, "customer": '}, "undecodable"),
    (
        {"side": "left", "key": 2, "value": {"order_id": "two", "customer": "c", "amount_cents": 1}},
        "wrong_type",
    ),
    ({"side": "right", "key": 3, "value": {"payment_id": "p", "amount_cents": 1}}, "wrong_type"),
    ({"side": "right", "key_raw": None, "value": payment(4)}, "null_key"),
    ({"side": "left", "key_raw": "not-an-int", "value": order(5)}, "undecodable"),
    ({"side": "right", "key": 6, "value_raw": "[1, 2]"}, "wrong_type"),
]


def traffic(orders: int, seed: int = 5) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Wave 1, sorted by time as live producers send: orders a second apart, 60 % paid within
    5 minutes, 10 % paid too late for the 10-minute window, every 9th order sent twice, payments
    for orders that never come, null values and bad records. What each side must count."""
    rng = random.Random(seed)
    rows: list[tuple[int, dict[str, Any]]] = []
    expected = {"duplicates": 0, "null_values": 0, "paid": 0}
    for i in range(1, orders + 1):
        ts = T0 + i * 1000
        rows.append((ts, {"side": "left", "key": i, "value": order(i)}))
        if i % 9 == 0:  # the same order again, 20 s later: one record, counted as a duplicate
            rows.append((ts + 20_000, {"side": "left", "key": i, "value": order(i)}))
            expected["duplicates"] += 1
        roll = rng.random()
        if roll < 0.6:
            expected["paid"] += 1
            rows.append((ts + rng.randint(0, 5 * MINUTE), {"side": "right", "key": i, "value": payment(i)}))
        elif roll < 0.7:  # out of the window: never matches (its order comes out unpaid)
            rows.append((ts + 10 * MINUTE + 5000, {"side": "right", "key": i, "value": payment(i, 1)}))
        if i % 30 == 0:  # a payment of an order that never comes
            rows.append((ts + 7, {"side": "right", "key": 900_000 + i, "value": payment(900_000 + i)}))
        if i % 50 == 0:
            rows.append((ts + 3, {"side": "left" if i % 100 else "right", "key": 800_000 + i, "value": None}))
            expected["null_values"] += 1
        if i % 40 == 0:
            bad, _ = BAD[(i // 40) % len(BAD)]
            rows.append((ts + 5, dict(bad)))
    rows.sort(key=lambda r: r[0])
    return [{**row, "timestamp": ts} for ts, row in rows], expected


def drained(bootstrap: str, workers: list[WorkerProcess], topics: list[str]) -> bool:
    return pipeline_e2e.drained(bootstrap, "orders", workers, topics, PARTITIONS)


def test_orders_stream_reconciles_with_its_twin_after_a_kill(spark: SparkSession, tmp_path: Path) -> None:
    spec = find_join("examples.orders", "paid")  # the defaults: app id "orders", 4 partitions
    assert spec.audit
    wave1, expected = traffic(3000)
    # An order an hour later on every partition closes every window: unpaid orders come out.
    tick_ids = {partition_for(str(i).encode(), PARTITIONS, "murmur2"): i for i in range(700_000, 700_100)}
    ticks = [
        {"side": "left", "key": i, "value": order(i), "timestamp": T0 + 120 * MINUTE}
        for i in tick_ids.values()
    ]
    # Then records older than every window: late, dropped by both sides and counted.
    late = [
        {"side": "left", "key": 600_000 + i, "value": order(600_000 + i), "timestamp": T0 + i}
        for i in range(9)
    ]
    late += [
        {"side": "right", "key": i, "value": payment(i), "timestamp": T0 + 60 * MINUTE} for i in range(1, 5)
    ]
    waves = [encoded(spec, wave1, 0)]
    waves.append(encoded(spec, ticks, len(waves[0])))
    waves.append(encoded(spec, late, len(waves[0]) + len(ticks)))

    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        topics = ["orders", "payments", "paid-orders", "customer-payments"]
        asyncio.run(create_topics(broker.bootstrap, topics, PARTITIONS))
        env = {
            **embedded_env(),
            "ORDERS_BROKER": f"kafka://{broker.bootstrap}",
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
            assert wait_for(lambda: _covered(workers), 90), "the workers did not share the partitions"
            # Sent over ~6 s, the kill lands while the workers join it.
            sender = threading.Thread(
                target=lambda: asyncio.run(produce(broker.bootstrap, spec, waves[0], rate=1200))
            )
            sender.start()
            time.sleep(3.0)
            nulls_seen = _null_values(workers[0])
            workers[0].kill()  # mid-run: what it handed over but did not commit is handed over again
            sender.join(60)
            time.sleep(2.0)
            workers[0].start()
            inputs = list(spec.input_topics)
            for wave in waves[1:]:  # each once the stream has taken everything before it
                assert wait_for(lambda: drained(broker.bootstrap, workers, inputs), 120), "the stream lags"
                asyncio.run(produce(broker.bootstrap, spec, wave))
            assert wait_for(lambda: drained(broker.bootstrap, workers, inputs), 120), "the stream lags"
            assert wait_for(lambda: _covered(workers), 60)
            nulls_seen += sum(_null_values(w) for w in workers)

            out = tmp_path / "report.json"
            args = ["--app", "examples.orders", "--bootstrap", broker.bootstrap, "--master", "local[2]",
                    "--examples", "10", "--strict-counters", "--json", str(out)]  # fmt: skip
            status = reconcile.main(args)
            report = json.loads(out.read_text())
        finally:
            for worker in workers:
                worker.stop(15)

    results, letters, counters = report["results"], report["letters"], report["counters"]
    counts = report["twin_counts"]
    print(json.dumps({"results": results, "letters": letters, "counters": counters, "twin": counts,
                      "null_values_counted_by_workers": nulls_seen}, indent=1))  # fmt: skip
    assert status == 0 and report["ok"], report["failures"]
    assert results["missing"] == results["spurious"] == results["repeated"] == results["misplaced"] == 0
    assert results["late_by_stream_only"] == 0
    paid = expected["paid"]
    assert counts["results"] == {"matched": paid, "left_only": 3000 - paid, "right_only": 0}
    assert results["matched"] == 3000
    assert letters["missing"] == letters["spurious"] == letters["other_category"] == 0
    sent_bad: dict[str, int] = {}
    for i in range(40, 3001, 40):
        category = BAD[(i // 40) % len(BAD)][1]
        sent_bad[category] = sent_bad.get(category, 0) + 1
    assert counts["dead_letters"] == dict(sorted(sent_bad.items()))
    assert letters["matched"] == sum(sent_bad.values())
    late_sent = len(late)
    assert counters["twin"] == {"late": late_sent, "duplicates": expected["duplicates"]}
    # Records read again after the kill are skipped as re-reads, not counted by the operator.
    assert counters["stream"] == counters["twin"]
    assert sum(counts["input"]["null_value"].values()) == expected["null_values"]


def _covered(workers: list[WorkerProcess]) -> bool:
    return pipeline_e2e.covered(workers, "paid", PARTITIONS)


def _null_values(worker: WorkerProcess) -> int:
    view = worker.view()
    return sum(view["joins"]["paid"]["null_values"].values()) if view else 0
