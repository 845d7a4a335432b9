"""Hypothesis strategies for planner scenarios (docs/scenario-format.md)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st


@st.composite
def scenarios(
    draw: st.DrawFn,
    max_members: int = 5,
    max_partitions: int = 6,
    uniform: bool = False,
    capacities: bool = True,
) -> dict[str, Any]:
    """Valid scenarios: a join group (maybe stateful), lone topics, random history."""
    join_size = draw(st.integers(0, max_partitions))
    join = ["clicks", "impressions"] + (["joins-changelog"] if draw(st.booleans()) else [])
    lone = draw(st.lists(st.sampled_from(["audit", "ledger"]), unique=True, max_size=2))
    topics = {t: join_size for t in join}
    topics |= {t: draw(st.integers(0, max_partitions)) for t in lone}
    names = [f"w{i}" for i in range(draw(st.integers(1, max_members)))]
    hosts = draw(st.sampled_from([None, ["h0"], ["h0", "h1"], ["h0", "h1", "h2"]]))
    racks = draw(st.sampled_from([None, ["r0", "r1"]]))
    members = {}
    for name in names:
        subscribed = list(topics) if uniform else draw(st.lists(st.sampled_from(list(topics)), unique=True))
        member: dict[str, Any] = {"topics": subscribed}
        if hosts:
            member["host"] = draw(st.sampled_from(hosts))
        if racks:
            member["rack"] = draw(st.sampled_from(racks))
        if capacities:
            member["capacity"] = draw(st.sampled_from([1, 1, 2, 3]))
        member["epoch"] = draw(st.integers(0, 3))
        member["previous_active"] = _partitions(draw, topics)
        if "joins-changelog" in topics:
            member["previous_standby"] = _partitions(draw, {"joins-changelog": join_size})
            offsets = draw(st.lists(st.integers(0, max(join_size - 1, 0)), max_size=3, unique=True))
            if join_size:
                member["local_offsets"] = {
                    "joins-changelog": {str(p): draw(st.integers(0, 1000)) for p in offsets}
                }
        members[name] = member
    scenario: dict[str, Any] = {
        "topics": topics,
        "copartition_groups": [join],
        "standby_replicas": draw(st.integers(0, 2)),
        "members": members,
    }
    if "joins-changelog" in topics:
        scenario["changelog_topics"] = ["joins-changelog"]
    return scenario


def _partitions(draw: st.DrawFn, topics: dict[str, int]) -> dict[str, list[int]]:
    chosen: dict[str, list[int]] = {}
    for topic, count in topics.items():
        if count and draw(st.booleans()):
            chosen[topic] = sorted(draw(st.sets(st.integers(0, count - 1), max_size=count)))
    return chosen


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)


@st.composite
def garbled_scenarios(draw: st.DrawFn) -> Any:
    """A valid scenario with random fields replaced by random JSON, or pure garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    scenario = draw(scenarios())
    for _ in range(draw(st.integers(1, 4))):
        target = scenario
        path = draw(st.sampled_from(["top", "member", "member-field"]))
        if path != "top" and isinstance(scenario.get("members"), dict) and scenario["members"]:
            member = draw(st.sampled_from(sorted(scenario["members"])))
            if path == "member":
                scenario["members"][member] = draw(json_values)
                continue
            target = scenario["members"][member]
            if not isinstance(target, dict):
                continue
        key = draw(st.sampled_from(sorted(target) + ["extra"]))
        target[key] = draw(json_values)
    return scenario


@st.composite
def churn_histories(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A stateful group of members on shared hosts and racks, and the events that follow.

    Two co-partitioned stateful groups (of different sizes) and a lone stateful
    topic; R = 1 or 2; members join, leave, or restart (empty history, with the
    `local_offsets` of the state they held). The events are applied by
    `apply_churn` to the scenario fed back from the previous plan.
    """
    sizes = draw(st.lists(st.integers(1, 40), min_size=3, max_size=3))
    groups = [["a-in", "a-side", "a-changelog"], ["b-in", "b-changelog"]]
    topics = {t: sizes[0] for t in groups[0]} | {t: sizes[1] for t in groups[1]} | {"c-changelog": sizes[2]}
    hosts = draw(st.integers(2, 6))
    racks = draw(st.sampled_from([0, 2, 3]))
    scenario: dict[str, Any] = {
        "topics": topics,
        "copartition_groups": groups,
        "changelog_topics": ["a-changelog", "b-changelog", "c-changelog"],
        "standby_replicas": draw(st.integers(1, 2)),
        "members": {},
    }
    for k in range(draw(st.integers(3, 10))):
        scenario["members"][f"w{k:02d}"] = _churn_member(draw, topics, hosts, racks)
    events = draw(
        st.lists(
            st.tuples(st.sampled_from(["join", "leave", "restart"]), st.integers(0, 10**6)),
            min_size=1,
            max_size=5,
        )
    )
    return scenario, [(kind, (seed, _churn_member(draw, topics, hosts, racks))) for kind, seed in events]


def _churn_member(draw: st.DrawFn, topics: dict[str, int], hosts: int, racks: int) -> dict[str, Any]:
    member: dict[str, Any] = {
        "topics": list(topics),
        "host": f"h{draw(st.integers(0, hosts - 1))}",
        "capacity": draw(st.sampled_from([1, 1, 1, 2])),
    }
    if racks:
        member["rack"] = f"r{draw(st.integers(0, racks - 1))}"
    return member


def apply_churn(scenario: dict[str, Any], event: tuple[str, Any]) -> dict[str, Any]:
    """The scenario after one churn event (`scenario` already carries the last plan)."""
    kind, (seed, newcomer) = event
    members = dict(scenario["members"])
    names = sorted(members)
    chosen = names[seed % len(names)]
    if kind == "join":
        members[f"n{seed:07d}"] = newcomer
    elif kind == "leave" and len(members) > 2:
        del members[chosen]
    elif kind == "restart":
        old = members[chosen]
        logs = set(scenario["changelog_topics"])
        held = [
            (t, p)
            for field in ("previous_active", "previous_standby")
            for t, ps in old.get(field, {}).items()
            if t in logs
            for p in ps
        ]
        offsets: dict[str, dict[str, int]] = {}
        for i, (t, p) in enumerate(sorted(held)):
            offsets.setdefault(t, {})[str(p)] = (seed * (i + 1)) % 10_000
        kept = {k: v for k, v in old.items() if k not in ("previous_active", "previous_standby", "epoch")}
        members[chosen] = {**kept, "local_offsets": offsets}
    return {**scenario, "members": members}


# Odd values a client or a bug could send, beside random JSON: digit strings with
# leading zeros or signs name the same partition as a plain one, and so on.
odd_values = st.sampled_from(
    [None, True, False, -1, 0, 2**70, 1.5, float("nan"), "", "05", "5", "-1", " 5", [], {}, [1, 1], {"5": 1}]
).map(copy.deepcopy)  # sampled_from hands out the same objects, and _malform mutates what it draws
any_value = st.one_of(odd_values, json_values)

# Keys added to an object: partition keys that parse alike, unknown and known names.
NEW_KEYS = ["05", "5", "-1", " 5", "x", "clicks", "joins-changelog", "audit"]

# Every place in a scenario where input can be malformed, as a path of keys; "*"
# stands for an existing key or index at that level (or a new one).
MALFORMABLE_PATHS = [
    ("topics",),
    ("topics", "*"),
    ("copartition_groups",),
    ("copartition_groups", "*"),
    ("copartition_groups", "*", "*"),
    ("changelog_topics",),
    ("changelog_topics", "*"),
    ("standby_replicas",),
    ("members",),
    ("members", "*"),
    *[
        ("members", "*", field, *rest)
        for field, depths in [
            ("topics", [(), ("*",)]),
            ("host", [()]),
            ("rack", [()]),
            ("capacity", [()]),
            ("epoch", [()]),
            ("previous_active", [(), ("*",), ("*", "*")]),
            ("previous_standby", [(), ("*",), ("*", "*")]),
            ("local_offsets", [(), ("*",), ("*", "*")]),
        ]
        for rest in depths
    ],
]


@st.composite
def malformed_scenarios(draw: st.DrawFn) -> Any:
    """A valid scenario with one to four fields, at any depth, made malformed or removed."""
    scenario = draw(scenarios())
    for _ in range(draw(st.integers(1, 4))):
        _malform(draw, scenario, draw(st.sampled_from(MALFORMABLE_PATHS)))
    return scenario


def _malform(draw: st.DrawFn, node: Any, path: tuple[str, ...]) -> None:
    """Replace, remove or add the value at `path` (or stop where the path no longer exists)."""
    for step in path[:-1]:
        key = _pick_key(draw, node, step)
        if key is None:
            return
        node = node[key]
    key = _pick_key(draw, node, path[-1], new=True)
    if key is None:
        return
    action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
    if isinstance(node, dict):
        if action == "remove":
            node.pop(key, None)
        elif action == "add":
            node[draw(st.sampled_from(NEW_KEYS))] = draw(any_value)
        else:
            node[key] = draw(any_value)
    elif action == "remove" and key < len(node):
        del node[key]
    elif action == "add" or key >= len(node):
        node.append(draw(any_value))
    else:
        node[key] = draw(any_value)


def _pick_key(draw: st.DrawFn, node: Any, step: str, new: bool = False) -> Any:
    if isinstance(node, dict):
        if step != "*" and step not in node and not new:
            return None
        keys = sorted(node, key=str) if step == "*" else [step]
        options = keys + (["extra"] if new and step == "*" else [])
        return draw(st.sampled_from(options)) if options else None
    if isinstance(node, list):
        return draw(st.integers(0, len(node) if new else max(len(node) - 1, 0))) if node or new else None
    return None


@st.composite
def warmup_scenarios(
    draw: st.DrawFn,
    max_members: int = 5,
    max_partitions: int = 6,
    uniform: bool = False,
    lone_topics: bool = True,
) -> dict[str, Any]:
    """Valid scenarios with warm-ups on: a stateful join (one or two changelogs), maybe a lone
    stateful topic and a lone stateless one, members reporting offsets of some of the state."""
    size = draw(st.integers(1, max_partitions))
    logs = ["joins-changelog"] + (["side-changelog"] if draw(st.booleans()) else [])
    join = ["clicks", "impressions", *logs]
    lone_names = ["audit", "ledger-changelog"] if lone_topics else []
    lone = draw(st.lists(st.sampled_from(lone_names), unique=True, max_size=2)) if lone_names else []
    topics = {t: size for t in join} | {t: draw(st.integers(1, max_partitions)) for t in lone}
    changelogs = [t for t in topics if t.endswith("changelog")]
    hosts = draw(st.sampled_from([None, ["h0", "h1"], ["h0", "h1", "h2"]]))
    members: dict[str, Any] = {}
    for i in range(draw(st.integers(1, max_members))):
        subscribed = list(topics) if uniform else draw(st.sampled_from([list(topics), join, lone or join]))
        member: dict[str, Any] = {"topics": subscribed, "epoch": draw(st.integers(0, 2))}
        if hosts:
            member["host"] = draw(st.sampled_from(hosts))
        member["previous_active"] = _partitions(draw, topics)
        member["previous_standby"] = _partitions(draw, {t: topics[t] for t in changelogs})
        offsets: dict[str, dict[str, int]] = {}
        for topic in changelogs:
            reported = draw(st.sets(st.integers(0, topics[topic] - 1), max_size=topics[topic]))
            if reported:
                offsets[topic] = {str(p): draw(st.sampled_from([0, 400, 900, 990, 1000])) for p in reported}
        member["local_offsets"] = offsets
        members[f"w{i}"] = member
    scenario: dict[str, Any] = {
        "topics": topics,
        "copartition_groups": [join],
        "changelog_topics": changelogs,
        "standby_replicas": draw(st.integers(0, 2)),
        "members": members,
        "acceptable_recovery_lag": draw(st.sampled_from([0, 10, 100, 1000])),
    }
    budget = draw(st.sampled_from([None, 0, 1, 2, 5]))
    if budget is not None:
        scenario["max_warmup_replicas"] = budget
    if draw(st.booleans()):
        scenario["changelog_end_offsets"] = {t: _end_offsets(draw, topics[t]) for t in changelogs}
    return scenario


def _end_offsets(draw: st.DrawFn, count: int) -> dict[str, int]:
    """Some partitions' end offsets, at or past what members report."""
    return {str(p): draw(st.sampled_from([1000, 1005, 1500])) for p in range(count) if draw(st.booleans())}
