"""The join written the usual way on Faust's own tables, as a worker:
`faust -A benchmarks.faust_table_app worker` (benchmarks/bench_worker.py).

One Faust `Table` (Faust's RocksDB store, on rocksdict, with its changelog) keyed by
auction id, whose value holds the impressions and clicks seen; an agent reads both
topics one event at a time (`stream.events()`), validates like the reference worker,
matches within the same window, writes the table entry back and sends each result.
What it leaves out, as such code usually does: event-time order across the topics,
expiry (the table grows for ever), late records, unmatched results, the atomic
offset checkpoint. Same settings, consumer timings and topics as `faust -A app
worker` (app/settings.py, Faust's own assignor), and the /tandem/ fields the
benchmark polls.
"""

from __future__ import annotations

import time
from typing import Any

import faust
import orjson
from app.worker import _faust_settings, _tune_consumer
from faust.types import TP
from faust.web import Request, Response, View

from app.settings import from_env
from pipeline.records import Rejected, Side, validate
from tables.operator import JoinWindow, output_record

settings = from_env()
app = faust.App(settings.app_id, **_faust_settings(settings), store="rocksdb://")
_tune_consumer(app, settings)
window = JoinWindow()
inputs = app.topic(settings.impressions, settings.clicks, key_serializer="raw", value_serializer="raw")
joins = app.topic(settings.joins, key_serializer="raw", value_serializer="raw")
seen = app.Table("ad-join-seen", default=dict, partitions=settings.partitions)  # JSON keys and values
positions: dict[TP, int] = {}
counts = {"outputs": 0, "dead_letters": 0}


def _join(side: Side, record: dict[str, Any], entry: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Results of one record against the entry of its auction; the entry gains the record."""
    mine = entry.setdefault(side, [])
    if any(r["event_id"] == record["event_id"] for r in mine):
        return []  # a duplicate
    results = []
    for other in entry.get("right" if side == "left" else "left", []):
        left, right = (record, other) if side == "left" else (other, record)
        if left["ts"] - window.before <= right["ts"] <= left["ts"] + window.after:
            results.append(
                output_record(
                    left["auction_id"],
                    (left["event_id"], left["campaign_id"], left["ts"]),
                    (right["event_id"], right["ts"]),
                )
            )
    mine.append(record)
    return results


@app.agent(inputs, name="ad-join-faust-table")
async def join(stream: faust.StreamT[bytes]) -> None:
    async for event in stream.events():
        message = event.message
        side: Side = "left" if message.topic == settings.impressions else "right"
        record = validate(side, message.key, message.value, int(time.time() * 1000))
        if isinstance(record, Rejected):
            counts["dead_letters"] += 1
        else:
            auction = record["auction_id"]
            entry = seen[auction]
            results = _join(side, record, entry)
            seen[auction] = entry  # Faust writes the store and sends the changelog record
            for result in results:
                await joins.send(key=message.key, value=orjson.dumps(result), partition=message.partition)
            counts["outputs"] += len(results)
        positions[message.tp] = message.offset


@app.page("/tandem/")
async def status(web: View, request: Request) -> Response:
    actives = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == settings.impressions)
    lag: dict[str, int | None] = {}
    for partition in actives:
        total: int | None = 0
        for topic in (settings.impressions, settings.clicks):
            tp = TP(topic, partition)
            try:
                high = app.consumer.highwater(tp)
            except (AssertionError, KeyError):
                high = None
            if high is None or total is None:
                total = None
            else:
                total += max(0, high - 1 - positions.get(tp, -1))
        lag[str(partition)] = total
    return web.json({"actives": actives, "lag": lag, "late": 0, "forced": 0, **counts})
