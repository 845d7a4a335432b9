"""An enrichment join for benchmarks/bench_pipeline.py (`--kind temporal`): trades enriched with
the quote of their symbol as of their time (str keys, `faust.Record` values, the time from a
field, trade ids), a left join with 5 s of grace and an hour of history, and a handler that
only takes its results, so that a worker replaying the topics is timed on the join.

`faust -A benchmarks.pipeline_enrich_app worker`; BENCH_BROKER, BENCH_APP_ID, BENCH_DATA_DIR,
BENCH_WEB_PORT, BENCH_PARTITIONS from the environment.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

from tables import JoinInput, JoinResults, TandemAssignor, join_table

PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "4"))
app = faust.App(
    os.environ.get("BENCH_APP_ID", "bench-enrich"),
    broker=os.environ.get("BENCH_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    store="rocksdb://",
    datadir=os.environ.get("BENCH_DATA_DIR", "bench-enrich-data"),
    web_port=int(os.environ.get("BENCH_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
    consumer_auto_offset_reset="earliest",
)


class Trade(faust.Record, serializer="json"):
    trade_id: str
    symbol: str
    qty: int
    price_cents: int
    ts: int


class Quote(faust.Record, serializer="json"):
    symbol: str
    bid_cents: int
    ask_cents: int
    ts: int


trades = app.topic("bench-trades", key_type=str, value_type=Trade, partitions=PARTITIONS)
quotes = app.topic("bench-quotes", key_type=str, value_type=Quote, partitions=PARTITIONS)


@join_table(
    app,
    JoinInput(trades, id="trade_id"),
    quotes,
    grace=timedelta(seconds=5),
    history=timedelta(hours=1),
    how="left",
    timestamp="ts",
)
async def enrich(results: JoinResults[str, Any, Any]) -> None:
    async for _batch in results.batches():
        pass
