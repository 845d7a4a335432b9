"""Scenario generators for the planner benchmark: a balanced steady state, then churn events.

Every strategy sees the same input for an event (derived from one common steady state), so
moves can be compared with one optimum per event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Scenario = dict[str, Any]
STEADY_EPOCH = 7


@dataclass(frozen=True)
class Size:
    """`members` x `partitions`; `join`: 2 inputs + a changelog in one group, else `topics` alone."""

    label: str
    members: int
    partitions: int
    join: bool = True
    topics: int = 3

    @property
    def tasks(self) -> int:
        return self.partitions * (1 if self.join else self.topics)

    @property
    def topic_partitions(self) -> int:
        return self.partitions * self.topics


def parse_size(text: str) -> Size:
    """`MxP` (join layout) or `1M` (2,000 members, 500 topics x 2,000 partitions, no state)."""
    if text.upper() == "1M":
        return Size("1M", 2000, 2000, join=False, topics=500)
    members, partitions = (int(x.replace(",", "").replace("_", "")) for x in text.split("x"))
    return Size(f"{members}x{partitions}", members, partitions)


def member_id(i: int) -> str:
    return f"w{i:04d}"


def _member(i: int, topics: list[str]) -> dict[str, Any]:
    # Two members per host and hosts spread over three racks, so standby placement matters.
    return {
        "topics": topics,
        "host": f"h{i // 2:04d}",
        "rack": f"rack-{(i // 2) % 3}",
        "capacity": 1,
        "epoch": STEADY_EPOCH,
        "previous_active": {},
        "previous_standby": {},
    }


def steady(size: Size, replicas: int) -> Scenario:
    """A balanced, co-partitioned assignment with standbys, as the previous generation."""
    if size.join:
        topics = ["in-a", "in-b", "state-changelog"]
        scenario: Scenario = {
            "copartition_groups": [topics],
            "changelog_topics": [topics[2]],
            "standby_replicas": replicas,
        }
    else:
        topics = [f"topic-{t:03d}" for t in range(size.topics)]
        scenario = {"copartition_groups": [], "changelog_topics": [], "standby_replicas": 0}
    scenario["topics"] = {t: size.partitions for t in topics}
    members = [_member(i, topics) for i in range(size.members)]
    if size.join:
        _fill_join(members, size, replicas, topics)
    else:
        _fill_wide(members, size, topics)
    scenario["members"] = {member_id(i): d for i, d in enumerate(members)}
    return scenario


def _fill_join(members: list[dict[str, Any]], size: Size, replicas: int, topics: list[str]) -> None:
    n_m = size.members
    active: list[list[int]] = [[] for _ in range(n_m)]
    standby: list[list[int]] = [[] for _ in range(n_m)]
    for p in range(size.partitions):
        owner = p * n_m // size.partitions  # contiguous ranges, counts within one
        active[owner].append(p)
        for k in range(1, min(replicas, n_m - 1) + 1):
            standby[(owner + 2 * k) % n_m].append(p)  # +2: the next host
    for d, act, sby in zip(members, active, standby, strict=True):
        d["previous_active"] = {t: act for t in topics} if act else {}
        d["previous_standby"] = {topics[2]: sby} if sby else {}


def _fill_wide(members: list[dict[str, Any]], size: Size, topics: list[str]) -> None:
    held: list[dict[str, list[int]]] = [{} for _ in range(size.members)]
    for ti, t in enumerate(topics):
        for p in range(size.partitions):
            held[(p + ti) % size.members].setdefault(t, []).append(p)
    for d, h in zip(members, held, strict=True):
        d["previous_active"] = h


def _without(scenario: Scenario, gone: set[str]) -> Scenario:
    members = {m: d for m, d in scenario["members"].items() if m not in gone}
    return {**scenario, "members": members}


def leave_one(scenario: Scenario) -> Scenario:
    return _without(scenario, {member_id(len(scenario["members"]) // 2)})


def leave_two(scenario: Scenario) -> Scenario:
    n = len(scenario["members"])
    return _without(scenario, {member_id(0), member_id(n // 2 + 2)})


def join_one(scenario: Scenario) -> Scenario:
    n = len(scenario["members"])
    first = next(iter(scenario["members"].values()))
    new = {**_member(n, list(first["topics"])), "epoch": 0}
    return {**scenario, "members": {**scenario["members"], member_id(n): new}}


def restart_one(scenario: Scenario) -> Scenario:
    """A member comes back with no previous assignment but its state still on disk."""
    m = member_id(len(scenario["members"]) // 3)
    old = scenario["members"][m]
    offsets: dict[str, dict[str, int]] = {}
    for cl in scenario.get("changelog_topics", []):
        parts = set(old["previous_active"].get(cl, [])) | set(old["previous_standby"].get(cl, []))
        if parts:
            offsets[cl] = {str(p): 1000 + p for p in sorted(parts)}
    back = {**old, "epoch": 0, "previous_active": {}, "previous_standby": {}, "local_offsets": offsets}
    return {**scenario, "members": {**scenario["members"], m: back}}


EVENTS: dict[str, Callable[[Scenario], Scenario]] = {
    "leave-1": leave_one,
    "join-1": join_one,
    "leave-2": leave_two,
    "restart": restart_one,
}
