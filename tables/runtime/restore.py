"""Restoring a join's newly active partitions in the background after a rebalance, retrying
after failures, each partition handed to the task as soon as it is at the end of its
changelog (tables/state/recovery.py reads the changelog). A restore that makes no progress
for `restore_stall_s` stops the worker, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from tables.runtime.stats import Rebalance
from tables.state.manager import JoinState, Moves

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


def rebalance_of(moves: Moves, epoch: int) -> Rebalance:
    """What an assignment did to one join (kept, moved warm, moved cold), for the view."""
    return Rebalance(
        epoch=epoch,
        started=moves.started,
        kept=moves.kept,
        moved_warm=moves.warm,
        moved_cold=moves.cold,
        seconds=None if moves.to_restore else 0.0,
    )


class Restore:
    """The background restore of one assignment's new actives of one join."""

    def __init__(self, join: str, state: JoinState, rebalance: Rebalance, stall_s: float) -> None:
        self.join = join
        self.state = state
        self.rebalance = rebalance
        self.stall_s = stall_s
        self._task: asyncio.Task[None] | None = None

    def start(
        self,
        partitions: list[int],
        on_ready: Callable[[int], None],
        on_stall: Callable[[Exception], Awaitable[None]],
    ) -> None:
        """Restore `partitions`; `on_ready(p)` as each is at its end; `on_stall(error)` if the
        restore makes no progress for too long (it stops the worker)."""
        self._task = asyncio.create_task(self._run(partitions, on_ready, on_stall))

    async def wait(self) -> None:
        """Until the restore is done (or has stopped the worker)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None

    async def _run(
        self,
        partitions: list[int],
        on_ready: Callable[[int], None],
        on_stall: Callable[[Exception], Awaitable[None]],
    ) -> None:
        state, rebalance = self.state, self.rebalance

        def ready(partition: int) -> None:
            rebalance.replayed[partition] = state.recovery.progress[partition].restored
            on_ready(partition)

        backoff, failing_since = 1.0, None
        while partitions:
            try:
                await state.restore(partitions, ready)
                break
            except Exception as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.exception("tandem: join %r: restore of %s failed; retrying", self.join, partitions)
                else:
                    log.error("tandem: join %r: restore of %s failed again: %r", self.join, partitions, exc)
                if now - failing_since > self.stall_s:
                    await on_stall(exc)  # bounded: the worker stops, saying why
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                before = len(partitions)
                partitions = [p for p in partitions if p not in state.ready]
                if len(partitions) < before:  # progress: the clock starts again
                    failing_since, backoff = None, 1.0
        for partition, progress in state.recovery.progress.items():
            if partition in rebalance.moved_warm + rebalance.moved_cold:
                rebalance.replayed[partition] = progress.restored
        rebalance.seconds = round(time.time() - rebalance.started, 3)
        log.info(
            "tandem: join %r restored in %s s: kept %s, moved warm %s, moved cold %s; %s records replayed",
            self.join, rebalance.seconds, rebalance.kept, rebalance.moved_warm, rebalance.moved_cold,
            sum(rebalance.replayed.values()),
        )  # fmt: skip
