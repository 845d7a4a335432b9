"""One canonical target among the equally good ones (used with warm-ups on).

The active placement (actives.py) is exact in what it optimises (kept, then moved onto
caught-up members, then onto state holders, then freshest), but among equally good
assignments the solver picks one arbitrarily, and a slightly different network (the
next round's, where held tasks are owned by their holders and warm-ups have caught up)
may make it pick another. With warm-ups that
would move pending targets from round to round (W5 says the target stays).

So the solver's answer is rewritten into a canonical one of the same value: its
moves onto state holders are kept as they are; for every other task only counts
matter (a member keeps min(held, count) of its own), so the counts per (group,
member) are chosen again by a small flow that keeps as many tasks as possible, then
follows fixed pseudo-random weights per (group, member) (a tie between two count
vectors then almost never happens). Owners keep their tasks in the order of fixed
weights per (task, member); the rest go, sorted, to the receivers in (group, member)
order. Removing a completed
move from a round then leaves every other choice as it was.

The result has the same kept count, and no more moves onto caught-up members or other
state holders (it would then beat an optimum; caught-up members hold the state), so the
same such moves: it is as good as the solver's.
"""

from __future__ import annotations

import numpy as np

from assignor.core.actives import ActiveProblem
from assignor.core.flow import FlowNetwork, tie_weights

TIE_WEIGHT_BITS = 20


def canonical_target(problem: ActiveProblem, placed: np.ndarray) -> np.ndarray:
    """`placed` (an optimal placement of `problem`) rewritten into the canonical one."""
    groups, members = problem.eligible.shape
    tasks = np.arange(len(placed))
    owner = problem.owner
    assigned = placed >= 0
    moved = assigned & (placed != owner)
    warm = np.zeros(len(placed), bool)
    warm[moved] = problem.warm.holds(tasks[moved], placed[moved], members)
    free = assigned & ~warm
    if not free.any():
        return placed
    group_of = problem.group_of
    fixed = _counts(group_of[warm], placed[warm], groups, members)
    owned = free & (owner >= 0)
    held = _counts(group_of[owned], owner[owned], groups, members)
    counts = _free_counts(problem, fixed, held, np.bincount(group_of[free], minlength=groups))
    if counts is None:
        return placed  # cannot happen for a feasible placement; keep the solver's
    result = placed.copy()
    result[free] = _realise(owner, group_of, tasks[free], counts, held)
    return result


def _counts(groups_of: np.ndarray, members_of: np.ndarray, groups: int, members: int) -> np.ndarray:
    return np.bincount(groups_of * members + members_of, minlength=groups * members).reshape(groups, members)


def _free_counts(
    problem: ActiveProblem, fixed: np.ndarray, held: np.ndarray, free_per_group: np.ndarray
) -> np.ndarray | None:
    """(G, M) free tasks per member: as many kept as possible, then the least tie weight."""
    bounds = problem.bounds
    lo = np.maximum(bounds.lo - fixed, 0)
    hi = np.maximum(bounds.hi - fixed, 0)
    fixed_total = fixed.sum(axis=0)
    base = lo.sum(axis=0)
    total_lo = np.maximum(bounds.total_lo - fixed_total - base, 0)
    total_hi = bounds.total_hi - fixed_total - base
    groups, members = lo.shape
    net = FlowNetwork()
    (sink,) = net.nodes(1)
    group_node, member_node = net.nodes(groups), net.nodes(members)
    extra = free_per_group - lo.sum(axis=1)
    net.supply(group_node, extra)
    net.supply([sink], [-int(extra.sum())])
    net.arcs(member_node, np.full(members, sink), total_hi, lower=np.minimum(total_lo, total_hi))
    g, m = np.nonzero(problem.eligible & (hi > lo))
    room = hi[g, m] - lo[g, m]
    keeps = np.clip(held[g, m] - lo[g, m], 0, room)  # extras that let an owner keep a task
    weight = tie_weights(g, m, TIE_WEIGHT_BITS)
    keep_gain = int(weight.sum()) + 1  # one more kept task beats any difference in weights
    keep_arcs = net.arcs(group_node[g], member_node[m], keeps, cost=weight - keep_gain)
    cold_arcs = net.arcs(group_node[g], member_node[m], room - keeps, cost=weight)
    flows = net.solve()
    if flows is None:
        return None
    counts = lo.copy()
    np.add.at(counts, (g, m), flows[keep_arcs] + flows[cold_arcs])
    return counts


def _realise(
    owner: np.ndarray, group_of: np.ndarray, free: np.ndarray, counts: np.ndarray, held: np.ndarray
) -> np.ndarray:
    """Owners keep their free tasks up to their count, those of the highest tie weight first
    (the order in which the flow's tie weights prefer moves onto a member: a task taken warm
    in one round is the one its new owner keeps in the next); the other free tasks, sorted,
    fill each member's remaining count in (group, member) order."""
    groups, members = counts.shape
    result = np.full(len(free), -1, np.int64)
    own = owner[free]
    pair = np.where(own >= 0, group_of[free] * members + own, -1)
    weight = tie_weights(free, np.maximum(own, 0), TIE_WEIGHT_BITS)
    order = np.lexsort((free, -weight, pair))  # by (group, owner), then weight, then task
    pair_sorted = pair[order]
    starts = np.r_[0, np.nonzero(np.diff(pair_sorted))[0] + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    limit = np.where(pair_sorted >= 0, counts.reshape(-1)[np.maximum(pair_sorted, 0)], 0)
    keep = order[rank < limit]
    result[keep] = own[keep]
    kept = np.minimum(held, counts).reshape(-1)
    receivers = np.repeat(np.arange(groups * members) % members, counts.reshape(-1) - kept)
    rest = np.nonzero(result < 0)[0]  # positions in `free`, sorted by task, so by group
    result[rest] = receivers[: len(rest)]
    return result
