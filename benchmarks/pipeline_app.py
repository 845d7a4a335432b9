"""A generic join for benchmarks/bench_pipeline.py: orders and payments by int order id (JSON
keys, `faust.Record` values, the time and the id from fields), a left join of 10 minutes after
the order with a minute of grace, and a handler that only takes its results, so that a worker
replaying the topics is timed on the join, not on what an app does with it.

`faust -A benchmarks.pipeline_app worker`; BENCH_BROKER, BENCH_APP_ID, BENCH_DATA_DIR,
BENCH_WEB_PORT, BENCH_PARTITIONS from the environment.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

from tables import JoinInput, JoinResults, TandemAssignor, join

PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "4"))
app = faust.App(
    os.environ.get("BENCH_APP_ID", "bench-pipeline"),
    broker=os.environ.get("BENCH_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    store="rocksdb://",
    datadir=os.environ.get("BENCH_DATA_DIR", "bench-pipeline-data"),
    web_port=int(os.environ.get("BENCH_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
    consumer_auto_offset_reset="earliest",
)


class Order(faust.Record, serializer="json"):
    order_id: int
    customer: str
    amount_cents: int
    ts: int


class Payment(faust.Record, serializer="json"):
    payment_id: str
    order_id: int
    amount_cents: int
    ts: int


orders = app.topic(
    "bench-orders", key_type=int, key_serializer="json", value_type=Order, partitions=PARTITIONS
)
payments = app.topic(
    "bench-payments", key_type=int, key_serializer="json", value_type=Payment, partitions=PARTITIONS
)


@join(
    app,
    JoinInput(orders, id="order_id"),
    JoinInput(payments, id="payment_id"),
    before=0,
    after=timedelta(minutes=10),
    grace=timedelta(minutes=1),
    how="left",
    timestamp="ts",
)
async def paid(results: JoinResults[int, Any, Any]) -> None:
    async for _batch in results.batches():
        pass
