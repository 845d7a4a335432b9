"""One partition of a join's state on this worker: its RocksDB store, the write overlay
of the batch in progress, and the join's operator over both (tables/operators/).

Write order of a batch (docs/tables.md, "Guarantees"): the caller first has the
batch's results acknowledged; `commit()` then produces the batch's changelog records
and waits for their acks, and only then writes every state change and the last
changelog offset in one RocksDB write batch. A crash anywhere replays input the
state does not yet hold.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from aiokafka import AIOKafkaProducer

from tables.kafka.batches import send_records
from tables.operators.base import JoinKind, Operator
from tables.operators.kv import Overlay
from tables.settings import SEND_BATCH_BYTES
from tables.state.store import PartitionStore

Role = Literal["active", "standby"]


@dataclass
class StatePartition:
    """The state of one partition held by this worker, as active or standby."""

    store: PartitionStore
    kind: JoinKind
    role: Role
    ids: bool = False  # records carry declared ids (the operator's duplicate check)
    overlay: Overlay = field(init=False)
    operator: Operator = field(init=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget what was applied but not written (the changelog has the truth)."""
        self.overlay = Overlay(self.store, unscanned=self.kind.unscanned)
        self.operator = self.kind.operator(self.overlay, self.ids)

    @property
    def checkpoint(self) -> int | None:
        """The last changelog offset this partition's files hold."""
        return self.store.checkpoint

    async def commit(
        self, producer: AIOKafkaProducer, changelog: str, partition: int, batch_bytes: int = SEND_BATCH_BYTES
    ) -> int | None:
        """Produce the batch's changelog records (record batches of up to `batch_bytes`),
        then write state + checkpoint atomically. Returns the new checkpoint."""
        self.write(await self.send_changes(producer, changelog, partition, batch_bytes))
        return self.checkpoint

    async def send_changes(
        self, producer: AIOKafkaProducer, changelog: str, partition: int, batch_bytes: int = SEND_BATCH_BYTES
    ) -> int | None:
        """The first half of `commit`: produce the batch's changelog records and wait for their
        acks; the checkpoint to `write` with (the last offset written, or the current one)."""
        changes = self.operator.take_changes()
        await asyncio.sleep(0)  # the loop's turn between collecting and encoding a large batch
        try:
            last = await send_records(producer, changelog, partition, changes, batch_bytes=batch_bytes)
        except BaseException:
            self.reset()  # nothing of this batch reaches the disk; its input is read again
            raise
        return self.checkpoint if last is None else last

    def write(self, checkpoint: int | None) -> None:
        """Write what the overlay holds and the checkpoint, in one RocksDB batch."""
        self.store.write(self.overlay.pending, checkpoint)
        self.overlay.clear()
