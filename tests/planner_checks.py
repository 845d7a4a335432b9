"""Independent checks of the contract's properties on (scenario, assignment) pairs.

Written from docs/scenario-format.md, not from the planner's code, so the tests
judge the planner rather than restate it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
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


def oracle_best(scn: dict[str, Any]) -> tuple[int, ...]:
    """(max kept, then max warm) over every balanced assignment, by exhaustive search."""
    return _best_balanced(scn, lambda owners: kept_and_warm(scn, owners))


def _best_balanced(
    scn: dict[str, Any], score: Callable[[dict[Task, str]], tuple[int, ...]]
) -> tuple[int, ...]:
    """The highest `score` of any balanced assignment (exhaustive: small scenarios only)."""
    tasks = [
        (gi, p)
        for gi, group in enumerate(groups_of(scn))
        for p in range(max(scn["topics"][t] for t in group))
        if eligible(scn, group)
    ]
    choices = [eligible(scn, groups_of(scn)[g]) for g, _ in tasks]
    best: tuple[int, ...] = (-1,)
    for combo in itertools.product(*choices):
        owners = dict(zip(tasks, combo, strict=True))
        if is_balanced(scn, owners):
            best = max(best, score(owners))
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


# -- warm-up replicas (the contract's "Warm-up replicas" section) ------------------------------

INF = math.inf


def changelogs_of(scn: dict[str, Any], group: list[str], partition: int) -> list[str]:
    """The group's changelog topics that have `partition`."""
    logs = set(scn.get("changelog_topics", []))
    return [t for t in group if t in logs and partition < scn["topics"][t]]


def local_offset(scn: dict[str, Any], member: str, topic: str, partition: int) -> int | None:
    found = scn["members"][member].get("local_offsets", {}).get(topic, {})
    for key, value in found.items():
        if int(key) == partition:
            return int(value)
    return None


def end_offset(scn: dict[str, Any], topic: str, partition: int) -> int | None:
    """Given in changelog_end_offsets, else the highest offset any member reports."""
    given = scn.get("changelog_end_offsets", {}).get(topic, {})
    for key, value in given.items():
        if int(key) == partition:
            return int(value)
    reported = [local_offset(scn, m, topic, partition) for m in scn["members"]]
    known = [o for o in reported if o is not None]
    return max(known) if known else None


def lag(scn: dict[str, Any], task: Task, member: str) -> float:
    """The contract's lag: the previous owner's is 0; else the largest end - local over the
    task's changelog partitions (0 at or past the end, unbounded without an offset)."""
    gi, p = task
    if fenced_claims(scn).get(task) == member:
        return 0
    worst: float = 0
    for topic in changelogs_of(scn, groups_of(scn)[gi], p):
        local = local_offset(scn, member, topic, p)
        end = end_offset(scn, topic, p)
        if local is None or end is None:
            return INF
        worst = max(worst, max(0, end - local))
    return worst


def caught_up(scn: dict[str, Any], task: Task, member: str) -> bool:
    return lag(scn, task, member) <= scn["acceptable_recovery_lag"]


def is_stateful(scn: dict[str, Any], task: Task) -> bool:
    gi, p = task
    return bool(changelogs_of(scn, groups_of(scn)[gi], p))


def task_of(scn: dict[str, Any], topics: list[str], partition: int) -> Task:
    return groups_of(scn).index(sorted(topics)), partition


def target_owners(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[Task, str]:
    """The output's owners with every pending move applied (the contract's target)."""
    owners = task_owner(scn, assignment)
    for move in assignment["pending_moves"]:
        task = task_of(scn, move["topics"], move["partition"])
        assert owners[task] == move["from"], f"pending move {move} does not start at the task's owner"
        owners[task] = move["to"]
    return owners


def warm_holders(scn: dict[str, Any]) -> dict[Task, set[str]]:
    """With warm-ups on, a member holds a task's state only when its lag is finite."""
    held: dict[Task, set[str]] = {}
    for gi, group in enumerate(groups_of(scn)):
        for p in range(max(scn["topics"][t] for t in group)):
            if not is_stateful(scn, (gi, p)):
                continue
            for m in eligible(scn, group):
                if fenced_claims(scn).get((gi, p)) != m and lag(scn, (gi, p), m) < INF:
                    held.setdefault((gi, p), set()).add(m)
    return held


def kept_and_warm_with_lags(
    scn: dict[str, Any], owners: dict[Task, str], held: dict[Task, set[str]]
) -> tuple[int, int]:
    previous = fenced_claims(scn)
    kept = sum(1 for t, m in owners.items() if previous.get(t) == m)
    warm = sum(1 for t, m in owners.items() if previous.get(t) != m and m in held.get(t, set()))
    return kept, warm


def kept_caught_warm(
    scn: dict[str, Any], owners: dict[Task, str], held: dict[Task, set[str]]
) -> tuple[int, int, int]:
    """W1's score: tasks kept, then moved stateful tasks on a member caught up on them, then
    moved tasks on a member holding their state (caught-up members hold it: lag is finite)."""
    previous = fenced_claims(scn)
    moved = [(t, m) for t, m in owners.items() if previous.get(t) != m]
    caught = sum(1 for t, m in moved if is_stateful(scn, t) and caught_up(scn, t, m))
    warm = sum(1 for t, m in moved if m in held.get(t, set()))
    return len(owners) - len(moved), caught, warm


def oracle_best_with_lags(scn: dict[str, Any]) -> tuple[int, ...]:
    """(max kept, then max moved onto caught-up members, then max warm) over every balanced
    assignment, holders by finite lag (W1)."""
    held = warm_holders(scn)
    return _best_balanced(scn, lambda owners: kept_caught_warm(scn, owners, held))


def better_caught_up_exchange(scn: dict[str, Any], owners: dict[Task, str]) -> str | None:
    """W1, locally: a task on a member that holds its state but is not caught up, which could
    instead go to an eligible member caught up on it, alone or in exchange for one of that
    member's tasks, keeping a balanced assignment that keeps no fewer tasks and places more
    moved tasks on caught-up members. Describes the first such exchange found, else None."""
    held = warm_holders(scn)
    score = kept_caught_warm(scn, owners, held)[:2]
    groups = groups_of(scn)
    for task, holder in sorted(owners.items()):
        if holder not in held.get(task, set()) or caught_up(scn, task, holder):
            continue
        for member in eligible(scn, groups[task[0]]):
            if member == holder or not caught_up(scn, task, member):
                continue
            given = [(task, member)]
            swaps = [(other, holder) for other, m in sorted(owners.items()) if m == member]
            for exchange in [given] + [given + [swap] for swap in swaps]:
                if any(holder not in eligible(scn, groups[t[0]]) for t, _ in exchange[1:]):
                    continue
                changed = owners | dict(exchange)
                if is_balanced(scn, changed) and kept_caught_warm(scn, changed, held)[:2] > score:
                    return f"{task} on {holder} (not caught up) could go to {member}: {exchange}"
    return None


def warmups_of(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[Task, set[str]]:
    """Members given a warm-up replica of each task; each lists every changelog partition."""
    found: dict[Task, set[str]] = {}
    for gi, group in enumerate(groups_of(scn)):
        for p in range(max(scn["topics"][t] for t in group)):
            logs = changelogs_of(scn, group, p)
            sets = [
                frozenset(m for m, d in assignment["members"].items() if p in d["warmup"].get(t, []))
                for t in logs
            ]
            assert len(set(sets)) <= 1, "a warm-up lists every changelog partition of its task"
            if sets and sets[0]:
                found[gi, p] = set(sets[0])
    return found


def standbys_of(scn: dict[str, Any], assignment: dict[str, Any], task: Task) -> set[str]:
    gi, p = task
    logs = changelogs_of(scn, groups_of(scn)[gi], p)
    return {m for m, d in assignment["members"].items() for t in logs if p in d.get("standby", {}).get(t, [])}


def feed_back_warmups(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    """The contract's W5 round: actives and standbys as previous, warm-ups as previous standbys,
    each warm-up member reporting the end offset of its warm-up partitions."""
    again = feed_back(scn, assignment)
    for m, d in assignment["members"].items():
        member = again["members"][m]
        standby = {t: sorted(set(ps)) for t, ps in member["previous_standby"].items()}
        offsets = {t: dict(v) for t, v in scn["members"][m].get("local_offsets", {}).items()}
        for topic, partitions in d.get("warmup", {}).items():
            standby[topic] = sorted(set(standby.get(topic, [])) | set(partitions))
            for p in partitions:
                end = end_offset(scn, topic, p)
                offsets.setdefault(topic, {})
                offsets[topic] = {k: v for k, v in offsets[topic].items() if int(k) != p}
                offsets[topic][str(p)] = end if end is not None else 0
        member["previous_standby"] = standby
        member["local_offsets"] = offsets
    return again


# -- cooperative rounds (the contract's "Cooperative rounds" section) --------------------------


def eager_of(scn: dict[str, Any]) -> dict[str, Any]:
    """The same scenario with the eager protocol (C1: its plan is the cooperative round's target)."""
    return {**scn, "protocol": "eager"}


def owned_tasks(scn: dict[str, Any]) -> dict[Task, str]:
    """Owned tasks: the winning claim's member is in the scenario (here every claimant is)."""
    return {t: m for t, m in fenced_claims(scn).items() if m in scn["members"]}


def revoked_tasks(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[Task, dict[str, Any]]:
    """The output's `revoking` entries by task; asserts each names one task once."""
    found: dict[Task, dict[str, Any]] = {}
    for entry in assignment["revoking"]:
        assert set(entry) == {"topics", "from", "to", "partition"}, entry
        task = task_of(scn, entry["topics"], entry["partition"])
        assert entry["topics"] == groups_of(scn)[task[0]], "a revocation lists the group's topics, sorted"
        assert task not in found, f"task {task} revoked twice"
        found[task] = entry
    return found


def round_owners(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[Task, str]:
    """Owner of each task in a cooperative round. Asserts validity and co-partitioning as
    task_owner does, and C2's half about revoked tasks: active on no member, not unassigned."""
    revoked = revoked_tasks(scn, assignment)
    unassigned = {t: list(ps) for t, ps in assignment["unassigned"].items()}
    groups = groups_of(scn)
    for gi, p in revoked:
        for topic in groups[gi]:
            if p < scn["topics"][topic]:
                assert p not in unassigned.get(topic, []), f"revoked {topic}#{p} is also unassigned"
                unassigned.setdefault(topic, []).append(p)
    owners = task_owner(scn, {**assignment, "unassigned": unassigned})
    for task in revoked:
        assert task not in owners, f"revoked task {task} is still active on {owners.get(task)}"
    return owners


def feed_back_round(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    """C4's follow-up scenario: actives as previous_active, standbys and warm-ups as
    previous_standby, the output's epoch; nothing else changes (offsets stay as they were)."""
    again = feed_back(scn, assignment)
    for m, d in assignment["members"].items():
        member = again["members"][m]
        standby = {t: set(ps) for t, ps in member["previous_standby"].items()}
        for topic, partitions in d.get("warmup", {}).items():
            standby[topic] = standby.get(topic, set()) | set(partitions)
        member["previous_standby"] = {t: sorted(ps) for t, ps in standby.items()}
    return again


def held_unowned(scn: dict[str, Any], assignment: dict[str, Any]) -> bool:
    """C4's exception: the round held an unowned task on a caught-up member (W2)."""
    owned = owned_tasks(scn)
    return any(
        task_of(scn, move["topics"], move["partition"]) not in owned
        for move in assignment.get("pending_moves", [])
    )


def follow_up_score(scn: dict[str, Any], owners: dict[Task, str]) -> tuple[int, ...]:
    """How sticky and warm a placement is in the follow-up round, as the contract counts it:
    kept, then (with warm-ups) moved onto caught-up members, then moved onto state holders."""
    if "acceptable_recovery_lag" in scn:
        return kept_caught_warm(scn, owners, warm_holders(scn))
    return kept_and_warm(scn, owners)
