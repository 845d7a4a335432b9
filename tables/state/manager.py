"""The state of one join on this worker: a RocksDB store per partition it owns (active)
or replicates (standby), restored and tailed from the join's changelog.

    state = JoinState(connection, "app-clicks-changelog", data_dir, kind=WindowedKind(...))
    moves = await state.assign(active={0, 1}, standby={2}, warmup={3})  # opens, closes; tails 2, 3
    await state.restore(moves.to_restore, on_ready)          # background: one partition at a time ready
    state.active(0).operator.process_many(...)               # the operator of an active partition
    await state.commit(0, producer, positions)                # changelog, then state + checkpoint
    state.local_offsets()                                     # {partition: checkpoint} of the files on disk

Partition p of the changelog belongs to task p (same number as the inputs). A
partition that stays active is not touched by a rebalance: nothing is replayed.
Revoked partitions are closed; their files stay for the assignor and for their return.
A warm-up replica (KIP-441) is a standby with a flag: tailed the same way, shown apart,
and its lag (`warmup_lags()`) tells the runtime when to ask for a probing rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from assignor.clients import Settings, settings_of
from tables.operators.base import JoinKind
from tables.settings import SEND_BATCH_BYTES
from tables.state.partition import Role, StatePartition
from tables.state.recovery import Recovery, RestoreProgress
from tables.state.store import (
    PartitionStore,
    StoreCorruptError,
    local_checkpoints,
    open_store,
    partition_path,
    rebuild_store,
)

log = logging.getLogger(__name__)


@dataclass
class Moves:
    """What one assignment changed for this join on this worker."""

    kept: list[int] = field(default_factory=list)
    warm: list[int] = field(default_factory=list)  # newly active, with state on this disk
    cold: list[int] = field(default_factory=list)  # newly active, restored from nothing
    to_restore: list[int] = field(default_factory=list)  # newly active or not yet restored
    started: float = field(default_factory=time.time)


class JoinState:
    """Every partition of one join's state this worker holds."""

    def __init__(
        self,
        connection: str | Settings,
        changelog: str,
        data_dir: Path | str,
        *,
        kind: JoinKind,
        ids: bool = False,
        table: str | None = None,
        sync_writes: bool = False,
        send_batch_bytes: int = SEND_BATCH_BYTES,
        stall_timeout_s: float = 120.0,
        recovery: Callable[..., Recovery] = Recovery,
    ) -> None:
        """`recovery`: what reads the changelog back (`Recovery`, Kafka's; the test driver's
        reads its in-memory log: tables/testing/memory.py)."""
        self.changelog = changelog
        self.data_dir = Path(data_dir)
        self.table = table or changelog
        self.kind = kind
        self.ids = ids
        self.sync_writes = sync_writes
        self.send_batch_bytes = send_batch_bytes
        self.partitions: dict[int, StatePartition] = {}
        self.ready: set[int] = set()  # active partitions restored to the end of their changelog
        self.warming: set[int] = set()  # standbys that are warm-up replicas of a pending move
        self.recovery = recovery(
            settings_of(connection),
            changelog,
            self.partitions,
            self._rebuild,
            stall_timeout_s,
            reopen=self._reopen,
        )
        self._tail: asyncio.Task[None] | None = None

    # -- assignment ------------------------------------------------------------

    async def assign(
        self, active: Iterable[int], standby: Iterable[int], warmup: Iterable[int] = ()
    ) -> Moves:
        """Own `active`, stand by for `standby` and warm up `warmup` (tailed like standbys),
        close the rest (files stay). Returns what moved; the caller restores `to_restore`
        (in the background) before processing them."""
        active = set(active)
        self.warming = set(warmup) - active
        standby = (set(standby) | self.warming) - active
        await self._stop_tailing()
        on_disk = set(self.local_offsets())
        before = {p for p, s in self.partitions.items() if s.role == "active"}
        moves = Moves(kept=sorted(before & active))
        for partition in [p for p in self.partitions if p not in active | standby]:
            self._close(partition)
        for partition in sorted(active - before):
            held = partition in self.partitions or partition in on_disk
            (moves.warm if held else moves.cold).append(partition)
        for partition in sorted(active | standby):
            self._open(partition, "active" if partition in active else "standby")
            # Each open reads a store's files and indexes its records: on a busy machine a
            # rebalance's opens in a row held the event loop for a second.
            await asyncio.sleep(0)
        self.ready &= active
        for partition in set(self.recovery.standby_lag) - standby:
            del self.recovery.standby_lag[partition]  # no longer tailed here: its lag is stale
        moves.to_restore = sorted(active - self.ready)
        if standby:
            self._tail = asyncio.create_task(self.recovery.tail(sorted(standby)))
        return moves

    async def restore(self, partitions: list[int], on_ready: Callable[[int], None]) -> None:
        """Restore active partitions to the end of the changelog, each handed over
        (`on_ready`) as soon as it is there."""

        def ready(partition: int) -> None:
            if self.role(partition) == "active":
                self.ready.add(partition)
                on_ready(partition)

        await self.recovery.restore([p for p in partitions if self.role(p) == "active"], ready)

    def role(self, partition: int) -> Role | None:
        state = self.partitions.get(partition)
        return state.role if state else None

    def active(self, partition: int) -> StatePartition:
        """The state of an active partition that is ready."""
        state = self.partitions.get(partition)
        if state is None or state.role != "active" or partition not in self.ready:
            raise KeyError(f"partition {partition} of {self.changelog} is not active and ready here")
        return state

    def actives(self) -> list[int]:
        return sorted(p for p, s in self.partitions.items() if s.role == "active")

    def standbys(self) -> list[int]:
        """Standby partitions (warm-up replicas not included)."""
        return sorted(p for p, s in self.partitions.items() if s.role == "standby" and p not in self.warming)

    def warmups(self) -> list[int]:
        return sorted(p for p, s in self.partitions.items() if s.role == "standby" and p in self.warming)

    def warmup_lags(self) -> dict[int, int | None]:
        """Warm-up partition -> records behind the changelog's end (None until a fetch saw it)."""
        return {p: self.recovery.standby_lag.get(p) for p in self.warmups()}

    def restoring(self) -> dict[int, RestoreProgress]:
        """Active partitions still being restored, and how far each has come."""
        progress = self.recovery.progress.items()
        return {p: r for p, r in progress if self.role(p) == "active" and p not in self.ready}

    # -- processing --------------------------------------------------------------

    async def commit(
        self, partition: int, producer: AIOKafkaProducer, positions: Mapping[str, bytes] | None = None
    ) -> int | None:
        """Changelog records of the partition's batch, then its state + checkpoint in one
        RocksDB batch. Call after the batch's results are acknowledged and before its
        input offsets are committed. `positions`: input topic -> how far the batch has taken
        it (tables/records/positions.py), kept with the state."""
        return await self.partitions[partition].commit(
            producer, self.changelog, partition, self.send_batch_bytes, positions
        )

    def positions(self, partition: int) -> dict[str, bytes]:
        """Input topic -> how far the partition's state has taken it (as its last commit or
        its restore left it); empty for a partition not held here."""
        state = self.partitions.get(partition)
        return state.positions() if state is not None else {}

    async def send_changes(
        self, partition: int, producer: AIOKafkaProducer, positions: Mapping[str, bytes] | None = None
    ) -> int | None:
        """`commit` in two halves, so that a batch's partitions send side by side and write one at
        a time: the changelog records produced and acknowledged (the checkpoint to write) ..."""
        return await self.partitions[partition].send_changes(
            producer, self.changelog, partition, self.send_batch_bytes, positions
        )

    def write(self, partition: int, checkpoint: int | None) -> None:
        """... then the state and that checkpoint in one RocksDB batch."""
        self.partitions[partition].write(checkpoint)

    def discard(self, partition: int) -> None:
        """Drop what a batch applied but did not commit (its input is read again)."""
        state = self.partitions.get(partition)
        if state is not None:
            state.reset()

    # -- what is on disk -----------------------------------------------------------

    def local_offsets(self) -> dict[int, int]:
        """Partition -> last changelog offset held on this disk, open or not. A cheap read
        that never raises: an unreadable store reports nothing (opening it repairs it)."""
        offsets = local_checkpoints(self.data_dir, self.table)
        for partition, state in self.partitions.items():
            if state.checkpoint is not None:
                offsets[partition] = state.checkpoint
            elif self.recovery.standby_lag.get(partition) == 0:
                # Tailed to the end of an empty changelog: as caught up as can be (with warm-ups,
                # a replica that reports nothing counts as holding nothing).
                offsets[partition] = 0
            else:
                offsets.pop(partition, None)
        return offsets

    # -- opening and closing -----------------------------------------------------------

    def _path(self, partition: int) -> Path:
        return partition_path(self.data_dir, self.table, partition)

    def _open(self, partition: int, role: Role) -> None:
        state = self.partitions.get(partition)
        if state is not None and state.store.failed is not None:
            state = self._reopen(partition)  # a standby whose write failed (a full disk)
        if state is None:
            store = self._open_store(partition)
            self.partitions[partition] = StatePartition(store, self.kind, role, self.ids)
        elif state.role != role:
            # Uncommitted work of a demoted active is dropped: the changelog has the truth.
            state.role = role
            state.reset()

    def _open_store(self, partition: int) -> PartitionStore:
        store = open_store(self._path(partition), sync=self.sync_writes)
        if store.damage is not None:
            self.recovery.note(
                f"state of {self.table}[{partition}] was damaged ({store.damage.reason}); "
                f"kept at {store.damage.moved_to}, restoring it from {self.changelog}"
            )
        return store

    def _reopen(self, partition: int) -> StatePartition:
        """A store whose write failed (a full disk) takes no more writes until it is reopened:
        reopen it at its last checkpoint, dropping what was applied after it in memory.
        Raises StoreOpenError while it cannot be opened (the disk still full)."""
        old = self.partitions[partition]
        old.store.close()
        fresh = StatePartition(self._open_store(partition), self.kind, old.role, self.ids)
        self.partitions[partition] = fresh
        return fresh

    def _rebuild(self, partition: int) -> StatePartition:
        """Replace a partition's files with an empty store (they do not match the changelog)."""
        old = self.partitions[partition]
        old.store.destroy()
        store = open_store(self._path(partition), sync=self.sync_writes)
        fresh = StatePartition(store, self.kind, old.role, self.ids)
        self.partitions[partition] = fresh
        return fresh

    def set_aside(self, partition: int, error: StoreCorruptError) -> None:
        """A store found damaged while in use: move it aside, open an empty one, and let
        the partition be restored again (it is no longer ready)."""
        old = self.partitions[partition]
        store = rebuild_store(old.store, error)
        self.partitions[partition] = StatePartition(store, self.kind, old.role, self.ids)
        self.ready.discard(partition)
        self.recovery.note(
            f"state of {self.table}[{partition}] was damaged while in use ({error.reason}); restoring it"
        )

    def _close(self, partition: int) -> None:
        self.ready.discard(partition)
        self.partitions.pop(partition).store.close()

    async def _stop_tailing(self) -> None:
        tail, self._tail = self._tail, None
        if tail is not None:
            tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tail

    async def close(self) -> None:
        await self._stop_tailing()
        for partition in list(self.partitions):
            self._close(partition)
