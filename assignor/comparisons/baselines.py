"""Baseline assignors on the scenario format (docs/scenario-format.md), for the planner benchmark.

Each strategy is split in three so the benchmark times only the assignor itself:
`prepare` builds the strategy's native input from a scenario (what the members would send),
`run` is the assignor call, `convert` turns its native output back into the scenario format.

- `faust_full`: Faust 0.15's real `PartitionAssignor.assign(cluster, member_metadata)` on a
  real `faust.App` (never started), previous assignments in Faust's own user data.
- `faust_copartitioned`: Faust's `CopartitionedAssignor` core, once per co-partition group.
- `round_robin`: aiokafka's `RoundRobinPartitionAssignor`.
- `range_assign`: Kafka's RangeAssignor, written here on aiokafka's assignor interface.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from assignor.comparisons.metrics import changelogs, eligible, groups

Scenario = Mapping[str, Any]
TopicParts = dict[str, set[int]]


@dataclass(frozen=True)
class Strategy:
    """One assignor: untimed prepare, timed run, untimed convert."""

    name: str
    prepare: Callable[[Scenario], Any]
    run: Callable[[Any], Any]
    convert: Callable[[Scenario, Any, Any], dict[str, Any]]
    copartitions: str  # whether it respects co-partition groups, and why

    def __call__(self, scenario: Scenario) -> dict[str, Any]:
        native = self.prepare(scenario)
        return self.convert(scenario, native, self.run(native))


# --- shared helpers -----------------------------------------------------------------------


class StaticCluster:
    """The one method of aiokafka's ClusterMetadata the assignors call, from scenario counts."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        self._parts = {t: set(range(int(n))) for t, n in topics.items() if int(n) > 0}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._parts.get(topic)

    def topics(self) -> set[str]:
        return set(self._parts)


def _members(scenario: Scenario) -> Mapping[str, Mapping[str, Any]]:
    return scenario.get("members", {}) or {}


def _subscription(scenario: Scenario, member: Mapping[str, Any]) -> list[str]:
    known = scenario.get("topics", {})
    return sorted(t for t in member.get("topics", []) if t in known)


def build_output(
    scenario: Scenario,
    active: Mapping[str, Mapping[str, Iterable[int]]],
    standby: Mapping[str, Mapping[str, Iterable[int]]],
    warnings: Iterable[str] = (),
) -> dict[str, Any]:
    """Scenario-format output; `unassigned` lists subscribed partitions nobody owns."""
    members: dict[str, dict[str, dict[str, list[int]]]] = {}
    owned: set[tuple[str, int]] = set()
    for m in sorted(set(active) | set(standby)):
        act = {t: sorted(set(ps)) for t, ps in sorted(active.get(m, {}).items()) if ps}
        sby = {t: sorted(set(ps)) for t, ps in sorted(standby.get(m, {}).items()) if ps}
        owned.update((t, p) for t, ps in act.items() for p in ps)
        members[m] = {"active": act, "standby": sby}
    subscribed = {t for d in _members(scenario).values() for t in d.get("topics", [])}
    unassigned: dict[str, list[int]] = {}
    for t, n in sorted(scenario.get("topics", {}).items()):
        missing = [p for p in range(int(n)) if t in subscribed and (t, p) not in owned]
        if missing:
            unassigned[t] = missing
    epochs = [d.get("epoch", 0) for d in _members(scenario).values()]
    epoch = max([e for e in epochs if isinstance(e, int)] or [0]) + 1
    return {"epoch": epoch, "members": members, "unassigned": unassigned, "warnings": list(warnings)}


def _protocol_output(
    scenario: Scenario, _native: Any, result: Mapping[str, ConsumerProtocolMemberAssignment]
) -> dict[str, Any]:
    active = {m: {t: ps for t, ps in a.assignment} for m, a in result.items()}
    return build_output(scenario, active, {})


def _protocol_input(
    scenario: Scenario,
) -> tuple[StaticCluster, dict[str, ConsumerProtocolMemberMetadata]]:
    members = {
        m: ConsumerProtocolMemberMetadata(0, _subscription(scenario, d), b"")
        for m, d in _members(scenario).items()
    }
    return StaticCluster(scenario.get("topics", {})), members


# --- round robin and range ----------------------------------------------------------------


class RangePartitionAssignor(AbstractPartitionAssignor):
    """Kafka's RangeAssignor: per topic, contiguous ranges over the sorted subscribers.

    Topics of equal partition counts and equal subscribers get the same layout, so it
    co-partitions them by construction (but piles the remainders on the first members).
    """

    name = "range"
    version = 0

    @classmethod
    def assign(
        cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        subscribers: dict[str, list[str]] = defaultdict(list)
        for m, meta in members.items():
            for t in meta.subscription:
                subscribers[t].append(m)
        layout: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for t, ms in subscribers.items():
            parts = sorted(cluster.partitions_for_topic(t) or ())
            per, extra = divmod(len(parts), len(ms))
            for i, m in enumerate(sorted(ms)):
                start = per * i + min(i, extra)
                layout[m][t] = parts[start : start + per + (i < extra)]
        return {
            m: ConsumerProtocolMemberAssignment(cls.version, sorted(layout[m].items()), b"") for m in members
        }

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, list(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass


ROUND_ROBIN = Strategy(
    "round-robin",
    _protocol_input,
    lambda n: RoundRobinPartitionAssignor.assign(*n),
    _protocol_output,
    "no (only if partitions % members == 0)",
)
RANGE = Strategy(
    "range",
    _protocol_input,
    lambda n: RangePartitionAssignor.assign(*n),
    _protocol_output,
    "yes, by construction (equal counts, equal subscriptions)",
)


# --- Faust ------------------------------------------------------------------------------


def _faust_app(scenario: Scenario) -> Any:
    """A real faust.App (never started) whose tables own the scenario's changelog topics."""
    import faust

    r = int(scenario.get("standby_replicas", 0) or 0)
    app = faust.App("tandem-bench", broker="memory://", store="memory://", table_standby_replicas=r)
    topics = scenario.get("topics", {})
    for cl in sorted(changelogs(scenario) & set(topics)):
        n = int(topics[cl])
        app.Table(f"table-{cl}", partitions=n, changelog_topic=app.topic(cl, partitions=n))
    return app


def _url(member: str) -> str:
    return f"http://{member}:6066"


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _faust_shared_state(scenario: Scenario) -> bytes:
    """The cluster-wide maps every Faust member echoes from its last assignment, in JSON.

    Each member sends the whole previous changelog and external-topic distribution back to
    the leader (`PartitionAssignor.metadata`), so its user data grows with the cluster.
    """
    cls = changelogs(scenario)
    changelog: dict[str, dict[str, list[int]]] = {}
    external: dict[str, dict[str, list[int]]] = {}
    for m, d in sorted(_members(scenario).items()):
        prev = d.get("previous_active") or {}
        changelog[_url(m)] = {t: list(ps) for t, ps in prev.items() if t in cls}
        external[_url(m)] = {t: list(ps) for t, ps in prev.items() if t not in cls}
    topic_groups = {t: i for i, (ts, _) in enumerate(groups(scenario)) for t in ts}
    return (
        b'"changelog_distribution":'
        + _json(changelog)
        + b',"external_topic_distribution":'
        + _json(external)
        + b',"topic_groups":'
        + _json(topic_groups)
    )


EMPTY_STATE = b'"changelog_distribution":{},"external_topic_distribution":{},"topic_groups":{}'


def _faust_user_data(member: str, data: Mapping[str, Any], shared: bytes) -> bytes:
    """Faust's ClientMetadata JSON (as `ClientMetadata.dumps()` writes it), shared maps spliced."""
    previous = {
        "actives": {t: list(ps) for t, ps in (data.get("previous_active") or {}).items()},
        "standbys": {t: list(ps) for t, ps in (data.get("previous_standby") or {}).items()},
    }
    fresh = not previous["actives"] and not previous["standbys"]  # new or restarted process
    return (
        b'{"assignment":'
        + _json(previous)
        + b',"url":'
        + _json(_url(member))
        + b","
        + (EMPTY_STATE if fresh else shared)
        + b"}"
    )


def _faust_full_prepare(scenario: Scenario) -> tuple[Any, StaticCluster, dict[str, Any]]:
    from faust.assignor.partition_assignor import PartitionAssignor

    class CapturingAssignor(PartitionAssignor):  # keeps Faust's own per-client result
        def _protocol_assignments(self, assignments: Any, *args: Any) -> Any:
            self.captured = assignments
            return super()._protocol_assignments(assignments, *args)

    app = _faust_app(scenario)
    assignor = CapturingAssignor(app, replicas=app.conf.table_standby_replicas)
    shared = _faust_shared_state(scenario)
    metadata = {
        m: ConsumerProtocolMemberMetadata(4, _subscription(scenario, d), _faust_user_data(m, d, shared))
        for m, d in sorted(_members(scenario).items())
    }
    return assignor, StaticCluster(scenario.get("topics", {})), metadata


def _faust_full_convert(scenario: Scenario, native: Any, _result: Any) -> dict[str, Any]:
    cls = changelogs(scenario)
    captured = native[0].captured
    active = {m: dict(a.actives) for m, a in captured.items()}
    # Faust keeps standbys for every topic of a group; only changelog ones are replicated.
    standby = {m: {t: ps for t, ps in a.standbys.items() if t in cls} for m, a in captured.items()}
    return build_output(scenario, active, standby)


def _faust_core_prepare(scenario: Scenario) -> list[tuple[Any, list[str]]]:
    """One CopartitionedAssignor per scenario group, on the members' ClientAssignments."""
    from faust.assignor.client_assignment import ClientAssignment
    from faust.assignor.copartitioned_assignor import CopartitionedAssignor

    r = int(scenario.get("standby_replicas", 0) or 0)
    cls = changelogs(scenario)
    previous = {
        m: ClientAssignment(
            actives={t: list(ps) for t, ps in (d.get("previous_active") or {}).items()},
            standbys={t: list(ps) for t, ps in (d.get("previous_standby") or {}).items()},
        )
        for m, d in _members(scenario).items()
    }
    out = []
    for ts, n in groups(scenario):
        ms = eligible(scenario, (ts, n))
        if not ms or n <= 0:
            continue
        cluster_asgn = {m: previous[m].copartitioned_assignment(set(ts)) for m in ms}
        replicas = r if cls & set(ts) else 0  # standbys only where there is state
        out.append((CopartitionedAssignor(ts, cluster_asgn, n, replicas), sorted(cls & set(ts))))
    return out


def _faust_core_run(native: list[tuple[Any, list[str]]]) -> list[Any]:
    return [assignor.get_assignment() for assignor, _ in native]


def _faust_core_convert(scenario: Scenario, native: Any, result: list[Any]) -> dict[str, Any]:
    active: dict[str, TopicParts] = defaultdict(dict)
    standby: dict[str, TopicParts] = defaultdict(dict)
    for (_, logs), per_member in zip(native, result, strict=True):
        for m, a in per_member.items():
            for t in a.topics:
                active[m][t] = set(a.actives)
            for t in logs:
                standby[m][t] = set(a.standbys)
    return build_output(scenario, active, standby)


FAUST_FULL = Strategy(
    "faust-full",
    _faust_full_prepare,
    lambda n: n[0].assign(n[1], n[2]),
    _faust_full_convert,
    "yes (groups co-subscribed topics of equal counts)",
)
FAUST_CORE = Strategy(
    "faust-core",
    _faust_core_prepare,
    _faust_core_run,
    _faust_core_convert,
    "yes (one CopartitionedAssignor per group)",
)

BASELINES: dict[str, Strategy] = {s.name: s for s in (FAUST_FULL, FAUST_CORE, ROUND_ROBIN, RANGE)}


def faust_full(scenario: Scenario) -> dict[str, Any]:
    """Faust 0.15's full PartitionAssignor path."""
    return FAUST_FULL(scenario)


def faust_copartitioned(scenario: Scenario) -> dict[str, Any]:
    """Faust 0.15's CopartitionedAssignor core, per co-partition group of the scenario."""
    return FAUST_CORE(scenario)


def round_robin(scenario: Scenario) -> dict[str, Any]:
    """aiokafka's round-robin assignor."""
    return ROUND_ROBIN(scenario)


def range_assign(scenario: Scenario) -> dict[str, Any]:
    """Kafka's range assignor."""
    return RANGE(scenario)


__all__ = [
    "BASELINES",
    "Strategy",
    "StaticCluster",
    "build_output",
    "changelogs",
    "eligible",
    "faust_copartitioned",
    "faust_full",
    "groups",
    "range_assign",
    "round_robin",
]
