"""What a worker remembers of its recent past, for the group page's plots and rebalance list:
a sample of its counters every few seconds (the last five minutes), and the group's last
rebalances as the leader planned them.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from faust.types import AppT

from tables.runtime.worker import Runtime

SAMPLE_EVERY_S = 2.0
SAMPLES_KEPT = 150  # five minutes
REBALANCES_KEPT = 10


@dataclass(frozen=True)
class Sample:
    """The worker's counters at one moment (summed over its joins)."""

    at: float  # seconds since the epoch
    read: int  # input records read, since the process started
    results: int
    lag: int  # input records not yet read, over its active partitions
    standby_lag: int


class History:
    """Samples and group rebalances of one worker (the view serves them)."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        self.rebalances: deque[dict[str, Any]] = deque(maxlen=REBALANCES_KEPT)

    def sample(self, app: AppT, runtime: Runtime) -> None:
        """Take one sample now, and note the group's rebalance if it is a new one."""
        read = results = lag = standby_lag = 0
        for task in runtime.tasks.values():
            read += sum(task.stats.read.values())
            results += task.stats.results
            state = task.state
            if state is None:
                continue
            lag += sum(task.input_lag(p) or 0 for p in state.actives())
            standby_lag += sum(state.recovery.standby_lag.get(p, 0) for p in state.standbys())
        self.samples.append(Sample(time.time(), read, results, lag, standby_lag))
        self.note_rebalance(app)

    def note_rebalance(self, app: AppT) -> None:
        info = getattr(app.assignor, "last_rebalance", None)
        if info is None or (self.rebalances and self.rebalances[-1]["epoch"] == info.epoch):
            return
        self.rebalances.append({**(group_rebalance(app) or {}), "at": info.received_at})

    def as_dict(self) -> dict[str, Any]:
        return {
            "sample_every_s": SAMPLE_EVERY_S,
            "samples": [asdict(s) for s in self.samples],
            "group_rebalances": list(self.rebalances),
        }


_histories: weakref.WeakKeyDictionary[Any, History] = weakref.WeakKeyDictionary()


def history_of(runtime: Runtime) -> History:
    """The runtime's history (made at the first ask)."""
    found = _histories.get(runtime)
    if found is None:
        found = _histories[runtime] = History()
    return found


def group_rebalance(app: AppT) -> dict[str, Any] | None:
    """The whole group's last rebalance as the Tandem planner counted it (None on stock)."""
    info = getattr(app.assignor, "last_rebalance", None)
    if info is None:
        return None
    stats = info.stats
    return {
        "epoch": info.epoch,
        "protocol": info.protocol,
        "tasks": stats.tasks,
        "kept": stats.kept,
        "moved_warm": stats.moved_warm,
        "moved_cold": stats.moved_cold,
        "plan_ms": stats.plan_ms,
        "pending_moves": stats.pending,  # held on a caught-up owner until their warm-up catches up
        "warmups": stats.warmups,
    }
