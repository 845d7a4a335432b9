"""Probing rebalances (KIP-441): a worker whose warm-up replica has caught up asks its group
for a rebalance at once, so the move it waits for happens within seconds of the catch-up
instead of at the next periodic probe (the leader's fallback, every
`probing_rebalance_interval_s`: assignor/faust_adapter/partition_assignor.py).

A warm-up is caught up when it is at most `acceptable_recovery_lag` records behind its
changelog's end (the high watermark its tail reads). Before asking, the worker refreshes the
local offsets it reports, so that the leader sees the catch-up in the JoinGroup this causes.
A probe that moved nothing (the partition is still a warm-up in the next generation) is
repeated with a growing delay, never more often than every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from faust.types import TP, AppT

from assignor.faust_adapter import faust_standby_lag
from tables.runtime.task import JoinTask

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5
FIRST_RETRY_S = 5.0  # a probe that moved nothing is repeated after this, then twice as long...
LOST_PROBE_S = 30.0  # ...and one whose rebalance never came (same generation) after this


@dataclass
class Asked:
    """The probes asked for one warm-up partition in a row."""

    times: int
    when: float
    epoch: int


class Prober:
    """Watches the warm-ups of every join on this worker and asks for probing rebalances."""

    def __init__(self, app: AppT, tasks: Mapping[str, JoinTask], refresh_offsets: Callable[[], None]) -> None:
        self.app = app
        self.tasks = tasks  # the runtime's, by join name (read each time: joins are added at import)
        self.refresh_offsets = refresh_offsets
        self.asked: dict[tuple[str, int], Asked] = {}  # (join, partition) -> its probes
        self.probes = 0  # probing rebalances this worker asked for (the view shows it)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                self.check()
            except Exception:  # a probe is an optimisation: the periodic one remains
                log.exception("tandem: warm-up check failed")

    def caught_up(self, acceptable_lag: int) -> dict[tuple[str, int], int]:
        """(join, partition) -> lag of every warm-up within `acceptable_lag` of its end, over
        the join's changelog and those of its Faust tables (the task moves only with all)."""
        app = self.app
        table_warmups = app.assignor.warmups() if hasattr(app.assignor, "warmups") else {}
        found: dict[tuple[str, int], int] = {}
        for name, task in self.tasks.items():
            if task.state is None:
                continue
            for partition, lag in task.state.warmup_lags().items():
                lags = [lag] + [
                    faust_standby_lag(app, TP(topic, partition))
                    for topic in task.spec.table_changelogs()
                    if partition in table_warmups.get(topic, ())
                ]
                if all(n is not None and n <= acceptable_lag for n in lags):
                    found[(name, partition)] = max(lags)  # type: ignore[type-var, assignment]
        return found

    def warming(self) -> set[tuple[str, int]]:
        return {
            (name, p)
            for name, task in self.tasks.items()
            if task.state is not None
            for p in task.state.warmups()
        }

    def check(self, now: float | None = None) -> bool:
        """Ask for a rebalance if a warm-up has caught up and is due a probe; whether it asked."""
        assignor: Any = self.app.assignor  # Tandem's, read by duck typing (getattr)
        settings = getattr(assignor, "settings", None)
        if settings is None or not settings.warmups:
            return False
        now = time.monotonic() if now is None else now
        warming = self.warming()
        self.asked = {k: v for k, v in self.asked.items() if k in warming}  # moved: forget it
        epoch = int(getattr(assignor, "epoch", 0) or 0)
        due = {
            key: lag
            for key, lag in self.caught_up(settings.acceptable_recovery_lag).items()
            if self._due(key, now, epoch, settings.probing_rebalance_interval_s)
        }
        if not due:
            return False
        self.refresh_offsets()  # the JoinGroup this causes must report the catch-up
        listed = ", ".join(f"{join}[{p}] {lag:,} behind" for (join, p), lag in sorted(due.items()))
        why = f"warm-up caught up ({listed}; acceptable {settings.acceptable_recovery_lag:,})"
        if not assignor.request_probe(why):
            return False
        self.probes += 1
        for key in due:
            before = self.asked.get(key)
            self.asked[key] = Asked((before.times if before else 0) + 1, now, epoch)
        return True

    def _due(self, key: tuple[str, int], now: float, epoch: int, interval_s: float) -> bool:
        asked = self.asked.get(key)
        if asked is None:
            return True
        if asked.epoch == epoch:
            return now - asked.when >= min(interval_s, LOST_PROBE_S)
        return now - asked.when >= min(interval_s, FIRST_RETRY_S * 2 ** (asked.times - 1))
