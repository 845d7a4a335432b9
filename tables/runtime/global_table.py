"""A global table on this worker: every partition of a table topic, held whole in this
worker's own RocksDB store, restored before the worker joins its group and kept up to date
while it runs (Kafka Streams' global state store and its GlobalStreamThread).

Its reader is a consumer of its own (the app's connection settings, `assignor.clients`)
assigned every partition of the topic: no group, so the group's assignor never places the
topic, and every worker reads all of it. What it has read is written with the values in one
RocksDB batch (the offsets under their own keys), so after a crash store and offsets agree
and a restart reads only what it missed. A record with a null value deletes its key.

| key | value |
| --- | --- |
| `k` key | the table's current value of `key` |
| `o` partition (4 bytes) | the next offset to read of that partition |
| `n:entries`, `n:bytes` | how many keys the table holds, and their keys' and values' bytes |

The view and /metrics show `status()`: restored or not, how far the restore is, the lag of
the reader, the entries and their bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from assignor import clients
from assignor.clients import Settings
from tables.state.store import PartitionStore, open_store

log = logging.getLogger(__name__)

VALUE = b"k"
OFFSET = b"o"
ENTRIES_KEY = b"n:entries"
BYTES_KEY = b"n:bytes"
_U64 = struct.Struct(">Q")
_PARTITION = struct.Struct(">I")
FOLLOW_POLL_MS = 500
PROGRESS_EVERY_S = 5.0


class GlobalTableError(RuntimeError):
    """The global table cannot be read: the message names the topic and what is wrong."""


def global_store_path(data_dir: Path, topic: str) -> Path:
    """Where the worker keeps a global table: under its join data dir, apart from the joins'
    own partition stores (a join is never named `.global`)."""
    return Path(data_dir) / ".global" / topic


class GlobalTable:
    """One table topic, held whole by this worker."""

    def __init__(
        self,
        topic: str,
        data_dir: Path,
        settings: Settings,
        *,
        stall_timeout_s: float = 120.0,
        sync: bool = False,
    ) -> None:
        self.topic = topic
        self.path = global_store_path(data_dir, topic)
        self.settings = settings
        self.stall_timeout_s = stall_timeout_s
        self.sync = sync
        self.store: PartitionStore | None = None
        self.next_offsets: dict[int, int] = {}  # partition -> next offset to read (what the store holds)
        self.ends: dict[int, int] = {}  # partition -> the high watermark last seen
        self.read_to: dict[int, int] = {}  # partition -> the reader's position (past compacted gaps)
        self.entries = 0
        self.bytes = 0
        self.restored = False
        self.restore_started: float | None = None
        self.restore_seconds: float | None = None
        self.restore_target: dict[int, int] = {}  # partition -> where the restore ends
        self.restore_from: dict[int, int] = {}  # partition -> where it began
        self.updates = 0  # records applied since the worker started (restore and after)
        self.failure: str | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._follower: asyncio.Task[None] | None = None

    # -- lookups (the operators) ------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The table's current value of a serialized key (None: no such key, or deleted)."""
        store = self.store
        if store is None:
            raise RuntimeError(f"the global table {self.topic!r} is not restored yet: no lookup before it is")
        return store.get(VALUE + key)

    # -- restore, then follow ---------------------------------------------------------

    async def restore(self) -> None:
        """Open the store and read every partition of the topic up to its end as found now.
        Raises GlobalTableError (no such topic, or the restore stalled)."""
        if self.restored:
            return
        self.restore_started = time.monotonic()
        self.open()
        consumer = self._consumer = clients.consumer(
            self.settings,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        tps = await self._assign(consumer)
        self.restore_from = {tp.partition: self.next_offsets.get(tp.partition, 0) for tp in tps}
        # Read to the high watermark the fetches report (not ListOffsets: the embedded broker
        # answers it short when a batch holds several records; tables/state/recovery.py).
        pending = set(tps)
        deadline = time.monotonic() + self.stall_timeout_s
        logged = time.monotonic()
        while pending:
            if time.monotonic() > deadline:
                raise GlobalTableError(
                    f"global table {self.topic!r}: the restore made no progress for "
                    f"{self.stall_timeout_s:.0f} s (partitions {sorted(tp.partition for tp in pending)})"
                )
            if await self._read_once(consumer, 200):
                deadline = time.monotonic() + self.stall_timeout_s
            for tp in list(pending):
                high = self.ends.get(tp.partition)
                if high is None:
                    continue
                self.restore_target[tp.partition] = high
                if self.read_to.get(tp.partition, 0) >= high:
                    pending.discard(tp)
            if pending and time.monotonic() - logged >= PROGRESS_EVERY_S:
                logged = time.monotonic()
                log.info("tandem: restoring global table %s: %s", self.topic, self.describe_restore())
        self.restore_seconds = time.monotonic() - self.restore_started
        self.restored = True
        log.info(
            "tandem: global table %s restored: %s entries, %s records read in %.1f s",
            self.topic, self.entries, self.updates, self.restore_seconds,
        )  # fmt: skip

    def follow(self, on_failure: Any = None) -> None:
        """Keep reading the topic in the background (after `restore`)."""
        if self._follower is None or self._follower.done():
            self._follower = asyncio.create_task(self._follow(on_failure), name=f"tandem-global-{self.topic}")

    async def _follow(self, on_failure: Any) -> None:
        consumer = self._consumer
        assert consumer is not None, "restore() first"
        try:
            while True:
                await self._read_once(consumer, FOLLOW_POLL_MS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the store or the broker: stop rather than serve stale lookups
            self.failure = f"{exc.__class__.__name__}: {exc}"
            log.critical(
                "tandem: global table %s cannot be kept up to date: %s", self.topic, exc, exc_info=exc
            )
            if on_failure is not None:
                await on_failure(exc)

    async def stop(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None and not follower.done():
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()
        if self.store is not None:
            self.store.close()
            self.store = None

    # -- reading ------------------------------------------------------------------------

    async def _assign(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        partitions = await self._partitions(consumer)
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        for tp in tps:
            offset = self.next_offsets.get(tp.partition, 0)
            start = int(starts.get(tp) or 0)
            if offset < start:  # retention or compaction removed the rest: what is left is read
                offset = start
            consumer.seek(tp, offset)
        return tps

    async def _partitions(self, consumer: AIOKafkaConsumer) -> set[int]:
        deadline = time.monotonic() + self.stall_timeout_s
        while True:
            found = consumer.partitions_for_topic(self.topic)
            if found:
                return set(found)
            if time.monotonic() > deadline:
                raise GlobalTableError(
                    f"global table {self.topic!r}: no such topic (create it, with the table's records, "
                    "before the workers start)"
                )
            with contextlib.suppress(Exception):
                await consumer._client.force_metadata_update()
            await asyncio.sleep(0.5)

    async def _read_once(self, consumer: AIOKafkaConsumer, timeout_ms: int) -> int:
        """One fetch applied to the store with the offsets it reaches; how many records."""
        fetched = await consumer.getmany(timeout_ms=timeout_ms)
        count = 0
        if fetched:
            count = self.apply(fetched)
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None:
                self.ends[tp.partition] = int(high)
                self.read_to[tp.partition] = int(await consumer.position(tp))
        return count

    def apply(self, fetched: Mapping[TopicPartition, list[ConsumerRecord[Any, Any]]]) -> int:
        """Records of the topic (each with `key`, `value`, `offset`), in offset order per
        partition, written to the store with the offsets they reach; how many were applied."""
        store = self.store
        assert store is not None
        changes: dict[bytes, bytes | None] = {}
        entries, size, count = self.entries, self.bytes, 0
        for tp, records in fetched.items():
            for record in records:
                key = record.key
                if key is None:  # no key to update: a table's record without one is skipped
                    continue
                stored = VALUE + key
                old = changes[stored] if stored in changes else store.get(stored)
                if old is not None:
                    entries -= 1
                    size -= len(key) + len(old)
                if record.value is not None:
                    entries += 1
                    size += len(key) + len(record.value)
                changes[stored] = record.value
                count += 1
            if records:
                next_offset = records[-1].offset + 1
                self.next_offsets[tp.partition] = next_offset
                changes[OFFSET + _PARTITION.pack(tp.partition)] = _U64.pack(next_offset)
        changes[ENTRIES_KEY] = _U64.pack(max(entries, 0))
        changes[BYTES_KEY] = _U64.pack(max(size, 0))
        store.write(changes, None)
        self.entries, self.bytes = max(entries, 0), max(size, 0)
        self.updates += count
        return count

    def open(self) -> None:
        """Open the store and read what it holds: the offsets reached and the entries' count."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        store = self.store = open_store(self.path, sync=self.sync)
        for stored_key, value in store.scan(OFFSET, OFFSET + b"\xff"):
            self.next_offsets[_PARTITION.unpack_from(stored_key, len(OFFSET))[0]] = _U64.unpack(value)[0]
        entries, size = store.get(ENTRIES_KEY), store.get(BYTES_KEY)
        self.entries = _U64.unpack(entries)[0] if entries else 0
        self.bytes = _U64.unpack(size)[0] if size else 0

    # -- what the view and /metrics show ----------------------------------------------------

    def lag(self) -> int | None:
        """Records of the topic not yet in the store (None: its end not known yet)."""
        if not self.ends:
            return None
        return sum(max(0, end - self.read_to.get(p, 0)) for p, end in self.ends.items())

    def restore_progress(self) -> float:
        """How much of the restore is done, 0 to 1 (1 once restored)."""
        if self.restored:
            return 1.0
        total = sum(max(0, end - self.restore_from.get(p, 0)) for p, end in self.restore_target.items())
        if not total:
            return 0.0
        done = sum(
            max(0, min(self.read_to.get(p, 0), end) - self.restore_from.get(p, 0))
            for p, end in self.restore_target.items()
        )
        return done / total

    def describe_restore(self) -> str:
        return f"{self.restore_progress():.0%} ({self.updates:,} records read)"

    def status(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "restored": self.restored,
            "restore_progress": round(self.restore_progress(), 4),
            "restore_seconds": None if self.restore_seconds is None else round(self.restore_seconds, 3),
            "partitions": len(self.ends) or len(self.restore_target),
            "lag": self.lag(),
            "entries": self.entries,
            "bytes": self.bytes,
            "updates": self.updates,
            "failure": self.failure,
        }
