"""The app's join state on `tables/` (RocksDB per partition, changelog, standbys).

`JoinTables.on_assignment` restores new actives before it returns, while Faust
may already deliver their records: `operator()` waits until the partition is
restored. Per-campaign counters (the click-through table) live in the join
state's metadata, so they travel in the changelog and survive a takeover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from app.state import Emit, Rebalance
from tables.changelog import JoinTables
from tables.join import JoinType, WindowedJoin
from tables.records import Side

_CTR = "ctr:"
ASSIGNMENT_WAIT_S = 30.0
log = logging.getLogger(__name__)


class TablesState:
    """Same surface as app.state.StateManager, backed by tables.changelog.JoinTables."""

    def __init__(self, bootstrap: str, changelog: str, data_dir: Path) -> None:
        self.changelog = changelog
        self.tables = JoinTables(bootstrap, changelog, data_dir / "join-state", join_type=JoinType.INNER)
        self.active: set[int] = set()
        self.standby: set[int] = set()
        self.joined: dict[int, int] = {}  # results emitted by this process, per partition
        self.rebalance = Rebalance()
        self.total_replayed = 0
        self._ready: dict[int, asyncio.Event] = {}
        self._ends: dict[int, int] = {}  # changelog end offsets of the standbys, for the view
        self._bootstrap = bootstrap
        self._offsets: AIOKafkaConsumer | None = None  # made in start(): needs the loop

    async def start(self) -> None:
        await self.tables.start()
        self._offsets = AIOKafkaConsumer(bootstrap_servers=self._bootstrap)
        await self._offsets.start()

    async def refresh_lag(self) -> None:
        """Fetch the standbys' changelog end offsets (ListOffsets: on the embedded broker
        it can be short by one batch, so the standby lag shown may read low)."""
        tps = [TopicPartition(self.changelog, p) for p in sorted(self.standby)]
        if not tps or self._offsets is None:
            return
        try:
            ends = await asyncio.wait_for(self._offsets.end_offsets(tps), 2.0)
        except (TimeoutError, KafkaError):
            return
        self._ends = {tp.partition: int(end) for tp, end in ends.items()}

    def rebalance_started(self) -> None:
        self.rebalance = Rebalance()

    async def on_assignment(self, active: set[int], standby: set[int]) -> None:
        previous, local = set(self.active), self.tables.local_offsets()
        rebalance = self.rebalance
        rebalance.kept = sorted(previous & active)
        moved = sorted(active - previous)
        # Warm: a standby here or files on this disk already hold part of the state.
        rebalance.warm = [p for p in moved if p in self.standby or p in local]
        rebalance.cold = [p for p in moved if p not in rebalance.warm]
        for partition in moved:
            self._ready.setdefault(partition, asyncio.Event()).clear()
        self.active, self.standby = set(active), set(standby) - set(active)
        await self.tables.on_assignment(self.active, self.standby)
        rebalance.replayed_by_partition = {p: self.tables.replayed.get(p, 0) for p in moved}
        replayed = sum(rebalance.replayed_by_partition.values())
        rebalance.replayed = replayed
        self.total_replayed += replayed
        rebalance.seconds = round(time.time() - rebalance.started, 3)
        for partition in moved:
            self._ready[partition].set()

    async def operator(self, partition: int) -> WindowedJoin | None:
        """The restored join of an active partition; None if it is not ours (revoked)."""
        # A record may arrive before the assignment signal: wait for it, bounded.
        event = self._ready.setdefault(partition, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), ASSIGNMENT_WAIT_S)
        except TimeoutError:
            log.warning("partition %s was never assigned here; record skipped", partition)
            return None
        return self.tables.operator(partition) if partition in self.active else None

    async def process_batch(
        self, partition: int, items: list[tuple[Side, dict[str, Any]]], emit: Emit
    ) -> None:
        """Join a partition's batch, emit and await the results, then changelog + state
        (tables' contract, docs/tables.md)."""
        join = await self.operator(partition)
        if join is None:
            return  # revoked meanwhile: the new owner processes it (offset not committed here)
        results: list[dict[str, Any]] = []
        bumps: dict[str, int] = {}
        for side, record in items:
            dropped = (join.duplicates, join.late)
            found = join.process(side, record)
            accepted = (join.duplicates, join.late) == dropped
            _count_campaigns(bumps, side, record, found, accepted)
            results += found
        for name, delta in bumps.items():  # one state write per counter and batch
            join.add_counter(name, delta)
        await emit(results)
        await self.tables.commit(partition)
        self.joined[partition] = self.joined.get(partition, 0) + len(results)

    def joined_counts(self) -> dict[int, int]:
        return {p: self.joined.get(p, 0) for p in sorted(self.active)}

    def local_offsets(self) -> dict[int, int]:
        return self.tables.local_offsets()

    def lag(self, partition: int) -> int | None:
        """Changelog records a standby has not applied yet (from the last refresh_lag)."""
        end = self._ends.get(partition)
        if end is None:
            return None
        return max(0, end - 1 - self.tables.local_offsets().get(partition, -1))

    def late(self) -> int:
        return sum(self.tables.operator(p).late for p in self.active if self._is_ready(p))

    def campaigns(self) -> dict[str, dict[str, int]]:
        """Impressions and joined clicks per campaign over this worker's actives."""
        totals: dict[str, dict[str, int]] = {}
        for partition in self.active:
            if not self._is_ready(partition):
                continue
            for name, value in self.tables.operator(partition).counters(_CTR).items():
                kind, campaign = name[len(_CTR) :].split(":", 1)
                entry = totals.setdefault(campaign, {"impressions": 0, "clicks": 0})
                entry["impressions" if kind == "i" else "clicks"] += value
        return totals

    def _is_ready(self, partition: int) -> bool:
        event = self._ready.get(partition)
        return partition in self.active and (event is None or event.is_set())

    async def close(self) -> None:
        if self._offsets is not None:
            await self._offsets.stop()
        await self.tables.close()


def _count_campaigns(
    bumps: dict[str, int],
    side: str,
    record: dict[str, Any],
    results: list[dict[str, Any]],
    accepted: bool,
) -> None:
    # Counters kept with the join state, so they ride the changelog with it.
    if side == "left" and accepted:
        name = f"{_CTR}i:{record['campaign_id']}"
        bumps[name] = bumps.get(name, 0) + 1
    for r in results:
        if r["kind"] == "inner":
            name = f"{_CTR}c:{r['campaign_id']}"
            bumps[name] = bumps.get(name, 0) + 1
