"""Every join of one app on this worker (Kafka Streams' StreamThread and TaskManager): the
consumer's record taker, start-up checks, rebalance hooks, and local state offsets.

Tandem's consumer (assignor/faust_adapter/consumer.py) hands `Runtime` the records of every
join input in whole fetches (no Faust Event or Stream per record); the runtime gives each
join's `JoinTask` (tables/runtime/task.py) its own. Before the worker joins its group, it
checks the data dir, the joins' topics (tables/runtime/startup.py) and Faust's internals;
on each assignment it assigns every task its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from faust.transport.drivers.aiokafka import server_list
from faust.types import TP, AppT

from assignor.faust_adapter.consumer import InputRecord, add_start_check, committed_offsets, set_record_taker
from assignor.faust_adapter.internals import IncompatibleInternals
from assignor.faust_adapter.partition_assignor import declare_join, install
from tables.compiled import PARTS
from tables.kafka.batches import producer_of, producer_problems
from tables.kafka.handler_sends import collect_handler_sends
from tables.records.codecs import CHECK
from tables.runtime.gcpacing import raise_gc_threshold
from tables.runtime.probing import Prober
from tables.runtime.results import Serializers
from tables.runtime.startup import prepare_topics
from tables.runtime.task import JoinTask
from tables.settings import RuntimeSettings
from tables.spec import JoinSpec
from tables.state.datadir import DataDirLock, check_data_dir, lock_data_dir
from tables.state.manager import JoinState
from tables.state.store import local_checkpoints

log = logging.getLogger(__name__)

OFFSETS_REFRESH_S = 2.0  # local offsets for the assignor


class Runtime:
    """Every join of one app: the consumer's record taker, rebalance hooks, state."""

    def __init__(self, app: AppT, settings: RuntimeSettings | None = None) -> None:
        self.app = app
        self.settings = settings or RuntimeSettings.from_env()
        self.tasks: dict[str, JoinTask] = {}
        self._by_topic: dict[str, JoinTask] = {}
        self.serializers = Serializers(app)
        self._offsets: dict[str, dict[int, int]] = {}  # read by the assignor's thread
        self._installed = False
        self._timer: asyncio.Task[None] | None = None
        self._lock: DataDirLock | None = None
        self.prober = Prober(app, self.tasks, self.refresh_offsets)
        self._prober: asyncio.Task[None] | None = None

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
        for topic in spec.input_topics:
            self._by_topic[topic] = task
        declare_join(
            self.app, topics=[*spec.input_topics, *spec.table_changelogs()], changelog=spec.changelog_topic
        )
        for side in (spec.left, spec.right):
            self.app.topics.add(side.topic)  # Faust subscribes the consumer to what its conductor holds

    def _install(self) -> None:
        # The join's own check first: it names the join and creates the join's topics.
        add_start_check(self.app, self._before_joining)
        install(self.app, local_offsets=self.local_offsets)
        set_record_taker(self.app, self)
        self.app.on_partitions_assigned.connect(self._on_assigned)
        self.app.on_before_shutdown.connect(self._on_shutdown)
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

    def _by_task(self, records: dict[TP, list[Any]]) -> dict[JoinTask, dict[TP, list[Any]]]:
        by_task: dict[JoinTask, dict[TP, list[Any]]] = {}
        for tp, found in records.items():
            by_task.setdefault(self._by_topic[tp.topic], {})[tp] = found
        return by_task

    def held_back(self) -> set[TP]:
        held: set[TP] = set()
        for task in self.tasks.values():
            held |= task.held_back | task.intake.ahead
        return held

    def commit_offset(self, tp: TP) -> int | None:
        return self._by_topic[tp.topic].intake.commit_at.get(tp)

    def progressed(self) -> Iterable[TP]:
        committed = committed_offsets(self.app)
        for task in self.tasks.values():
            for tp, offset in list(task.intake.commit_at.items()):
                if offset > (committed.get(tp) or 0):
                    yield tp

    async def quiesce(self) -> None:
        await asyncio.gather(*(task.quiesce() for task in self.tasks.values()))

    # -- start-up and rebalances ---------------------------------------------------------------

    async def _before_joining(self, bootstrap: list[str]) -> None:
        """Before the worker joins its group: the data dir, Faust's producer, partition
        counts, the join's own topics, and the local offsets found on disk (reported at the
        first JoinGroup)."""
        if self._lock is None:  # one worker per data dir, for the life of the process
            check_data_dir(self.data_dir)
            self._lock = lock_data_dir(self.data_dir)
            raise_gc_threshold(self.settings.gc_threshold)
        problems = producer_problems(producer_of(self.app))
        if problems:
            raise IncompatibleInternals("Tandem cannot start: " + "; ".join(problems))
        collect_handler_sends(self.app)
        self._log_compiled_parts()
        for task in self.tasks.values():
            task.partitions = await prepare_topics(task.spec, ",".join(bootstrap))
        self.refresh_offsets()

    def _log_compiled_parts(self) -> None:
        for part in PARTS:
            if part is not CHECK:  # said per input below
                how = "compiled" if part.active else "pure Python (not built, or TANDEM_PURE_PYTHON=1)"
                log.info("tandem: %s is %s (%s)", part.what, how, part.module)
        in_python = [
            f"{task.spec.name} {side}"
            for task in self.tasks.values()
            for side, codec in task.intake.codecs.items()
            if not codec.compiled
        ]
        if not in_python:
            check = "compiled (tables/records/_fastcheck)"
        elif CHECK.active:
            check = f"pure Python for {', '.join(in_python)}: configurations _fastcheck does not cover"
        else:
            check = "pure Python (tables/records/_fastcheck not built, or TANDEM_PURE_PYTHON=1)"
        log.info("tandem: the per-record input check is %s", check)

    async def _on_assigned(self, sender: AppT, assigned: set[TP], **kwargs: Any) -> None:
        assignor = self.app.assignor
        standby_tps = set(assignor.assigned_standbys())  # warm-ups included (Kafka-wise standbys)
        warmups = assignor.warmups() if hasattr(assignor, "warmups") else {}
        epoch = int(getattr(assignor, "epoch", 0) or 0)
        for task in self.tasks.values():
            spec = task.spec
            topics = {*spec.input_topics, spec.changelog_topic}
            active = {tp.partition for tp in assigned if tp.topic == spec.left.name}
            standby = {tp.partition for tp in standby_tps if tp.topic in topics}
            warmup = set(warmups.get(spec.changelog_topic, ()))
            await task.assign(active, standby - warmup, epoch, warmup)
        self.refresh_offsets()
        if self._timer is None:
            self._timer = asyncio.create_task(self._refresh_offsets_every())
        if self._prober is None:
            self._prober = asyncio.create_task(self.prober.run())

    async def _on_shutdown(self, sender: AppT, **kwargs: Any) -> None:
        for background in (self._timer, self._prober):
            if background is not None and not background.done():
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await background
        for task in self.tasks.values():
            await task.stop()

    # -- local state --------------------------------------------------------------------------

    def open_state(self, spec: JoinSpec) -> JoinState:
        return JoinState(
            ",".join(server_list(self.app.conf.broker, 9092)),
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
