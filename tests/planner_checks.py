"""Independent checks of the contract's properties on (scenario, assignment) pairs.

Written from docs/scenario-format.md, not from the planner's code, so the tests
judge the planner rather than restate it.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

Task = tuple[int, int]


def groups_of(scn: dict[str, Any]) -> list[list[str]]:
    """Co-partition groups as the contract defines them (valid input only)."""
    grouped = [sorted(g) for g in scn.get("copartition_groups", [])]
    inside = {t for g in grouped for t in g}
    return sorted(grouped + [[t] for t in scn["topics"] if t not in inside])


def eligible(scn: dict[str, Any], group: list[str]) -> list[str]:
    return sorted(m for m, d in scn["members"].items() if set(group) <= set(d.get("topics", [])))


def capacity(scn: dict[str, Any], member: str) -> Fraction:
    return Fraction(scn["members"][member].get("capacity", 1))


def owner_of(assignment: dict[str, Any], topic: str, partition: int) -> list[str]:
    return [m for m, d in assignment["members"].items() if partition in d.get("active", {}).get(topic, [])]


def task_owner(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[Task, str]:
    """Owner of each task; asserts validity (one owner, subscribed) and co-partitioning."""
    owners: dict[Task, str] = {}
    for gi, group in enumerate(groups_of(scn)):
        for p in range(max(scn["topics"][t] for t in group)):
            found = {(t, tuple(owner_of(assignment, t, p))) for t in group if p < scn["topics"][t]}
            holders = {o for _, o in found}
            assert len(holders) == 1, f"task {group}#{p} split across {holders} (co-partitioning)"
            (holder,) = holders
            if not holder:
                for t in group:
                    if p < scn["topics"][t]:
                        assert p in assignment["unassigned"].get(t, []), f"{t}#{p} has no owner"
                continue
            assert len(holder) == 1, f"task {group}#{p} has several owners {holder}"
            member = holder[0]
            assert set(group) <= set(scn["members"][member]["topics"]), "owner must subscribe"
            owners[gi, p] = member
    return owners


def quota_bounds(scn: dict[str, Any]) -> tuple[dict[tuple[int, str], Fraction], dict[str, Fraction]]:
    """The contract's quotas: q = tasks x capacity / capacity of eligible members."""
    per_group: dict[tuple[int, str], Fraction] = {}
    total: dict[str, Fraction] = {}
    for gi, group in enumerate(groups_of(scn)):
        members = eligible(scn, group)
        if not members:
            continue
        tasks = max(scn["topics"][t] for t in group)
        weight = sum(capacity(scn, m) for m in members)
        for m in members:
            q = tasks * capacity(scn, m) / weight
            per_group[gi, m] = q
            total[m] = total.get(m, Fraction(0)) + q
    return per_group, total


def counts(owners: dict[Task, str]) -> tuple[dict[tuple[int, str], int], dict[str, int]]:
    per_group: dict[tuple[int, str], int] = {}
    total: dict[str, int] = {}
    for (g, _), m in owners.items():
        per_group[g, m] = per_group.get((g, m), 0) + 1
        total[m] = total.get(m, 0) + 1
    return per_group, total


def is_balanced(scn: dict[str, Any], owners: dict[Task, str]) -> bool:
    """floor(q) <= count <= ceil(q) per group and in total (uniform subscriptions)."""
    quotas, totals = quota_bounds(scn)
    per_group, total = counts(owners)
    ok_groups = all(math.floor(q) <= per_group.get(k, 0) <= math.ceil(q) for k, q in quotas.items())
    ok_total = all(math.floor(q) <= total.get(m, 0) <= math.ceil(q) for m, q in totals.items())
    return ok_groups and ok_total


def uniform(scn: dict[str, Any]) -> bool:
    """Every member eligible for any group is eligible for all groups with tasks."""
    groups = [g for g in groups_of(scn) if max(scn["topics"][t] for t in g) > 0]
    sets = {tuple(eligible(scn, g)) for g in groups}
    return len(sets) <= 1


def fenced_claims(scn: dict[str, Any]) -> dict[Task, str]:
    """Previous owner per task after epoch fencing (highest epoch wins; tie: nobody)."""
    claims: dict[Task, list[tuple[int, str]]] = {}
    for gi, group in enumerate(groups_of(scn)):
        for m, d in scn["members"].items():
            parts = {p for t in group for p in d.get("previous_active", {}).get(t, [])}
            for p in parts:
                claims.setdefault((gi, p), []).append((d.get("epoch", 0), m))
    winners: dict[Task, str] = {}
    for task, cs in claims.items():
        top = max(e for e, _ in cs)
        at_top = [m for e, m in cs if e == top]
        if len(at_top) == 1:
            winners[task] = at_top[0]
    return winners


def holders_of_state(scn: dict[str, Any]) -> dict[Task, set[str]]:
    logs = set(scn.get("changelog_topics", []))
    held: dict[Task, set[str]] = {}
    for gi, group in enumerate(groups_of(scn)):
        for m, d in scn["members"].items():
            for t in set(group) & logs:
                parts = set(d.get("previous_standby", {}).get(t, []))
                parts |= {int(p) for p in d.get("local_offsets", {}).get(t, {})}
                for p in parts:
                    held.setdefault((gi, p), set()).add(m)
    return held


def kept_and_warm(scn: dict[str, Any], owners: dict[Task, str]) -> tuple[int, int]:
    previous = fenced_claims(scn)
    held = holders_of_state(scn)
    kept = sum(1 for t, m in owners.items() if previous.get(t) == m)
    warm = sum(1 for t, m in owners.items() if previous.get(t) != m and m in held.get(t, set()))
    return kept, warm


def oracle_best(scn: dict[str, Any]) -> tuple[int, int]:
    """(max kept, then max warm) over every balanced assignment, by exhaustive search."""
    tasks = [
        (gi, p)
        for gi, group in enumerate(groups_of(scn))
        for p in range(max(scn["topics"][t] for t in group))
        if eligible(scn, group)
    ]
    choices = [eligible(scn, groups_of(scn)[g]) for g, _ in tasks]
    best = (-1, -1)
    for combo in itertools.product(*choices):
        owners = dict(zip(tasks, combo, strict=True))
        if is_balanced(scn, owners):
            best = max(best, kept_and_warm(scn, owners))
    return best


def check_standbys(scn: dict[str, Any], assignment: dict[str, Any], owners: dict[Task, str]) -> None:
    logs = set(scn.get("changelog_topics", []))
    replicas = scn.get("standby_replicas", 0)
    members = scn["members"]
    for gi, group in enumerate(groups_of(scn)):
        group_logs = sorted(set(group) & logs)
        if not group_logs:
            continue
        candidates = eligible(scn, group)
        for p in range(max(scn["topics"][t] for t in group)):
            if (gi, p) not in owners:
                continue
            active = owners[gi, p]
            sets = [
                frozenset(m for m, d in assignment["members"].items() if p in d.get("standby", {}).get(t, []))
                for t in group_logs
                if p < scn["topics"][t]
            ]
            assert len(set(sets)) <= 1, "a standby must list every changelog topic of its group"
            chosen = sets[0] if sets else frozenset()
            k = min(replicas, len(candidates) - 1)
            assert len(chosen) == k, f"task {group}#{p}: {len(chosen)} standbys, expected {k}"
            assert active not in chosen, "a standby never sits on the active owner"
            assert chosen <= set(candidates), "standbys only on eligible members"
            host = _host(members, active)
            others = [m for m in candidates if m != active]
            off_host = [m for m in others if _host(members, m) != host]
            assert sum(1 for m in chosen if _host(members, m) != host) == min(k, len(off_host))


def _host(members: dict[str, Any], member: str) -> str:
    return members[member].get("host") or member


def feed_back(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    """The scenario with the assignment as the previous one (the contract's idempotence)."""
    again = {**scn, "members": {}}
    for m, d in scn["members"].items():
        out = assignment["members"].get(m, {"active": {}, "standby": {}})
        again["members"][m] = {
            **d,
            "previous_active": out.get("active", {}),
            "previous_standby": out.get("standby", {}),
            "epoch": assignment["epoch"],
        }
    return again
