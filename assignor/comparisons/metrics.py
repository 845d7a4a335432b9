"""Metrics comparing an assignment with the previous one (scenario format, docs/scenario-format.md).

Independent of the planner on purpose: the benchmark uses these to check the planner's claims
(exact stickiness, balance, warm moves), so nothing here imports `assignor.core`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

Scenario = Mapping[str, Any]
Assignment = Mapping[str, Any]
Group = tuple[tuple[str, ...], int]  # (topics of a co-partition group, partition count)
Task = tuple[int, int]  # (group index, partition)


def groups(scenario: Scenario) -> list[Group]:
    """Co-partition groups, then every remaining topic alone; a group uses its smallest count."""
    topics: Mapping[str, int] = scenario.get("topics", {})
    out: list[Group] = []
    seen: set[str] = set()
    for grp in scenario.get("copartition_groups", []) or []:
        known = tuple(t for t in grp if t in topics and t not in seen)
        if known:
            seen.update(known)
            out.append((known, min(int(topics[t]) for t in known)))
    out.extend(((t,), int(n)) for t, n in sorted(topics.items()) if t not in seen)
    return out


def changelogs(scenario: Scenario) -> set[str]:
    return set(scenario.get("changelog_topics", []) or [])


def _members(scenario: Scenario) -> Mapping[str, Mapping[str, Any]]:
    return scenario.get("members", {}) or {}


def _epoch(member: Mapping[str, Any]) -> int:
    e = member.get("epoch", 0)
    return e if isinstance(e, int) and e >= 0 else 0


def eligible(scenario: Scenario, grp: Group) -> list[str]:
    """Members subscribing to every topic of the group (the only ones that may own its tasks)."""
    need = set(grp[0])
    return sorted(m for m, d in _members(scenario).items() if need <= set(d.get("topics", [])))


def _topic_index(gs: list[Group]) -> dict[str, int]:
    return {t: gi for gi, (ts, _) in enumerate(gs) for t in ts}


def previous_owners(scenario: Scenario) -> dict[Task, str]:
    """Fenced previous owner per task: highest epoch wins, a tie at the top voids the claim."""
    gs = groups(scenario)
    index = _topic_index(gs)
    claims: dict[Task, dict[str, int]] = defaultdict(dict)
    for m, d in _members(scenario).items():
        for topic, parts in (d.get("previous_active") or {}).items():
            gi = index.get(topic)
            if gi is None:
                continue
            for p in parts:
                if 0 <= p < gs[gi][1]:
                    claims[(gi, p)][m] = _epoch(d)
    owners: dict[Task, str] = {}
    for task, by_member in claims.items():
        top = max(by_member.values())
        winners = [m for m, e in by_member.items() if e == top]
        if len(winners) == 1:
            owners[task] = winners[0]
    return owners


def _tp_owners(assignment: Assignment, kind: str) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    for m, d in (assignment.get("members") or {}).items():
        for topic, parts in (d.get(kind) or {}).items():
            for p in parts:
                out[(topic, p)].append(m)
    return out


@dataclass
class Metrics:
    tasks: int = 0
    moves: int = 0  # tasks not kept by their fenced previous owner (spec: tasks - kept)
    warm: int = 0  # moved stateful tasks landing on a member with a standby or local state for them
    cold: int = 0  # moved stateful tasks landing elsewhere
    spread_group: int = 0  # max over groups and member classes of (max - min) active tasks
    spread_total: int = 0  # same over each member's total active tasks
    idle: int = 0  # subscribed members with no active task
    copart_violations: int = 0  # tasks whose topic-partitions are not all on one member
    invalid: int = 0  # partitions with zero or several owners, or a non-subscribing owner
    standby_missing: int = 0  # stateful tasks with fewer than min(R, eligible - 1) standbys
    standby_on_active: int = 0
    standby_same_host: int = 0  # (task, standby) pairs on the active owner's host

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _task_owners(
    scenario: Scenario, assignment: Assignment, gs: list[Group], met: Metrics
) -> dict[Task, str | None]:
    """Owner of each task (owner of its first topic); counts invalid partitions and violations."""
    active = _tp_owners(assignment, "active")
    subs = {m: set(d.get("topics", [])) for m, d in _members(scenario).items()}
    owners: dict[Task, str | None] = {}
    for gi, (ts, n) in enumerate(gs):
        elig = bool(eligible(scenario, (ts, n)))
        for p in range(n):
            per_topic = [active.get((t, p), []) for t in ts]
            for t, own in zip(ts, per_topic, strict=True):
                ok = len(own) == 1 and t in subs.get(own[0], ())
                met.invalid += int(elig and not ok)
            firsts = {own[0] if own else None for own in per_topic}
            met.copart_violations += int(elig and len(firsts) > 1)
            owners[(gi, p)] = per_topic[0][0] if per_topic[0] else None
    return owners


def _warm_members(scenario: Scenario, gs: list[Group]) -> dict[Task, set[str]]:
    """Members holding state for a task: a previous standby or local offsets of a changelog."""
    index = _topic_index(gs)
    cls = changelogs(scenario)
    warm: dict[Task, set[str]] = defaultdict(set)
    for m, d in _members(scenario).items():
        for field in ("previous_standby", "local_offsets"):
            for topic, parts in (d.get(field) or {}).items():
                if topic in cls and topic in index:
                    for p in parts:
                        warm[(index[topic], int(p))].add(m)
    return warm


def _classes(scenario: Scenario) -> dict[tuple[frozenset[str], float], list[str]]:
    out: dict[tuple[frozenset[str], float], list[str]] = defaultdict(list)
    for m, d in _members(scenario).items():
        out[(frozenset(d.get("topics", [])), float(d.get("capacity", 1) or 1))].append(m)
    return out


def _spread(scenario: Scenario, owners: Mapping[Task, str | None], met: Metrics) -> None:
    per_group: Counter[tuple[str, int]] = Counter()
    total: Counter[str] = Counter()
    for (gi, _), m in owners.items():
        if m is not None:
            per_group[(m, gi)] += 1
            total[m] += 1
    gs = groups(scenario)
    for (subs, _), ms in _classes(scenario).items():
        totals = [total[m] for m in ms]
        met.spread_total = max(met.spread_total, max(totals) - min(totals))
        for gi, (ts, _) in enumerate(gs):
            if set(ts) <= subs:
                counts = [per_group[(m, gi)] for m in ms]
                met.spread_group = max(met.spread_group, max(counts) - min(counts))
        met.idle += sum(1 for m in ms if subs and total[m] == 0)


def _standbys(
    scenario: Scenario,
    assignment: Assignment,
    gs: list[Group],
    owners: Mapping[Task, str | None],
    met: Metrics,
) -> None:
    cls = changelogs(scenario)
    standby = _tp_owners(assignment, "standby")
    r = int(scenario.get("standby_replicas", 0) or 0)
    members = _members(scenario)
    for gi, (ts, n) in enumerate(gs):
        logs = [t for t in ts if t in cls]
        if not logs:
            continue
        want = max(0, min(r, len(eligible(scenario, (ts, n))) - 1))
        for p in range(n):
            holders = set(standby.get((logs[0], p), []))
            owner = owners.get((gi, p))
            met.standby_missing += int(len(holders - {owner}) < want)
            met.standby_on_active += int(owner in holders)
            if owner is not None:
                host = members.get(owner, {}).get("host", owner)
                met.standby_same_host += sum(
                    1 for s in holders if s != owner and members.get(s, {}).get("host", s) == host
                )


def measure(scenario: Scenario, assignment: Assignment) -> Metrics:
    """All metrics of `assignment` as the answer to `scenario`."""
    gs = groups(scenario)
    met = Metrics(tasks=sum(n for _, n in gs))
    owners = _task_owners(scenario, assignment, gs, met)
    prev = previous_owners(scenario)
    warm = _warm_members(scenario, gs)
    cls = changelogs(scenario)
    stateful = {gi for gi, (ts, _) in enumerate(gs) if cls & set(ts)}
    for task, m in owners.items():
        if m is not None and prev.get(task) == m:
            continue
        met.moves += 1
        if task[0] in stateful:
            if m in warm.get(task, ()):
                met.warm += 1
            else:
                met.cold += 1
    _spread(scenario, owners, met)
    _standbys(scenario, assignment, gs, owners, met)
    return met


def optimum_moves(scenario: Scenario) -> int:
    """Fewest moves (tasks - kept) among balanced assignments, equal subscriptions and capacities.

    With M members every group count x[g,m] is lo_g or lo_g + 1 (lo_g = T_g // M), so
    kept = sum min(prev[g,m], lo_g) + #{extra task of g on m where prev[g,m] > lo_g}. Choosing
    the extras is a flow: group g hands out r_g = T_g - M*lo_g extras, at most one per member,
    and member m takes between floor(T/M) - sum lo_g and ceil(T/M) - sum lo_g of them (lower
    bound forced with a large negative cost). Solved exactly with ortools' min-cost flow.
    """
    members, gs = _uniform_members(scenario)
    if not members or not gs:
        return sum(n for _, n in gs)
    prev = _prev_counts(scenario, gs, members)
    big_m = len(members)
    lo = np.array([n // big_m for _, n in gs], dtype=np.int64)
    extras = np.array([n for _, n in gs], dtype=np.int64) - big_m * lo
    total = sum(n for _, n in gs)
    kept = int(np.minimum(prev, lo[:, None]).sum())
    need_lo = total // big_m - int(lo.sum())
    need_hi = -(-total // big_m) - int(lo.sum())
    return total - kept - _extra_gain(prev, lo, extras, need_lo, need_hi)


def _uniform_members(scenario: Scenario) -> tuple[list[str], list[Group]]:
    classes = _classes(scenario)
    if len(classes) > 1:
        raise ValueError("optimum_moves needs equal subscriptions and capacities")
    members = sorted(_members(scenario))
    subs = next(iter(classes))[0] if classes else frozenset()
    return members, [g for g in groups(scenario) if set(g[0]) <= subs]


def _prev_counts(scenario: Scenario, gs: list[Group], members: list[str]) -> np.ndarray:
    col = {m: i for i, m in enumerate(members)}
    allg = groups(scenario)
    row = {allg.index(g): i for i, g in enumerate(gs)}
    prev = np.zeros((len(gs), len(members)), dtype=np.int64)
    for (gi, _), m in previous_owners(scenario).items():
        if gi in row and m in col:
            prev[row[gi], col[m]] += 1
    return prev


def _extra_gain(prev: np.ndarray, lo: np.ndarray, extras: np.ndarray, need_lo: int, need_hi: int) -> int:
    from ortools.graph.python import min_cost_flow

    n_groups, n_members = prev.shape
    rows = np.flatnonzero(extras > 0)
    supply = int(extras.sum())
    if supply == 0:
        return 0
    src, sink = 0, 1 + n_groups + n_members
    g_node = 1 + rows
    m_node = 1 + n_groups + np.arange(n_members)
    big = supply + 1  # forcing a lower-bound unit must outweigh any achievable gain
    tails = [np.zeros(len(rows), dtype=np.int64), np.repeat(g_node, n_members), m_node, m_node]
    heads = [g_node, np.tile(m_node, len(rows)), np.full(n_members, sink), np.full(n_members, sink)]
    caps = [
        extras[rows],
        np.ones(len(rows) * n_members, dtype=np.int64),
        np.full(n_members, need_lo),
        np.full(n_members, need_hi - need_lo),
    ]
    gain = (prev[rows] > lo[rows, None]).astype(np.int64).ravel()
    costs = [
        np.zeros(len(rows), dtype=np.int64),
        -gain,
        np.full(n_members, -big),
        np.zeros(n_members, dtype=np.int64),
    ]
    flow = min_cost_flow.SimpleMinCostFlow()
    flow.add_arcs_with_capacity_and_unit_cost(
        np.concatenate(tails),
        np.concatenate(heads),
        np.concatenate(caps),
        np.concatenate(costs),
    )
    flow.set_node_supply(src, supply)
    flow.set_node_supply(sink, -supply)
    if flow.solve() != flow.OPTIMAL:
        raise RuntimeError("no balanced assignment exists")
    gain = -flow.optimal_cost() - big * need_lo * n_members
    if not 0 <= gain <= supply:  # a lower bound was left unsaturated
        raise RuntimeError("no balanced assignment exists")
    return int(gain)
