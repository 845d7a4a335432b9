"""One partition of a join's state on this worker: its RocksDB store, the write overlay
of the batch in progress, and the join's operator over both (tables/operators/).

Write order of a batch (docs/tables.md, "Guarantees"): the caller first has the
batch's results acknowledged; `commit()` then produces the batch's changelog records
and waits for their acks, and only then writes every state change and the last
changelog offset in one RocksDB write batch. A crash anywhere replays input the
state does not yet hold.

With the operator's keys the state holds, under POSITION + topic, how far the batches have
taken each input partition (tables/records/positions.py): written and restored with the rest,
so a worker reading records again after a restart or a takeover knows which are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from aiokafka import AIOKafkaProducer

from tables.kafka.batches import send_records
from tables.operators.base import JoinKind, Operator
from tables.operators.kv import Overlay
from tables.settings import SEND_BATCH_BYTES
from tables.state.store import PartitionStore

Role = Literal["active", "standby"]

POSITION = b"\x00in:"  # + input topic -> InputPosition.encode(): no operator's keys start so
_POSITION_END = b"\x00in;"


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
        self.overlay = Overlay(self.store, unscanned=(*self.kind.unscanned, POSITION))
        self.operator = self.kind.operator(self.overlay, self.ids)

    def positions(self) -> dict[str, bytes]:
        """Input topic -> how far the state has taken that input's partition (encoded
        InputPosition), as last written or restored."""
        found: dict[bytes, bytes | None] = dict(self.store.scan(POSITION, _POSITION_END))
        found |= {key: value for key, value in self.overlay.pending.items() if key.startswith(POSITION)}
        return {key[len(POSITION) :].decode(): value for key, value in found.items() if value is not None}

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record: a position is kept as is, the rest goes to the operator."""
        if key.startswith(POSITION):
            if value is not None:
                self.overlay.put(key, value)
            return
        self.operator.restore(key, value)

    @property
    def checkpoint(self) -> int | None:
        """The last changelog offset this partition's files hold."""
        return self.store.checkpoint

    async def commit(
        self,
        producer: AIOKafkaProducer,
        changelog: str,
        partition: int,
        batch_bytes: int = SEND_BATCH_BYTES,
        positions: Mapping[str, bytes] | None = None,
    ) -> int | None:
        """Produce the batch's changelog records (record batches of up to `batch_bytes`),
        then write state + checkpoint atomically. Returns the new checkpoint. `positions`:
        input topic -> how far this batch has taken it (written where it changed)."""
        self.write(await self.send_changes(producer, changelog, partition, batch_bytes, positions))
        return self.checkpoint

    async def send_changes(
        self,
        producer: AIOKafkaProducer,
        changelog: str,
        partition: int,
        batch_bytes: int = SEND_BATCH_BYTES,
        positions: Mapping[str, bytes] | None = None,
    ) -> int | None:
        """The first half of `commit`: produce the batch's changelog records (the inputs'
        `positions` with them, where they changed) and wait for their acks; the checkpoint to
        `write` with (the last offset written, or the current one)."""
        changes = self.operator.take_changes()
        for topic, raw in (positions or {}).items():
            key = POSITION + topic.encode()
            if self.overlay.get(key) != raw:
                self.overlay.put(key, raw)
                changes.append((key, raw))
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
