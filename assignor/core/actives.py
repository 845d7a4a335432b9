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

Tasks are numbered 0..T-1, group by group; members 0..M-1; -1 means none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from assignor.core.flow import FlowNetwork
from assignor.core.quotas import Bounds


@dataclass(slots=True)
class ActiveProblem:
    offsets: np.ndarray  # (G+1,): tasks of group g are offsets[g]..offsets[g+1]-1
    eligible: np.ndarray  # (G, M) bool
    bounds: Bounds
    owner: np.ndarray  # (T,) fenced previous owner, -1 if none or not eligible
    warm: dict[int, dict[int, int]]  # task -> {member: freshness}, owner excluded

    @property
    def group_of(self) -> np.ndarray:
        sizes = np.diff(self.offsets)
        return np.repeat(np.arange(len(sizes)), sizes)


@dataclass(slots=True)
class _Residual:
    lo: np.ndarray  # (G, M) what is left of the per-group bounds
    hi: np.ndarray
    total_lo: np.ndarray  # (M,)
    total_hi: np.ndarray


def place_actives(problem: ActiveProblem) -> np.ndarray:
    """New owner of every task (-1 only if its group has no eligible member)."""
    group_of = problem.group_of
    placed = np.full(len(problem.owner), -1, np.int64)
    residual = _fix_safe_keeps(problem, group_of, placed)
    open_tasks = placed < 0
    has_state = np.zeros(len(placed), bool)
    has_state[list(problem.warm)] = True
    in_flow = open_tasks & ((problem.owner >= 0) | has_state)
    pooled = np.nonzero(open_tasks & ~in_flow)[0]
    if not in_flow.any() and _greedy_fill(problem, residual, pooled, group_of, placed):
        return placed
    _solve_flow(problem, residual, np.nonzero(in_flow)[0], pooled, group_of, placed)
    return placed


def _fix_safe_keeps(problem: ActiveProblem, group_of: np.ndarray, placed: np.ndarray) -> _Residual:
    """Keep every task whose owner holds no more than its lower bound."""
    groups, members = problem.eligible.shape
    owner = problem.owner
    owned = owner >= 0
    held = np.bincount(
        group_of[owned] * members + owner[owned], minlength=groups * members
    ).reshape(groups, members)
    safe = (held > 0) & (held <= problem.bounds.lo)
    keep = owned & safe[group_of, np.where(owned, owner, 0)]
    placed[keep] = owner[keep]
    used = np.where(safe, held, 0)
    used_total = used.sum(axis=0)
    return _Residual(
        lo=np.maximum(problem.bounds.lo - used, 0),
        hi=problem.bounds.hi - used,
        total_lo=np.maximum(problem.bounds.total_lo - used_total, 0),
        total_hi=problem.bounds.total_hi - used_total,
    )


def _greedy_fill(
    problem: ActiveProblem,
    residual: _Residual,
    pooled: np.ndarray,
    group_of: np.ndarray,
    placed: np.ndarray,
) -> bool:
    """Place interchangeable tasks: lower bounds first, then the neediest members.

    Returns False (changing nothing) when it cannot meet every bound; the exact
    flow then decides.
    """
    members = problem.eligible.shape[1]
    load = np.zeros(members, np.int64)
    index = np.arange(members)
    choices: list[tuple[np.ndarray, np.ndarray]] = []
    for tasks in _split_by_group(pooled, group_of):
        g = group_of[tasks[0]]
        mandatory = residual.lo[g]
        need = len(tasks) - int(mandatory.sum())
        spare = np.nonzero(residual.hi[g] > mandatory)[0]
        if need < 0 or need > len(spare):
            return False
        load += mandatory
        neediest = np.lexsort((spare, load[spare], load[spare] - residual.total_lo[spare]))
        extra = spare[neediest[:need]]
        load[extra] += 1
        picks = np.sort(np.concatenate([np.repeat(index, mandatory), extra]))
        choices.append((tasks, picks))
    if ((load < residual.total_lo) | (load > residual.total_hi)).any():
        return False
    for tasks, picks in choices:
        placed[tasks] = picks
    return True


def _split_by_group(tasks: np.ndarray, group_of: np.ndarray) -> list[np.ndarray]:
    """Sorted task ids, cut where the group changes."""
    if len(tasks) == 0:
        return []
    cuts = np.nonzero(np.diff(group_of[tasks]))[0] + 1
    return np.split(tasks, cuts)


def _solve_flow(
    problem: ActiveProblem,
    residual: _Residual,
    flow_tasks: np.ndarray,
    pooled: np.ndarray,
    group_of: np.ndarray,
    placed: np.ndarray,
) -> None:
    groups, members = problem.eligible.shape
    net = FlowNetwork()
    (sink,) = net.nodes(1)
    member_node = net.nodes(members)
    hub = net.nodes(groups)
    net.arcs(member_node, np.full(members, sink), residual.total_hi, lower=residual.total_lo)
    slot_group, slot_member = np.nonzero(residual.hi > 0)
    slot = net.nodes(len(slot_group))
    slot_of = np.full((groups, members), -1, np.int64)
    slot_of[slot_group, slot_member] = slot
    lo, hi = residual.lo[slot_group, slot_member], residual.hi[slot_group, slot_member]
    net.arcs(slot, member_node[slot_member], hi, lower=lo)
    cold = net.arcs(hub[slot_group], slot, hi)
    task_node = net.nodes(len(flow_tasks))
    net.supply(task_node, np.ones(len(flow_tasks), np.int64))
    options = _task_arcs(problem, net, flow_tasks, task_node, slot_of, group_of)
    to_hub = net.arcs(task_node, hub[group_of[flow_tasks]], 1)
    pooled_per_group = np.bincount(group_of[pooled], minlength=groups)
    net.supply(hub, pooled_per_group)
    net.supply([sink], [-(len(flow_tasks) + len(pooled))])
    flows = net.solve()
    if flows is None:  # bounds inconsistent: should not happen; stay valid regardless
        _place_unbounded(problem, np.concatenate([flow_tasks, pooled]), group_of, placed)
        return
    for rows, arcs, targets in options:
        chosen = flows[arcs] > 0
        placed[flow_tasks[rows[chosen]]] = targets[chosen]
    via_hub = np.sort(np.concatenate([pooled, flow_tasks[flows[to_hub] > 0]]))
    receivers = np.repeat(slot_member, flows[cold])  # grouped by group, then member
    placed[via_hub] = receivers[: len(via_hub)]


def _task_arcs(
    problem: ActiveProblem,
    net: FlowNetwork,
    flow_tasks: np.ndarray,
    task_node: np.ndarray,
    slot_of: np.ndarray,
    group_of: np.ndarray,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Keep and warm arcs of the open tasks, as (rows in flow_tasks, arc ids, target member)."""
    levels = 1 + max((len(c) for c in problem.warm.values()), default=0)
    warm_unit = len(flow_tasks) * levels + 1
    keep_unit = len(flow_tasks) * (warm_unit + levels) + 1
    owner = problem.owner[flow_tasks]
    groups = group_of[flow_tasks]
    own_slot = np.where(owner >= 0, slot_of[groups, np.maximum(owner, 0)], -1)
    rows = np.nonzero(own_slot >= 0)[0]
    kinds = [(rows, net.arcs(task_node[rows], own_slot[rows], 1, cost=-keep_unit), owner[rows])]
    warm_rows, heads, costs, targets = [], [], [], []
    for i, task in enumerate(flow_tasks.tolist()):
        ranked = sorted(problem.warm.get(task, {}).items(), key=lambda c: (-c[1], c[0]))
        for rank, (member, _) in enumerate(ranked):
            target_slot = int(slot_of[groups[i], member])
            if target_slot >= 0:
                warm_rows.append(i)
                heads.append(target_slot)
                costs.append(-(warm_unit + levels - 1 - rank))
                targets.append(member)
    if warm_rows:
        arcs = net.arcs(task_node[warm_rows], np.array(heads), 1, cost=np.array(costs))
        kinds.append((np.array(warm_rows), arcs, np.array(targets)))
    return kinds


def _place_unbounded(
    problem: ActiveProblem, tasks: np.ndarray, group_of: np.ndarray, placed: np.ndarray
) -> None:
    """Last resort: keep owners, spread the rest round-robin. Valid, maybe unbalanced."""
    for task in np.sort(tasks).tolist():
        owner = int(problem.owner[task])
        if owner >= 0:
            placed[task] = owner
        else:
            candidates = np.nonzero(problem.eligible[group_of[task]])[0]
            placed[task] = candidates[task % len(candidates)]
