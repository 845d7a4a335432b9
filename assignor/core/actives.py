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

With warm-ups on (`warm.caught` set) the objective gains a tier before (2): the most
moved tasks on members caught up on them (contract W1; `_graded_task_arcs`).

Tasks are numbered 0..T-1, group by group; members 0..M-1; -1 means none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from assignor.core.flow import FlowNetwork, tie_weights
from assignor.core.holders import StateHolders
from assignor.core.quotas import Bounds


@dataclass(slots=True)
class ActiveProblem:
    group_of: np.ndarray  # (T,) group of each task; tasks are numbered group by group
    eligible: np.ndarray  # (G, M) bool
    bounds: Bounds
    owner: np.ndarray  # (T,) fenced previous owner, -1 if none or not eligible
    warm: StateHolders  # task -> {member: freshness}, owner excluded
    # Warm-ups on, with a `protocol` field: every caught-up holder ranks first alike, and a
    # caught-up previous standby gets no preference, so a cooperative follow-up (where the
    # revoking member became a fresh holder and the first round's standby is gone) breaks
    # ties as its first round did (C4). Freshness still ranks the holders not caught up.
    follow_up_stable: bool = False


@dataclass(slots=True)
class _Residual:
    lo: np.ndarray  # (G, M) what is left of the per-group bounds
    hi: np.ndarray
    total_lo: np.ndarray  # (M,)
    total_hi: np.ndarray


def place_actives(problem: ActiveProblem) -> np.ndarray:
    """New owner of every task (-1 only if its group has no eligible member)."""
    group_of = problem.group_of
    if not problem.warm:
        counted = _place_by_counts(problem, group_of)
        if counted is not None:
            return counted
    placed = np.full(len(problem.owner), -1, np.int64)
    residual = _fix_safe_keeps(problem, group_of, placed)
    open_tasks = placed < 0
    has_state = np.zeros(len(placed), bool)
    has_state[problem.warm.task_ids()] = True
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
    held = np.bincount(group_of[owned] * members + owner[owned], minlength=groups * members).reshape(
        groups, members
    )
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
    graded = problem.warm.caught is not None  # warm-ups on: tiers sized by the moves
    moves = _moves_bound(problem, residual, flow_tasks, pooled, group_of) if graded else len(flow_tasks)
    options = _task_arcs(problem, net, flow_tasks, task_node, slot_of, group_of, moves)
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
    moves: int,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Keep and warm arcs of the open tasks, as (rows in flow_tasks, arc ids, target member).
    `moves` bounds how many of them move in a placement that keeps the most (warm-ups on)."""
    if problem.warm.caught is not None:
        return _graded_task_arcs(problem, net, flow_tasks, task_node, slot_of, group_of, moves)
    levels = 1 + problem.warm.most()
    warm_unit = len(flow_tasks) * levels + 1
    keep_unit = len(flow_tasks) * (warm_unit + levels) + 1
    groups = group_of[flow_tasks]
    kinds = [_keep_arcs(problem, net, flow_tasks, task_node, slot_of, groups, keep_unit)]
    ranked = _ranked_holders(problem.warm, flow_tasks, slot_of, groups, graded=False)
    if len(ranked.rows):
        costs = -(warm_unit + levels - 1 - ranked.rank)
        arcs = net.arcs(task_node[ranked.rows], ranked.slots, 1, cost=costs)
        kinds.append((ranked.rows, arcs, ranked.members))
    return kinds


@dataclass(slots=True)
class _RankedHolders:
    """Warm arcs of the open tasks, by row in flow_tasks then rank: the holder `members[i]` of
    task `flow_tasks[rows[i]]`, its slot, its rank among the task's holders (0 the best), and
    (graded) whether it is caught up and a caught-up previous standby."""

    rows: np.ndarray
    members: np.ndarray
    slots: np.ndarray
    rank: np.ndarray
    caught: np.ndarray
    caught_standby: np.ndarray


def _ranked_holders(
    warm: StateHolders, flow_tasks: np.ndarray, slot_of: np.ndarray, groups: np.ndarray, graded: bool
) -> _RankedHolders:
    """Every holder of every open task ranked the freshest first, then (graded) a caught-up
    previous standby (a warm-up that caught up), then the lowest member id; those without a
    slot (not eligible, or no room) are left out after ranking. All at once with numpy."""
    if len(flow_tasks) == 0:
        at = np.zeros(0, np.int64)
    else:
        position = np.minimum(np.searchsorted(flow_tasks, warm.tasks), len(flow_tasks) - 1)
        at = np.nonzero(flow_tasks[position] == warm.tasks)[0]
    rows = np.searchsorted(flow_tasks, warm.tasks[at])
    members = warm.members[at]
    fresh = warm.fresh[at]
    if fresh.dtype == object:  # exact sums past 2**52: their order, as int64 ranks
        fresh = np.unique(fresh, return_inverse=True)[1].reshape(-1)
    no = np.zeros(len(at), bool)
    caught = warm.caught[at] if graded and warm.caught is not None else no
    caught_standby = caught & warm.standby[at] if graded and warm.standby is not None else no
    order = np.lexsort((members, ~caught_standby, -fresh, rows))
    rows, members, caught, caught_standby = rows[order], members[order], caught[order], caught_standby[order]
    starts = np.r_[0, np.nonzero(np.diff(rows))[0] + 1] if len(rows) else np.zeros(0, np.int64)
    rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    slots = slot_of[groups[rows], members]
    ok = slots >= 0
    return _RankedHolders(rows[ok], members[ok], slots[ok], rank[ok], caught[ok], caught_standby[ok])


def _caught_up_ranked_alike(ranked: _RankedHolders) -> _RankedHolders:
    """Rank 0 for every caught-up holder; the others ranked among themselves, freshest first
    (their order in `ranked`), from 1; no caught-up-standby preference."""
    rows, caught = ranked.rows, ranked.caught
    if len(rows) == 0:
        return ranked
    starts = np.r_[0, np.nonzero(np.diff(rows))[0] + 1]
    lengths = np.diff(np.r_[starts, len(rows)])
    behind = (~caught).astype(np.int64)
    # Position among the row's holders not caught up (cumulative count within the row).
    before = np.cumsum(behind) - behind
    position = before - np.repeat(before[starts], lengths)
    rank = np.where(caught, 0, position + 1)
    none = np.zeros(len(rows), bool)
    return _RankedHolders(rows, ranked.members, ranked.slots, rank, caught, none)


def _keep_arcs(
    problem: ActiveProblem,
    net: FlowNetwork,
    flow_tasks: np.ndarray,
    task_node: np.ndarray,
    slot_of: np.ndarray,
    groups: np.ndarray,
    keep_unit: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An arc from each open task that has an owner to its owner's slot, worth `keep_unit`."""
    owner = problem.owner[flow_tasks]
    own_slot = np.where(owner >= 0, slot_of[groups, np.maximum(owner, 0)], -1)
    rows = np.nonzero(own_slot >= 0)[0]
    return rows, net.arcs(task_node[rows], own_slot[rows], 1, cost=-keep_unit), owner[rows]


# OR-Tools scales costs by the node count internally: |cost| x nodes must stay in int64.
COST_LIMIT = 2**62
TIE_BITS = (10, 8, 6, 4, 2, 0)  # tie-weight resolutions tried, finest first


def _graded_task_arcs(
    problem: ActiveProblem,
    net: FlowNetwork,
    flow_tasks: np.ndarray,
    task_node: np.ndarray,
    slot_of: np.ndarray,
    group_of: np.ndarray,
    moves: int,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """With warm-ups on (contract W1): keep, then onto a caught-up member, then onto a member
    holding the state, lexicographically; then the freshest holder (among equally fresh ones,
    a caught-up previous standby: a warm-up that caught up), then a fixed tie weight per
    (task, member).

    One more task on a caught-up member outweighs any number more on members that hold the
    state but are not caught up (caught-up members hold it too: their lag is finite). The
    standby preference and the tie weights make equal choices come out the same in every
    round (W5). When the units would not fit OR-Tools' cost range, the tie weights get
    coarser, then the freshness goes, then the state-holding tier (the caught-up tier,
    which W1 ranks first, still holds).
    """
    levels = 1 + problem.warm.most()
    keep_unit, caught_unit, warm_unit, bits, fine = _graded_units(moves, 2 * levels, net.node_count + 1)
    groups = group_of[flow_tasks]
    kinds = [_keep_arcs(problem, net, flow_tasks, task_node, slot_of, groups, keep_unit)]
    # The freshest first; among equally fresh, a caught-up previous standby (a warm-up that
    # caught up). Across tasks, at equal rank, a move onto one wins (+1): the warm-up takes its
    # task rather than another the counts would equally allow. A standby not caught up gets no
    # preference: the last round put plain standbys by its actives, and preferring them would
    # change which task a held move takes when nothing else changed (W5).
    ranked = _ranked_holders(problem.warm, flow_tasks, slot_of, groups, graded=True)
    if problem.follow_up_stable:
        ranked = _caught_up_ranked_alike(ranked)
    if len(ranked.rows):
        preference = 2 * (levels - 1 - ranked.rank) + ranked.caught_standby
        tie = tie_weights(flow_tasks[ranked.rows], ranked.members, bits)
        preferred = (preference << bits) + tie if fine else 0
        cost = warm_unit + caught_unit * ranked.caught.astype(np.int64) + preferred
        arcs = net.arcs(task_node[ranked.rows], ranked.slots, 1, cost=-cost)
        kinds.append((ranked.rows, arcs, ranked.members))
    return kinds


def _moves_bound(
    problem: ActiveProblem,
    residual: _Residual,
    flow_tasks: np.ndarray,
    pooled: np.ndarray,
    group_of: np.ndarray,
) -> int:
    """How many open tasks move in a placement that keeps the most (at least 1).

    Kept counts depend only on how many tasks each member gets per group (it keeps
    min(held, count)), so a small flow over (group, member) counts finds the most. Should it
    fail, a bound: each owner keeps at least min(held, lo) of its open tasks in a group (were
    it to keep fewer, it would hold another's task there, as its count is at least lo, and
    swapping that one for one of its own would keep one more).
    """
    groups, members = residual.lo.shape
    owner = problem.owner[flow_tasks]
    owned = owner >= 0
    pair = group_of[flow_tasks[owned]] * members + owner[owned]
    held = np.bincount(pair, minlength=groups * members).reshape(groups, members)
    tasks = np.bincount(group_of[np.concatenate([flow_tasks, pooled])], minlength=groups)
    kept = _most_kept(residual, held, tasks)
    if kept is None:
        kept = int(np.minimum(held, residual.lo).sum())
    return max(len(flow_tasks) - kept, 1)


def _most_kept(residual: _Residual, held: np.ndarray, tasks: np.ndarray) -> int | None:
    """The most open tasks their owners can keep: per (group, member), counts within the
    residual bounds, the extras above lo worth one where they let an owner keep a task."""
    lo, hi = residual.lo, np.maximum(residual.hi, residual.lo)
    base = lo.sum(axis=0)
    net = FlowNetwork()
    (sink,) = net.nodes(1)
    group_node, member_node = net.nodes(len(tasks)), net.nodes(lo.shape[1])
    extra = tasks - lo.sum(axis=1)
    net.supply(group_node, extra)
    net.supply([sink], [-int(extra.sum())])
    g, m = np.nonzero(hi > lo)
    gain = np.minimum(held, hi)[g, m] - np.minimum(held, lo)[g, m]
    keeps = net.arcs(group_node[g], member_node[m], gain, cost=-1)
    net.arcs(group_node[g], member_node[m], hi[g, m] - lo[g, m] - gain)
    upper = residual.total_hi - base
    net.arcs(member_node, np.full(len(base), sink), upper, lower=np.maximum(residual.total_lo - base, 0))
    flows = net.solve()
    if flows is None:
        return None
    return int(np.minimum(held, lo).sum() + flows[keeps].sum())


def _graded_units(moves: int, ranks: int, nodes: int) -> tuple[int, int, int, int, bool]:
    """(keep, caught-up, warm units, tie-weight bits, whether freshness and ties count).

    Each tier's unit exceeds what the moved tasks together can gain from the tiers below it
    (a kept task gains nothing there): `score` bounds one arc's freshness rank and tie
    weight; among placements that keep the most, at most `moves` tasks move, so
    `warm_unit` > moves x score and `caught_unit` > moves x (warm_unit + score); one keep
    fewer lets at most one more task move (per keep lost), so `keep_unit` > (moves + 1) x
    (caught_unit + warm_unit + score) outweighs it. OR-Tools multiplies costs by the node
    count, so keep_unit x nodes must stay below COST_LIMIT; the finest tie weights that fit
    are used.
    """
    for bits in TIE_BITS:
        score = ranks << bits  # per arc: freshness rank and standby, then the tie weight
        warm_unit = moves * score + 1
        caught_unit = moves * (warm_unit + score) + 1
        keep_unit = (moves + 1) * (caught_unit + warm_unit + score) + 1
        if keep_unit * nodes < COST_LIMIT:
            return keep_unit, caught_unit, warm_unit, bits, True
    warm_unit = 1  # no freshness, no ties: kept, then caught up, then holding state
    caught_unit = moves * warm_unit + 1
    keep_unit = (moves + 1) * (caught_unit + warm_unit) + 1
    if keep_unit * nodes < COST_LIMIT:
        return keep_unit, caught_unit, warm_unit, 0, False
    return moves + 2, 1, 0, 0, False  # kept, then caught up


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


MAX_CLASSES = 64  # beyond this many distinct member rows, the per-task flow is no slower


def _place_by_counts(problem: ActiveProblem, group_of: np.ndarray) -> np.ndarray | None:
    """Exact placement when no task has warm state: decide counts per member class.

    Without warmth, tasks of one (group, owner) are interchangeable and only the
    count a member gets in a group matters: it keeps min(held, count). Members with
    identical rows (held, bounds) form a class; a small flow over (group, class)
    decides how many of each group's extras (count above the lower bound) each class
    gets, the most where an extra lets an owner keep a task; round-robin within the
    class realises it (each member then within its total bounds). Aggregation is a
    relaxation that is realised at equal value, so the kept count is the optimum.
    Returns None (use the per-task flow) when classes are many or the flow fails.
    """
    groups, members = problem.eligible.shape
    owner, lo, hi = problem.owner, problem.bounds.lo, problem.bounds.hi
    owned = owner >= 0
    held = np.bincount(group_of[owned] * members + owner[owned], minlength=groups * members).reshape(
        groups, members
    )
    rows = np.ascontiguousarray(np.vstack([held, lo, hi, problem.bounds.total_lo, problem.bounds.total_hi]).T)
    first_of: dict[bytes, int] = {}  # hashing rows is much cheaper than sorting them
    member_class = np.array([first_of.setdefault(r.tobytes(), len(first_of)) for r in rows], np.int64)
    if len(first_of) > MAX_CLASSES:
        return None
    classes = rows[np.unique(member_class, return_index=True)[1]]
    extras = _class_extras(problem, classes, np.bincount(member_class), held, group_of)
    if extras is None:
        return None
    counts = lo + _realise(extras, member_class, hi - lo)
    return _keep_then_fill(owner, group_of, counts, held.shape)


def _class_extras(
    problem: ActiveProblem,
    classes: np.ndarray,
    sizes: np.ndarray,
    held: np.ndarray,
    group_of: np.ndarray,
) -> np.ndarray | None:
    """(group, class) -> number of the class's members that get an extra task there."""
    groups = held.shape[0]
    rep_held, rep_lo, rep_hi = (classes[:, k * groups : (k + 1) * groups].T for k in range(3))
    total_lo, total_hi = classes[:, 3 * groups], classes[:, 3 * groups + 1]
    n_classes = len(classes)
    tasks = np.bincount(group_of, minlength=groups)
    extras_needed = tasks - (rep_lo * sizes).sum(axis=1)
    base = rep_lo.sum(axis=0)
    gain = np.minimum(rep_held, rep_hi) - np.minimum(rep_held, rep_lo)  # 0 or 1
    net = FlowNetwork()
    (sink,) = net.nodes(1)
    group_node, class_node = net.nodes(groups), net.nodes(n_classes)
    net.supply(group_node, extras_needed)
    net.supply([sink], [-int(extras_needed.sum())])
    g_idx, c_idx = np.nonzero(rep_hi > rep_lo)
    pair_arcs = net.arcs(group_node[g_idx], class_node[c_idx], sizes[c_idx], cost=-gain[g_idx, c_idx])
    low = sizes * np.maximum(total_lo - base, 0)
    net.arcs(class_node, np.full(n_classes, sink), sizes * (total_hi - base), lower=low)
    flows = net.solve()
    if flows is None:
        return None
    extras = np.zeros((groups, n_classes), np.int64)
    extras[g_idx, c_idx] = flows[pair_arcs]
    return extras


def _realise(extras: np.ndarray, member_class: np.ndarray, spare: np.ndarray) -> np.ndarray:
    """Per (group, member) extra 0/1: each class's extras dealt round-robin over its members."""
    given = np.zeros(spare.shape, np.int64)
    for c in range(extras.shape[1]):
        members = np.nonzero(member_class == c)[0]
        sequence = np.repeat(np.arange(extras.shape[0]), extras[:, c])  # group per extra
        slots = np.arange(len(sequence)) % len(members)
        given[sequence, members[slots]] += 1
    return np.minimum(given, spare)


def _keep_then_fill(
    owner: np.ndarray, group_of: np.ndarray, counts: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
    """Owners keep their lowest partitions up to their count; the rest fill the gaps."""
    groups, members = shape
    tasks = np.arange(len(owner))
    placed = np.full(len(owner), -1, np.int64)
    owned = np.nonzero(owner >= 0)[0]
    pair = group_of[owned] * members + owner[owned]
    order = np.lexsort((owned, pair))  # by (group, owner), then task
    pair_sorted = pair[order]
    starts = np.r_[0, np.nonzero(np.diff(pair_sorted))[0] + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    keep = owned[order][rank < counts.reshape(-1)[pair_sorted]]
    placed[keep] = owner[keep]
    kept = np.bincount(group_of[keep] * members + owner[keep], minlength=groups * members)
    deficit = counts.reshape(-1) - kept  # row-major: grouped by group, then member
    receivers = np.repeat(np.arange(groups * members) % members, deficit)
    free = tasks[placed < 0]  # sorted by task id, so grouped by group
    placed[free] = receivers[: len(free)]
    return placed
