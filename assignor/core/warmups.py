"""Warm-up replicas (KIP-441 style): lags, holds and the warm-up budget.

With warm-ups on (docs/scenario-format.md, "Warm-up replicas"), a member's lag on a
stateful task is the largest, over the task's changelog partitions, of
`end - local_offset` (0 at or past the end, unbounded when it reports no offset for
one of them); the task's previous owner has lag 0. A member is caught up when its
lag is at most `acceptable_recovery_lag`.

The planner first computes the *target* (the balanced, sticky, warm assignment,
with the members of finite lag as the state holders, the least behind first). Then:

- W2: a stateful task whose target owner is not its previous owner and is not caught
  up is held on a caught-up member when one exists (its previous owner, else the
  least behind, then the one with the fewest actives, then the lowest id), and
  listed as a pending move;
- W3: the first `max_warmup_replicas` pending moves, the least behind target first,
  give their target a warm-up replica of the task's changelog partitions.

Tasks and members are the planner's indices (plan.py `_Index`): tasks numbered group
by group, members in id order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from assignor.core.holders import StateHolders
from assignor.core.scenario import Group, Scenario, WarmupInput


@dataclass(frozen=True, slots=True)
class Lags:
    """Finite lags of eligible members on stateful tasks, owners excluded: (task, member, lag)
    sorted by task then member. `stateful[t]`: task t has a changelog partition."""

    tasks: np.ndarray
    members: np.ndarray
    lags: np.ndarray
    standby: np.ndarray  # the member was a standby (or warm-up replica) of the task
    stateful: np.ndarray
    acceptable: int

    def of(self, task: int) -> dict[int, int]:
        """member -> lag of the members (not the owner) with a finite lag on `task`."""
        a, b = np.searchsorted(self.tasks, [task, task + 1]).tolist()
        return dict(zip(self.members[a:b].tolist(), self.lags[a:b].tolist(), strict=True))

    def holders(self) -> StateHolders:
        """The members holding each task's state (finite lag), the least behind the freshest,
        and which of them are caught up."""
        return StateHolders(self.tasks, self.members, -self.lags, self.lags <= self.acceptable, self.standby)


@dataclass(frozen=True, slots=True)
class PendingMove:
    task: int
    holder: int  # the caught-up member the task stays on (its active owner in the output)
    target: int  # the member it moves to once that one has caught up
    lag: int | None  # the target's lag on the task (None: unbounded)
    warmup: bool = False


@dataclass(frozen=True, slots=True)
class Holds:
    """The output's actives with the pending moves held back, and the moves."""

    placed: np.ndarray  # (T,) active owner in the output
    moves: list[PendingMove]  # in task order

    def warmup_members(self, tasks: int) -> np.ndarray:
        """(T,) the member given a warm-up replica of each task, -1 for none."""
        member = np.full(tasks, -1, np.int64)
        for move in self.moves:
            if move.warmup:
                member[move.task] = move.target
        return member


def task_lags(
    scn: Scenario,
    warmup: WarmupInput,
    groups: list[Group],
    offsets: np.ndarray,
    eligible: np.ndarray,
    owner: np.ndarray,
) -> Lags:
    """The finite lags of every eligible member (not the owner) on every stateful task."""
    stateful = np.zeros(int(offsets[-1]), bool)
    chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # task, member, lag, needed
    for g, group in enumerate(groups):
        if not group.stateful:
            continue
        counts = dict(zip(group.topics, group.counts, strict=True))
        base = int(offsets[g])
        stateful[base : base + max(counts[c] for c in group.changelogs)] = True
        # Changelog partitions a task of this group has: those below each changelog's count.
        needed = np.zeros(group.size, np.int64)
        for c in group.changelogs:
            needed[: counts[c]] += 1
        members = np.nonzero(eligible[g])[0].tolist()
        for topic in group.changelogs:
            found = _topic_lags(scn, warmup, topic, counts[topic], members)
            if found is not None:
                partition, member, lag = found
                chunks.append((partition + base, member, lag, needed[partition]))
    empty = np.zeros(0, np.int64)
    if not chunks:
        return Lags(empty, empty, empty, np.zeros(0, bool), stateful, warmup.acceptable_lag)
    task, member, lag, needed = (np.concatenate(parts) for parts in zip(*chunks, strict=True))
    keep = owner[task] != member
    task, member, lag, needed = task[keep], member[keep], lag[keep], needed[keep]
    key = task * len(scn.members) + member
    unique, inverse, reported = np.unique(key, return_inverse=True, return_counts=True)
    worst = np.zeros(len(unique), np.int64)
    np.maximum.at(worst, inverse, lag)
    first = np.zeros(len(unique), np.int64)
    first[inverse] = np.arange(len(key))  # any row of the key: `needed` is the same for all
    finite = reported == needed[first]  # an offset for every changelog partition of the task
    unique, worst = unique[finite], worst[finite]
    standby = np.isin(unique, _standby_keys(scn, groups, offsets))
    n = len(scn.members)
    return Lags(unique // n, unique % n, worst, standby, stateful, warmup.acceptable_lag)


def _standby_keys(scn: Scenario, groups: list[Group], offsets: np.ndarray) -> np.ndarray:
    """task * members + member of every previous standby (warm-ups are reported as standbys)."""
    base = {t: int(offsets[g]) for g, group in enumerate(groups) for t in group.changelogs}
    keys: list[int] = []
    members = len(scn.members)
    for i, member in enumerate(scn.members):
        for topic, partitions in member.previous_standby.items():
            if topic in base:
                keys.extend((base[topic] + p) * members + i for p in partitions)
    return np.array(keys, np.int64)


def _topic_lags(
    scn: Scenario, warmup: WarmupInput, topic: str, count: int, members: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(partition, member, lag) of every offset the given members report for `topic`."""
    end = _end_offsets(scn, warmup, topic, count)
    partitions: list[Iterable[int]] = []
    values: list[Iterable[int]] = []
    who: list[int] = []
    lengths: list[int] = []
    for i in members:
        local = scn.members[i].local_offsets.get(topic)
        if local:
            partitions.append(local.keys())
            values.append(local.values())
            who.append(i)
            lengths.append(len(local))
    if not who:
        return None
    total = sum(lengths)
    partition = np.fromiter(itertools.chain.from_iterable(partitions), np.int64, total)
    offset = np.fromiter(itertools.chain.from_iterable(values), np.int64, total)
    member = np.repeat(np.array(who, np.int64), lengths)
    return partition, member, np.maximum(end[partition] - offset, 0)


def _end_offsets(scn: Scenario, warmup: WarmupInput, topic: str, count: int) -> np.ndarray:
    """(count,) end offset of each partition: given, else the highest any member reports (0 if none:
    then nobody reports one and no lag is finite)."""
    end = np.zeros(count, np.int64)
    for member in scn.members:
        local = member.local_offsets.get(topic)
        if local:
            partition = np.fromiter(local.keys(), np.int64, len(local))
            np.maximum.at(end, partition, np.fromiter(local.values(), np.int64, len(local)))
    given: Mapping[int, int] = warmup.end_offsets.get(topic, {})
    if given:
        partitions = np.fromiter(given.keys(), np.int64, len(given))
        end[partitions] = np.fromiter(given.values(), np.int64, len(given))
    return end


def hold_moves(
    lags: Lags,
    target: np.ndarray,
    owner: np.ndarray,
    budget: int,
    member_count: int,
) -> Holds:
    """W2 and W3: hold every stateful task moving to a member not caught up on it, when some
    eligible member is; give the first `budget` of those moves a warm-up replica."""
    placed = target.copy()
    moving = np.nonzero(lags.stateful & (target >= 0) & (target != owner))[0]
    if len(moving) == 0:
        return Holds(placed, [])
    actives = np.bincount(target[target >= 0], minlength=member_count)
    moves: list[PendingMove] = []
    for task in moving.tolist():
        found = lags.of(task)
        to = int(target[task])
        lag = found.get(to)
        if lag is not None and lag <= lags.acceptable:
            continue  # the target is caught up: the move happens now
        holder = _holder(found, int(owner[task]), lags.acceptable, actives)
        if holder is None:
            continue  # nobody is caught up: the task moves cold now
        placed[task] = holder
        actives[holder] += 1
        actives[to] -= 1
        moves.append(PendingMove(task, holder, to, lag))
    return Holds(placed, _budget(moves, budget))


def _holder(found: dict[int, int], owner: int, acceptable: int, actives: np.ndarray) -> int | None:
    """The previous owner (caught up by definition), else the caught-up member least behind,
    then with the fewest actives so far, then the lowest id."""
    if owner >= 0:
        return owner
    caught = [(lag, int(actives[m]), m) for m, lag in found.items() if lag <= acceptable]
    return min(caught)[2] if caught else None


def _budget(moves: list[PendingMove], budget: int) -> list[PendingMove]:
    """The first `budget` moves, the least behind target first (unbounded last), then in task
    order, get a warm-up replica."""
    ranked = sorted(moves, key=lambda m: (m.lag is None, m.lag or 0, m.task))
    chosen = {m.task for m in ranked[: min(budget, len(moves))]}
    return [PendingMove(m.task, m.holder, m.target, m.lag, m.task in chosen) for m in moves]
