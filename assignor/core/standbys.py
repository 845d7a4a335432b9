"""Placing standby replicas of stateful tasks.

Each task gets `k = min(R, eligible - 1)` standbys, never on its active owner.
Of them, as many as possible sit off the active's host, and within that as
many as possible off its rack (racks compare only when both members have
one): per task this fixes how many standbys go in each of three categories
(off host and rack, off host only, same host), and every task reaches its
best counts because members have no hard limit on standbys.

Within those counts: previous standbys stay; the rest go to the member under
its balance cap (ceil of its capacity share of all standbys) that holds the
task's state, else the least loaded. A repair pass then brings every count
within [floor, cap] of its share by chains of moves, wherever some chain can:
it moves only as many standbys as balance needs, and a plan fed back is left
exactly as it is.

Members are indices in member-id order (so comparing indices compares ids);
tasks are positions in `StandbyProblem.tasks`. Keeping previous standbys is
done for all tasks at once with numpy; only tasks still short of standbys, and
members out of balance, are handled one by one.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

SPREAD_LOOKAHEAD = 8  # equally loaded candidates compared for spreading
CATEGORIES = 3


@dataclass(slots=True)
class StandbyProblem:
    replicas: int
    groups: np.ndarray  # (S,) group of each stateful task that has an active owner, in task order
    active: np.ndarray  # (S,) its active owner
    eligible: np.ndarray  # (G, M) bool
    host: np.ndarray  # (M,) host id
    rack: np.ndarray  # (M,) rack id in rack-name order, -1 for none
    capacity: list[Fraction]  # (M,)
    previous: tuple[np.ndarray, np.ndarray]  # (task, member) pairs of previous standbys
    holders: Callable[[int], Iterable[int]]  # members holding a task's state (for the fill)
    # (S,) a member that may not stand by for the task (its warm-up replica), -1 for none;
    # None: no task has one (warm-ups off)
    excluded: np.ndarray | None = None

    def barred(self, task: int, member: int) -> bool:
        """Whether `member` is the task's warm-up member (which takes no standby of it)."""
        return self.excluded is not None and int(self.excluded[task]) == member


def categories(problem: StandbyProblem, active: np.ndarray, member: np.ndarray) -> np.ndarray:
    """0: other host and rack, 1: other host, same rack, 2: same host (element-wise)."""
    host, rack = problem.host, problem.rack
    same_rack = (rack[active] >= 0) & (rack[member] == rack[active])
    return np.where(host[member] == host[active], 2, np.where(same_rack, 1, 0))


def _category(problem: StandbyProblem, active: int, member: int) -> int:
    if problem.host[member] == problem.host[active]:
        return 2
    a = problem.rack[active]
    return 1 if a >= 0 and a == problem.rack[member] else 0


def place_standbys(problem: StandbyProblem) -> list[list[int]]:
    """Standby members of every task (sorted), in task order."""
    tasks = len(problem.groups)
    eligible_count = problem.eligible.sum(axis=1)
    replicas = min(problem.replicas, problem.eligible.shape[1])  # R is unbounded; numpy is not
    others = eligible_count[problem.groups] - 1
    if problem.excluded is not None:
        others = others - (problem.excluded >= 0)  # the warm-up member plays a standby's part
    need = np.minimum(replicas, others).clip(min=0)
    quota = _quotas(problem, need)
    chosen, kept = _keep_previous(problem, need, quota)
    loads = _Loads(problem, chosen, np.bincount(kept, minlength=problem.eligible.shape[1]), int(need.sum()))
    short = np.nonzero(np.fromiter(map(len, chosen), np.int64, tasks) < need)[0]
    if len(short):
        previous = _PreviousByTask(problem.previous)
        for t in short.tolist():
            _fill(problem, t, int(need[t]), quota[t], chosen[t], previous.of(t), loads)
    _rebalance(problem, chosen, loads)
    return [sorted(ms) for ms in chosen]


def _quotas(problem: StandbyProblem, need: np.ndarray) -> np.ndarray:
    """(S, 3) standbys per category: most off host, and of those most off rack."""
    quota = np.zeros((len(need), CATEGORIES), np.int64)
    hosts = int(problem.host.max(initial=-1)) + 1
    racks = int(problem.rack.max(initial=-1)) + 2  # +1 for "no rack"
    for g in np.unique(problem.groups).tolist():
        rows = np.nonzero(problem.groups == g)[0]
        members = np.nonzero(problem.eligible[g])[0]
        host, rack = problem.host[members], problem.rack[members]
        by_host = np.bincount(host, minlength=hosts)
        has_rack = rack >= 0
        by_rack = np.bincount(rack[has_rack], minlength=racks)
        pair_keys, pair_counts = np.unique(host[has_rack] * racks + rack[has_rack], return_counts=True)
        active = problem.active[rows]
        a_host, a_rack = problem.host[active], problem.rack[active]
        same_host = by_host[a_host] - 1
        pair_count = _lookup(pair_keys, pair_counts, a_host * racks + a_rack)
        same_rack_other_host = np.where(a_rack >= 0, by_rack[np.maximum(a_rack, 0)] - pair_count, 0)
        other = len(members) - 1 - same_host - same_rack_other_host
        if problem.excluded is not None:  # the warm-up member is no candidate: one fewer in its category
            barred = problem.excluded[rows]
            has = barred >= 0
            category = categories(problem, active, np.maximum(barred, 0))
            other = other - (has & (category == 0))
            same_rack_other_host = same_rack_other_host - (has & (category == 1))
        k = need[rows]
        off_rack = np.minimum(k, other)
        off_host = np.minimum(k, other + same_rack_other_host) - off_rack
        quota[rows] = np.stack([off_rack, off_host, k - off_rack - off_host], axis=1)
    return quota


def _lookup(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values[keys == w] for each w (sorted unique `keys`), 0 where absent."""
    if len(keys) == 0:
        return np.zeros(len(wanted), np.int64)
    at = np.searchsorted(keys, wanted).clip(max=len(keys) - 1)
    return np.where(keys[at] == wanted, values[at], 0)


def _keep_previous(
    problem: StandbyProblem, need: np.ndarray, quota: np.ndarray
) -> tuple[list[list[int]], np.ndarray]:
    """Every previous standby that fits its task's category counts stays, whatever the load.

    The repair pass moves only as many as balance needs. Within a category the
    lowest member ids are kept first; `quota` is left with what remains to fill.
    Returns the members per task and the members of every kept standby.
    """
    chosen: list[list[int]] = [[] for _ in range(len(need))]
    task, member = problem.previous
    if len(task) == 0:
        return chosen, np.zeros(0, np.int64)
    members = problem.eligible.shape[1]
    pairs = np.unique(task * members + member)
    task, member = pairs // members, pairs % members
    active = problem.active[task]
    usable = (member != active) & problem.eligible[problem.groups[task], member] & (need[task] > 0)
    if problem.excluded is not None:
        usable &= member != problem.excluded[task]
    task, member, active = task[usable], member[usable], active[usable]
    category = categories(problem, active, member)
    order = np.lexsort((member, category, task))
    task, member, category = task[order], member[order], category[order]
    slot = task * CATEGORIES + category
    starts = np.r_[0, np.nonzero(np.diff(slot))[0] + 1]
    rank = np.arange(len(slot)) - np.repeat(starts, np.diff(np.r_[starts, len(slot)]))
    kept = rank < quota[task, category]
    np.subtract.at(quota, (task[kept], category[kept]), 1)
    for t, m in zip(task[kept].tolist(), member[kept].tolist(), strict=True):
        chosen[t].append(m)
    return chosen, member[kept]


class _PreviousByTask:
    """Previous standby members of one task at a time (only short tasks ask)."""

    def __init__(self, pairs: tuple[np.ndarray, np.ndarray]) -> None:
        order = np.argsort(pairs[0], kind="stable")
        self.tasks, self.members = pairs[0][order], pairs[1][order]

    def of(self, task: int) -> list[int]:
        a, b = np.searchsorted(self.tasks, [task, task + 1]).tolist()
        return self.members[a:b].tolist()


class _Loads:
    """Standby counts per member, with a lazy heap of the least loaded."""

    def __init__(
        self, problem: StandbyProblem, chosen: list[list[int]], counts: np.ndarray, total: int
    ) -> None:
        members = np.nonzero(problem.eligible[np.unique(problem.groups)].any(axis=0))[0].tolist()
        capacity = [problem.capacity[m] for m in members]
        shares = Counter(capacity)  # a few distinct capacities: the Fraction arithmetic once each
        weight = sum((c * n for c, n in shares.items()), Fraction(0)) or Fraction(1)
        bounds = {
            c: (math.floor(total * c / weight), math.ceil(total * c / weight), 1 / float(c)) for c in shares
        }
        self.floor = {m: bounds[c][0] for m, c in zip(members, capacity, strict=True)}
        self.cap = {m: bounds[c][1] for m, c in zip(members, capacity, strict=True)}
        self.scale = {m: bounds[c][2] for m, c in zip(members, capacity, strict=True)}
        load = counts.tolist()
        self.load = {m: load[m] for m in members}
        self._problem = problem
        self._chosen = chosen
        self._spread: dict[int, Counter[int]] = {}  # active -> its tasks' standbys per member
        self._heap = [self.key(m) for m in members]
        heapq.heapify(self._heap)

    def key(self, m: int) -> tuple[bool, float, int]:
        return (self.load[m] >= self.cap[m], self.load[m] * self.scale[m], m)

    def spread(self, active: int) -> Counter[int]:
        """Standbys of `active`'s tasks per member (built when first asked)."""
        if active not in self._spread:
            tasks = np.nonzero(self._problem.active == active)[0].tolist()
            self._spread[active] = Counter(m for t in tasks for m in self._chosen[t])
        return self._spread[active]

    def best(self, accept: Callable[[int], bool], spread_from: int | None = None) -> int | None:
        """Least-loaded member for which accept(m) is true (skipping stale entries).

        Among the equally loaded (a few looked at), the one holding the fewest
        standbys of `spread_from`'s tasks: if that member dies, its tasks then
        find warm standbys on several survivors instead of piling on one.
        """
        skipped = []
        fitting: list[tuple[bool, float, int]] = []
        while self._heap and len(fitting) < SPREAD_LOOKAHEAD:
            entry = heapq.heappop(self._heap)
            if entry != self.key(entry[2]):
                continue  # stale: the member's load changed since
            if fitting and entry[:2] != fitting[0][:2]:
                heapq.heappush(self._heap, entry)
                break
            skipped.append(entry)
            if accept(entry[2]):
                fitting.append(entry)
                if spread_from is None:
                    break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        if not fitting:
            return None
        if spread_from is None:
            return fitting[0][2]
        spread = self.spread(spread_from)
        return min(fitting, key=lambda e: (spread[e[2]], e))[2]

    def add(self, m: int, active: int) -> None:
        """`m` took a standby of one of `active`'s tasks (already in its chosen list)."""
        self.load[m] += 1
        if active in self._spread:
            self._spread[active][m] += 1
        heapq.heappush(self._heap, self.key(m))


def _fill(
    problem: StandbyProblem,
    task: int,
    k: int,
    quota: np.ndarray,
    chosen: list[int],
    previous: Iterable[int],
    loads: _Loads,
) -> None:
    active = int(problem.active[task])
    eligible = problem.eligible[problem.groups[task]]
    holders = sorted(set(problem.holders(task)) | set(previous))
    for category in range(CATEGORIES):
        while quota[category] > 0 and len(chosen) < k:

            def fits(m: int, category: int = category) -> bool:
                return (
                    m != active
                    and bool(eligible[m])
                    and m not in chosen
                    and _category(problem, active, m) == category
                    and not problem.barred(task, m)
                )

            pick = _prefer_state_holder(holders, fits, loads, loads.best(fits, spread_from=active))
            if pick is None:
                break
            quota[category] -= 1
            chosen.append(pick)
            loads.add(pick, active)


def _prefer_state_holder(
    holders: list[int], fits: Callable[[int], bool], loads: _Loads, least_loaded: int | None
) -> int | None:
    """A member under its cap that already holds the state beats the least loaded one."""
    warm = [m for m in holders if m in loads.load and fits(m)]
    under_cap = [m for m in warm if loads.load[m] < loads.cap[m]]
    if under_cap:
        return min(under_cap, key=loads.key)
    return least_loaded


def _rebalance(problem: StandbyProblem, chosen: list[list[int]], loads: _Loads) -> None:
    """Bring every member's standby count within [floor, cap] where any chain of moves can.

    The greedy fill can corner itself (the last tasks' only light members are their
    own actives), and kept previous standbys may sit above a share. A single move
    from a heavy to a light member is not always legal (the light one is the task's
    active, shares its host...), so this moves along augmenting paths: heavy -> m1
    (task a), m1 -> light (task b) leaves m1's count as it was. A move never puts a
    standby on the task's active, on a member already holding one, or in a worse
    host/rack category. It stops only when no path exists, so a plan fed back finds
    none and stays as it is (idempotence), whatever the history that made it.
    """
    load, floor, cap = loads.load, loads.floor, loads.cap
    if all(floor[m] <= n <= cap[m] for m, n in load.items()):
        return  # the usual case: nothing to search
    held: dict[int, set[int]] = {m: set() for m in load}
    for task, members in enumerate(chosen):
        for m in members:
            held[m].add(task)
    search = _PathSearch(problem, chosen, held)
    # Each augmentation takes one from someone's excess and none from anyone's margin.
    while True:
        moved = search.augment(load, lambda m: load[m] > cap[m], lambda m: load[m] < cap[m])
        moved = moved or search.augment(load, lambda m: load[m] > floor[m], lambda m: load[m] < floor[m])
        if not moved:
            return


class _PathSearch:
    """Breadth-first search for the shortest chain of legal standby moves."""

    def __init__(self, problem: StandbyProblem, chosen: list[list[int]], held: dict[int, set[int]]):
        self.problem = problem
        self.chosen = chosen
        self.held = held
        self.members = sorted(held)
        # Receivers are found by rack: a task's off-rack standby can only move off its rack.
        self.rack_of = {m: int(problem.rack[m]) for m in self.members}
        self.racks = sorted(set(self.rack_of.values()))

    def augment(
        self, load: dict[int, int], source: Callable[[int], bool], target: Callable[[int], bool]
    ) -> bool:
        """Move one unit of load from a source to a target member; False if no path exists."""
        sources = [m for m in self.members if source(m)]
        if not sources or not any(target(m) for m in self.members):
            return False
        parent: dict[int, tuple[int, int]] = {}
        visited = set(sources)
        unvisited = {
            r: [m for m in self.members if self.rack_of[m] == r and m not in visited] for r in self.racks
        }
        queue = list(sources)
        for donor in queue:  # the queue grows while it is walked
            for task in sorted(self.held[donor]):
                found = self._receivers(donor, task, unvisited, visited, parent, queue, target)
                if found is not None:
                    self._apply(found, parent, load)
                    return True
        return False

    def _receivers(
        self,
        donor: int,
        task: int,
        unvisited: dict[int, list[int]],
        visited: set[int],
        parent: dict[int, tuple[int, int]],
        queue: list[int],
        target: Callable[[int], bool],
    ) -> int | None:
        """Visit every unvisited member that could take `task` from `donor`; a target ends it."""
        problem = self.problem
        active = int(problem.active[task])
        worst = _category(problem, active, donor)
        active_rack = int(problem.rack[active])
        eligible = problem.eligible[problem.groups[task]]
        taken = self.chosen[task]
        for rack in self.racks:
            if worst == 0 and active_rack >= 0 and rack == active_rack:
                continue  # an off-rack standby must stay off the active's rack
            waiting: list[int] = []
            for m in unvisited[rack]:
                if m in visited:
                    continue
                if (
                    m == active
                    or m in taken
                    or not eligible[m]
                    or _category(problem, active, m) > worst
                    or problem.barred(task, m)
                ):
                    waiting.append(m)
                    continue
                visited.add(m)
                parent[m] = (donor, task)
                queue.append(m)
                if target(m):
                    return m
            unvisited[rack] = waiting
        return None

    def _apply(self, receiver: int, parent: dict[int, tuple[int, int]], load: dict[int, int]) -> None:
        """Carry out the chain ending at `receiver`: only its two ends change load."""
        load[receiver] += 1
        while receiver in parent:
            donor, task = parent[receiver]
            members = self.chosen[task]
            members[members.index(donor)] = receiver
            self.held[donor].discard(task)
            self.held[receiver].add(task)
            receiver = donor
        load[receiver] -= 1  # the source
