"""The ten properties of docs/scenario-format.md, checked with hypothesis."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignor import plan
from tests import planner_checks as check
from tests.planner_strategies import garbled_scenarios, malformed_scenarios, scenarios

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scenarios())
def test_valid_and_copartitioned(scn: dict[str, Any]) -> None:
    assignment = plan(scn)
    check.task_owner(scn, assignment)  # asserts one subscribed owner per task, co-partitioned
    assert set(assignment) == {"epoch", "members", "unassigned", "warnings"}


@FAST
@given(scenarios(uniform=True))
def test_balanced_per_group_and_in_total(scn: dict[str, Any]) -> None:
    owners = check.task_owner(scn, plan(scn))
    assert check.is_balanced(scn, owners)


@FAST
@given(scenarios(capacities=False))
def test_kip54_rule_with_unequal_subscriptions(scn: dict[str, Any]) -> None:
    """No member two or more tasks short of another could take one of its tasks."""
    owners = check.task_owner(scn, plan(scn))
    _, total = check.counts(owners)
    groups = check.groups_of(scn)
    for (g, _), holder in owners.items():
        for other in check.eligible(scn, groups[g]):
            assert total.get(other, 0) >= total[holder] - 1, (holder, other, total)


@settings(max_examples=120, deadline=None)
@given(scenarios(max_members=3, max_partitions=4, uniform=True))
def test_sticky_and_warm_exactly_as_the_exhaustive_oracle(scn: dict[str, Any]) -> None:
    owners = check.task_owner(scn, plan(scn))
    assert check.kept_and_warm(scn, owners) == check.oracle_best(scn)


@FAST
@given(scenarios())
def test_standbys_count_placement_and_hosts(scn: dict[str, Any]) -> None:
    assignment = plan(scn)
    owners = check.task_owner(scn, assignment)
    check.check_standbys(scn, assignment, owners)


@FAST
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_json_order(scn: dict[str, Any], rnd: random.Random) -> None:
    assert plan(_shuffled(scn, rnd)) == plan(scn)


@FAST
@given(scenarios())
def test_idempotent_when_fed_back(scn: dict[str, Any]) -> None:
    first = plan(scn)
    second = plan(check.feed_back(scn, first))
    assert second["members"] == first["members"]
    assert second["unassigned"] == first["unassigned"]


@settings(max_examples=400, deadline=None)
@given(garbled_scenarios())
def test_total_on_garbage(raw: Any) -> None:
    before = copy.deepcopy(raw)
    assignment = plan(raw)
    assert set(assignment) == {"epoch", "members", "unassigned", "warnings"}
    assert isinstance(assignment["epoch"], int) and assignment["epoch"] >= 1
    json.dumps(assignment)  # serialisable
    assert raw == before or raw != raw  # the input is not mutated (NaN compares unequal)
    for entry in assignment["members"].values():
        for kind in ("active", "standby"):
            for partitions in entry[kind].values():
                assert partitions == sorted(set(partitions))
    if not any("internal planner error" in w for w in assignment["warnings"]):
        return
    raise AssertionError(assignment["warnings"])


def _shuffled(value: Any, rnd: random.Random) -> Any:
    """The same JSON with every object's keys, and every partition list, in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        items = [_shuffled(v, rnd) for v in value]
        rnd.shuffle(items)
        return items
    return value


@FAST
@given(st.integers(2, 7), st.integers(1, 24), st.integers(1, 2), st.data())
def test_standby_counts_balanced_across_distinct_hosts(
    members: int, partitions: int, replicas: int, data: st.DataObject
) -> None:
    """Equal members on distinct hosts: standby counts differ by at most one, whatever the history."""
    topics = ["impressions", "clicks", "joins-changelog"]
    scn: dict[str, Any] = {
        "topics": {t: partitions for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "standby_replicas": replicas,
        "members": {},
    }
    anywhere = st.lists(st.integers(0, partitions - 1), unique=True, max_size=partitions)
    for k in range(members):
        scn["members"][f"w{k}"] = {
            "topics": topics,
            "epoch": data.draw(st.integers(0, 2)),
            "previous_active": {t: data.draw(anywhere) for t in topics[:1]},
            "previous_standby": {"joins-changelog": data.draw(anywhere)},
        }
    assignment = plan(scn)
    owners = check.task_owner(scn, assignment)
    check.check_standbys(scn, assignment, owners)
    counts = [sum(map(len, d["standby"].values())) for d in assignment["members"].values()]
    assert max(counts) - min(counts) <= 1, counts


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed_scenarios(), st.randoms(use_true_random=False))
def test_deterministic_on_malformed_input_of_every_field(raw: Any, rnd: random.Random) -> None:
    """The same output, warnings and their order included, whatever the JSON order."""
    assert plan(_shuffled(raw, rnd)) == plan(raw)


@FAST
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_without_the_topics_field(scn: dict[str, Any], rnd: random.Random) -> None:
    del scn["topics"]
    assert plan(_shuffled(scn, rnd)) == plan(scn)
