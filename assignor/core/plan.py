"""The planner: a pure function from a scenario to an assignment (docs/scenario-format.md)."""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assignor.core.actives import ActiveProblem, place_actives
from assignor.core.canonical import canonical_target
from assignor.core.holders import StateHolders
from assignor.core.quotas import compute_bounds
from assignor.core.scenario import Group, Scenario, parse_scenario
from assignor.core.standbys import StandbyProblem, place_standbys
from assignor.core.warmups import Holds, hold_moves, task_lags


@dataclass(slots=True)
class PlanStats:
    """How the active tasks moved, for summaries and rebalance views."""

    kept: int = 0
    moved_warm: int = 0
    moved_cold: int = 0  # includes tasks that had no previous owner
    unassigned: int = 0
    actives: dict[str, int] = field(default_factory=dict)
    standbys: dict[str, int] = field(default_factory=dict)
    pending: int = 0  # moves held on a caught-up member (warm-ups on)
    warmups: dict[str, int] = field(default_factory=dict)  # warm-up replicas per member
    revoking: int = 0  # tasks revoked in this cooperative round, assigned in the follow-up


@dataclass(slots=True)
class PlanResult:
    assignment: dict[str, Any]
    stats: PlanStats


@dataclass(slots=True)
class _Index:
    """Placeable groups and their tasks, numbered group by group."""

    groups: list[Group]
    offsets: np.ndarray  # (G+1,)
    members: list[str]
    eligible: np.ndarray  # (G, M) bool
    group_of: np.ndarray  # (T,) group of each task

    def task(self, group: int, partition: int) -> int:
        return int(self.offsets[group]) + partition


def plan(raw: Any) -> dict[str, Any]:
    """The assignment for a decoded JSON scenario. Never raises."""
    return plan_with_stats(raw).assignment


def plan_with_stats(raw: Any) -> PlanResult:
    with collector_paused():
        return _plan_or_fall_back(raw)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Planning a million topic-partitions allocates millions of small acyclic
    containers; the cyclic collector would walk the whole heap (the caller's
    scenario included) several times for nothing, ~0.3-1 s at that size.
    Reference counting still frees everything as it goes. Nests: the state
    found on entry is restored on exit.

    On the way out, what was allocated meanwhile goes straight to the oldest
    generation (gc.freeze then gc.unfreeze, documented to do that, in O(1)):
    else the first young collection after it would walk every one of those
    objects (60 ms for a million lists), then the middle one again. Skipped when
    the process keeps frozen objects of its own (unfreezing would release them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _plan_or_fall_back(raw: Any) -> PlanResult:
    try:
        return _plan(parse_scenario(raw))
    except Exception as exc:  # the last line of defence on a group leader
        reason = f"internal planner error, fell back to round-robin: {exc!r}"
        try:
            return PlanResult(_round_robin(parse_scenario(raw), reason), PlanStats())
        except Exception:
            return PlanResult(_empty_assignment(raw, reason), PlanStats())


def _plan(scn: Scenario) -> PlanResult:
    index = _index(scn)
    owner = _fenced_owners(scn, index)
    owned = owner.copy()  # cooperative rounds: an ineligible owner still runs its task
    owner[(owner >= 0) & ~_eligible_for_task(index, owner)] = -1
    if scn.warmup is not None:
        return _plan_with_warmups(scn, index, owner, owned)
    warm = _state_holders(scn, index, owner)
    sizes = np.diff(index.offsets)
    bounds = compute_bounds(sizes, index.eligible, [m.capacity for m in scn.members])
    problem = ActiveProblem(index.group_of, index.eligible, bounds, owner.copy(), warm)
    placed = place_actives(problem)
    if scn.protocol_named:  # follow-up-stable ties (C4); without the field, ties as before
        placed = canonical_target(problem, placed)
    standbys = _standbys(scn, index, placed, warm)
    stats = _stats(index, placed, owner, warm, standbys)
    revoked = _revoked(scn, owned, placed)
    assignment = _render(scn, index, _without(placed, revoked), standbys)
    _render_revoking(scn, index, placed, owned, revoked, assignment, stats)
    return PlanResult(assignment, stats)


def _plan_with_warmups(scn: Scenario, index: _Index, owner: np.ndarray, owned: np.ndarray) -> PlanResult:
    """The target as without warm-ups, but with the members of finite lag as the holders of
    state (least behind first); then the moves to members not caught up are held (W1-W4)."""
    assert scn.warmup is not None
    lags = task_lags(scn, scn.warmup, index.groups, index.offsets, index.eligible, owner)
    warm = lags.holders()
    bounds = compute_bounds(np.diff(index.offsets), index.eligible, [m.capacity for m in scn.members])
    problem = ActiveProblem(
        index.group_of, index.eligible, bounds, owner.copy(), warm, follow_up_stable=scn.protocol_named
    )
    target = canonical_target(problem, place_actives(problem))
    holds = hold_moves(lags, target, owner, scn.warmup.budget, len(scn.members))
    warmup_member = holds.warmup_members(len(target))
    standbys = _standbys(scn, index, holds.placed, warm, warmup_member)
    stats = _stats(index, holds.placed, owner, warm, standbys)
    stats.pending = len(holds.moves)
    stats.warmups = _warmup_counts(index, holds)
    revoked = _revoked(scn, owned, holds.placed)
    assignment = _render(scn, index, _without(holds.placed, revoked), standbys)
    _render_warmups(index, holds, assignment)
    _render_revoking(scn, index, holds.placed, owned, revoked, assignment, stats)
    return PlanResult(assignment, stats)


def _revoked(scn: Scenario, owned: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Cooperative rounds (C2): the owned tasks whose target active owner is another member.
    Unowned tasks move at once (C5); eager rounds revoke nothing here (everything is given up)."""
    if not scn.cooperative:
        return np.zeros(len(target), bool)
    return (owned >= 0) & (target >= 0) & (target != owned)


def _without(placed: np.ndarray, revoked: np.ndarray) -> np.ndarray:
    """The round's actives: the target's, less the tasks revoked in this round (C2)."""
    if not revoked.any():
        return placed
    actives = placed.copy()
    actives[revoked] = -1
    return actives


def _render_revoking(
    scn: Scenario,
    index: _Index,
    target: np.ndarray,
    owned: np.ndarray,
    revoked: np.ndarray,
    assignment: dict[str, Any],
    stats: PlanStats,
) -> None:
    """`revoking` (task order, like `pending_moves`) and `follow_up`, in cooperative rounds;
    the round's active counts (a revoked task counts on nobody until the follow-up)."""
    if not scn.cooperative:
        return
    revoking: list[dict[str, Any]] = []
    for task in np.nonzero(revoked)[0].tolist():
        g = int(index.group_of[task])
        revoking.append(
            {
                "topics": list(index.groups[g].topics),
                "partition": task - int(index.offsets[g]),
                "from": index.members[int(owned[task])],
                "to": index.members[int(target[task])],
            }
        )
    assignment["revoking"] = revoking
    assignment["follow_up"] = bool(revoking)
    stats.revoking = len(revoking)
    for entry in revoking:
        taker: str = entry["to"]
        stats.actives[taker] -= 1
        if not stats.actives[taker]:
            del stats.actives[taker]


def _warmup_counts(index: _Index, holds: Holds) -> dict[str, int]:
    counts: dict[str, int] = {}
    for move in holds.moves:
        if move.warmup:
            name = index.members[move.target]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _render_warmups(index: _Index, holds: Holds, assignment: dict[str, Any]) -> None:
    """`members.*.warmup` (changelog topic -> partitions) and `pending_moves`, in task order."""
    warmups: list[dict[str, list[int]]] = [{} for _ in index.members]
    pending = []
    for move in holds.moves:
        g = int(index.group_of[move.task])
        group = index.groups[g]
        partition = move.task - int(index.offsets[g])
        if move.warmup:
            for topic in group.changelogs_of(partition):
                warmups[move.target].setdefault(topic, []).append(partition)
        pending.append(
            {
                "topics": list(group.topics),
                "partition": partition,
                "from": index.members[move.holder],
                "to": index.members[move.target],
                "warmup": move.warmup,
            }
        )
    for name, entry in zip(index.members, warmups, strict=True):
        assignment["members"][name]["warmup"] = {t: sorted(ps) for t, ps in sorted(entry.items())}
    assignment["pending_moves"] = pending


def _index(scn: Scenario) -> _Index:
    subscriptions: dict[frozenset[str], list[int]] = {}
    for i, m in enumerate(scn.members):
        subscriptions.setdefault(m.topics, []).append(i)
    placeable: list[Group] = []
    rows: list[np.ndarray] = []
    for group in scn.groups:
        if group.size == 0:
            continue
        row = np.zeros(len(scn.members), bool)
        for topics, who in subscriptions.items():
            common = topics & set(group.topics)
            if len(common) == len(group.topics):
                row[who] = True
            elif common:
                _warn_partial(scn, group, who, common)
        if row.any():
            placeable.append(group)
            rows.append(row)
    offsets = np.concatenate([[0], np.cumsum([g.size for g in placeable])]).astype(np.int64)
    eligible = np.array(rows, bool).reshape(len(rows), len(scn.members))
    group_of = np.repeat(np.arange(len(placeable)), np.diff(offsets))
    return _Index(placeable, offsets, [m.id for m in scn.members], eligible, group_of)


def _warn_partial(scn: Scenario, group: Group, who: list[int], common: AbstractSet[str]) -> None:
    missing = sorted(set(group.topics) - common)
    for i in who:
        scn.warnings.member(
            scn.members[i].id,
            "topics",
            f"member {scn.members[i].id!r} subscribes to part of co-partition group "
            f"{list(group.topics)} (missing {missing}); it gets none of its tasks",
        )


def _eligible_for_task(index: _Index, owner: np.ndarray) -> np.ndarray:
    return index.eligible[index.group_of, np.maximum(owner, 0)]


def _fenced_owners(scn: Scenario, index: _Index) -> np.ndarray:
    """Previous owner per task: highest epoch wins; a tie at the top voids every claim."""
    task, member = _claims(scn, index)
    owner = np.full(int(index.offsets[-1]), -1, np.int64)
    if len(task) == 0:
        return owner
    if np.bincount(task).max() == 1:  # nobody contests anything: the usual case
        owner[task] = member
        return owner
    members = len(scn.members)
    pairs = np.unique(task * members + member)  # a member may list a partition twice
    task, member = pairs // members, pairs % members
    # Epochs are unbounded integers: compare their ranks, which fit numpy's int64.
    ranks = {e: r for r, e in enumerate(sorted({m.epoch for m in scn.members}))}
    epoch = np.array([ranks[m.epoch] for m in scn.members], np.int64)[member]
    order = np.lexsort((member, -epoch, task))
    task, member, epoch = task[order], member[order], epoch[order]
    starts = np.nonzero(np.r_[True, task[1:] != task[:-1]])[0]
    claims = np.diff(np.r_[starts, len(task)])
    runner_up = np.minimum(starts + 1, len(task) - 1)
    tied = (claims > 1) & (epoch[runner_up] == epoch[starts])
    owner[task[starts]] = np.where(tied, -1, member[starts])
    _warn_contested(scn, index, task, member, starts, claims, owner)
    return owner


def _claims(scn: Scenario, index: _Index) -> tuple[np.ndarray, np.ndarray]:
    """(task, member) for every previous-active claim."""
    group_of_topic = {t: g for g, group in enumerate(index.groups) for t in group.topics}
    chunks: list[Collection[int]] = []
    bases: list[int] = []
    claimant: list[int] = []
    offsets = index.offsets.tolist()
    flat_tasks: list[np.ndarray] = []
    flat_claimants: list[np.ndarray] = []
    for i, m in enumerate(scn.members):
        claimed, flat = m.previous_active, m.previous_active_flat
        if flat is not None:
            groups = list(map(group_of_topic.get, flat.names))
            if None not in groups and len(set(groups)) == len(groups):
                # One topic per group (lone topics): the parser's arrays are the claims.
                base = np.fromiter(map(offsets.__getitem__, groups), np.int64, len(groups))
                lengths, values = flat.arrays()
                flat_tasks.append(values + np.repeat(base, lengths))
                flat_claimants.append(np.full(len(values), i, np.int64))
                continue
        groups = list(map(group_of_topic.get, claimed))
        per_group: dict[int, set[int]] = {}
        for g, partitions in zip(groups, claimed.values(), strict=True):
            if g is not None:  # claiming any partition of a task claims the task
                per_group.setdefault(g, set()).update(partitions)
        for g, partitions in per_group.items():
            chunks.append(partitions)
            bases.append(offsets[g])
            claimant.append(i)
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    claimed_ids = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, int(lengths.sum()))
    flat_tasks.append(claimed_ids + np.repeat(np.array(bases, np.int64), lengths))
    flat_claimants.append(np.repeat(np.array(claimant, np.int64), lengths))
    return np.concatenate(flat_tasks), np.concatenate(flat_claimants)


def _warn_contested(
    scn: Scenario,
    index: _Index,
    task: np.ndarray,
    member: np.ndarray,
    starts: np.ndarray,
    claims: np.ndarray,
    owner: np.ndarray,
) -> None:
    contested = np.nonzero(claims > 1)[0]
    for k in contested[:21].tolist():
        t = int(task[starts[k]])
        g = int(np.searchsorted(index.offsets, t, side="right")) - 1
        names = member[starts[k] : starts[k] + claims[k]].tolist()
        listed = ", ".join(f"{scn.members[i].id} (epoch {scn.members[i].epoch})" for i in sorted(names))
        winner = int(owner[t])
        verdict = (
            f"{scn.members[winner].id} wins" if winner >= 0 else "tie at the highest epoch: no claim counts"
        )
        label = index.groups[g].label()
        scn.warnings.add("fenced", f"task {label}#{t - index.offsets[g]} claimed by {listed}: {verdict}")
    if len(contested) > 21:
        scn.warnings.add("fenced", f"{len(contested)} tasks in all were claimed by several members")


def _state_holders(scn: Scenario, index: _Index, owner: np.ndarray) -> StateHolders:
    """Eligible members (not the owner) holding each stateful task's state, and how fresh."""
    chunks: list[Collection[int]] = []
    offsets: list[Iterable[int]] = []
    reported: list[bool] = []
    bases: list[int] = []
    claimant: list[int] = []
    for g, group in enumerate(index.groups):
        if not group.stateful:
            continue
        base = int(index.offsets[g])
        for i in np.nonzero(index.eligible[g])[0].tolist():
            member = scn.members[i]
            if not member.previous_standby and not member.local_offsets:
                continue
            for topic in group.changelogs:
                standby = member.previous_standby.get(topic)
                local = member.local_offsets.get(topic)
                for partitions, values, has_offset in (
                    (standby, itertools.repeat(0, len(standby or ())), False),
                    (local, local.values() if local else (), True),
                ):
                    if partitions:
                        chunks.append(partitions)
                        offsets.append(values)
                        reported.append(has_offset)
                        bases.append(base)
                        claimant.append(i)
    if not chunks:
        return StateHolders.none()
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    total = int(lengths.sum())
    partitions = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, total)
    return StateHolders.of(
        tasks=partitions + np.repeat(np.array(bases, np.int64), lengths),
        members=np.repeat(np.array(claimant, np.int64), lengths),
        offsets=np.fromiter(itertools.chain.from_iterable(offsets), np.int64, total),
        has_offset=np.repeat(np.array(reported, bool), lengths),
        owner=owner,
        member_count=len(scn.members),
    )


@dataclass(slots=True)
class _Standbys:
    """Standby members of stateful tasks: `members[i]` of task `tasks[i]`."""

    tasks: np.ndarray
    members: list[list[int]]

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(task, member) of every standby, in task order."""
        lengths = np.fromiter(map(len, self.members), np.int64, len(self.members))
        members = np.fromiter(itertools.chain.from_iterable(self.members), np.int64, int(lengths.sum()))
        return np.repeat(self.tasks, lengths), members


def _standbys(
    scn: Scenario,
    index: _Index,
    placed: np.ndarray,
    warm: StateHolders,
    warmup_member: np.ndarray | None = None,
) -> _Standbys:
    """Standby members of every stateful task that has an owner (never its warm-up member)."""
    none = _Standbys(np.zeros(0, np.int64), [])
    if scn.standby_replicas == 0:
        return none
    # A task beyond a mismatched group's changelog count has no state to replicate.
    chunks = [
        index.offsets[g] + np.arange(_state_partitions(group))
        for g, group in enumerate(index.groups)
        if group.stateful
    ]
    if not chunks:
        return none
    tasks = np.concatenate(chunks).astype(np.int64)
    tasks = tasks[placed[tasks] >= 0]
    hosts: dict[str, int] = {}
    rack_names = sorted({m.rack for m in scn.members if m.rack is not None})
    rack_ids = {r: i for i, r in enumerate(rack_names)}  # in name order: the repair walks racks so
    problem = StandbyProblem(
        replicas=scn.standby_replicas,
        groups=index.group_of[tasks],
        active=placed[tasks],
        eligible=index.eligible,
        host=np.array([hosts.setdefault(m.host, len(hosts)) for m in scn.members], np.int64),
        rack=np.array([rack_ids.get(m.rack, -1) for m in scn.members], np.int64),  # type: ignore[arg-type]
        capacity=[m.capacity for m in scn.members],
        previous=_previous_standbys(scn, index, tasks),
        holders=lambda position: warm.get(int(tasks[position])),
        excluded=None if warmup_member is None else warmup_member[tasks],
    )
    return _Standbys(tasks, place_standbys(problem))


def _previous_standbys(scn: Scenario, index: _Index, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position in `tasks`, member) of every previous standby of those tasks."""
    chunks: list[Any] = []
    bases: list[int] = []
    claimant: list[int] = []
    stateful = [
        (int(index.offsets[g]), group.changelogs) for g, group in enumerate(index.groups) if group.stateful
    ]
    for i, m in enumerate(scn.members):
        if not m.previous_standby:
            continue
        for base, changelogs in stateful:
            for topic in changelogs:
                partitions = m.previous_standby.get(topic)
                if partitions:
                    chunks.append(partitions)
                    bases.append(base)
                    claimant.append(i)
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    flat = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, int(lengths.sum()))
    task = flat + np.repeat(np.array(bases, np.int64), lengths)
    member = np.repeat(np.array(claimant, np.int64), lengths)
    position = np.searchsorted(tasks, task).clip(max=max(len(tasks) - 1, 0))
    found = (tasks[position] == task) if len(tasks) else np.zeros(len(task), bool)
    return position[found], member[found]


def _state_partitions(group: Group) -> int:
    """Tasks 0..n-1 of a stateful group have a changelog partition to replicate."""
    return max(n for t, n in zip(group.topics, group.counts, strict=True) if t in group.changelogs)


def _stats(
    index: _Index,
    placed: np.ndarray,
    previous: np.ndarray,
    warm: StateHolders,
    standbys: _Standbys,
) -> PlanStats:
    assigned = placed >= 0
    kept = assigned & (placed == previous)
    moved = np.nonzero(assigned & ~kept)[0]
    moved_warm = int(warm.holds(moved, placed[moved], len(index.members)).sum())
    actives = np.bincount(placed[assigned], minlength=len(index.members))
    standby_counts = np.bincount(standbys.flat()[1], minlength=len(index.members))
    return PlanStats(
        kept=int(kept.sum()),
        moved_warm=moved_warm,
        moved_cold=len(moved) - moved_warm,
        unassigned=int((~assigned).sum()),
        actives={m: int(n) for m, n in zip(index.members, actives.tolist(), strict=True) if n},
        standbys={m: int(n) for m, n in zip(index.members, standby_counts.tolist(), strict=True) if n},
    )


def _render(scn: Scenario, index: _Index, placed: np.ndarray, standbys: _Standbys) -> dict[str, Any]:
    active = _active_lists(index, placed)
    standby = _standby_lists(index, standbys)
    members = {m: {"active": active[i], "standby": standby[i]} for i, m in enumerate(index.members)}
    unassigned = _unassigned(scn, index)
    return {
        "epoch": scn.max_epoch + 1,
        "members": members,
        "unassigned": unassigned,
        "warnings": scn.warnings.render(),
    }


def _standby_lists(index: _Index, standbys: _Standbys) -> list[dict[str, list[int]]]:
    """Per member, changelog topic -> sorted partitions it replicates."""
    result: list[dict[str, list[int]]] = [{} for _ in index.members]
    task, member = standbys.flat()
    order = np.lexsort((task, member))
    task, member = task[order], member[order]
    group = index.group_of[task]
    partition = task - index.offsets[group]
    for g, spec in enumerate(index.groups):
        counts = dict(zip(spec.topics, spec.counts, strict=True))
        in_group = group == g
        for topic in sorted(spec.changelogs):
            chosen = np.nonzero(in_group & (partition < counts[topic]))[0]
            if len(chosen) == 0:
                continue
            who, parts = member[chosen], partition[chosen].tolist()
            cuts = (np.nonzero(np.diff(who))[0] + 1).tolist()
            starts = [0, *cuts]
            for m, a, b in zip(who[starts].tolist(), starts, [*cuts, len(parts)], strict=True):
                result[m][topic] = parts[a:b]
    if sum(len(g.changelogs) for g in index.groups) > 1:  # topics of one member in name order
        result = [dict(sorted(entry.items())) if len(entry) > 1 else entry for entry in result]
    return result


def _active_lists(index: _Index, placed: np.ndarray) -> list[dict[str, list[int]]]:
    """Per member, topic -> sorted partitions, built from sorted runs at C speed.

    A million topic-partitions make a million small lists: every Python-level
    step per list shows, so runs are cut with numpy and sliced with map().
    """
    active: list[dict[str, list[int]]] = [{} for _ in index.members]
    if len(placed) == 0:
        return active
    # By member, then task (group, partition); a narrow dtype lets numpy radix-sort.
    narrow = placed.astype(np.int16) if len(index.members) < 2**15 - 1 else placed
    order = np.argsort(narrow, kind="stable")
    owners = placed[order]
    groups = index.group_of[order]
    partition_array = order - index.offsets[groups]
    partitions = partition_array.tolist()
    cuts = np.nonzero((np.diff(owners) != 0) | (np.diff(groups) != 0))[0] + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(order)]
    run_owner, run_group = owners[starts], groups[starts]
    runs = _runs(partitions, partition_array, starts, ends)
    # One entry per (run, topic of its group), ordered by member then topic name.
    names = sorted({t for g in index.groups for t in g.topics})
    rank = {t: i for i, t in enumerate(names)}
    group_topics = [[rank[t] for t in g.topics] for g in index.groups]
    width = np.array([len(t) for t in group_topics])[run_group]
    entry_run = np.repeat(np.arange(len(runs)), width)
    first = np.r_[0, np.cumsum(width)[:-1]]
    within = np.arange(len(entry_run)) - np.repeat(first, width)
    flat_topics = np.array([t for ts in group_topics for t in ts], np.int64)
    topic_start = np.r_[0, np.cumsum([len(t) for t in group_topics])[:-1]].astype(np.int64)
    entry_topic = flat_topics[topic_start[run_group[entry_run]] + within]
    entry_owner = run_owner[entry_run]
    keep = np.nonzero(entry_owner >= 0)[0]
    key = entry_owner[keep] * len(names) + entry_topic[keep]
    if (np.diff(key) < 0).any():  # groups are not in topic-name order
        keep = keep[np.argsort(key, kind="stable")]
    if len(keep) == len(runs) and (entry_run[keep] == np.arange(len(runs))).all():
        lists = runs  # one topic per run, already in order: the runs are the lists
    else:
        lists = list(map(runs.__getitem__, entry_run[keep].tolist()))
    if (width > 1).any():  # a run shared by several topics: one list object per topic
        lists = list(map(list, lists))
    topics = np.array(names, object)[entry_topic[keep]].tolist()
    bounds = np.searchsorted(entry_owner[keep], np.arange(len(index.members) + 1))
    for member in range(len(index.members)):
        a, b = int(bounds[member]), int(bounds[member + 1])
        if a < b:
            active[member] = dict(zip(topics[a:b], lists[a:b], strict=True))
    _trim_mismatched(index, active)
    return active


def _runs(partitions: list[int], values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[list[int]]:
    """`partitions[a:b]` for every run, as new lists. Most runs of a large lone-topic group hold
    one partition: those are made in one pass at C speed, and only longer ones sliced."""
    longer = np.nonzero(ends - starts > 1)[0]
    if 2 * len(longer) > len(starts):  # mostly long runs: slice them all
        return list(map(partitions.__getitem__, map(slice, starts.tolist(), ends.tolist())))
    runs = list(map(list, zip(values[starts].tolist())))
    for i, a, b in zip(longer.tolist(), starts[longer].tolist(), ends[longer].tolist(), strict=True):
        runs[i] = partitions[a:b]
    return runs


def _trim_mismatched(index: _Index, active: list[dict[str, list[int]]]) -> None:
    """In a group with mismatched counts, a shorter topic lacks the higher partitions."""
    short = {t: n for g in index.groups for t, n in zip(g.topics, g.counts, strict=True) if n < g.size}
    if not short:
        return
    for entry in active:
        for topic, count in short.items():
            if topic in entry:
                kept = [p for p in entry[topic] if p < count]
                if kept:
                    entry[topic] = kept
                else:
                    del entry[topic]


def _unassigned(scn: Scenario, index: _Index) -> dict[str, list[int]]:
    unassigned: dict[str, list[int]] = {}
    placeable = {g.index for g in index.groups}
    for g in scn.groups:
        if g.index in placeable or g.size == 0:
            continue
        for topic, count in zip(g.topics, g.counts, strict=True):
            if count:
                unassigned[topic] = list(range(count))
        scn.warnings.add(
            "unassigned",
            f"no member subscribes to every topic of {list(g.topics)}: its partitions are unassigned",
        )
    return dict(sorted(unassigned.items()))


def _round_robin(scn: Scenario, reason: str) -> dict[str, Any]:
    """A valid, co-partitioned, deterministic assignment, balanced per group, not sticky."""
    members: dict[str, dict[str, Any]] = {m.id: {"active": {}, "standby": {}} for m in scn.members}
    unassigned: dict[str, list[int]] = {}
    for group in scn.groups:
        eligible = [m.id for m in scn.members if set(group.topics) <= m.topics]
        for p in range(group.size):
            for topic in group.topics_of(p):
                if eligible:
                    owner = eligible[(p + group.index) % len(eligible)]
                    members[owner]["active"].setdefault(topic, []).append(p)
                else:
                    unassigned.setdefault(topic, []).append(p)
    return {
        "epoch": scn.max_epoch + 1,
        "members": members,
        "unassigned": unassigned,
        "warnings": [reason, *scn.warnings.render()],
    }


def _empty_assignment(raw: Any, reason: str) -> dict[str, Any]:
    members = raw.get("members") if isinstance(raw, Mapping) else None
    ids = sorted(k for k in members if isinstance(k, str)) if isinstance(members, Mapping) else []
    return {
        "epoch": 1,
        "members": {m: {"active": {}, "standby": {}} for m in ids},
        "unassigned": {},
        "warnings": [reason],
    }
