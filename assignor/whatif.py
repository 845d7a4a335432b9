"""What a change would do to a live group, without changing anything:

    python -m assignor what-if --worker http://HOST:PORT --leave NAME
    python -m assignor what-if --worker http://HOST:PORT --join 2 [--host H --rack R]
    python -m assignor what-if --worker http://HOST:PORT --restart NAME

Reads the group from any worker's `/tandem/group.json` (the leader's routing table and
every member's own view: its subscription, epoch, host, rack, capacity, what it holds
and the changelog offsets on its disk), builds the planner's scenario the way the
leader does (assignor/faust_adapter/partition_assignor.py, `assign_members`), applies the change, plans it
with the same planner, and reports per worker the partitions kept, moved warm and moved
cold, the changelog records each move would replay, and the balance after.

The leader's inputs are rebuilt in full: warm-ups (KIP-441) with the changelogs' end offsets
(the freshest checkpoint any member reports, as the broker's end is for a quiet group), the
standby and recovery-lag settings, and the rebalance protocol the workers report. The
rounds that follow on their own are predicted too: the follow-up of a cooperative round
(KIP-429: revoked partitions are assigned in the next round), and the probing rebalances
that complete the moves held for a warm-up (each warm-up then reports the end offset). A
probing round is planned with every copy at the changelog's end: with traffic flowing, which
of several equally caught-up copies the leader moves depends on their lags at the probe.

A move is warm when the new owner has the partition's state on its disk (a standby, or
files kept from before), as the runtime counts it; it replays from its checkpoint to the
changelog's end (the freshest checkpoint any member reports). A cold move replays the
whole changelog partition. A restart is two rebalances: the worker leaves, then comes
back with what its disk holds (a new member id: where two placements cost the same, the
planner may break the tie differently from this prediction; likewise for new members).
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from assignor.core.plan import plan_with_stats
from assignor.group_scenario import (
    Join,
    MemberInfo,
    Warmups,
    build_scenario,
    copartition_groups,
    topic_counts,
)
from assignor.wire import Subscription

GROUP_PATH = "/tandem/group.json"
# Rounds predicted after a change at most: cooperative follow-ups and probing rebalances
# (W5 bounds the probing rounds by ceil(pending / max_warmup_replicas) + 1 for a group that
# settles; a prediction that needs more says so in a warning).
MAX_FOLLOW_UPS = 8
PROTOCOLS = ("eager", "cooperative")


class WhatIfError(RuntimeError):
    """The group could not be read, or the change names no member of it."""


# What reading a group.json of the wrong shape raises (a member's view is another process's).
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)
MAX_SHOWN = 200  # characters of a malformed value shown in the one-line error


def one_line(text: str) -> str:
    """Text for one terminal line: control characters (newlines, escapes) shown escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _malformed(exc: BaseException) -> WhatIfError:
    what = one_line(f"{type(exc).__name__}: {exc}")
    what = what if len(what) <= MAX_SHOWN else what[: MAX_SHOWN - 3] + "..."
    return WhatIfError(f"malformed {GROUP_PATH} ({what}); is the worker a Tandem worker of this version?")


@dataclass(frozen=True)
class Change:
    """One change to the group: `leave`, `join` (with `count`, `host`, `rack`) or `restart`."""

    kind: str
    name: str = ""
    count: int = 0
    host: str = ""
    rack: str = ""


@dataclass
class WorkerMoves:
    """What one rebalance does for one worker and one join."""

    worker: str
    host: str
    rack: str
    actives_before: list[int]
    actives_after: list[int]
    standbys_after: list[int]
    kept: list[int] = field(default_factory=list)
    moved_warm: list[int] = field(default_factory=list)
    moved_cold: list[int] = field(default_factory=list)
    replay: dict[int, int] = field(default_factory=dict)  # partition -> changelog records
    leaves: bool = False  # a worker that is no longer in the group after the step

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "leaves": self.leaves,
            "host": self.host,
            "rack": self.rack,
            "actives_before": self.actives_before,
            "actives_after": self.actives_after,
            "standbys_after": self.standbys_after,
            "kept": self.kept,
            "moved_warm": self.moved_warm,
            "moved_cold": self.moved_cold,
            "replay": {str(p): n for p, n in sorted(self.replay.items())},
            "replay_total": sum(self.replay.values()),
        }


@dataclass
class Step:
    """One planned rebalance: its epoch, the planner's group counts, and each join's moves."""

    title: str
    epoch: int
    group: dict[str, int]  # tasks, kept, moved_warm, moved_cold (as the leader counts them)
    joins: dict[str, list[WorkerMoves]]
    warnings: list[str]
    planned: dict[str, Any] = field(default_factory=dict)  # member id -> the planner's output
    # What makes the group rebalance again on its own: moves held for a warm-up (a probing
    # rebalance completes them) and, in a cooperative round, the partitions it revokes.
    pending_moves: list[dict[str, Any]] = field(default_factory=list)
    revoking: list[dict[str, Any]] = field(default_factory=list)
    follow_up: bool = False
    round: str = "change"  # "change", "follow-up" (cooperative) or "probing" (warm-ups)
    member_ids: dict[str, str] = field(default_factory=dict)  # worker name -> its member id here

    def planned_for(self, worker: str) -> dict[str, Any]:
        """The planner's output for one worker (active, standby, warmup: topic -> partitions)."""
        return dict(self.planned.get(self.member_ids.get(worker, ""), {}))

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "round": self.round,
            "epoch": self.epoch,
            "group": self.group,
            "joins": {name: [m.as_dict() for m in moves] for name, moves in self.joins.items()},
            "balance": {name: balance(moves) for name, moves in self.joins.items()},
            "pending_moves": self.pending_moves,
            "revoking": self.revoking,
            "follow_up": self.follow_up,
            "warnings": self.warnings,
        }

    def actives(self, join: str | None = None) -> dict[str, list[int]]:
        """Each remaining worker's actives of a join (the first one by default) after the step."""
        moves = self.joins.get(join) if join else next(iter(self.joins.values()), [])
        return {m.worker: m.actives_after for m in moves or [] if not m.leaves}


# -- reading the group -------------------------------------------------------------------------


def fetch_group(worker_url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The group as one worker sees it (its /tandem/group.json)."""
    url = worker_url.rstrip("/") + GROUP_PATH
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:  # HTTPException: not HTTP
        raise WhatIfError(f"cannot read the group from {url}: {type(exc).__name__}: {exc}") from exc
    try:
        found = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _malformed(exc) from None
    if not isinstance(found, dict):
        raise _malformed(TypeError(f"a JSON {type(found).__name__}, not an object"))
    return found


@dataclass
class Member:
    """A member as the leader sees it, keyed by its worker name."""

    name: str
    member_id: str
    topics: frozenset[str]
    state: Subscription


@dataclass
class Group:
    """Everything the leader plans with."""

    members: dict[str, Member]  # by worker name
    joins: list[Join]
    join_names: dict[str, str]  # changelog -> join name
    table_changelogs: set[str]
    counts: dict[str, int]  # from the routing table
    standby_replicas: int
    acceptable_lag: int
    warmups: Warmups | None = None  # on in the group: budget and lag (end offsets: `ends`)
    # (changelog, partition) -> the last offset written, as far as the group knows: the freshest
    # checkpoint any member reported before the change (a member that leaves takes its disk
    # away, not the changelog). The leader asks the broker for the same ends.
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    protocol: str | None = None  # the rebalance protocol the workers report (None: not named)


def read_group(snapshot: Mapping[str, Any]) -> Group:
    """The planner's inputs from a group snapshot; raises WhatIfError if a member is missing."""
    missing = [w["url"] for w in snapshot["workers"] if not w["ok"]]
    if missing:
        raise WhatIfError(f"members not answering: {', '.join(missing)}; the prediction needs every member")
    views = [w["view"] for w in snapshot["workers"]]
    planner = next((v["planner"] for v in views if v.get("planner")), None)
    if planner is None or snapshot.get("routing") is None:
        raise WhatIfError("the group does not run the Tandem assignor, or has no routing table yet")
    members = {v["worker"]: _member(v) for v in views if v.get("member")}
    joins = [Join(tuple(j["topics"]), j["changelog"]) for j in planner["joins"]]
    join_names = {j["changelog"]: name for v in views for name, j in v["joins"].items()}
    counts = {t: g["partitions"] for g in snapshot["routing"]["groups"] for t in g["topics"]}
    protocol = planner.get("protocol")
    return Group(
        members=members,
        joins=joins,
        join_names=join_names,
        table_changelogs=set(planner["table_changelogs"]),
        counts=counts,
        standby_replicas=int(planner["standby_replicas"]),
        acceptable_lag=int(planner["acceptable_recovery_lag"]),
        warmups=Warmups(int(planner["acceptable_recovery_lag"]), int(planner["max_warmup_replicas"]), {})
        if planner.get("warmups")
        else None,
        ends=_freshest(members.values()),
        protocol=None if protocol is None else str(protocol),
    )


def _member(view: Mapping[str, Any]) -> Member:
    m = view["member"]
    state = Subscription(
        epoch=int(m["epoch"]),
        url=m["url"],
        host=m["host"],
        rack=m["rack"],
        capacity=float(m["capacity"]),
        previous_active={t: list(p) for t, p in m["previous_active"].items()},
        previous_standby={t: list(p) for t, p in m["previous_standby"].items()},
        local_offsets={t: {int(p): int(o) for p, o in by.items()} for t, by in m["local_offsets"].items()},
    )
    return Member(view["worker"], m["id"] or view["worker"], frozenset(m["topics"]), state)


def scenario_of(group: Group) -> dict[str, Any]:
    """The scenario the leader would build for these members (faust_adapter.assign_members):
    with warm-ups on, the changelogs' end offsets as the leader looks them up; the protocol
    field when the workers name one."""
    by_id = {m.member_id: MemberInfo(m.topics, m.state) for m in group.members.values()}
    subscribed = {t for m in by_id.values() for t in m.subscription}
    counts = topic_counts(group.joins, subscribed, group.counts)
    groups = copartition_groups(
        group.joins, counts, group.table_changelogs, [by_id[m].subscription for m in sorted(by_id)]
    )
    changelogs = group.table_changelogs | {j.changelog for j in group.joins if j.changelog}
    warmups = None
    if group.warmups is not None:
        ends: dict[str, dict[int, int]] = {}
        for (topic, p), last in group.ends.items():
            ends.setdefault(topic, {})[p] = last + 1  # the end: the next offset to be written
        warmups = replace(group.warmups, end_offsets=ends)
    scenario = build_scenario(
        by_id,
        counts,
        groups,
        changelogs,
        group.standby_replicas,
        group.joins,
        group.acceptable_lag,
        warmups,
    )
    if group.protocol is not None:
        scenario["protocol"] = group.protocol
    return scenario


# -- changing it --------------------------------------------------------------------------------


def predict(snapshot: Mapping[str, Any], change: Change, protocol: str | None = None) -> list[Step]:
    """The rebalance(s) the change would cause, planned; nothing is sent to the group.
    `protocol` ("eager" or "cooperative"): plan as if the group ran it (default: the one the
    workers report). Raises WhatIfError (one line) for a snapshot of the wrong shape."""
    if protocol not in (None, *PROTOCOLS):
        raise WhatIfError(f"unknown protocol {protocol!r}: use {' or '.join(PROTOCOLS)}")
    try:
        return _predict(snapshot, change, protocol)
    except MALFORMED as exc:
        raise _malformed(exc) from None


def _predict(snapshot: Mapping[str, Any], change: Change, protocol: str | None) -> list[Step]:
    group = read_group(snapshot)
    if protocol is not None:
        group = replace(group, protocol=protocol)
    if change.kind in ("leave", "restart") and change.name not in group.members:
        known = ", ".join(sorted(group.members))
        raise WhatIfError(f"no worker named {change.name!r} in the group (workers: {known})")
    if change.kind == "leave":
        return _rounds(f"{change.name} leaves", group, _without(group, change.name))[0]
    if change.kind == "join":
        if change.count < 1:
            raise WhatIfError("--join needs a number of workers >= 1")
        return _rounds(f"{change.count} new worker(s) join", group, _with_new(group, change))[0]
    if change.kind == "restart":
        # The worker comes back before any warm-up of its stop has caught up: only the
        # cooperative follow-ups (immediate) come between its stop and its return.
        stopped, planned = _rounds(f"{change.name} stops", group, _without(group, change.name), probe=False)
        left = _after(planned, stopped[-1], caught_up=False)
        back = _back(left, group.members[change.name])
        return stopped + _rounds(f"{change.name} comes back with its disk", left, back)[0]
    raise WhatIfError(f"unknown change {change.kind!r}")


def _rounds(title: str, before: Group, after: Group, probe: bool = True) -> tuple[list[Step], Group]:
    """The change's rebalance and the ones that follow from it with nothing else changing:
    the cooperative follow-up of a round that revokes (at once, the revoking member rejoins),
    then, with `probe`, a probing rebalance while moves are held for a warm-up (once the
    warm-ups have caught up). Also the group as the last step planned it (its input)."""
    steps = [_step(title, before, after)]
    current = after
    while True:
        last = steps[-1]
        if last.follow_up:
            kind, caught_up, what = "follow-up", False, "the revoked partitions assigned"
        elif probe and last.pending_moves:
            kind, caught_up, what = "probing", True, "the warm-ups caught up"
        else:
            return steps, current
        if len(steps) > MAX_FOLLOW_UPS:
            last.warnings.append(
                f"the group still rebalances after {MAX_FOLLOW_UPS} rounds; not predicted further"
            )
            return steps, current
        current = _after(current, last, caught_up)
        steps.append(_step(f"{kind} rebalance after {title}: {what}", current, current, kind))


def _without(group: Group, name: str) -> Group:
    return replace(group, members={n: m for n, m in group.members.items() if n != name})


def _with_new(group: Group, change: Change) -> Group:
    topics = frozenset().union(*(m.topics for m in group.members.values()))
    members = dict(group.members)
    for i in range(1, change.count + 1):
        name = f"new-{i}"
        host = change.host or name
        state = Subscription(host=host, rack=change.rack)
        members[name] = Member(name, f"~{name}", topics, state)  # "~": sorts after real member ids
    return replace(group, members=members)


def _back(group: Group, old: Member) -> Group:
    """The restarted worker: no history (a new process), the same disk."""
    state = Subscription(
        url=old.state.url,
        host=old.state.host,
        rack=old.state.rack,
        capacity=old.state.capacity,
        local_offsets=old.state.local_offsets,
    )
    members = {**group.members, old.name: Member(old.name, f"~{old.name}", old.topics, state)}
    return replace(group, members=members)


def _after(group: Group, step: Step, caught_up: bool) -> Group:
    """The members as they join the next round, having run the step's plan: what it made
    active they own (a revoked partition: nobody), its standbys and warm-ups they report as
    standbys (as the contract asks). A partition a member keeps tailing (its actives, and the
    standbys it held before the step) is at the changelog's end; with `caught_up` (a probing
    rebalance) its new standbys and warm-ups are too, else they report what their disk had."""
    members = {}
    for name, m in group.members.items():
        planned = step.planned.get(m.member_id, {})
        held_before = _partitions(m.state.previous_active) | _partitions(m.state.previous_standby)
        replicas = _union(planned.get("standby", {}), planned.get("warmup", {}))
        offsets = {t: dict(by) for t, by in m.state.local_offsets.items()}
        tailing = _partitions(planned.get("active", {})) | {
            tp for tp in _partitions(replicas) if caught_up or tp in held_before
        }
        for tp in tailing:
            if tp in group.ends:
                offsets.setdefault(tp[0], {})[tp[1]] = group.ends[tp]
        state = Subscription(
            epoch=step.epoch,
            url=m.state.url,
            host=m.state.host,
            rack=m.state.rack,
            capacity=m.state.capacity,
            previous_active={t: list(p) for t, p in planned.get("active", {}).items()},
            previous_standby=replicas,
            local_offsets=offsets,
        )
        members[name] = Member(name, m.member_id, m.topics, state)
    return replace(group, members=members)


def _partitions(by_topic: Mapping[str, list[int]]) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in by_topic.items() for p in ps}


def _union(a: Mapping[str, list[int]], b: Mapping[str, list[int]]) -> dict[str, list[int]]:
    return {t: sorted(set(a.get(t, [])) | set(b.get(t, []))) for t in sorted(set(a) | set(b))}


def _freshest(members: Iterable[Member]) -> dict[tuple[str, int], int]:
    """(changelog, partition) -> the highest checkpoint any member holds (the active's)."""
    ends: dict[tuple[str, int], int] = {}
    for m in members:
        for topic, by in m.state.local_offsets.items():
            for p, offset in by.items():
                ends[(topic, p)] = max(ends.get((topic, p), offset), offset)
    return ends


def _step(title: str, before: Group, after: Group, kind: str = "change") -> Step:
    """Plan `after` (the group with the change) and count what moves against `before`."""
    result = plan_with_stats(scenario_of(after))
    planned = result.assignment
    joins = {}
    for join in after.joins:
        if not join.changelog:
            continue
        name = before.join_names.get(join.changelog, join.changelog)
        joins[name] = [
            _moves(m, planned["members"].get(m.member_id, {}), join, before.ends)
            for m in after.members.values()
        ] + [_leaving(m, join) for n, m in before.members.items() if n not in after.members]
    s = result.stats
    names = {m.member_id: m.name for m in after.members.values()}
    changelogs = {j.changelog for j in after.joins if j.changelog} | after.table_changelogs
    return Step(
        title=title,
        epoch=int(planned["epoch"]),
        group={
            "tasks": s.kept + s.moved_warm + s.moved_cold,
            "kept": s.kept,
            "moved_warm": s.moved_warm,
            "moved_cold": s.moved_cold,
        },
        joins=joins,
        warnings=list(planned["warnings"]),
        planned=_incoming_warmed(planned, changelogs),
        pending_moves=[_named(move, names) for move in planned.get("pending_moves", [])],
        revoking=[_named(move, names) for move in planned.get("revoking", [])],
        follow_up=bool(planned.get("follow_up")),
        round=kind,
        member_ids={m.name: m.member_id for m in after.members.values()},
    )


def _incoming_warmed(planned: Mapping[str, Any], changelogs: set[str]) -> dict[str, Any]:
    """Each member's part of the plan as the leader sends it: in a cooperative round, a task
    revoked towards a member is a warm-up there until the follow-up (the changelogs of its
    group: assignor/group_scenario.py `with_incoming_warmed`, which the leader applies)."""
    members = {m: {k: dict(v) for k, v in part.items()} for m, part in planned["members"].items()}
    for entry in planned.get("revoking", []):
        warmup = members.setdefault(entry["to"], {}).setdefault("warmup", {})
        for topic in entry["topics"]:
            if topic in changelogs:
                warmup[topic] = sorted({*warmup.get(topic, []), int(entry["partition"])})
    return members


def _named(move: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """A pending move or a revocation with worker names instead of member ids."""
    return {**move, "from": names.get(move["from"], move["from"]), "to": names.get(move["to"], move["to"])}


def _moves(
    member: Member, planned: Mapping[str, Any], join: Join, ends: Mapping[tuple[str, int], int]
) -> WorkerMoves:
    changelog = join.changelog or join.topics[0]
    first = join.topics[0]
    before = sorted(member.state.previous_active.get(first, []))
    after = sorted(planned.get("active", {}).get(first, []))
    on_disk = member.state.local_offsets.get(changelog, {})
    standby_before = set(member.state.previous_standby.get(changelog, []))
    moves = WorkerMoves(
        worker=member.name,
        host=member.state.host,
        rack=member.state.rack,
        actives_before=before,
        actives_after=after,
        standbys_after=sorted(planned.get("standby", {}).get(changelog, [])),
    )
    for p in after:
        if p in before:
            moves.kept.append(p)
            continue
        end = ends.get((changelog, p), -1) + 1  # the changelog's end offset
        local = on_disk.get(p)
        if local is not None or p in standby_before:  # the runtime's "warm": state on this disk
            moves.moved_warm.append(p)
            moves.replay[p] = max(0, end - (local + 1 if local is not None else 0))
        else:
            moves.moved_cold.append(p)
            moves.replay[p] = end
    return moves


def _leaving(member: Member, join: Join) -> WorkerMoves:
    actives = sorted(member.state.previous_active.get(join.topics[0], []))
    return WorkerMoves(member.name, member.state.host, member.state.rack, actives, [], [], leaves=True)


def balance(moves: list[WorkerMoves]) -> dict[str, Any]:
    """Actives and standbys per worker after the step, and the spread of the actives."""
    moves = [m for m in moves if not m.leaves]
    actives = {m.worker: len(m.actives_after) for m in moves}
    standbys = {m.worker: len(m.standbys_after) for m in moves}
    counts = list(actives.values())
    return {
        "actives": actives,
        "standbys": standbys,
        "spread": (max(counts) - min(counts)) if counts else 0,
    }


# -- printing -------------------------------------------------------------------------------------


def render(steps: list[Step]) -> str:
    """A table per step and join, for a person."""
    lines: list[str] = []
    for step in steps:
        g = step.group
        lines += [
            f"== {step.title}: generation {step.epoch}",
            f"group (every task, as the leader counts them): {g['tasks']} tasks, kept {g['kept']}, "
            f"moved warm {g['moved_warm']}, moved cold {g['moved_cold']}",
        ]
        for name, moves in step.joins.items():
            lines += ["", f"join {name}:", *_table(moves)]
            b = balance(moves)
            total = sum(sum(m.replay.values()) for m in moves)
            per = ", ".join(f"{w} {n}" for w, n in b["actives"].items())
            lines += [
                f"changelog records replayed in all: {total:,}",
                f"balance after: actives {per} (spread {b['spread']}); standbys "
                + ", ".join(f"{w} {n}" for w, n in b["standbys"].items()),
            ]
        if step.round == "probing":
            lines.append(
                "(planned with every copy at the changelog's end: where several are caught up, the one"
                " that moves depends on their lags at the probe)"
            )
        lines += [f"revoked now, assigned in the follow-up round: {_move(m)}" for m in step.revoking]
        lines += [
            f"held for a warm-up (moves in a probing rebalance): {_move(m)}" for m in step.pending_moves
        ]
        lines += [f"warning: {w}" for w in step.warnings]
        lines.append("")
    lines.append("Nothing was changed in the group.")
    return "\n".join(one_line(line) for line in lines)  # labels are the workers' own text


def _table(moves: list[WorkerMoves]) -> list[str]:
    rows = [("worker", "host", "rack", "actives", "kept", "moved warm", "moved cold", "replay (records)")]
    for m in moves:
        replay = ", ".join(f"p{p}: {n:,}" for p, n in sorted(m.replay.items())) or "—"
        rows.append(
            (
                m.worker,
                m.host,
                m.rack or "—",
                f"{len(m.actives_before)} -> {len(m.actives_after)}" + (" (leaves)" if m.leaves else ""),
                _parts(m.kept),
                _parts(m.moved_warm),
                _parts(m.moved_cold),
                replay,
            )
        )
    shown = [[one_line(str(c)) for c in row] for row in rows]  # widths of what is printed
    widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in shown]


def _move(move: Mapping[str, Any]) -> str:
    replica = "" if move.get("warmup", True) else " (no warm-up replica yet: over the budget)"
    return f"partition {move['partition']} {move['from']} -> {move['to']}{replica}"


def _parts(partitions: list[int]) -> str:
    return ", ".join(map(str, partitions)) or "—"
