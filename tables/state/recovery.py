"""Reading a join's changelog into its state partitions: restoring a new active to the
end of its changelog, and tailing the changelog into standbys.

Restore reads from the local checkpoint + 1 up to the high watermark of the fetch
responses, never `end_offsets()` (ListOffsets is short on the embedded broker when a
batch holds several records). Partitions are restored side by side, and each is handed
back (`on_ready`) as soon as it reaches the end, so one long restore never holds up
the others. Progress is logged every few seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from assignor import clients
from assignor.clients import Settings
from tables.kafka.topics import topic_ids
from tables.state.partition import POSITION, StatePartition
from tables.state.store import read_changelog_id, write_changelog_id

log = logging.getLogger(__name__)

# Restore and standbys write to RocksDB every this many changelog records: it bounds
# memory, and keeps the write overlay small.
FLUSH_RECORDS = 2_000
PROGRESS_EVERY_S = 5.0


class RestoreStalled(RuntimeError):
    """Restore made no progress towards the changelog's high watermark for too long."""


@dataclass
class RestoreProgress:
    """How far one partition's restore has come (for the logs, the view and metrics)."""

    partition: int
    started: float = field(default_factory=time.monotonic)
    restored: int = 0  # changelog records applied
    position: int | None = None  # next changelog offset to read
    end: int | None = None  # the changelog's high watermark, once a fetch has seen it
    finished: float | None = None

    @property
    def to_go(self) -> int | None:
        if self.end is None or self.position is None:
            return None
        return max(0, self.end - self.position)

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def rate(self) -> float:
        return self.restored / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        to_go = self.to_go
        eta = f", about {to_go / self.rate:.0f} s to go" if to_go and self.rate > 0 else ""
        left = "?" if to_go is None else f"{to_go:,}"
        return f"{self.restored:,} records restored, {left} to go, {self.rate:,.0f}/s{eta}"


Rebuild = Callable[[int], StatePartition]


class Recovery:
    """Changelog readers for one join's partitions on this worker."""

    def __init__(
        self,
        settings: Settings,
        changelog: str,
        partitions: Mapping[int, StatePartition],
        rebuild: Rebuild,
        stall_timeout_s: float = 120.0,
        reopen: Rebuild | None = None,
    ) -> None:
        self.settings = settings  # the connection (the app's credentials)
        self.changelog = changelog
        self.partitions = partitions  # the join state's live map (entries may be replaced)
        self.rebuild = rebuild
        self.reopen = reopen  # a store whose write failed, reopened at its checkpoint
        self.stall_timeout_s = stall_timeout_s
        self.progress: dict[int, RestoreProgress] = {}
        self.standby_lag: dict[int, int] = {}
        self.events: list[str] = []  # what restores found and did (log start moved, rebuilt)

    def _consumer(self) -> AIOKafkaConsumer:
        return clients.consumer(
            self.settings,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_wait_ms=100,
        )

    async def _seek(self, consumer: AIOKafkaConsumer, partitions: list[int]) -> list[TopicPartition]:
        tps = [TopicPartition(self.changelog, p) for p in partitions]
        topic_id = await self._changelog_id()
        for tp in tps:
            self._check_history(tp.partition, topic_id)
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        for tp in tps:
            checkpoint = self.partitions[tp.partition].checkpoint
            offset = 0 if checkpoint is None else checkpoint + 1
            start = int(starts.get(tp) or 0)
            if offset < start:
                self.note(
                    f"changelog {tp.topic}[{tp.partition}] now starts at {start:,}, after the local "
                    f"state's checkpoint {offset - 1:,} (retention or compaction removed the rest): "
                    f"restoring from {start:,}"
                )
                offset = start
            consumer.seek(tp, offset)
        return tps

    async def _changelog_id(self) -> str | None:
        """The changelog topic's id (None: the broker has none, or did not answer)."""
        try:
            return (await topic_ids(self.settings, [self.changelog])).get(self.changelog)
        except Exception as error:  # only the check below is lost
            log.warning("tandem: no topic id for %s (%r): its history is not checked", self.changelog, error)
            return None

    def _check_history(self, partition: int, topic_id: str | None) -> None:
        """The local state must come from this changelog, not from an earlier topic of the same
        name (deleted and created again, then written past the local checkpoint: its offsets
        would look right, and the restore would skip the new log's first records). The topic
        id is recorded next to the store's files; a store recording another is rebuilt."""
        if topic_id is None:
            return
        state = self.partitions[partition]
        recorded = read_changelog_id(state.store.path, self.changelog)
        if recorded is not None and recorded != topic_id and state.checkpoint is not None:
            self.note(
                f"changelog {self.changelog}[{partition}] is not the log the local state came from "
                f"(topic id {topic_id}, the state's {recorded}: the topic was deleted and created "
                "again): discarding the local state and restoring from the start"
            )
            state = self.rebuild(partition)
        if recorded != topic_id:
            write_changelog_id(state.store.path, self.changelog, topic_id)

    def note(self, message: str) -> None:
        """Log what a restore found and did, and keep it for the view (the last 20)."""
        log.warning("tandem: %s", message)
        self.events = [*self.events[-19:], message]

    async def restore(self, partitions: list[int], on_ready: Callable[[int], None]) -> None:
        """Replay each partition's changelog from its checkpoint to the high watermark,
        calling `on_ready(p)` as each arrives there."""
        if not partitions:
            return
        self._reopen_failed(partitions)
        for p in partitions:
            self.progress[p] = RestoreProgress(p)
        consumer = self._consumer()
        await consumer.start()
        try:
            pending = set(await self._seek(consumer, partitions))
            await self._replay(consumer, pending, on_ready)
        finally:
            await consumer.stop()

    async def _replay(
        self, consumer: AIOKafkaConsumer, pending: set[TopicPartition], on_ready: Callable[[int], None]
    ) -> None:
        # A stall, not a long restore, is an error: the deadline moves with progress.
        deadline = time.monotonic() + self.stall_timeout_s
        logged = time.monotonic()
        while pending:
            if time.monotonic() > deadline:
                raise RestoreStalled(f"changelog {self.changelog} {sorted(tp.partition for tp in pending)}")
            fetched = await consumer.getmany(*pending, timeout_ms=200)
            for tp in pending:
                self._check_not_ahead(consumer, tp)
            for tp, records in fetched.items():
                await self._apply(tp.partition, records)
                deadline = time.monotonic() + self.stall_timeout_s
            for tp in list(pending):
                progress = self.progress[tp.partition]
                progress.end = consumer.highwater(tp)
                progress.position = await consumer.position(tp)
                if progress.end is not None and progress.position >= progress.end:
                    self._flush(tp.partition)
                    progress.finished = time.monotonic()
                    pending.discard(tp)
                    on_ready(tp.partition)
            if pending and time.monotonic() - logged >= PROGRESS_EVERY_S:
                logged = time.monotonic()
                for tp in sorted(pending):
                    log.info("tandem: restoring %s[%s]: %s", tp.topic, tp.partition,
                             self.progress[tp.partition].describe())  # fmt: skip

    def _reopen_failed(self, partitions: list[int]) -> None:
        """A store whose write failed (a full disk) refuses every write until it is reopened, so
        a retry of the restore or the tail would fail forever, even once the space is back.
        Reopen it at its last checkpoint first (raises StoreOpenError while it cannot be)."""
        for partition in partitions:
            failed = self.partitions[partition].store.failed
            if failed is None or self.reopen is None:
                continue
            checkpoint = self.reopen(partition).checkpoint
            self.note(
                f"state of {self.changelog}[{partition}] could not be written "
                f"({errno.errorcode.get(failed.errno or 0, 'an I/O error')}): reopened at its checkpoint "
                f"{checkpoint}, reading the changelog on from there"
            )

    def _check_not_ahead(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """A changelog that ends before our checkpoint is not the log our files came from
        (a recreated topic, a new cluster): drop the files and replay it from the start."""
        state = self.partitions[tp.partition]
        end = consumer.highwater(tp)
        if state.checkpoint is None or end is None or end > state.checkpoint:
            return
        self.note(
            f"changelog {tp.topic}[{tp.partition}] ends at {end:,}, before the local state's "
            f"checkpoint {state.checkpoint:,} (the topic was recreated or truncated): "
            "discarding the local state and restoring from the start"
        )
        self.rebuild(tp.partition)
        consumer.seek(tp, 0)

    async def _apply(self, partition: int, records: list[ConsumerRecord]) -> None:
        """Apply a fetch's records, written every FLUSH_RECORDS; the event loop gets a turn after
        each write (a fetch holds up to 4 MB: tens of thousands of records)."""
        state = self.partitions[partition]
        operator = state.operator
        restore = operator.restore
        for applied, record in enumerate(records, 1):
            key = record.key
            if key.startswith(POSITION):
                state.restore(key, record.value)  # the state's own record (how far the inputs are)
            else:
                restore(key, record.value)
            if applied % FLUSH_RECORDS == 0:
                state.write(record.offset)
                await asyncio.sleep(0)  # nothing pending: a cancellation here loses nothing
        if records:
            operator.finish_restore()
            state.write(records[-1].offset)
        progress = self.progress.get(partition)
        if progress is not None:
            progress.restored += len(records)

    def _flush(self, partition: int) -> None:
        state = self.partitions[partition]
        state.operator.finish_restore()
        if state.overlay.pending:
            state.write(state.checkpoint)

    async def tail(self, partitions: list[int]) -> None:
        """Follow the standbys' changelogs into their own databases until cancelled.
        A broker error restarts the tail from the checkpoints on disk."""
        while True:
            try:
                await self._tail_once(partitions)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("tandem: standby tail of %s %s failed; restarting", self.changelog, partitions)
                for partition in partitions:  # drop what was applied but not written
                    state = self.partitions[partition]
                    if state.store.failed is None:  # a failed store is reopened instead (it may be closed)
                        state.reset()
                await asyncio.sleep(1.0)

    async def _tail_once(self, partitions: list[int]) -> None:
        self._reopen_failed(partitions)
        consumer = self._consumer()
        await consumer.start()
        try:
            tps = await self._seek(consumer, partitions)
            while True:
                fetched = await consumer.getmany(timeout_ms=500)
                for tp, records in fetched.items():
                    await self._apply(tp.partition, records)
                for tp in tps:
                    end, checkpoint = consumer.highwater(tp), self.partitions[tp.partition].checkpoint
                    if end is not None:
                        self.standby_lag[tp.partition] = max(
                            0, end - 1 - (-1 if checkpoint is None else checkpoint)
                        )
        finally:
            await consumer.stop()
