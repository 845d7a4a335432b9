"""Balance bounds: how many tasks of each group, and in total, each member may own.

Quotas are proportional to capacity. When every member eligible for any group
is eligible for all of them (the usual case) this is the contract's formula:
`q = tasks x capacity / total capacity`, per group and in total, and a member's
count must lie in `[floor(q), ceil(q)]`.

With unequal subscriptions that formula can contradict KIP-54's rule (a member
two tasks short of another that could take one of its tasks). There the
quotas come from the most balanced fractional assignment instead: loads are
water-filled (a member's load over its capacity is as even as eligibility
allows; computed exactly with fractions), and each level's tasks are split
proportionally where every member can take every group of the level, by
iterative proportional fitting otherwise. On uniform input both agree.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

ClassKey = tuple[frozenset[int], Fraction]
Number = Fraction | float


@dataclass(frozen=True, slots=True)
class Bounds:
    """`[lo, hi]` task counts per (group, member) and per member in total."""

    lo: np.ndarray  # (groups, members), 0 where not eligible
    hi: np.ndarray
    total_lo: np.ndarray  # (members,)
    total_hi: np.ndarray


def compute_bounds(sizes: np.ndarray, eligible: np.ndarray, capacity: list[Fraction]) -> Bounds:
    """Bounds for groups of `sizes` tasks; `eligible[g, m]` says who may own group g's tasks."""
    groups, members = eligible.shape
    live = (sizes > 0) & eligible.any(axis=1)
    participating = np.asarray(eligible[live].any(axis=0))
    bounds = Bounds(
        np.zeros((groups, members), np.int64),
        np.zeros((groups, members), np.int64),
        np.zeros(members, np.int64),
        np.zeros(members, np.int64),
    )
    if not live.any():
        return bounds
    if eligible[live][:, participating].all():
        _uniform_bounds(bounds, sizes, live, participating, capacity)
    else:
        _water_filled_bounds(bounds, sizes, live, eligible, capacity)
    return bounds


def _uniform_bounds(
    bounds: Bounds,
    sizes: np.ndarray,
    live: np.ndarray,
    participating: np.ndarray,
    capacity: list[Fraction],
) -> None:
    """The contract's formula, exactly: q = tasks x capacity / total capacity."""
    who = np.nonzero(participating)[0]
    total_capacity = sum((capacity[m] for m in who), Fraction(0))
    tasks = int(sizes[live].sum())
    live_groups = np.nonzero(live)[0]
    for cap in sorted({capacity[m] for m in who}):
        cols = np.array([m for m in who if capacity[m] == cap])
        share = cap / total_capacity
        for g in live_groups:
            q = int(sizes[g]) * share
            bounds.lo[g, cols], bounds.hi[g, cols] = math.floor(q), math.ceil(q)
        q = tasks * share
        bounds.total_lo[cols], bounds.total_hi[cols] = math.floor(q), math.ceil(q)


def _water_filled_bounds(
    bounds: Bounds,
    sizes: np.ndarray,
    live: np.ndarray,
    eligible: np.ndarray,
    capacity: list[Fraction],
) -> None:
    live_groups = set(np.nonzero(live)[0].tolist())
    member_class: dict[int, ClassKey] = {}
    for m in np.nonzero(eligible[live].any(axis=0))[0].tolist():
        groups = frozenset(np.nonzero(eligible[:, m])[0].tolist()) & live_groups
        member_class[m] = (groups, capacity[m])
    classes: dict[ClassKey, list[int]] = {}
    for m, key in member_class.items():
        classes.setdefault(key, []).append(m)
    fractions = _fractional_split(
        {g: int(sizes[g]) for g in live_groups}, {k: len(ms) for k, ms in classes.items()}
    )
    load: dict[ClassKey, Number] = {}
    for (g, key), x in fractions.items():
        share = x / len(classes[key])  # per member of the class
        members_of_class = np.array(classes[key])
        bounds.lo[g, members_of_class], bounds.hi[g, members_of_class] = _round_range(share)
        load[key] = load.get(key, 0) + share
    for key, cols in classes.items():
        bounds.total_lo[cols], bounds.total_hi[cols] = _round_range(load.get(key, 0))


def _round_range(value: Number) -> tuple[int, int]:
    if isinstance(value, Fraction):
        return math.floor(value), math.ceil(value)
    nearest = round(value)
    if abs(value - nearest) < 1e-9:  # float noise from proportional fitting
        return nearest, nearest
    return math.floor(value), math.ceil(value)


def _fractional_split(
    sizes: dict[int, int], classes: dict[ClassKey, int]
) -> dict[tuple[int, ClassKey], Number]:
    """Tasks of each group per member class, in the most balanced fractional assignment."""
    weight = {k: n * k[1] for k, n in classes.items()}
    split: dict[tuple[int, ClassKey], Number] = {}
    remaining_groups = set(sizes)
    remaining_classes = set(classes)
    while remaining_groups:
        level, level_groups, level_classes = _densest_level(
            remaining_groups, remaining_classes, sizes, weight
        )
        if not level_groups:  # cannot happen with consistent input; guards the loop
            break
        split.update(_split_level(level, level_groups, level_classes, sizes, weight))
        remaining_groups -= level_groups
        remaining_classes -= level_classes
    return split


def _neighbours(groups: Iterable[int], classes: Iterable[ClassKey]) -> set[ClassKey]:
    groups = set(groups)
    return {k for k in classes if k[0] & groups}


def _densest_level(
    groups: set[int], classes: set[ClassKey], sizes: dict[int, int], weight: dict[ClassKey, Fraction]
) -> tuple[Fraction, set[int], set[ClassKey]]:
    """The largest set of groups with the highest tasks-per-capacity ratio (Dinkelbach)."""
    chosen = set(groups)
    for _ in range(len(groups) + 2):  # each round strictly raises the ratio
        around = _neighbours(chosen, classes)
        ratio = Fraction(sum(sizes[g] for g in chosen)) / sum(weight[k] for k in around)
        closure = _max_closure(groups, classes, sizes, weight, ratio)
        gain = sum(sizes[g] for g in closure) - ratio * sum(weight[k] for k in _neighbours(closure, classes))
        if gain <= 0:
            return ratio, closure, _neighbours(closure, classes)
        chosen = closure
    return ratio, chosen, _neighbours(chosen, classes)


def _max_closure(
    groups: set[int],
    classes: set[ClassKey],
    sizes: dict[int, int],
    weight: dict[ClassKey, Fraction],
    ratio: Fraction,
) -> set[int]:
    """Largest group set maximising tasks - ratio x capacity of eligible classes (a min cut)."""
    source, sink = ("s",), ("t",)
    residual: dict[object, dict[object, Fraction]] = {source: {}, sink: {}}
    infinite = Fraction(sum(sizes[g] for g in groups) + 1)

    def arc(u: object, v: object, cap: Fraction) -> None:
        residual.setdefault(u, {})[v] = residual.get(u, {}).get(v, Fraction(0)) + cap
        residual.setdefault(v, {}).setdefault(u, Fraction(0))

    for g in sorted(groups):
        arc(source, ("g", g), Fraction(sizes[g]))
        for k in classes:
            if g in k[0]:
                arc(("g", g), ("k", k), infinite)
    for k in classes:
        arc(("k", k), sink, ratio * weight[k])
    while (path := _augmenting_path(residual, source, sink)) is not None:
        push = min(residual[u][v] for u, v in path)
        for u, v in path:
            residual[u][v] -= push
            residual[v][u] += push
    reaches_sink = _reverse_reachable(residual, sink)
    return {g for g in groups if ("g", g) not in reaches_sink}


def _augmenting_path(
    residual: dict[object, dict[object, Fraction]], source: object, sink: object
) -> list[tuple[object, object]] | None:
    parent: dict[object, object] = {source: source}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v, cap in residual[u].items():
            if cap > 0 and v not in parent:
                parent[v] = u
                if v == sink:
                    path = []
                    while v != source:
                        path.append((parent[v], v))
                        v = parent[v]
                    return path[::-1]
                queue.append(v)
    return None


def _reverse_reachable(residual: dict[object, dict[object, Fraction]], target: object) -> set[object]:
    incoming: dict[object, list[object]] = {}
    for u, arcs in residual.items():
        for v, cap in arcs.items():
            if cap > 0:
                incoming.setdefault(v, []).append(u)
    seen = {target}
    queue = deque([target])
    while queue:
        for u in incoming.get(queue.popleft(), []):
            if u not in seen:
                seen.add(u)
                queue.append(u)
    return seen


def _split_level(
    ratio: Fraction,
    groups: set[int],
    classes: set[ClassKey],
    sizes: dict[int, int],
    weight: dict[ClassKey, Fraction],
) -> dict[tuple[int, ClassKey], Number]:
    total_weight = sum(weight[k] for k in classes)
    if all(groups <= k[0] for k in classes):  # every class takes every group: exact
        return {(g, k): sizes[g] * weight[k] / total_weight for g in groups for k in classes}
    return _proportional_fit(ratio, groups, classes, sizes, weight)


def _proportional_fit(
    ratio: Fraction,
    groups: set[int],
    classes: set[ClassKey],
    sizes: dict[int, int],
    weight: dict[ClassKey, Fraction],
) -> dict[tuple[int, ClassKey], Number]:
    """Iterative proportional fitting of group rows to class loads (ratio x weight)."""
    ordered_groups = sorted(groups)
    ordered_classes = sorted(classes, key=lambda k: (sorted(k[0]), k[1]))
    x = {(g, k): float(weight[k]) for g in ordered_groups for k in ordered_classes if g in k[0]}
    target = {k: float(ratio * weight[k]) for k in ordered_classes}
    for _ in range(5000):
        for g in ordered_groups:
            row = sum(x[g, k] for k in ordered_classes if (g, k) in x)
            for k in ordered_classes:
                if (g, k) in x:
                    x[g, k] *= sizes[g] / row
        error = 0.0
        for k in ordered_classes:
            col = sum(x[g, k] for g in ordered_groups if (g, k) in x)
            error = max(error, abs(col - target[k]))
            for g in ordered_groups:
                if (g, k) in x:
                    x[g, k] *= target[k] / col
        if error < 1e-12:
            break
    return dict(x)
