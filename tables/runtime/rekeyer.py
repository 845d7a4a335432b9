"""A rekeyed input's first leg (`JoinInput(topic, key=...)`; Kafka Streams' repartitioning):
the records of the source topic, as fetched, each given its new key (tables/records/rekey.py)
and produced to the join's repartition topic, `{app id}-{join}-{side}-repartition`, on the
partition the join's partitioner gives that key, with the source record's timestamp (its
event time) and headers. The join then reads the repartition topic as that side's input.

At least once: a source partition's offset moves (what Faust may commit) only once every
record before it is acknowledged by the broker, repartitioned or dead-lettered. A record
read twice (a crash, a rebalance) may be repartitioned twice; the join sees two records.
Records whose key cannot be found (a key function that raises, a null key, an undecodable
value) go to the join's dead-letter topic with the reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from faust.types import TP

from tables.kafka.batches import create_batch, max_record_bytes, start_sending
from tables.kafka.consumer import InputRecord
from tables.records.codecs import Rejected
from tables.records.partitioners import partition_for
from tables.records.sides import Letter
from tables.runtime.output import letter_records
from tables.runtime.ports import Producer
from tables.runtime.stats import JoinStats
from tables.settings import SEND_BATCH_BYTES
from tables.spec import JoinSpec, Repartition

log = logging.getLogger(__name__)


class RekeyWorker(Protocol):
    """What a rekeyer needs of the worker that runs it (tables/runtime/worker.py)."""

    @property
    def quiesce_timeout_s(self) -> float: ...

    def producer(self) -> Producer: ...

    async def rewind(self, restart: dict[TP, int]) -> None: ...

    async def crash(self, exc: Exception) -> None: ...


class Rekeyer:
    """One rekeyed input of one join on this worker: reads its source topic's partitions
    assigned here (the assignor places them freely: they are only consumed)."""

    def __init__(
        self, spec: JoinSpec, repartition: Repartition, worker: RekeyWorker, stats: JoinStats
    ) -> None:
        self.spec = spec
        self.repartition = repartition
        self.source = repartition.source.name
        self.target = repartition.name
        self.worker = worker
        self.stats = stats  # the join's: its dead letters are counted with the join's
        self.rekey = repartition.rekey()
        self.partitions: int | None = None  # the join's partition count (the start-up check)
        self._commit_at: dict[TP, int] = {}  # per source partition: everything before is acknowledged
        self._read_next: dict[TP, int] = {}
        self._assigned: set[TP] | None = None  # None until the first assignment: any
        self._working = asyncio.Lock()
        self._failed = False

    # -- what the runtime asks (as of a JoinTask: tables/runtime/worker.py) --------------------

    async def take(self, records: dict[TP, list[InputRecord]]) -> None:
        """Rekey and produce a fetch's records; their offsets move once all are acknowledged."""
        async with self._working:
            if self._failed:
                return  # the worker is stopping: nothing more moves
            try:
                await self._forward(records)
            except Exception as exc:
                self._failed = True
                log.critical("tandem: join %r cannot repartition %s: %s", self.spec.name, self.source, exc)
                await self.worker.crash(exc)

    async def dropped(self, records: dict[TP, list[Any]]) -> None:
        """Fetched across a rebalance and not taken: read again from the first of them."""
        restart = {}
        for tp, found in records.items():
            if found:
                restart[tp] = min(self._read_next.get(tp, found[0].offset), found[0].offset)
                self._read_next[tp] = restart[tp]
        await self.worker.rewind(restart)

    async def quiesce(self) -> None:
        """Before a revocation or a stop: the fetch in flight is acknowledged (or failed). One
        still waiting on the broker after the worker's quiesce timeout is left to finish: its
        offsets have not moved, so Faust commits only what was acknowledged before it."""
        try:
            await asyncio.wait_for(self._working.acquire(), self.worker.quiesce_timeout_s)
        except TimeoutError:
            log.warning(
                "tandem: join %r: records of %s still unacknowledged at a revocation",
                self.spec.name,
                self.source,
            )
            return
        self._working.release()

    def assign(self, assigned: set[TP]) -> None:
        """Forget source partitions no longer assigned here (their next owner commits them)."""
        self._assigned = set(assigned)
        for found in (self._commit_at, self._read_next):
            for tp in [tp for tp in found if tp not in assigned]:
                del found[tp]

    def paused(self) -> set[TP]:
        return set()

    def commit_offset(self, tp: TP) -> int | None:
        return self._commit_at.get(tp)

    def committing(self) -> Iterable[TP]:
        return self._commit_at.keys()

    def taken_upto(self, tp: TP) -> int | None:
        return self._read_next.get(tp)

    # -- one fetch -----------------------------------------------------------------------------

    async def _forward(self, records: dict[TP, list[InputRecord]]) -> None:
        producer: Any = self.worker.producer()
        partitions = self.partitions
        if partitions is None:
            raise RuntimeError(
                f"the partition count of {self.target} is not known (the start-up check did not run)"
            )
        partitioner = self.spec.partitioner if self.spec.partitioner != "none" else "murmur2"
        key_of = self.rekey.key_of
        acks: list[Any] = []
        letters: list[Letter] = []
        moved: dict[TP, int] = {}
        copies: dict[int, list[tuple[bytes, TP, Any]]] = {}  # repartition partition -> its records
        for tp, found in records.items():
            if not found:
                continue
            for record in found:
                key = key_of(record.value)
                if isinstance(key, Rejected):  # where it was read: the source partition
                    letters.append((tp.topic, tp.partition, record.offset, record.key, record.value, key))
                    continue
                copies.setdefault(partition_for(key, partitions, partitioner), []).append((key, tp, record))
            moved[tp] = found[-1].offset + 1
        sent = 0
        for partition, rows in copies.items():
            started, refused = await self._send_copies(producer, partition, rows)
            acks += started
            sent += len(rows) - len(refused)
            letters += refused
        by_partition: dict[int, list[Any]] = {}  # the dead-letter topic has the join's partition count
        for partition, dead in letter_records(self.spec.name, letters).items():
            by_partition.setdefault(partition % partitions, []).extend(dead)
        for partition, dead in by_partition.items():
            acks += [
                ack for ack, _ in await start_sending(producer, self.spec.dead_letter_topic, partition, dead)
            ]
        await asyncio.gather(*acks)
        for letter in letters:
            self.stats.dead_letters[letter[5].category] += 1
        self.stats.rekeyed[self.repartition.side] += sent
        for tp, offset in moved.items():
            if self._assigned is not None and tp not in self._assigned:
                continue  # revoked while its records were in flight: its next owner reads them again
            self._commit_at[tp] = offset
            self._read_next[tp] = offset

    async def _send_copies(
        self, producer: Any, partition: int, rows: list[tuple[bytes, TP, Any]]
    ) -> tuple[list[Any], list[Letter]]:
        """Produce one repartition partition's copies as whole record batches, each record with
        its own timestamp and headers (far cheaper than a send() each); the acks to await, and
        the dead letters of records too large for the producer even alone in a batch (retried,
        they would stop the worker at every start)."""
        limit = max_record_bytes(producer)
        size = SEND_BATCH_BYTES if limit is None else min(SEND_BATCH_BYTES, limit)
        acks: list[Any] = []
        refused: list[Letter] = []
        batch, count = create_batch(producer, size), 0
        for key, tp, record in rows:
            value, stamp = record.value, record.timestamp
            headers = list(getattr(record, "headers", None) or ())
            if batch.append(key=key, value=value, timestamp=stamp, headers=headers) is None:
                acks.append(await self._close_and_send(producer, batch, partition))
                batch, count = create_batch(producer, size), 0
                batch.append(key=key, value=value, timestamp=stamp, headers=headers)  # alone: it fits
            count += 1
            if count == 1 and limit is not None and batch.size() > limit:
                why = Rejected(
                    f"its repartitioned record is over the producer's max_request_size ({limit})", "too_large"
                )
                refused.append((tp.topic, tp.partition, record.offset, record.key, value, why))
                batch, count = create_batch(producer, size), 0
        if count:
            acks.append(await self._close_and_send(producer, batch, partition))
        return acks, refused

    async def _close_and_send(self, producer: Any, batch: Any, partition: int) -> Any:
        batch.close()
        return await producer.send_batch(batch, self.target, partition=partition)
