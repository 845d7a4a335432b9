"""Who already holds each stateful task's state, and how fresh it is.

A member holds a task's state when it was a previous standby of it or reports
`local_offsets` for one of its changelog partitions. Freshness: the sum of its
offsets over the task's changelog topics, or -1 with no offset (a standby that
reported none). The task's previous owner is not counted: keeping it is
stickiness, not warmth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class StateHolders:
    """(task, member, freshness) triples, sorted by task then member."""

    tasks: np.ndarray
    members: np.ndarray
    fresh: np.ndarray
    # With warm-ups on: whether each holder is caught up (placing there moves the task now),
    # and whether it was a standby (or warm-up replica) of the task.
    caught: np.ndarray | None = None
    standby: np.ndarray | None = None

    @classmethod
    def none(cls) -> StateHolders:
        empty = np.zeros(0, np.int64)
        return cls(empty, empty, empty)

    @classmethod
    def of(
        cls,
        tasks: np.ndarray,
        members: np.ndarray,
        offsets: np.ndarray,
        has_offset: np.ndarray,
        owner: np.ndarray,
        member_count: int,
    ) -> StateHolders:
        """From raw claims (one per reported standby or offset); the owner's are dropped."""
        keep = owner[tasks] != members
        key = tasks[keep] * member_count + members[keep]
        if len(key) == 0:
            return cls.none()
        unique, inverse = np.unique(key, return_inverse=True)
        summed = np.bincount(inverse, weights=np.maximum(offsets[keep], 0), minlength=len(unique))
        reported = np.bincount(inverse, weights=has_offset[keep], minlength=len(unique)) > 0
        # Offsets reach 2**63: float64 sums lose precision there, so sum exactly where needed.
        fresh = summed.astype(np.int64) if summed.max(initial=0) < 2**52 else _exact(inverse, offsets[keep])
        return cls(unique // member_count, unique % member_count, np.where(reported, fresh, -1))

    def __bool__(self) -> bool:
        return len(self.tasks) > 0

    def task_ids(self) -> np.ndarray:
        """Tasks with at least one holder."""
        return np.unique(self.tasks)

    def most(self) -> int:
        """The largest number of holders of one task."""
        return int(np.bincount(self.tasks).max()) if len(self.tasks) else 0

    def get(self, task: int) -> dict[int, int]:
        """member -> freshness of the holders of `task`."""
        a, b = np.searchsorted(self.tasks, [task, task + 1]).tolist()
        return dict(zip(self.members[a:b].tolist(), self.fresh[a:b].tolist(), strict=True))

    def holds(self, tasks: np.ndarray, members: np.ndarray, member_count: int) -> np.ndarray:
        """Element-wise: does `members[i]` hold the state of `tasks[i]`?"""
        return np.isin(tasks * member_count + members, self.tasks * member_count + self.members)


def _exact(inverse: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sums of offsets near 2**63 as Python ints (an object array): exact, never clipped."""
    sums = [0] * (int(inverse.max()) + 1)
    for i, offset in zip(inverse.tolist(), offsets.tolist(), strict=True):
        sums[i] += max(offset, 0)
    exact = np.empty(len(sums), object)
    exact[:] = sums
    return exact
