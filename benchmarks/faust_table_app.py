"""The join written the usual way on Faust's own tables, as a worker:
`faust -A benchmarks.faust_table_app worker` (benchmarks/bench_worker.py, bench_failover.py).

One Faust `Table` (Faust's RocksDB store, on rocksdict, with its changelog and standby
replicas) keyed by auction id, whose value holds the impressions and clicks seen; an
agent reads both topics one event at a time (`stream.events()`), validates like the
ad contract's plain statement (app/contract.py), matches within the ad join's window, writes the table
entry back and sends each result (app/contract.py's `result`). What it leaves out,
as such code usually does: event-time order across the topics, expiry (the table grows
for ever), late records, unmatched results, dead-letter topics.

Faust's own assignor, and the reference app's Faust settings (app.join.faust_settings).
Like the Tandem worker on the embedded broker it reads its fetch wait, follower sync
delay and end offsets the way docs/embedded-broker.md says (assignor/faust_adapter/group_consumer.py;
without the end offsets Faust's table recovery stops with ConsistencyError there).
It serves the `/tandem/` fields the benchmarks poll, in the Tandem worker's shape
(`joins: {"ad-join": {...}}`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import faust
import orjson
from faust.types import TP, EventT
from faust.web import Request, Response, View

from app.contract import Rejected, Side, result, validate
from app.join import faust_settings
from app.settings import JOIN_NAME, from_env
from assignor.faust_adapter.group import delay_follower_sync
from assignor.faust_adapter.group_consumer import install_consumer
from assignor.faust_adapter.settings import TandemSettings
from tables.kafka.consumer import committed_offsets
from tables.operators.windowed import JoinWindow

settings = from_env()
app = faust.App(settings.app_id, **faust_settings(settings))
_tuning = TandemSettings.from_env()
install_consumer(app, _tuning.fetch_max_wait_ms, _tuning.fetch_high_watermarks)
delay_follower_sync(_tuning.follower_sync_delay_ms / 1000)

window = JoinWindow()  # the ad join's: a click up to 10 minutes after its impression
inputs = app.topic(settings.impressions, settings.clicks, key_serializer="raw", value_serializer="raw")
joins = app.topic(settings.joins, key_serializer="raw", value_serializer="raw")
positions: dict[TP, int] = {}  # next offset to read, per input partition
counts = {"results": 0, "dead_letters": 0, "duplicates": 0}
read: dict[Side, int] = {"left": 0, "right": 0}  # input records taken, per side


class _Rebalance:
    """What the last assignment did on this worker (the fields of Tandem's view)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.actives: list[int] = []
        self.standbys: list[int] = []
        self.kept: list[int] = []
        self.warm: list[int] = []
        self.cold: list[int] = []
        self.replayed: dict[int, int] = {}
        self.seconds: float | None = None
        self.count = 0

    def assigned(self, actives: list[int], standbys: list[int]) -> None:
        before, held = set(self.actives), set(self.actives) | set(self.standbys)
        self.started, self.seconds = time.monotonic(), None
        self.kept = sorted(before & set(actives))
        self.warm = sorted(p for p in actives if p not in before and p in held)
        self.cold = sorted(p for p in actives if p not in held)
        self.actives, self.standbys, self.replayed = actives, standbys, {}
        self.count += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "moved_warm": self.warm,
            "moved_cold": self.cold,
            "replayed": sum(self.replayed.values()),
            "replayed_by_partition": {str(p): n for p, n in sorted(self.replayed.items())},
            "seconds": self.seconds,
        }


rebalance = _Rebalance()


class CountingTable(faust.Table):  # type: ignore[misc]
    """Faust's Table, counting the changelog records recovery replays into new actives."""

    def apply_changelog_batch(self, batch: Iterable[EventT]) -> None:
        events = list(batch)
        recovery = self.app.tables.recovery
        if recovery.in_recovery:
            for event in events:
                if event.message.tp in recovery.active_tps:
                    partition = event.message.partition
                    rebalance.replayed[partition] = rebalance.replayed.get(partition, 0) + 1
        super().apply_changelog_batch(events)


# What app.Table(...) builds, of the counting class: JSON keys and values.
seen = app.tables.add(
    CountingTable(
        app, name="ad-join-seen", default=dict, partitions=settings.partitions, beacon=app.tables.beacon
    )
)


def _join(side: Side, record: dict[str, Any], entry: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Results of one record against the entry of its auction; the entry gains the record."""
    mine = entry.setdefault(side, [])
    if any(r["event_id"] == record["event_id"] for r in mine):
        counts["duplicates"] += 1
        return []
    found = []
    for other in entry.get("right" if side == "left" else "left", []):
        left, right = (record, other) if side == "left" else (other, record)
        if left["ts"] - window.before <= right["ts"] <= left["ts"] + window.after:
            found.append(result(left, right))
    mine.append(record)
    return found


@app.agent(inputs, name="ad-join-faust-table")
async def join(stream: faust.StreamT[bytes]) -> None:
    async for event in stream.events():
        message = event.message
        side: Side = "left" if message.topic == settings.impressions else "right"
        read[side] += 1
        record = validate(side, message.key, message.value, int(time.time() * 1000))
        if isinstance(record, Rejected):
            counts["dead_letters"] += 1
        else:
            auction = record["auction_id"]
            entry = seen[auction]
            results = _join(side, record, entry)
            seen[auction] = entry  # Faust writes the store and sends the changelog record
            for joined in results:
                await joins.send(key=message.key, value=orjson.dumps(joined), partition=message.partition)
            counts["results"] += len(results)
        positions[message.tp] = message.offset + 1


@app.on_partitions_assigned.connect
async def _assigned(sender: faust.App, assigned: set[TP], **kwargs: Any) -> None:
    changelog = seen.changelog_topic.get_topic_name()
    actives = sorted(tp.partition for tp in assigned if tp.topic == settings.impressions)
    standbys = sorted(tp.partition for tp in app.assignor.assigned_standbys() if tp.topic == changelog)
    rebalance.assigned(actives, standbys)


@app.on_rebalance_complete.connect
async def _recovered(sender: faust.App, **kwargs: Any) -> None:
    rebalance.seconds = round(time.monotonic() - rebalance.started, 3)


def _lag(partition: int) -> int | None:
    total = 0
    for topic in (settings.impressions, settings.clicks):
        tp = TP(topic, partition)
        try:
            high = app.consumer.highwater(tp)
        except (AssertionError, KeyError):
            return None
        if high is None:
            return None
        committed = committed_offsets(app).get(tp) or 0
        total += max(0, high - positions.get(tp, committed))
    return total


def join_view() -> dict[str, Any]:
    """The fields of Tandem's join view this app can fill honestly."""
    done = rebalance.seconds is not None
    return {
        "changelog": seen.changelog_topic.get_topic_name(),
        "actives": rebalance.actives,
        "standbys": rebalance.standbys,
        "restoring": {} if done else {str(p): {} for p in rebalance.warm + rebalance.cold},
        "lag": {str(p): _lag(p) for p in rebalance.actives},
        "read": read,
        "results": counts["results"],
        "dead_letters": counts["dead_letters"],
        "duplicates": counts["duplicates"],
        "late": 0,  # no event time: nothing is ever late
        "forced": 0,
        "held": 0,
        "rebalances": rebalance.count,
        "last_rebalance": rebalance.as_dict(),
    }


@app.page("/tandem/")
async def status(web: View, request: Request) -> Response:
    return web.json(
        {
            "worker": settings.worker,
            "host": settings.host,
            "app_id": settings.app_id,
            "assignor": "faust",
            "joins": {JOIN_NAME: join_view()},
        }  # fmt: skip
    )
