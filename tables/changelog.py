"""Join state per partition: RocksDB files, a changelog topic, restore and standbys.

    tables = JoinTables(bootstrap, "ad-joins-changelog", data_dir, window=..., join_type=...)
    await tables.start()
    await tables.on_assignment(active={0, 1}, standby={2})  # open/reopen, replay the missed tail
    join = tables.operator(0)                  # the WindowedJoin of partition 0
    results = join.process("left", record)     # 1. process a batch
    join.set_input_offset("impressions", n)    #    (optional: input position, kept with state)
    ...send results to the output topic, await the acks...   # 2. results first
    await tables.commit(0)                     # 3. changelog, then state + offset in one batch
    tables.local_offsets()                     # {partition: last changelog offset on disk}
    tables.changelog_offsets()                 # {changelog topic: local_offsets()}: assignor
    await tables.close()                       # files stay for the next owner on this disk

Partition p of the changelog belongs to task p (same number as the inputs).
Restore reads from the local checkpoint + 1 up to the high watermark of the
fetch responses, never `end_offsets()` (ListOffsets is short on tansu when a
batch holds several records). Guarantees: docs/tables.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.producer.message_accumulator import BatchBuilder

from tables import keys
from tables.join import JoinType, JoinWindow, WindowedJoin
from tables.kv import Overlay
from tables.store import PartitionStore, local_partitions, partition_path

log = logging.getLogger(__name__)

# Restore and standbys write to RocksDB every this many changelog records: it bounds
# memory, and keeps the write overlay small (each of its writes costs O(pending keys)).
RESTORE_FLUSH_RECORDS = 2_000


class RestoreTimeout(RuntimeError):
    """Restore made no progress towards the changelog's high watermark for too long."""


@dataclass
class _Task:
    """The state of one partition held by this worker."""

    store: PartitionStore
    overlay: Overlay
    join: WindowedJoin
    role: str  # "active" or "standby"
    replayed: int = 0
    applied_since_flush: int = 0
    pending_checkpoint: int | None = None


async def create_changelog_topic(
    bootstrap: str, topic: str, partitions: int, retention_ms: int | None = None
) -> None:
    """Create the changelog topic (idempotent). The join writes no tombstones: expired
    records are dropped by time, so give it a retention above window + grace."""
    configs = {"cleanup.policy": "compact,delete" if retention_ms else "compact"}
    if retention_ms:
        configs["retention.ms"] = str(retention_ms)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()


async def send_records(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[tuple[bytes | None, bytes | None]],
    headers: Sequence[tuple[str, bytes]] = (),
) -> int | None:
    """Produce (key, value) records to one partition in order, as whole record batches
    (far cheaper than one send() each), and wait for the acks. Returns the last offset.
    `headers` go on every record.

    Each batch is closed before it is handed over: a closed batch is sent at once,
    an open one would wait out the producer's `linger_ms` first."""
    if not records:
        return None
    batches: list[tuple[BatchBuilder, int]] = []
    batch = producer.create_batch()
    append = batch.append
    on_each = list(headers)
    for key, value in records:
        if append(key=key, value=value, timestamp=None, headers=on_each) is None:
            batches.append((batch, batch.record_count()))
            batch = producer.create_batch()
            append = batch.append
            append(key=key, value=value, timestamp=None, headers=on_each)
    batches.append((batch, batch.record_count()))
    sent = []
    for b, n in batches:
        b.close()
        sent.append((await producer.send_batch(b, topic, partition=partition), n))
    last = -1
    for future, count in sent:
        ack = await future
        last = max(last, ack.offset + count - 1)
    return last


class JoinTables:
    """The join state of every partition this worker owns or stands by for."""

    def __init__(
        self,
        bootstrap: str,
        changelog_topic: str,
        data_dir: Path | str,
        *,
        table: str | None = None,
        window: JoinWindow | None = None,
        join_type: JoinType = JoinType.INNER,
        sync_writes: bool = False,
        restore_timeout_s: float = 120.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.changelog_topic = changelog_topic
        self.data_dir = Path(data_dir)
        self.table = table or changelog_topic
        self.window = window or JoinWindow()
        self.join_type = join_type
        self.sync_writes = sync_writes
        self.restore_timeout_s = restore_timeout_s
        self.replayed: dict[int, int] = {}  # partition -> changelog records its last restore read
        self._tasks: dict[int, _Task] = {}
        self._producer: AIOKafkaProducer | None = None
        self._tail: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, max_batch_size=256 * 1024
        )
        await self._producer.start()

    async def close(self) -> None:
        await self._stop_tailing()
        for partition in list(self._tasks):
            self._close_task(partition)
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    # -- assignment ----------------------------------------------------------

    async def on_assignment(self, active: Iterable[int], standby: Iterable[int]) -> None:
        """Own `active`, stand by for `standby`, close the rest (files stay)."""
        active, standby = set(active), set(standby) - set(active)
        async with self._lock:
            await self._stop_tailing()
            for partition in [p for p in self._tasks if p not in active | standby]:
                self._close_task(partition)
            to_restore = [p for p in sorted(active) if self._role(p) != "active"]
            for partition in sorted(active | standby):
                self._open_task(partition, "active" if partition in active else "standby")
            self.replayed = {p: 0 for p in active}
            await self._restore(to_restore)
            if standby:
                self._tail = asyncio.create_task(self._tail_standbys(sorted(standby)))

    def operator(self, partition: int) -> WindowedJoin:
        """The join of an active partition."""
        task = self._tasks.get(partition)
        if task is None or task.role != "active":
            raise KeyError(f"partition {partition} is not active on this worker")
        return task.join

    def local_offsets(self) -> dict[int, int]:
        """Partition -> last changelog offset held on this disk, open or not."""
        offsets: dict[int, int] = {}
        for partition in local_partitions(self.data_dir, self.table):
            task = self._tasks.get(partition)
            if task is not None:
                checkpoint = task.store.checkpoint
            else:
                checkpoint = PartitionStore.read_checkpoint(self._path(partition))
            if checkpoint is not None:
                offsets[partition] = checkpoint
        return offsets

    def changelog_offsets(self) -> dict[str, dict[int, int]]:
        """`local_offsets()` keyed by changelog topic: the shape the assignor's wire format
        reports (`assignor.faust_adapter.install(app, local_offsets=tables.changelog_offsets)`)."""
        return {self.changelog_topic: self.local_offsets()}

    def assigned(self) -> dict[int, str]:
        """Partition -> "active" or "standby"."""
        return {p: task.role for p, task in self._tasks.items()}

    def _path(self, partition: int) -> Path:
        return partition_path(self.data_dir, self.table, partition)

    def _role(self, partition: int) -> str | None:
        task = self._tasks.get(partition)
        return task.role if task else None

    def _open_task(self, partition: int, role: str) -> None:
        task = self._tasks.get(partition)
        if task is None:
            store = PartitionStore(self._path(partition), sync=self.sync_writes)
            task = self._new_task(store, role)
            self._tasks[partition] = task
        elif task.role != role:
            # Uncommitted work of a demoted active is dropped: the changelog has the truth.
            self._tasks[partition] = self._new_task(task.store, role)

    def _new_task(self, store: PartitionStore, role: str) -> _Task:
        overlay = Overlay(store, unscanned=keys.POINT_ONLY)
        return _Task(store, overlay, WindowedJoin(overlay, self.window, self.join_type), role)

    def _close_task(self, partition: int) -> None:
        self._tasks.pop(partition).store.close()

    # -- processing ----------------------------------------------------------

    async def commit(self, partition: int) -> int | None:
        """Write the partition's changelog records, then its state and their last offset
        in one RocksDB batch. Returns the checkpoint. Call after the batch's results are
        acknowledged and before the input offsets are committed."""
        task = self._tasks[partition]
        assert self._producer is not None, "start() first"
        changes = task.join.take_changes()
        try:
            last = await send_records(self._producer, self.changelog_topic, partition, changes)
        except BaseException:
            # Nothing of this batch reaches the disk; the caller replays its input.
            self._tasks[partition] = self._new_task(task.store, task.role)
            raise
        checkpoint = task.store.checkpoint if last is None else last
        task.store.write(task.overlay.pending, checkpoint)
        task.overlay.clear()
        return checkpoint

    # -- restore and standbys ------------------------------------------------

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_wait_ms=100,
        )

    def _seek_from_checkpoint(self, consumer: AIOKafkaConsumer, partitions: list[int]) -> None:
        tps = [TopicPartition(self.changelog_topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            checkpoint = self._tasks[tp.partition].store.checkpoint
            consumer.seek(tp, 0 if checkpoint is None else checkpoint + 1)

    async def _restore(self, partitions: list[int]) -> None:
        """Replay each partition's changelog from its checkpoint to the high watermark."""
        if not partitions:
            return
        consumer = self._consumer()
        await consumer.start()
        try:
            self._seek_from_checkpoint(consumer, partitions)
            for partition in partitions:
                self._tasks[partition].replayed = 0
            await self._replay_to_high_watermark(consumer, partitions)
        finally:
            await consumer.stop()
        for partition in partitions:
            self.replayed[partition] = self._tasks[partition].replayed

    async def _replay_to_high_watermark(self, consumer: AIOKafkaConsumer, partitions: list[int]) -> None:
        pending = {TopicPartition(self.changelog_topic, p) for p in partitions}
        # A stall, not a long restore, is an error: the deadline moves with progress.
        deadline = time.monotonic() + self.restore_timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise RestoreTimeout(f"changelog {sorted(tp.partition for tp in pending)}")
            fetched = await consumer.getmany(*pending, timeout_ms=200)
            for tp in pending:
                await self._check_not_truncated(consumer, tp)
            for tp, records in fetched.items():
                self._apply(tp.partition, records)
                deadline = time.monotonic() + self.restore_timeout_s
            for tp in list(pending):
                if await at_high_watermark(consumer, tp):
                    self._flush_restored(tp.partition)
                    pending.discard(tp)

    async def _check_not_truncated(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """A changelog that ends before our checkpoint is not the log our files came from
        (a recreated topic, a new cluster): drop the files and replay it from the start."""
        task = self._tasks[tp.partition]
        high_watermark = consumer.highwater(tp)
        if task.store.checkpoint is None or high_watermark is None:
            return
        if high_watermark > task.store.checkpoint:
            return
        log.warning("changelog %s ends before local checkpoint; rebuilding", tp)
        task.store.destroy()
        fresh = self._new_task(PartitionStore(self._path(tp.partition), self.sync_writes), task.role)
        self._tasks[tp.partition] = fresh
        consumer.seek(tp, 0)

    def _apply(self, partition: int, records: list[ConsumerRecord]) -> None:
        task = self._tasks[partition]
        for record in records:
            task.join.restore(record.key, record.value)
            task.pending_checkpoint = record.offset
            task.applied_since_flush += 1
            if task.applied_since_flush >= RESTORE_FLUSH_RECORDS:
                self._flush_restored(partition)
        task.replayed += len(records)

    def _flush_restored(self, partition: int) -> None:
        task = self._tasks[partition]
        if task.pending_checkpoint is None:
            return
        task.join.finish_restore()
        task.store.write(task.overlay.pending, task.pending_checkpoint)
        task.overlay.clear()
        task.pending_checkpoint = None
        task.applied_since_flush = 0

    async def _tail_standbys(self, partitions: list[int]) -> None:
        """Follow the standbys' changelogs into their own databases until reassigned.
        A broker error restarts the tail from the checkpoints on disk."""
        while True:
            try:
                await self._tail_once(partitions)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("standby tail of %s failed; restarting", partitions)
                for partition in partitions:  # drop what was applied but not written
                    task = self._tasks[partition]
                    self._tasks[partition] = self._new_task(task.store, task.role)
                await asyncio.sleep(1.0)

    async def _tail_once(self, partitions: list[int]) -> None:
        consumer = self._consumer()
        await consumer.start()
        try:
            self._seek_from_checkpoint(consumer, partitions)
            while True:
                fetched = await consumer.getmany(timeout_ms=500)
                for tp, records in fetched.items():
                    self._apply(tp.partition, records)
                    self._flush_restored(tp.partition)
        finally:
            await consumer.stop()

    async def _stop_tailing(self) -> None:
        tail, self._tail = self._tail, None
        if tail is None:
            return
        tail.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tail


async def at_high_watermark(consumer: AIOKafkaConsumer, tp: TopicPartition) -> bool:
    """Whether the consumer has read `tp` to the high watermark of its last fetch: the end
    of the log as every broker reports it (the embedded one's ListOffsets is short)."""
    high_watermark = consumer.highwater(tp)
    return high_watermark is not None and await consumer.position(tp) >= high_watermark


async def caught_up(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> bool:
    """Whether every one of `tps` is read to its high watermark."""
    for tp in tps:
        if not await at_high_watermark(consumer, tp):
            return False
    return True
