"""Placing active tasks: balanced, then as sticky as possible, then as warm as possible.

Objective, lexicographic: (1) the most tasks kept by their previous owner,
(2) the most of the others placed on a member holding their state, (3) the
freshest such member. Solved exactly as a min-cost flow over

    task -> its owner's slot      (keep:  cost -KEEP)
    task -> a warm member's slot  (warm:  cost -(WARM + freshness rank))
    task -> cold hub of its group (cost 0) -> any eligible member's slot
    slot(group, member) -> member -> sink

with the per-group bounds on slots and the total bounds on members. Two
reductions keep it small: an owner holding no more than its lower bound keeps
all its tasks in every optimum (swapping one away lowers the kept count), so
those are fixed first; and tasks with no owner and no warm member are pooled.
When only pooled tasks remain, a greedy fill is tried first and checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from assignor.core.flow import FlowNetwork
from assignor.core.quotas import Bounds

Task = tuple[int, int]  # (group index, partition)


@dataclass(slots=True)
class ActiveProblem:
    sizes: dict[int, int]  # group -> task count
    eligible: dict[int, list[str]]  # group -> eligible members, sorted
    bounds: Bounds
    owner: dict[int, list[str | None]]  # group -> fenced previous owner per partition
    warm: dict[Task, list[tuple[str, int]]]  # task -> [(member, freshness)], excl. owner


@dataclass(slots=True)
class _Residual:
    """What is left of each bound after the fixed tasks."""

    slot: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    total: dict[str, tuple[int, int]] = field(default_factory=dict)


def place_actives(problem: ActiveProblem) -> dict[int, list[str | None]]:
    """New owner of every task of every group with eligible members."""
    placed: dict[int, list[str | None]] = {g: [None] * n for g, n in problem.sizes.items()}
    used: dict[tuple[int, str], int] = {}
    open_tasks = _fix_safe_keeps(problem, placed, used)
    residual = _residual(problem, used)
    flow_tasks = [t for t in open_tasks if _owner(problem, t) or problem.warm.get(t)]
    pooled: dict[int, list[int]] = {}
    for g, p in open_tasks:
        if not (_owner(problem, (g, p)) or problem.warm.get((g, p))):
            pooled.setdefault(g, []).append(p)
    if not flow_tasks and _greedy_fill(problem, residual, pooled, placed):
        return placed
    _solve_flow(problem, residual, flow_tasks, pooled, placed)
    return placed


def _owner(problem: ActiveProblem, task: Task) -> str | None:
    return problem.owner[task[0]][task[1]]


def _fix_safe_keeps(
    problem: ActiveProblem, placed: dict[int, list[str | None]], used: dict[tuple[int, str], int]
) -> list[Task]:
    """Keep every task whose owner holds no more than its lower bound; return the rest."""
    open_tasks: list[Task] = []
    for g in sorted(problem.sizes):
        eligible = set(problem.eligible[g])
        held: dict[str, list[int]] = {}
        for p, owner in enumerate(problem.owner[g]):
            if owner is not None and owner in eligible:
                held.setdefault(owner, []).append(p)
            else:
                problem.owner[g][p] = None  # an owner that may not keep it is no owner
                open_tasks.append((g, p))
        for member, partitions in held.items():
            if len(partitions) <= problem.bounds.group(g, member)[0]:
                for p in partitions:
                    placed[g][p] = member
                used[g, member] = len(partitions)
            else:
                open_tasks.extend((g, p) for p in partitions)
    open_tasks.sort()
    return open_tasks


def _residual(problem: ActiveProblem, used: dict[tuple[int, str], int]) -> _Residual:
    residual = _Residual()
    used_total: dict[str, int] = {}
    for (_g, m), n in used.items():
        used_total[m] = used_total.get(m, 0) + n
    for g, members in problem.eligible.items():
        if problem.sizes.get(g, 0) == 0:
            continue
        for m in members:
            lo, hi = problem.bounds.group(g, m)
            n = used.get((g, m), 0)
            residual.slot[g, m] = (max(0, lo - n), hi - n)
    for m, (lo, hi) in problem.bounds.total.items():
        n = used_total.get(m, 0)
        residual.total[m] = (max(0, lo - n), hi - n)
    return residual


def _greedy_fill(
    problem: ActiveProblem,
    residual: _Residual,
    pooled: dict[int, list[int]],
    placed: dict[int, list[str | None]],
) -> bool:
    """Place interchangeable tasks: lower bounds first, then the neediest members.

    Returns False (changing nothing) when it cannot meet every bound; the exact
    flow then decides.
    """
    load = {m: 0 for m in residual.total}
    choice: dict[int, list[str]] = {}
    for g in sorted(pooled):
        count = len(pooled[g])
        picks: list[str] = []
        extra: list[str] = []
        for m in problem.eligible[g]:
            lo, hi = residual.slot[g, m]
            picks.extend([m] * lo)
            if hi > lo:
                extra.append(m)
        if len(picks) > count:
            return False
        for m in picks:
            load[m] += 1
        need = count - len(picks)
        extra.sort(key=lambda m: (load[m] - residual.total[m][0], load[m], m))
        for m in extra[:need]:
            load[m] += 1
        picks.extend(extra[:need])
        if len(picks) != count:
            return False
        choice[g] = sorted(picks)
    if any(not lo <= load[m] <= hi for m, (lo, hi) in residual.total.items()):
        return False
    for g, members in choice.items():
        for p, m in zip(pooled[g], members, strict=True):
            placed[g][p] = m
    return True


def _solve_flow(
    problem: ActiveProblem,
    residual: _Residual,
    flow_tasks: Sequence[Task],
    pooled: dict[int, list[int]],
    placed: dict[int, list[str | None]],
) -> None:
    net = FlowNetwork()
    sink = net.node()
    member_node = {m: net.node() for m in sorted(residual.total)}
    for m, node in member_node.items():
        lo, hi = residual.total[m]
        net.arc(node, sink, hi, lower=lo)
    slot_node: dict[tuple[int, str], int] = {}
    cold_arcs: dict[int, list[tuple[str, int]]] = {}
    hubs: dict[int, int] = {}
    for g in sorted(problem.sizes):
        hubs[g] = hub = net.node()
        for m in problem.eligible[g]:
            lo, hi = residual.slot[g, m]
            if hi <= 0:
                continue
            slot_node[g, m] = slot = net.node()
            net.arc(slot, member_node[m], hi, lower=lo)
            cold_arcs.setdefault(g, []).append((m, net.arc(hub, slot, hi)))
    freshness_levels = 1 + max((len(c) for c in problem.warm.values()), default=0)
    warm_unit = len(flow_tasks) * freshness_levels + 1
    keep_unit = len(flow_tasks) * (warm_unit + freshness_levels) + 1
    task_arcs: list[tuple[Task, list[tuple[str | None, int]]]] = []
    for task in flow_tasks:
        g, _ = task
        node = net.node(supply=1)
        options: list[tuple[str | None, int]] = []
        owner = _owner(problem, task)
        if owner is not None and (g, owner) in slot_node:
            options.append((owner, net.arc(node, slot_node[g, owner], 1, cost=-keep_unit)))
        for rank, member in enumerate(_warm_by_freshness(problem.warm.get(task, []))):
            if (g, member) in slot_node:
                cost = -(warm_unit + freshness_levels - 1 - rank)
                options.append((member, net.arc(node, slot_node[g, member], 1, cost=cost)))
        options.append((None, net.arc(node, hubs[g], 1)))
        task_arcs.append((task, options))
    for g, partitions in pooled.items():
        net.add_supply(hubs[g], len(partitions))
    net.add_supply(sink, -(len(flow_tasks) + sum(len(p) for p in pooled.values())))
    flows = net.solve()
    if flows is None:  # bounds inconsistent: should not happen; stay valid regardless
        _place_unbounded(problem, flow_tasks, pooled, placed)
        return
    via_hub: dict[int, list[int]] = {g: list(ps) for g, ps in pooled.items()}
    for (g, p), options in task_arcs:
        target = next((m for m, arc in options if flows[arc]), None)
        if target is None:
            via_hub.setdefault(g, []).append(p)
        else:
            placed[g][p] = target
    for g, partitions in via_hub.items():
        receivers = [m for m, arc in cold_arcs.get(g, []) for _ in range(flows[arc])]
        for p, m in zip(sorted(partitions), receivers, strict=False):
            placed[g][p] = m


def _warm_by_freshness(candidates: list[tuple[str, int]]) -> list[str]:
    return [m for m, _ in sorted(candidates, key=lambda c: (-c[1], c[0]))]


def _place_unbounded(
    problem: ActiveProblem,
    flow_tasks: Sequence[Task],
    pooled: dict[int, list[int]],
    placed: dict[int, list[str | None]],
) -> None:
    """Last resort: keep owners, spread the rest round-robin. Valid, maybe unbalanced."""
    rest: dict[int, list[int]] = {g: list(ps) for g, ps in pooled.items()}
    for g, p in flow_tasks:
        owner = _owner(problem, (g, p))
        if owner is not None:
            placed[g][p] = owner
        else:
            rest.setdefault(g, []).append(p)
    for g, partitions in rest.items():
        members = problem.eligible[g]
        for i, p in enumerate(sorted(partitions)):
            placed[g][p] = members[i % len(members)]
