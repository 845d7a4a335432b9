"""Every join of one app on this worker (Kafka Streams' StreamThread and TaskManager): the
consumer's record taker, start-up checks, rebalance hooks, and local state offsets.

The join runtime's consumer (tables/kafka/consumer.py) hands `Runtime` the records of every
join input in whole fetches (no Faust Event or Stream per record); the runtime gives each
join's `JoinTask` (tables/runtime/task.py) its own. Before the worker joins its group, it
checks the data dir, the joins' topics (tables/runtime/startup.py) and Faust's internals;
on each assignment it assigns every task its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from faust.types import TP, AppT

from assignor.clients import ConnectionFailed, app_settings, check_connection
from assignor.faust_adapter import CopartitionError, add_start_check, declare_join, install
from assignor.internals import IncompatibleInternals
from tables.compiled import PARTS
from tables.kafka.batches import producer_of, producer_problems
from tables.kafka.consumer import (
    InputRecord,
    committed_offsets,
    seek,
    shared_topics,
    subscribe,
    take_records,
)
from tables.kafka.handler_sends import collect_handler_sends
from tables.kafka.table_stores import guard_table_stores
from tables.kafka.topics import topic_ids
from tables.records.codecs import CHECK
from tables.runtime.gcpacing import raise_gc_threshold
from tables.runtime.global_table import GlobalTable, GlobalTableError
from tables.runtime.looplag import LoopLag
from tables.runtime.ports import ConsumerOffsets
from tables.runtime.probing import Prober
from tables.runtime.rekeyer import Rekeyer
from tables.runtime.results import Serializers
from tables.runtime.startup import JoinStartupError, prepare_topics
from tables.runtime.task import JoinTask
from tables.settings import RuntimeSettings
from tables.spec import JoinSpec
from tables.state.datadir import (
    DataDirError,
    DataDirLock,
    check_data_dir,
    claim_data_dir,
    lock_data_dir,
    make_private,
    set_umask,
)
from tables.state.faust_stores import FaustStoreGuard
from tables.state.manager import JoinState
from tables.state.store import StateFormatError, local_checkpoints

log = logging.getLogger(__name__)

OFFSETS_REFRESH_S = 2.0  # local offsets for the assignor
# What stops a worker before it joins its group: each says what to change, in one line.
STARTUP_ERRORS = (
    JoinStartupError,
    CopartitionError,
    DataDirError,
    StateFormatError,
    IncompatibleInternals,
    GlobalTableError,
)


async def fatal_at_start(check: Callable[[], Awaitable[None]]) -> None:
    """Run a start-up check; if it finds the worker cannot start, say so in one line (the
    traceback at DEBUG) and exit with code 1 at once, rather than let Faust's crash unwind
    a half-started worker into hundreds of lines of tracebacks."""
    try:
        await check()
    except STARTUP_ERRORS as error:
        log.debug("tandem: the start-up check failed", exc_info=error)
        log.critical("tandem cannot start: %s", str(error).removeprefix("tandem cannot start: "))
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)


class Runtime:
    """Every join of one app: the consumer's record taker, rebalance hooks, state."""

    def __init__(self, app: AppT, settings: RuntimeSettings | None = None) -> None:
        self.app = app
        self.settings = settings or RuntimeSettings.from_env()
        self.tasks: dict[str, JoinTask] = {}
        # A topic may feed several joins; a rekeyed input's source topic feeds its rekeyer.
        self._by_topic: dict[str, list[JoinTask | Rekeyer]] = {}
        self.rekeyers: list[Rekeyer] = []
        self.serializers = Serializers(app)
        self.offsets = ConsumerOffsets(app)  # the inputs' high watermarks and committed offsets
        self._offsets: dict[str, dict[int, int]] = {}  # read by the assignor's thread
        self._installed = False
        self._timer: asyncio.Task[None] | None = None
        self._lock: DataDirLock | None = None
        self.prober = Prober(app, self.tasks, self.refresh_offsets)
        self._prober: asyncio.Task[None] | None = None
        self.faust_stores = FaustStoreGuard()  # the app's Faust table stores, checked as they open
        self.loop_lag = LoopLag()  # the event loop's stalls (the view, /metrics)
        self._loop_lag: asyncio.Task[None] | None = None
        # Global tables by topic (one store and reader per topic, whatever joins look it up).
        self.global_tables: dict[str, GlobalTable] = {}

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir or Path(self.app.conf.datadir) / "tandem-joins"

    @property
    def quiesce_timeout_s(self) -> float:
        """How long a revocation waits for a batch in flight: half a session, 1-10 s."""
        return max(1.0, min(10.0, float(self.app.conf.broker_session_timeout) * 0.5))

    def specs(self) -> list[JoinSpec]:
        return [task.spec for task in self.tasks.values()]

    def add(self, spec: JoinSpec) -> None:
        """Register a declared join (at import time: nothing is read or started here)."""
        if not self._installed:
            self._install()
        task = JoinTask(spec, self)
        self.tasks[spec.name] = task
        for topic in spec.topics:
            self._by_topic.setdefault(topic, []).append(task)
        for repartition in spec.repartitions:
            rekeyer = Rekeyer(spec, repartition, self, task.stats)
            self.rekeyers.append(rekeyer)
            self._by_topic.setdefault(rekeyer.source, []).append(rekeyer)
            # Subscribed as the join's inputs are (tables/kafka/consumer.py `subscribe`): a topic
            # the conductor held as is would count as one a Faust stream reads, whose acks the
            # source's commits would then wait for, and no stream acks them.
            subscribe(self.app, repartition.source.topic)
        # A repartition topic is one of the join's inputs: placed with its co-partition group
        # (its source topic is only consumed, assigned on its own).
        declare_join(
            self.app, topics=[*spec.topics, *spec.table_changelogs()], changelog=spec.changelog_topic
        )
        for side in {spec.left.name: spec.left, spec.right.name: spec.right}.values():
            if side.name in spec.input_topics:  # a global table is read by its own reader, not the group
                subscribe(self.app, side.topic)  # what Faust's conductor holds, it subscribes to

    def _install(self) -> None:
        # The connection before anything connects (the app's first start, before its services);
        # then, before the group is joined, the join's own check: it names the join and creates
        # the join's topics.
        first_start = self.app.on_first_start  # type: ignore[attr-defined]

        async def on_first_start() -> None:
            set_umask(self.settings.umask)  # before Faust or Tandem creates a file (TANDEM_UMASK)
            await first_start()
            if self._loop_lag is None:
                self._loop_lag = asyncio.create_task(self.loop_lag.run())
            await fatal_at_start(self._check_connection)

        self.app.on_first_start = on_first_start  # type: ignore[attr-defined]
        add_start_check(self.app, lambda: fatal_at_start(self._before_joining))
        install(self.app, local_offsets=self.local_offsets)  # the group protocol (checks the internals)
        take_records(self.app, self)  # the runtime's own consumer: join input taken whole
        guard_table_stores(self.faust_stores.open)
        self.app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        self.app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
        self._installed = True

    # -- RecordTaker (called by the consumer, on the app's loop) --------------------------

    def takes(self, topic: str) -> bool:
        return topic in self._by_topic

    async def take(self, records: dict[TP, list[InputRecord]]) -> None:
        for task, taken in self._by_task(records).items():
            await task.take(taken)

    async def dropped(self, records: dict[TP, list[Any]]) -> None:
        for task, dropped in self._by_task(records).items():
            await task.dropped(dropped)

    def _by_task(self, records: dict[TP, list[Any]]) -> dict[JoinTask | Rekeyer, dict[TP, list[Any]]]:
        """Each task's share of a fetch: a topic read by several joins is fetched once and
        handed to each (the records are only read)."""
        by_task: dict[JoinTask | Rekeyer, dict[TP, list[Any]]] = {}
        for tp, found in records.items():
            for task in self._by_topic[tp.topic]:
                by_task.setdefault(task, {})[tp] = found
        return by_task

    def held_back(self) -> set[TP]:
        held: set[TP] = set()
        for task in self.tasks.values():
            held |= task.paused()
        return held

    def commit_offset(self, tp: TP) -> int | None:
        """What Faust may commit for a taken partition: what every join reading it is done
        with (None while one of them has done nothing of it)."""
        found = [task.commit_offset(tp) for task in self._by_topic[tp.topic]]
        return None if None in found else min(found)  # type: ignore[type-var]

    def progressed(self) -> Iterable[TP]:
        committed = committed_offsets(self.app)
        for topic, tasks in self._by_topic.items():
            for tp in {tp for task in tasks for tp in task.committing() if tp.topic == topic}:
                offset = self.commit_offset(tp)
                if offset is not None and offset > (committed.get(tp) or 0):
                    yield tp

    async def rewind(self, restart: dict[TP, int]) -> None:
        """Set input partitions back so that every join reading one gets what it has not
        done: to the earliest first-not-done offset of the joins that read it (a join
        further on skips what it already took: tables/runtime/intake.py). A partition an
        agent reads too goes back to its committed offset, as Faust sets it back at a
        rebalance: what the agent had not acked was dropped from its queue."""
        committed = committed_offsets(self.app)
        shared = shared_topics(self.app)
        for tp, offset in restart.items():
            positions = [offset]
            if tp.topic in shared:
                positions.append(committed.get(tp) or 0)  # nothing committed: from the start
            for task in self._by_topic.get(tp.topic, []):
                done = task.taken_upto(tp)
                positions.append(done if done is not None else committed.get(tp) or 0)
            target = min(positions)
            try:
                await seek(self.app, tp, target)
            except Exception as exc:  # stopping, or no longer assigned: its next owner reads it
                log.debug("tandem: no seek of %s to %s: %r", tp, target, exc)

    def producer(self) -> AIOKafkaProducer:
        return producer_of(self.app)

    async def crash(self, exc: Exception) -> None:
        await self.app.crash(exc)

    async def quiesce(self, partitions: set[TP] | None = None) -> None:
        """Every join and rekeyer finishes what it has in flight, and the joins drop what they
        hold. `partitions`: a cooperative revoke's: only the joins and rekeyers reading one of
        them wait, and the joins drop only what they hold of those."""
        waits: list[Awaitable[None]] = []
        for task in self.tasks.values():
            if partitions is None:
                waits.append(task.quiesce())
                continue
            mine = {tp.partition for tp in partitions if tp.topic in task.spec.input_topics}
            if mine:
                waits.append(task.quiesce(mine))
        for rekeyer in self.rekeyers:
            if partitions is None or any(tp.topic == rekeyer.source for tp in partitions):
                waits.append(rekeyer.quiesce())
        await asyncio.gather(*waits)

    # -- start-up and rebalances ---------------------------------------------------------------

    async def _check_connection(self) -> None:
        """First of all, before Faust's producer and consumer connect: Kafka answers with the
        app's own settings (TLS, SASL). A wrong password or a missing TLS setting is then one
        clear line, where Kafka's clients would only say "Unable to bootstrap"."""
        try:
            await check_connection(app_settings(self.app, "admin"))
        except ConnectionFailed as failed:
            raise JoinStartupError(f"tandem cannot start: {failed}") from None

    async def _before_joining(self) -> None:
        """Before the worker joins its group: the data dir, Faust's producer, partition
        counts, the join's own topics, and the local offsets found on disk (reported at the
        first JoinGroup)."""
        if self._lock is None:  # one worker per data dir, for the life of the process
            check_data_dir(self.data_dir)
            # Faust made its own directories before the umask was set (its app's first start).
            conf = self.app.conf
            make_private(self.settings.umask, self.data_dir, conf.datadir, conf.appdir, conf.tabledir)
            self._lock = lock_data_dir(self.data_dir)
            for directory in self._state_dirs():
                claim_data_dir(directory, str(self.app.conf.id))
            raise_gc_threshold(self.settings.gc_threshold)
        problems = producer_problems(producer_of(self.app))
        if problems:
            raise IncompatibleInternals("Tandem cannot start: " + "; ".join(problems))
        collect_handler_sends(self.app)
        self._log_compiled_parts()
        admin = app_settings(self.app, "admin")
        for task in self.tasks.values():
            task.partitions = await prepare_topics(task.spec, admin, self.settings.create_topics)
        for rekeyer in self.rekeyers:
            rekeyer.partitions = self.tasks[rekeyer.spec.name].partitions
        await self._learn_table_changelog_ids()
        await self._restore_global_tables()
        self.refresh_offsets()

    async def _restore_global_tables(self) -> None:
        """Every global table read to its end before the worker joins its group (its stream
        partitions join only with the whole table), then followed while the worker runs."""
        for task in self.tasks.values():
            spec = task.spec
            if not spec.is_global:
                continue
            table = self.global_tables.get(spec.right.name)
            if table is None:
                table = self.global_tables[spec.right.name] = GlobalTable(
                    spec.right.name,
                    self.data_dir,
                    app_settings(self.app, "global"),
                    stall_timeout_s=self.settings.restore_stall_s,
                    sync=self.settings.sync_writes,
                )
            spec.kind.table = table  # type: ignore[attr-defined]
        for table in self.global_tables.values():
            await table.restore()
            table.follow(self.crash)

    def _state_dirs(self) -> list[Path]:
        """Where this worker keeps state: Faust's data dir (its tables), and Tandem's join dir
        when it lies elsewhere (TANDEM_JOIN_DIR)."""
        faust_dir = Path(self.app.conf.datadir).absolute()
        joins = self.data_dir.absolute()
        return [faust_dir] if joins.is_relative_to(faust_dir) else [faust_dir, joins]

    async def _learn_table_changelog_ids(self) -> None:
        """The topic ids of the Faust tables' changelogs, for the check of their stores (a store
        from a changelog that was deleted and created again is set aside). Never raises: without
        them, only that check is lost."""
        tables = self.app.tables.values()
        changelogs = sorted({t.changelog_topic.get_topic_name() for t in tables})
        try:
            self.faust_stores.record_ids(await topic_ids(app_settings(self.app, "admin"), changelogs))
        except Exception as error:
            log.warning("tandem: no topic ids for %s (%r): their history is not checked", changelogs, error)

    def _log_compiled_parts(self) -> None:
        for part in PARTS:
            if part is not CHECK:  # said per input below
                how = "compiled" if part.active else "pure Python (not built, or TANDEM_PURE_PYTHON=1)"
                log.info("tandem: %s is %s (%s)", part.what, how, part.module)
        in_python = [
            f"{task.spec.name} {side}: {reason}"
            for task in self.tasks.values()
            for side, reason in task.checks_in_python().items()
        ]
        if not in_python:
            check = "compiled (tables/records/_fastcheck)"
        else:
            check = "pure Python for " + "; ".join(in_python)
        log.info("tandem: the per-record input check is %s", check)

    async def _on_assigned(self, sender: AppT, assigned: set[TP], **kwargs: Any) -> None:
        assignor = self.app.assignor
        standby_tps = set(assignor.assigned_standbys())  # warm-ups included (Kafka-wise standbys)
        warmups = assignor.warmups() if hasattr(assignor, "warmups") else {}
        epoch = int(getattr(assignor, "epoch", 0) or 0)
        shared = shared_topics(self.app)
        for task in self.tasks.values():
            spec = task.spec
            if shared & set(spec.input_topics):
                # A Faust stream reads one of its inputs: the stream skips what it had in
                # flight of every partition at a new generation, kept ones included, and reads
                # it again from the committed offset; so does the join (not only the moved).
                await task.quiesce()
            topics = {*spec.input_topics, spec.changelog_topic}
            active = {tp.partition for tp in assigned if tp.topic == spec.left.name}
            standby = {tp.partition for tp in standby_tps if tp.topic in topics}
            warmup = set(warmups.get(spec.changelog_topic, ()))
            await task.assign(active, standby - warmup, epoch, warmup)
        for rekeyer in self.rekeyers:
            rekeyer.assign({tp for tp in assigned if tp.topic == rekeyer.source})
        self.refresh_offsets()
        if self.faust_stores.waiting_for_ids():  # tables whose changelogs Faust just created
            await self._learn_table_changelog_ids()
        if self._timer is None:
            self._timer = asyncio.create_task(self._refresh_offsets_every())
        if self._prober is None:
            self._prober = asyncio.create_task(self.prober.run())

    async def _on_shutdown(self, sender: AppT, **kwargs: Any) -> None:
        for background in (self._timer, self._prober, self._loop_lag):
            if background is not None and not background.done():
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await background
        for task in self.tasks.values():
            await task.stop()
        for table in self.global_tables.values():
            await table.stop()

    # -- local state --------------------------------------------------------------------------

    def open_state(self, spec: JoinSpec) -> JoinState:
        return JoinState(
            app_settings(self.app, "restore"),
            spec.changelog_topic,
            self.data_dir,
            kind=spec.kind,
            ids=spec.ids,
            table=spec.name,
            sync_writes=self.settings.sync_writes,
            stall_timeout_s=self.settings.restore_stall_s,
            send_batch_bytes=self.settings.send_batch_bytes,
        )

    def offsets_on_disk(self, spec: JoinSpec) -> dict[int, int]:
        return local_checkpoints(self.data_dir, spec.name)

    def local_offsets(self) -> dict[str, dict[int, int]]:
        """Changelog offsets of the state on this disk, per join changelog (the assignor
        reads this at every JoinGroup, on the consumer's thread: a cached value)."""
        return self._offsets

    def refresh_offsets(self) -> None:
        self._offsets = {task.spec.changelog_topic: task.local_offsets() for task in self.tasks.values()}

    async def _refresh_offsets_every(self) -> None:
        while True:
            await asyncio.sleep(OFFSETS_REFRESH_S)
            self.refresh_offsets()
