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
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

Task = tuple[int, int]
SPREAD_LOOKAHEAD = 8  # equally loaded candidates compared for spreading


@dataclass(slots=True)
class StandbyProblem:
    replicas: int
    tasks: list[Task]  # stateful tasks that have an active owner, sorted
    active: dict[Task, str]
    eligible: dict[int, list[str]]
    host: dict[str, str]
    rack: dict[str, str | None]
    capacity: dict[str, Fraction]
    previous: dict[Task, set[str]] = field(default_factory=dict)
    holds_state: dict[Task, set[str]] = field(default_factory=dict)
    eligible_set: dict[int, frozenset[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.eligible_set = {g: frozenset(ms) for g, ms in self.eligible.items()}


def _category(problem: StandbyProblem, active: str, member: str) -> int:
    """0: other host and rack, 1: other host, same rack, 2: same host."""
    if problem.host[member] == problem.host[active]:
        return 2
    a, b = problem.rack[active], problem.rack[member]
    return 1 if a is not None and a == b else 0


class _Loads:
    """Standby counts per member, with a lazy heap of the least loaded."""

    def __init__(self, problem: StandbyProblem, total: int) -> None:
        members = sorted({m for g in {t[0] for t in problem.tasks} for m in problem.eligible[g]})
        weight = sum((problem.capacity[m] for m in members), Fraction(0)) or Fraction(1)
        self.cap = {m: math.ceil(total * problem.capacity[m] / weight) for m in members}
        self.floor = {m: math.floor(total * problem.capacity[m] / weight) for m in members}
        self.scale = {m: 1 / float(problem.capacity[m]) for m in members}
        self.load = dict.fromkeys(members, 0)
        self.pairs: Counter[tuple[str | None, str]] = Counter()  # (active, standby member)
        self._heap = [(False, 0.0, m) for m in members]
        heapq.heapify(self._heap)

    def key(self, m: str) -> tuple[bool, float, str]:
        return (self.load[m] >= self.cap[m], self.load[m] * self.scale[m], m)

    def best(self, accept: Callable[[str], bool], spread_from: str | None = None) -> str | None:
        """Least-loaded member for which accept(m) is true (skipping stale entries).

        Among the equally loaded (a few looked at), the one holding the fewest
        standbys of `spread_from`'s tasks: if that member dies, its tasks then
        find warm standbys on several survivors instead of piling on one.
        """
        skipped = []
        fitting: list[tuple[bool, float, str]] = []
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
        return min(fitting, key=lambda e: (self.pairs[spread_from, e[2]], e))[2]

    def add(self, m: str, active: str | None = None) -> None:
        self.load[m] += 1
        self.pairs[active, m] += 1
        heapq.heappush(self._heap, self.key(m))


def place_standbys(problem: StandbyProblem) -> dict[Task, list[str]]:
    need = {t: min(problem.replicas, len(problem.eligible[t[0]]) - 1) for t in problem.tasks}
    need = {t: k for t, k in need.items() if k > 0}
    loads = _Loads(problem, sum(need.values()))
    census = {g: _Census(problem, g) for g in {t[0] for t in need}}
    quota = {t: census[t[0]].quota(problem.active[t], k) for t, k in need.items()}
    chosen: dict[Task, list[str]] = {t: [] for t in need}
    for t in need:
        _keep_previous(problem, t, quota[t], chosen[t], loads)
    for t, k in need.items():
        _fill(problem, t, k, quota[t], chosen[t], loads)
    _rebalance(problem, chosen, loads)
    return {t: sorted(ms) for t, ms in chosen.items() if ms}


class _Census:
    """How many eligible members of a group share a host, a rack, or both."""

    def __init__(self, problem: StandbyProblem, group: int) -> None:
        self.problem = problem
        members = problem.eligible[group]
        self.size = len(members)
        self.by_host = Counter(problem.host[m] for m in members)
        self.by_rack = Counter(problem.rack[m] for m in members if problem.rack[m] is not None)
        self.by_host_rack = Counter(
            (problem.host[m], problem.rack[m]) for m in members if problem.rack[m] is not None
        )

    def quota(self, active: str, k: int) -> list[int]:
        """Standbys per category: most off host, and of those most off rack."""
        host, rack = self.problem.host[active], self.problem.rack[active]
        same_host = self.by_host[host] - 1
        same_rack_other_host = 0 if rack is None else self.by_rack[rack] - self.by_host_rack[host, rack]
        other = self.size - 1 - same_host - same_rack_other_host
        off_rack = min(k, other)
        off_host = min(k, other + same_rack_other_host) - off_rack
        return [off_rack, off_host, k - off_rack - off_host]


def _keep_previous(
    problem: StandbyProblem, task: Task, quota: list[int], chosen: list[str], loads: _Loads
) -> None:
    active = problem.active[task]
    eligible = problem.eligible_set[task[0]]
    candidates = sorted(
        (_category(problem, active, m), m)
        for m in problem.previous.get(task, ())
        if m != active and m in eligible
    )
    # Kept whatever the member's load: the repair pass moves only as many as balance needs.
    for category, m in candidates:
        if quota[category] > 0:
            quota[category] -= 1
            chosen.append(m)
            loads.add(m, active)


def _fill(
    problem: StandbyProblem,
    task: Task,
    k: int,
    quota: list[int],
    chosen: list[str],
    loads: _Loads,
) -> None:
    active = problem.active[task]
    eligible = problem.eligible_set[task[0]]
    holders = sorted(problem.holds_state.get(task, set()) | problem.previous.get(task, set()))
    for category in range(3):
        while quota[category] > 0 and len(chosen) < k:

            def fits(m: str, category: int = category) -> bool:
                return (
                    m != active
                    and m in eligible
                    and m not in chosen
                    and _category(problem, active, m) == category
                )

            pick = _prefer_state_holder(holders, fits, loads, loads.best(fits, spread_from=active))
            if pick is None:
                break
            quota[category] -= 1
            chosen.append(pick)
            loads.add(pick, active)


def _prefer_state_holder(
    holders: list[str], fits: Callable[[str], bool], loads: _Loads, least_loaded: str | None
) -> str | None:
    """A member under its cap that already holds the state beats the least loaded one."""
    warm = [m for m in holders if m in loads.load and fits(m)]
    under_cap = [m for m in warm if loads.load[m] < loads.cap[m]]
    if under_cap:
        return min(under_cap, key=loads.key)
    return least_loaded


def _rebalance(problem: StandbyProblem, chosen: dict[Task, list[str]], loads: _Loads) -> None:
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
    held: dict[str, set[Task]] = {m: set() for m in loads.load}
    for task, members in chosen.items():
        for m in members:
            held[m].add(task)
    search = _PathSearch(problem, chosen, held)
    load, floor, cap = loads.load, loads.floor, loads.cap
    # Each augmentation takes one from someone's excess and none from anyone's margin.
    while True:
        moved = search.augment(load, lambda m: load[m] > cap[m], lambda m: load[m] < cap[m])
        moved = moved or search.augment(load, lambda m: load[m] > floor[m], lambda m: load[m] < floor[m])
        if not moved:
            return


class _PathSearch:
    """Breadth-first search for the shortest chain of legal standby moves."""

    def __init__(self, problem: StandbyProblem, chosen: dict[Task, list[str]], held: dict[str, set[Task]]):
        self.problem = problem
        self.chosen = chosen
        self.held = held
        self.members = sorted(held)
        # Receivers are found by rack: a task's off-rack standby can only move off its rack.
        self.racks = sorted({problem.rack[m] or "" for m in self.members})

    def augment(
        self, load: dict[str, int], source: Callable[[str], bool], target: Callable[[str], bool]
    ) -> bool:
        """Move one unit of load from a source to a target member; False if no path exists."""
        sources = [m for m in self.members if source(m)]
        if not sources or not any(target(m) for m in self.members):
            return False
        parent: dict[str, tuple[str, Task]] = {}
        visited = set(sources)
        unvisited = {r: [m for m in self.members if (self.problem.rack[m] or "") == r and m not in visited]
                     for r in self.racks}
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
        donor: str,
        task: Task,
        unvisited: dict[str, list[str]],
        visited: set[str],
        parent: dict[str, tuple[str, Task]],
        queue: list[str],
        target: Callable[[str], bool],
    ) -> str | None:
        """Visit every unvisited member that could take `task` from `donor`; a target ends it."""
        problem = self.problem
        active = problem.active[task]
        worst = _category(problem, active, donor)
        active_rack = problem.rack[active]
        eligible = problem.eligible_set[task[0]]
        taken = self.chosen[task]
        for rack in self.racks:
            if worst == 0 and active_rack is not None and rack == active_rack:
                continue  # an off-rack standby must stay off the active's rack
            waiting: list[str] = []
            for m in unvisited[rack]:
                if m in visited:
                    continue
                if m == active or m in taken or m not in eligible or _category(problem, active, m) > worst:
                    waiting.append(m)
                    continue
                visited.add(m)
                parent[m] = (donor, task)
                queue.append(m)
                if target(m):
                    return m
            unvisited[rack] = waiting
        return None

    def _apply(self, receiver: str, parent: dict[str, tuple[str, Task]], load: dict[str, int]) -> None:
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
