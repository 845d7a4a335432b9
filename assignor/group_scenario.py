"""Pure translation between a consumer group's state and the planner's scenario.

No Faust and no Kafka objects here: the adapter (assignor/faust_adapter/partition_assignor.py)
reads them and hands plain values to these functions, which keeps the
translation unit-testable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from assignor.wire import VERSION, Assignment, RebalanceStats, RoutingTable, Subscription, TopicPartitions


class CopartitionError(RuntimeError):
    """A declared join whose topics have different partition counts."""


@dataclass(frozen=True)
class Join:
    """A join the app declares: its input topics and its state changelog."""

    topics: tuple[str, ...]
    changelog: str | None = None

    @property
    def all_topics(self) -> tuple[str, ...]:
        return self.topics + ((self.changelog,) if self.changelog else ())


@dataclass(frozen=True)
class MemberInfo:
    """What the leader knows of one member: its Kafka subscription and its user data."""

    subscription: frozenset[str]
    state: Subscription
    wire_version: int = VERSION  # the protocol metadata version: which assignments it reads


@dataclass(frozen=True)
class Warmups:
    """The scenario's warm-up inputs (docs/scenario-format.md, "Warm-up replicas")."""

    acceptable_recovery_lag: int
    max_warmup_replicas: int
    end_offsets: Mapping[str, Mapping[int, int]]  # changelog topic -> partition -> end; may be empty


def verify_copartitioned(joins: Iterable[Join], counts: Mapping[str, int]) -> None:
    """Raise naming the topics and counts of any join whose known counts differ."""
    problems = []
    for join in joins:
        known = {t: counts[t] for t in join.all_topics if counts.get(t)}
        if len(set(known.values())) > 1:
            listed = ", ".join(f"{t}={n}" for t, n in sorted(known.items()))
            problems.append(f"join {list(join.all_topics)} has different partition counts: {listed}")
    if problems:
        raise CopartitionError("; ".join(problems))


def topic_counts(
    joins: Sequence[Join], subscribed: Iterable[str], cluster_count: Mapping[str, int]
) -> dict[str, int]:
    """Partition counts of every topic to plan; a changelog nobody consumes takes its join's."""
    counts = {t: cluster_count[t] for t in set(subscribed) if cluster_count.get(t)}
    for join in joins:
        if join.changelog and join.changelog not in counts:
            inputs = [counts[t] for t in join.topics if t in counts]
            if inputs:
                counts[join.changelog] = max(inputs)
    return counts


def copartition_groups(
    joins: Sequence[Join],
    counts: Mapping[str, int],
    table_changelogs: Iterable[str],
    subscriptions: Iterable[frozenset[str]],
) -> list[list[str]]:
    """Declared joins, then undeclared table changelogs with their co-subscribed topics.

    A Faust table's changelog must live with the stream that updates it; without a
    declaration we group it like stock Faust does (same partition count, same
    subscribers). Every other topic stands alone.
    """
    groups = merged([sorted(t for t in j.all_topics if t in counts) for j in joins])
    taken = {t for g in groups for t in g}
    members_of: dict[str, set[int]] = {}
    for index, sub in enumerate(subscriptions):
        for topic in sub:
            members_of.setdefault(topic, set()).add(index)
    subscribers = {t: frozenset(ms) for t, ms in members_of.items()}
    for changelog in sorted(set(table_changelogs) - taken):
        if changelog not in counts:
            continue
        key = (counts[changelog], subscribers.get(changelog, frozenset()))
        mates = sorted(
            t for t in counts if t not in taken and (counts[t], subscribers.get(t, frozenset())) == key
        )
        groups.append(mates)
        taken |= set(mates)
    groups += [[t] for t in sorted(set(counts) - taken)]
    return groups


def merged(groups: Iterable[Sequence[str]]) -> list[list[str]]:
    """Groups that share a topic, made one (joins reading one topic: one table enriching two
    streams): partition p of every topic of both joins goes to one member. Sorted, in the
    order of each merged group's first appearance; empty groups dropped."""
    found: list[set[str]] = []
    for group in groups:
        mine = set(group)
        if not mine:
            continue
        hits = [i for i, g in enumerate(found) if g & mine]
        for i in hits:
            mine |= found[i]
        found = [g for i, g in enumerate(found) if i not in hits]
        found.insert(hits[0] if hits else len(found), mine)
    return [sorted(g) for g in found]


def scenario_topics(joins: Sequence[Join], subscription: frozenset[str]) -> list[str]:
    """A member subscribed to all inputs of a join also hosts its changelog."""
    hosted = {j.changelog for j in joins if j.changelog and set(j.topics) <= subscription}
    return sorted(subscription | hosted)


def fresh_offsets(
    members: Mapping[str, MemberInfo], acceptable_lag: int
) -> dict[str, dict[str, dict[int, int]]]:
    """Each member's local offsets, keeping only copies within the lag of the freshest.

    Partition keys stay ints (the planner reads ints or decimal text; JSON writes text).
    """
    best: dict[str, dict[int, int]] = {}
    for info in members.values():
        for topic, offsets in info.state.local_offsets.items():
            top = best.setdefault(topic, {})
            for partition, offset in offsets.items():
                if offset > top.get(partition, offset - 1):
                    top[partition] = offset
    result: dict[str, dict[str, dict[int, int]]] = {}
    for member, info in members.items():
        kept: dict[str, dict[int, int]] = {}
        for topic, offsets in info.state.local_offsets.items():
            top = best[topic]
            fresh = {p: o for p, o in offsets.items() if o >= top[p] - acceptable_lag}
            if fresh:
                kept[topic] = fresh
        result[member] = kept
    return result


def build_scenario(
    members: Mapping[str, MemberInfo],
    counts: Mapping[str, int],
    groups: list[list[str]],
    changelogs: Iterable[str],
    standby_replicas: int,
    joins: Sequence[Join] = (),
    acceptable_lag: int = 10_000,
    warmups: Warmups | None = None,
) -> dict[str, Any]:
    """The planner's scenario. Without warm-ups, local offsets further than `acceptable_lag`
    behind the freshest copy are left out (they would not count as warm); with warm-ups the
    planner is given every offset and the end offsets, and judges the lags itself."""
    if warmups is None:
        offsets = fresh_offsets(members, acceptable_lag)
    else:
        offsets = {m: dict(info.state.local_offsets) for m, info in members.items()}
    changelog_topics = sorted(set(changelogs) & set(counts))
    scenario: dict[str, Any] = {
        "topics": dict(counts),
        "copartition_groups": [g for g in groups if len(g) > 1],
        "changelog_topics": changelog_topics,
        "standby_replicas": standby_replicas,
        "members": {
            member: _member(info, scenario_topics(joins, info.subscription), offsets[member])
            for member, info in members.items()
        },
    }
    if warmups is not None:
        scenario["acceptable_recovery_lag"] = warmups.acceptable_recovery_lag
        scenario["max_warmup_replicas"] = warmups.max_warmup_replicas
        ends = {t: dict(warmups.end_offsets[t]) for t in changelog_topics if warmups.end_offsets.get(t)}
        if ends:
            scenario["changelog_end_offsets"] = ends
    return scenario


def _member(info: MemberInfo, topics: list[str], offsets: Mapping[str, Any]) -> dict[str, Any]:
    state = info.state
    entry: dict[str, Any] = {
        "topics": topics,
        "capacity": state.capacity,
        "epoch": state.epoch,
        "previous_active": state.previous_active,
        "previous_standby": state.previous_standby,
        "local_offsets": offsets,
    }
    if state.host:
        entry["host"] = state.host
    if state.rack:
        entry["rack"] = state.rack
    return entry


def member_assignments(
    planned: Mapping[str, Any],
    members: Iterable[str],
    groups: list[list[str]],
    leader_url: str,
    stats: RebalanceStats,
) -> dict[str, Assignment]:
    """Every member's own part of the plan (and nothing of the others'); in a cooperative round,
    what it revokes now and what it gets in the follow-up."""
    by_member = planned.get("members", {})
    follow_up = bool(planned.get("follow_up", False))
    cooperative = "revoking" in planned  # present (possibly empty) in every cooperative round
    return {
        member: Assignment(
            epoch=int(planned.get("epoch", 0)),
            active=_copy(by_member.get(member, {}).get("active", {})),
            standby=_copy(by_member.get(member, {}).get("standby", {})),
            topic_groups=groups,
            leader_url=leader_url,
            stats=stats,
            warmup=_copy(by_member.get(member, {}).get("warmup", {})),
            revoking=_moving(planned, "from", member),
            incoming=_moving(planned, "to", member),
            follow_up=follow_up,
            cooperative=cooperative,
        )
        for member in members
    }


def _moving(planned: Mapping[str, Any], side: str, member: str) -> dict[str, list[int]]:
    """topic -> partitions of the round's revoked tasks whose `side` ("from"/"to") is `member`."""
    found: dict[str, set[int]] = {}
    for entry in planned.get("revoking", []):
        if entry.get(side) == member:
            for topic in entry["topics"]:
                found.setdefault(topic, set()).add(int(entry["partition"]))
    return {t: sorted(p) for t, p in sorted(found.items())}


def with_incoming_warmed(assignment: Assignment, changelogs: set[str]) -> Assignment:
    """A cooperative round lists a task coming to this member in the follow-up under nobody's
    standbys or warm-ups (C3: they are the target's, where it is this member's active). Its
    changelogs stay warm-ups here meanwhile (Faust tables' too, through the consumer), so the
    member keeps tailing them and reports them caught up: else the follow-up finds it cold
    and holds the task elsewhere, and the next probe revokes it again (measured: a loop)."""
    incoming = {t: p for t, p in assignment.incoming.items() if t in changelogs}
    if not incoming:
        return assignment
    warmup = {t: sorted(set(p) | set(incoming.get(t, []))) for t, p in assignment.warmup.items()}
    warmup.update({t: p for t, p in incoming.items() if t not in warmup})
    return replace(assignment, warmup=warmup)


def with_global_tables(
    assignment: Assignment, subscription: frozenset[str], global_counts: Mapping[str, int]
) -> Assignment:
    """Every member that subscribes to a global table's changelog reads all of it."""
    everything = {t: list(range(n)) for t, n in global_counts.items() if t in subscription}
    if not everything:
        return assignment
    return replace(assignment, active={**assignment.active, **everything})


def kafka_partitions(
    assignment: Assignment, subscription: frozenset[str], table_changelogs: Iterable[str]
) -> list[tuple[str, list[int]]]:
    """What the consumer fetches: subscribed actives, plus standbys and warm-ups of Faust tables.

    Faust replays a table's standby changelog through its consumer; Tandem's own
    join state tails its standbys itself, and the consumer may only be given
    topics it subscribes to.
    """
    wanted: dict[str, set[int]] = {}
    for topic, partitions in assignment.active.items():
        if topic in subscription:
            wanted.setdefault(topic, set()).update(partitions)
    for topic in set(table_changelogs) & subscription:
        wanted.setdefault(topic, set()).update(assignment.standby.get(topic, []))
        wanted[topic].update(assignment.warmup.get(topic, []))
    return sorted((t, sorted(p)) for t, p in wanted.items() if p)


def routing_table(
    planned: Mapping[str, Any],
    urls: Mapping[str, str],
    groups: list[list[str]],
    counts: Mapping[str, int],
) -> RoutingTable:
    """Owner url of every partition of every group, from the plan."""
    url_list = sorted(set(urls.values()))
    index = {url: i for i, url in enumerate(url_list)}
    owners = [[-1] * max((counts.get(t, 0) for t in g), default=0) for g in groups]
    # A group's topics go together (co-partitioned), and its largest topic has every
    # partition: reading that one topic per group reads every owner once.
    leads = [(gi, max(g, key=lambda t: (counts.get(t, 0), t))) for gi, g in enumerate(groups) if g]
    for member, entry in planned.get("members", {}).items():
        url = urls.get(member)
        active = entry.get("active", {})
        if url is None or not active:
            continue
        for gi, topic in leads:
            row = owners[gi]
            for p in active.get(topic, ()):
                if 0 <= p < len(row):
                    row[p] = index[url]
    return RoutingTable(int(planned.get("epoch", 0)), url_list, groups, owners)


def _copy(mapping: Mapping[str, Iterable[int]]) -> TopicPartitions:
    return {t: sorted(p) for t, p in mapping.items() if p}
