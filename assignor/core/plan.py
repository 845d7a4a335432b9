"""The planner: a pure function from a scenario to an assignment (docs/scenario-format.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from assignor.core.actives import ActiveProblem, Task, place_actives
from assignor.core.quotas import compute_bounds
from assignor.core.scenario import Group, Member, Scenario, parse_scenario
from assignor.core.standbys import StandbyProblem, place_standbys


@dataclass(slots=True)
class PlanStats:
    """How the active tasks moved, for summaries and rebalance views."""

    kept: int = 0
    moved_warm: int = 0
    moved_cold: int = 0  # includes tasks that had no previous owner
    unassigned: int = 0
    actives: dict[str, int] = field(default_factory=dict)
    standbys: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class PlanResult:
    assignment: dict[str, Any]
    stats: PlanStats


def plan(raw: Any) -> dict[str, Any]:
    """The assignment for a decoded JSON scenario. Never raises."""
    return plan_with_stats(raw).assignment


def plan_with_stats(raw: Any) -> PlanResult:
    try:
        return _plan(parse_scenario(raw))
    except Exception as exc:  # the last line of defence on a group leader
        return PlanResult(_empty_assignment(raw, f"internal planner error: {exc!r}"), PlanStats())


def _plan(scn: Scenario) -> PlanResult:
    groups = [g for g in scn.groups if g.size > 0]
    eligible = {g.index: _eligible(g, scn) for g in groups}
    placeable = [g for g in groups if eligible[g.index]]
    owner = {g.index: _fenced_owners(g, scn) for g in placeable}
    warm = _state_holders(placeable, scn, owner, eligible)
    previous_owner = {g: list(o) for g, o in owner.items()}
    bounds = compute_bounds(
        {g.index: g.size for g in placeable},
        {g.index: eligible[g.index] for g in placeable},
        {m.id: m.capacity for m in scn.members},
    )
    problem = ActiveProblem(
        sizes={g.index: g.size for g in placeable},
        eligible={g.index: eligible[g.index] for g in placeable},
        bounds=bounds,
        owner=owner,
        warm={t: [(m, f) for m, f in holders.items()] for t, holders in warm.items()},
    )
    placed = place_actives(problem)
    standbys = _standbys(scn, placeable, eligible, placed, warm)
    stats = _stats(placed, previous_owner, warm, standbys)
    assignment = _render(scn, groups, placeable, placed, standbys, stats)
    return PlanResult(assignment, stats)


def _eligible(group: Group, scn: Scenario) -> list[str]:
    members = []
    for m in scn.members:
        subscribed = m.topics & set(group.topics)
        if len(subscribed) == len(group.topics):
            members.append(m.id)
        elif subscribed:
            scn.warnings.add(
                "partial",
                f"member {m.id!r} subscribes to part of co-partition group {list(group.topics)} "
                f"(missing {sorted(set(group.topics) - subscribed)}); it gets none of its tasks",
            )
    return members


def _fenced_owners(group: Group, scn: Scenario) -> list[str | None]:
    """Previous owner per task: highest epoch wins; a tie at the top voids every claim."""
    size = group.size
    best_epoch = [-1] * size
    best: list[str | None] = [None] * size
    claimants: list[list[str]] = [[] for _ in range(size)]
    for m in scn.members:
        claimed: set[int] = set()
        for topic in group.topics:
            claimed |= m.previous_active.get(topic, frozenset())
        for p in claimed:
            claimants[p].append(m.id)
            if m.epoch > best_epoch[p]:
                best_epoch[p], best[p] = m.epoch, m.id
            elif m.epoch == best_epoch[p]:
                best[p] = None
    epochs = {m.id: m.epoch for m in scn.members}
    for p, names in enumerate(claimants):
        if len(names) > 1:
            claims = ", ".join(f"{n} (epoch {epochs[n]})" for n in sorted(names))
            verdict = f"{best[p]} wins" if best[p] else "tie at the highest epoch: no claim counts"
            scn.warnings.add("fenced", f"task {group.label()}#{p} claimed by {claims}: {verdict}")
    return best


def _state_holders(
    groups: list[Group],
    scn: Scenario,
    owner: dict[int, list[str | None]],
    eligible: dict[int, list[str]],
) -> dict[Task, dict[str, int]]:
    """Members (not the owner) holding a task's state, with its freshness (-1: unknown)."""
    holders: dict[Task, dict[str, int]] = {}
    by_id = {m.id: m for m in scn.members}
    for g in groups:
        if not g.stateful:
            continue
        for member_id in eligible[g.index]:
            _add_holdings(g, by_id[member_id], owner[g.index], holders)
    return holders


def _add_holdings(
    group: Group, member: Member, owner: list[str | None], holders: dict[Task, dict[str, int]]
) -> None:
    freshness: dict[int, int] = {}
    for topic in group.changelogs:
        for p in member.previous_standby.get(topic, ()):
            freshness.setdefault(p, -1)
        for p, offset in member.local_offsets.get(topic, {}).items():
            freshness[p] = max(freshness.get(p, -1), 0) + max(offset, 0)
    for p, fresh in freshness.items():
        if p < group.size and owner[p] != member.id:
            holders.setdefault((group.index, p), {})[member.id] = fresh


def _standbys(
    scn: Scenario,
    groups: list[Group],
    eligible: dict[int, list[str]],
    placed: dict[int, list[str | None]],
    warm: dict[Task, dict[str, int]],
) -> dict[Task, list[str]]:
    if scn.standby_replicas == 0:
        return {}
    tasks = [(g.index, p) for g in groups if g.stateful for p in range(g.size) if placed[g.index][p]]
    previous: dict[Task, set[str]] = {}
    for g in groups:
        for m in scn.members:
            for topic in g.changelogs:
                for p in m.previous_standby.get(topic, ()):
                    previous.setdefault((g.index, p), set()).add(m.id)
    problem = StandbyProblem(
        replicas=scn.standby_replicas,
        tasks=tasks,
        active={t: placed[t[0]][t[1]] for t in tasks},  # type: ignore[misc]
        eligible=eligible,
        host={m.id: m.host for m in scn.members},
        rack={m.id: m.rack for m in scn.members},
        capacity={m.id: m.capacity for m in scn.members},
        previous=previous,
        holds_state={t: set(h) for t, h in warm.items()},
    )
    return place_standbys(problem)


def _stats(
    placed: dict[int, list[str | None]],
    previous_owner: dict[int, list[str | None]],
    warm: dict[Task, dict[str, int]],
    standbys: dict[Task, list[str]],
) -> PlanStats:
    stats = PlanStats()
    for g, owners in placed.items():
        for p, member in enumerate(owners):
            if member is None:
                stats.unassigned += 1
                continue
            stats.actives[member] = stats.actives.get(member, 0) + 1
            if previous_owner[g][p] == member:
                stats.kept += 1
            elif member in warm.get((g, p), {}):
                stats.moved_warm += 1
            else:
                stats.moved_cold += 1
    for members in standbys.values():
        for m in members:
            stats.standbys[m] = stats.standbys.get(m, 0) + 1
    return stats


def _render(
    scn: Scenario,
    groups: list[Group],
    placeable: list[Group],
    placed: dict[int, list[str | None]],
    standbys: dict[Task, list[str]],
    stats: PlanStats,
) -> dict[str, Any]:
    members: dict[str, dict[str, dict[str, list[int]]]] = {
        m.id: {"active": {}, "standby": {}} for m in scn.members
    }
    by_index = {g.index: g for g in groups}
    for g_index, owners in placed.items():
        group = by_index[g_index]
        for p, member in enumerate(owners):
            if member is not None:
                active = members[member]["active"]
                for topic in group.topics_of(p):
                    active.setdefault(topic, []).append(p)
    for (g_index, p), holders in standbys.items():
        for member in holders:
            standby = members[member]["standby"]
            for topic in by_index[g_index].changelogs_of(p):
                standby.setdefault(topic, []).append(p)
    unassigned = _unassigned(scn, groups, placeable)
    for entry in members.values():
        for kind in ("active", "standby"):
            entry[kind] = {t: sorted(ps) for t, ps in sorted(entry[kind].items())}
    return {
        "epoch": scn.max_epoch + 1,
        "members": members,
        "unassigned": unassigned,
        "warnings": scn.warnings.render(),
    }


def _unassigned(scn: Scenario, groups: list[Group], placeable: list[Group]) -> dict[str, list[int]]:
    unassigned: dict[str, list[int]] = {}
    placeable_ids = {g.index for g in placeable}
    for g in groups:
        if g.index in placeable_ids:
            continue
        for topic, count in zip(g.topics, g.counts, strict=True):
            if count:
                unassigned[topic] = list(range(count))
        scn.warnings.add(
            "unassigned",
            f"no member subscribes to every topic of {list(g.topics)}: its partitions are unassigned",
        )
    return dict(sorted(unassigned.items()))


def _empty_assignment(raw: Any, reason: str) -> dict[str, Any]:
    members = raw.get("members") if isinstance(raw, Mapping) else None
    ids = sorted(k for k in members if isinstance(k, str)) if isinstance(members, Mapping) else []
    return {
        "epoch": 1,
        "members": {m: {"active": {}, "standby": {}} for m in ids},
        "unassigned": {},
        "warnings": [reason],
    }
