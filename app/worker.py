"""The Faust app: agents, dead letters, output, rebalance hooks and the web view."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import orjson
from faust.types import TP
from faust.web import Request, Response, View
from mode.utils.futures import notify

from app.alignment import Aligner, InOrderAcks
from app.join_state import TablesState
from app.settings import Settings
from app.state import StateManager
from app.view import render_html
from tables.changelog import send_records
from tables.records import Rejected, Side, validate

# Input batches: up to this many records, or what arrived within this time.
BATCH_MAX = 500
BATCH_WITHIN_S = 0.05
# How often held records are checked when no batch comes (app/alignment.py).
ALIGN_CHECK_S = 0.25

log = logging.getLogger(__name__)


class Worker:
    """One worker's join: owns the state manager and the counters the view shows."""

    def __init__(self, app: faust.App, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        bootstrap = _bootstrap(settings.broker)
        self.state: StateManager | TablesState
        if settings.state == "interim":
            self.state = StateManager(bootstrap, settings.changelog, settings.data_dir, self._send)
        else:
            self.state = TablesState(bootstrap, settings.changelog, settings.data_dir)
        self._starting: asyncio.Future[None] | None = None
        self.positions: dict[TP, int] = {}
        self.dead_letters = 0
        self.aligner: Aligner[tuple[Side, dict[str, Any], Any]] = Aligner(
            [settings.impressions, settings.clicks],
            max_wait_s=settings.align_max_wait_ms / 1000,
            max_held=settings.align_max_held,
        )
        self._output_headers = [("tandem-worker", settings.worker.encode())]
        self._joining = asyncio.Lock()  # the agent and the release timer join in turn
        self._revoking = False  # from Faust's wait for acks until the next assignment
        self.ack: Callable[[Any], Awaitable[Any]] = _no_ack  # the agent's stream.ack
        self._acks: InOrderAcks[TP, Any] = InOrderAcks()  # events in the order they were read
        self.outputs = 0
        self.rebalances = 0
        # Partitions this worker took over in the last rebalance and has not yet emitted
        # a result for: the log says when each produces again (the failover timeline).
        self._awaiting_first: set[int] = set()
        self._received: set[int] = set()
        # Read by the assignor on the consumer's thread at every JoinGroup: a cached
        # value, replaced whole (thread-safe), refreshed on the event loop.
        self.local_offsets: dict[str, dict[int, int]] = {}
        self.refresh_local_offsets()

    def refresh_local_offsets(self) -> None:
        self.local_offsets = {self.settings.changelog: dict(self.state.local_offsets())}

    async def _send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        metadata = await self.app.producer.send_and_wait(topic, key, value, partition, None, None)
        return int(metadata.offset)

    async def ensure_started(self) -> None:
        """Start the state once; the agent and the rebalance hook may both get here first."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self.state.start())
        await asyncio.shield(self._starting)

    async def handle_batch(self, events: list[Any]) -> None:
        """A batch of input events: bad records to the dead-letter topic; valid ones held
        and joined per partition in event-time order (app/alignment.py).

        Each event is acked once its results, dead letter or changelog are acknowledged,
        and after every event read before it from its partition (InOrderAcks): a held
        record is never committed before it is joined (at-least-once)."""
        now = int(time.time() * 1000)
        letters = []
        touched: set[int] = set()
        for event in events:
            message = event.message
            self._acks.read(message.tp, event)
            side: Side = "left" if message.topic == self.settings.impressions else "right"
            checked = validate(side, message.key, message.value, now)
            if isinstance(checked, Rejected):
                letters.append((event, await self._dead_letter(message, checked.reason)))
                self.aligner.skip(message.partition, message.topic, message.offset)
            else:
                item = (side, checked, event)
                self.aligner.add(message.partition, message.topic, message.offset, checked["ts"], item)
                touched.add(message.partition)
        for partition in self._awaiting_first & touched - self._received:
            self._received.add(partition)
            log.info("tandem: partition %s: first records after takeover received", partition)
        await self.ensure_started()
        async with self._joining:
            if self._revoking:
                self._drop()  # read meanwhile: read again after the rebalance
            else:
                await self._join_released(sorted(touched))
        for event, letter in letters:
            await letter
            await self._done(event)
        self.dead_letters += len(letters)

    async def release_waiting(self) -> None:
        """Join held records whose wait is over although no new batch came (timer)."""
        if self._starting is None:
            return
        async with self._joining:
            if not self._revoking:
                await self._join_released(self.aligner.holding())

    async def drop_held(self) -> None:
        """Before a revocation or a stop Faust waits for every event it handed over to be
        acked. Held records are neither joined now (stream time would jump past records
        of the other input still to come, and drop them as late) nor acked (that would
        commit them unjoined): Faust is told to stop waiting for them, commits each input
        only up to its first held record, and after the rebalance seeks every partition
        it assigns back to its committed offset, so they are read again, by this worker
        or the next owner, whose state drops what was already joined as duplicates.
        Until the next assignment, new batches are dropped the same way."""
        async with self._joining:
            self._revoking = True
            held, dropped = self.aligner.held(), self._drop()
        if dropped:
            log.info(
                "tandem: %s held records left to be read again after the rebalance (%s read in all)",
                held,
                dropped,
            )

    def _drop(self) -> int:
        """Forget every record read and not acked, held or joined after one still held:
        Faust stops waiting for them and reads them again from the committed offsets."""
        self.aligner.forget()
        consumer = self.app.consumer
        unacked = consumer._unacked_messages  # Faust's: what wait_empty waits for
        events = self._acks.forget()
        for event in events:
            unacked.discard(event.message)
        # wait_empty rechecks when an ack wakes it, else after a second: wake it now.
        notify(consumer._waiting_for_ack)
        return len(events)

    async def _done(self, event: Any) -> None:
        """A record joined or dead-lettered: ack what its partition has now finished, in the
        order it was read (InOrderAcks)."""
        for finished in self._acks.done(event.message.tp, event):
            await self.ack(finished)

    async def _join_released(self, partitions: list[int]) -> None:
        """Join what each partition releases, the partitions side by side: each waits for
        its results' and changelog's acks (two broker round trips), which overlap."""
        released = {p: self._release(p) for p in partitions}
        await asyncio.gather(*(self._join(p, items) for p, items in released.items() if items))

    async def _join(self, partition: int, items: list[tuple[Side, dict[str, Any], Any]]) -> None:
        if not items:
            return
        before = self.outputs
        emit = functools.partial(self._emit, partition)
        await self.state.process_batch(partition, [(side, record) for side, record, _ in items], emit)
        if partition in self._awaiting_first and self.outputs > before:
            self._awaiting_first.discard(partition)
            log.info("tandem: partition %s: first result after takeover acked", partition)
        positions = self.positions
        for _, _, event in items:
            tp = event.message.tp
            positions[tp] = max(positions.get(tp, -1), event.message.offset)
            await self._done(event)

    def _release(self, partition: int) -> list[tuple[Side, dict[str, Any], Any]]:
        """Held records of the partition now due, given how far each input has been read."""
        consumer = self.app.consumer
        committed = getattr(consumer, "_committed_offset", {})  # Faust's; absent: start 0
        ends: dict[str, int | None] = {}
        starts: dict[str, int | None] = {}
        for topic in (self.settings.impressions, self.settings.clicks):
            tp = TP(topic, partition)
            try:
                ends[topic] = consumer.highwater(tp)  # None until a fetch has seen it
            except (AssertionError, KeyError):
                ends[topic] = None
            # Where this consumer started: the group's committed offset (Faust keeps it).
            starts[topic] = committed.get(tp)
        return self.aligner.release(partition, ends, starts)

    async def _emit(self, partition: int, results: list[dict[str, Any]]) -> None:
        """Send a partition's results to the same partition of the output topic, as whole
        record batches (one send() per result cost more than the join), and wait for the
        acks: before the changelog write, so a crash in between replays the input, which
        re-emits the same join_id (a duplicate, never a loss)."""
        if not results:
            return
        records = [(r["auction_id"].encode(), orjson.dumps(r)) for r in results]
        producer = self.app.producer._ensure_producer()  # Faust's aiokafka producer
        await send_records(producer, self.settings.joins, partition, records, self._output_headers)
        self.outputs += len(results)

    async def _dead_letter(self, message: Any, reason: str) -> Awaitable[Any]:
        """Send one dead letter; the returned future completes when it is acknowledged."""
        value = message.value or b""
        letter = {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "reason": reason,
            "key": None if message.key is None else message.key.decode("utf-8", "replace"),
            "value": value.decode("utf-8", "replace"),
        }
        topic = self.settings.dead_letters
        return await self.app.producer.send(topic, message.key, json.dumps(letter).encode(), None, None, None)

    async def on_assigned(self, assigned: set[TP]) -> None:
        self._revoking = False
        await self.ensure_started()
        self.rebalances += 1
        s = self.settings
        active = {tp.partition for tp in assigned if tp.topic == s.impressions}
        # Stock Faust lists standbys under the inputs, Tandem under the changelog too.
        topics = {s.impressions, s.clicks, s.changelog}
        standby = {tp.partition for tp in self.app.assignor.assigned_standbys() if tp.topic in topics}
        moved = active - set(self.state.active)
        # Before the restore: records of a moved partition may arrive while it runs.
        self._awaiting_first = (self._awaiting_first & active) | moved
        self._received -= moved
        log.info("tandem: assigned actives %s standbys %s: restoring", sorted(active), sorted(standby))
        await self.state.on_assignment(active, standby)
        self.refresh_local_offsets()
        log.info("tandem: restored %s", self.state.rebalance.as_dict())

    def view(self) -> dict[str, Any]:
        """This worker's view of the group (JSON of /tandem/)."""
        state = self.state
        stats = {
            c: {**n, "ctr": round(n["clicks"] / n["impressions"], 4) if n["impressions"] else 0.0}
            for c, n in sorted(state.campaigns().items())
        }
        return {
            "worker": self.settings.worker,
            "host": self.settings.host,
            "rack": self.settings.rack,
            "app_id": self.settings.app_id,
            "url": str(self.app.conf.canonical_url),
            "assignor": self.settings.assignor,
            "state": self.settings.state,
            "actives": sorted(state.active),
            "standbys": sorted(state.standby),
            "wire": _wire(self.app),
            "assignment": _assignment(self.app),
            "lag": {str(p): self._lag(p) for p in sorted(state.active)},
            "standby_lag": {str(p): state.lag(p) for p in sorted(state.standby)},
            "joined": {str(p): n for p, n in sorted(state.joined_counts().items())},
            "outputs": self.outputs,
            "dead_letters": self.dead_letters,
            "held": self.aligner.held(),  # waiting for the other input (app/alignment.py)
            "forced": self.aligner.forced,
            "late": state.late(),
            "replayed_total": state.total_replayed,
            "rebalances": self.rebalances,
            "last_rebalance": state.rebalance.as_dict(),
            "group_rebalance": _group_rebalance(self.app),
            "campaigns": stats,
        }

    def _lag(self, partition: int) -> int | None:
        total = 0
        for topic in (self.settings.impressions, self.settings.clicks):
            tp = TP(topic, partition)
            try:
                high = self.app.consumer.highwater(tp)
            except (AssertionError, KeyError):
                return None
            if high is None:
                return None
            total += max(0, high - 1 - self.positions.get(tp, -1))
        return total


def _assignment(app: faust.App) -> dict[str, dict[str, list[int]]]:
    """The assignor's view of this member (with Tandem it includes the changelog)."""
    found: dict[str, dict[str, list[int]]] = {"active": {}, "standby": {}}
    for kind, tps in (
        ("active", app.assignor.assigned_actives()),
        ("standby", app.assignor.assigned_standbys()),
    ):
        for tp in tps:
            found[kind].setdefault(tp.topic, []).append(tp.partition)
    return {k: {t: sorted(p) for t, p in sorted(v.items())} for k, v in found.items()}


def _group_rebalance(app: faust.App) -> dict[str, Any] | None:
    """The whole group's last rebalance as the Tandem planner counted it (None on stock)."""
    info = getattr(app.assignor, "last_rebalance", None)
    if info is None:
        return None
    stats = info.stats
    return {
        "epoch": info.epoch,
        "protocol": info.protocol,
        "tasks": stats.tasks,
        "kept": stats.kept,
        "moved_warm": stats.moved_warm,
        "moved_cold": stats.moved_cold,
        "plan_ms": stats.plan_ms,
    }


def _bootstrap(url: str) -> str:
    """kafka://h1:9092;h2:9092 -> h1:9092,h2:9092 for aiokafka."""
    return ",".join(part.split("://", 1)[-1] for part in url.replace(";", ",").split(","))


def _wire(app: faust.App) -> dict[str, list[int]]:
    """The Kafka-protocol assignment this member holds, by topic."""
    wire: dict[str, list[int]] = {}
    try:
        tps = app.consumer.assignment()
    except Exception:  # not started yet
        return wire
    for tp in tps:
        wire.setdefault(tp.topic, []).append(tp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(wire.items())}


def build(settings: Settings) -> faust.App:
    """The Faust app configured from `settings` (see app/settings.py)."""
    extra: dict[str, Any] = {}
    if settings.assignor == "tandem":
        extra["PartitionAssignor"] = "assignor.faust_adapter:TandemAssignor"
    app = faust.App(settings.app_id, **_faust_settings(settings), **extra)
    worker = Worker(app, settings)
    app.tandem = worker  # type: ignore[attr-defined]
    _register(app, worker, settings)
    if settings.assignor == "tandem":
        _install_tandem(app, worker, settings)
    _tune_consumer(app, settings)
    _drop_held_before_waiting_for_acks(app, worker)
    return app


def _tune_consumer(app: faust.App, settings: Settings) -> None:
    """Group consumer settings Faust does not expose (docs/embedded-broker.md), for either
    assignor: the fetch wait, and an optional pause before a follower's SyncGroup."""
    base = app.transport.Consumer
    fetch_max_wait_ms = settings.fetch_max_wait_ms

    class TunedConsumer(base):  # type: ignore[misc, valid-type]
        def _new_consumer_thread(self) -> Any:
            thread = super()._new_consumer_thread()
            create = thread._create_worker_consumer

            def create_tuned(transport: Any) -> Any:
                consumer = create(transport)
                # Faust hard-codes 1500 ms; read by the fetcher made in consumer.start().
                consumer._fetch_max_wait_ms = fetch_max_wait_ms
                return consumer

            thread._create_worker_consumer = create_tuned
            return thread

    app.transport.Consumer = TunedConsumer
    if settings.follower_sync_delay_ms > 0:
        _delay_follower_sync(settings.follower_sync_delay_ms / 1000)


def _drop_held_before_waiting_for_acks(app: faust.App, worker: Worker) -> None:
    """Faust waits for every event it handed over to be acked before a revocation or a
    stop goes on (`wait_empty`): held records are left to be read again (drop_held)."""
    base = app.transport.Consumer

    class FlushingConsumer(base):  # type: ignore[misc, valid-type]
        async def wait_empty(self) -> None:
            await worker.drop_held()
            await super().wait_empty()

    app.transport.Consumer = FlushingConsumer


async def _no_ack(event: Any) -> None:
    """Before the agent starts there is no stream to ack on (unit tests)."""


def _delay_follower_sync(seconds: float) -> None:
    """Send a follower's SyncGroup `seconds` after its JoinGroup answer, so that it reaches
    the embedded broker after the leader's (this process has one group consumer)."""
    from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance

    original = CoordinatorGroupRebalance._on_join_follower
    if getattr(original, "tandem_delay", None) is not None:
        return

    async def on_join_follower(self: Any) -> Any:
        await asyncio.sleep(seconds)
        return await original(self)

    on_join_follower.tandem_delay = seconds  # type: ignore[attr-defined]
    CoordinatorGroupRebalance._on_join_follower = on_join_follower  # type: ignore[method-assign]


def _install_tandem(app: faust.App, worker: Worker, settings: Settings) -> None:
    """Tandem's assignor (docs/assignor-adapter.md): one co-partitioned join, local offsets."""
    from assignor.faust_adapter import declare_join, install

    declare_join(app, topics=[settings.impressions, settings.clicks], changelog=settings.changelog)
    install(app, local_offsets=lambda: worker.local_offsets)

    @app.timer(interval=2.0)
    async def refresh_local_offsets() -> None:
        worker.refresh_local_offsets()


def _faust_settings(settings: Settings) -> dict[str, Any]:
    return {
        "broker": settings.broker,
        "datadir": str(settings.data_dir / "faust"),
        "web_port": settings.web_port,
        "web_bind": settings.web_bind,
        "canonical_url": settings.url,
        "table_standby_replicas": settings.standby_replicas,
        "topic_partitions": settings.partitions,
        "topic_replication_factor": settings.replication_factor,
        "broker_session_timeout": settings.session_timeout_ms / 1000,
        "broker_heartbeat_interval": settings.heartbeat_ms / 1000,
        "broker_request_timeout": settings.request_timeout_ms / 1000,
        "consumer_auto_offset_reset": "earliest",
        # No transactions on the embedded broker (docs/embedded-broker.md).
        "processing_guarantee": "at_least_once",
        "broker_commit_interval": 1.0,
        "web_in_thread": False,
    }


def _register(app: faust.App, worker: Worker, settings: Settings) -> None:
    inputs = app.topic(settings.impressions, settings.clicks, key_serializer="raw", value_serializer="raw")

    @app.agent(inputs, name="ad-join")
    async def join(stream: faust.StreamT[bytes]) -> None:
        # Events are acked by the worker once joined: some are held for event-time order.
        worker.ack = stream.ack
        async for events in stream.noack_take(BATCH_MAX, within=BATCH_WITHIN_S):
            await worker.handle_batch(list(events))

    @app.timer(interval=ALIGN_CHECK_S)
    async def release_waiting() -> None:
        await worker.release_waiting()

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: faust.App, revoked: set[TP], **kwargs: Any) -> None:
        log.info("tandem: rebalance started")
        worker.state.rebalance_started()

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: faust.App, assigned: set[TP], **kwargs: Any) -> None:
        await worker.on_assigned(assigned)

    @app.on_before_shutdown.connect
    async def on_shutdown(sender: faust.App, **kwargs: Any) -> None:
        await worker.drop_held()  # read again after the restart
        await asyncio.wait_for(worker.state.close(), 5.0)

    @app.page("/tandem/")
    async def status(web: View, request: Request) -> Response:
        await worker.state.refresh_lag()
        return web.json(worker.view())

    @app.page("/tandem/html")
    async def status_html(web: View, request: Request) -> Response:
        await worker.state.refresh_lag()
        return web.html(render_html(worker.view()))
