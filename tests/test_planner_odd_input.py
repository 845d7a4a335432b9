"""Structurally odd input (issue 14, parts 2 and 3): one answer whatever the JSON order,
and a warning naming the member and the field for every part the planner ignores or corrects."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignor import plan
from tests import planner_checks as check
from tests.planner_strategies import scenarios

JOIN = ["clicks", "impressions", "joins-changelog"]


def _join(members: dict[str, dict[str, Any]], partitions: int = 4) -> dict[str, Any]:
    return {
        "topics": {t: partitions for t in JOIN} | {"audit": 2},
        "copartition_groups": [JOIN],
        "changelog_topics": ["joins-changelog"],
        "standby_replicas": 1,
        "members": {m: {"topics": [*JOIN, "audit"], **d} for m, d in members.items()},
    }


def _reversed(value: Any) -> Any:
    """The same JSON with every object's keys and every list in reverse order."""
    if isinstance(value, dict):
        return {k: _reversed(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_reversed(v) for v in reversed(value)]
    return value


def test_one_partition_spelled_two_ways_resolves_alike_in_either_order() -> None:
    """ "05" and "5" used to both mean partition 5, and the last one in the JSON won."""
    fresh, stale = {"5": 90_000, "05": 3}, {"05": 3, "5": 90_000}
    members = {
        "owner": {"epoch": 3, "previous_active": {t: [0, 1, 2, 3, 4, 5] for t in JOIN}},
        "idle": {"epoch": 3},
        "other": {"local_offsets": {"joins-changelog": {"5": 50_000}}},
    }
    one = _join({**members, "idle": {**members["idle"], "local_offsets": {"joins-changelog": fresh}}}, 6)
    two = _join({**members, "idle": {**members["idle"], "local_offsets": {"joins-changelog": stale}}}, 6)
    assert plan(one) == plan(two)
    assert any("local_offsets['joins-changelog']['05']" in w for w in plan(one)["warnings"])
    # The plain spelling counts: idle (90,000) is fresher than other (50,000) and takes 5.
    assert 5 in plan(one)["members"]["idle"]["active"]["clicks"]


@pytest.mark.parametrize(
    "bad",
    [
        {"joins-changelog": {"1": "ten"}},
        {"joins-changelog": {"x": 1, "1": 5}},
        {"joins-changelog": [1, 2]},
        {"joins-changelog": {"1": [5], "2": {"3": 4}}},
        {"joins-changelog": {"1": -7}},
        {"joins-changelog": {"+1": 3, " 1": 4, "1": 5}},
        [["joins-changelog", 1]],
    ],
)
def test_malformed_local_offsets_give_one_answer_whatever_the_order(bad: Any) -> None:
    scn = _join({"w1": {"local_offsets": bad}, "w2": {}, "w3": {"epoch": 1}})
    assert plan(_reversed(scn)) == plan(scn)
    assert any("'w1'" in w and "local_offsets" in w for w in plan(scn)["warnings"])


def test_no_topics_field_gives_one_answer_whatever_the_order() -> None:
    scn = _join({"w1": {"previous_active": {"clicks": [0], "impressions": [1], "audit": [0]}}, "w2": {}})
    del scn["topics"]
    assert plan(_reversed(scn)) == plan(scn)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("previous_standby", {"clicks": [1]}, "clicks"),  # a known topic, not a changelog
        ("previous_standby", {"audit": [0]}, "audit"),
        ("previous_standby", {"ghost": [0]}, "ghost"),  # not a known topic at all
        ("previous_standby", {"ghost": []}, "ghost"),
        ("local_offsets", {"clicks": {"1": 5}}, "clicks"),
        ("local_offsets", {"ghost": {"1": 5}}, "ghost"),
        ("local_offsets", {"joins-changelog": {"1": -1}}, "negative"),
        ("local_offsets", {"joins-changelog": {"01": 5}}, "'01'"),
        ("local_offsets", {"joins-changelog": {"1": 2**63}}, "not a Kafka offset"),
        ("hots", "node-a", "hots"),  # a misspelt field
    ],
)
def test_every_ignored_part_names_the_member_and_the_field(field: str, value: Any, named: str) -> None:
    scn = _join({"w1": {field: value}, "w2": {}})
    warnings = plan(scn)["warnings"]
    assert any("'w1'" in w and field in w and named in w for w in warnings), warnings


def test_warm_up_fields_without_the_lag_are_reported_as_ignored() -> None:
    scn = _join({"w1": {}, "w2": {}}) | {"max_warmup_replicas": 3, "colour": "blue"}
    result = plan(scn)
    warnings = result["warnings"]
    assert any("max_warmup_replicas" in w and "off without acceptable_recovery_lag" in w for w in warnings)
    assert any("colour" in w for w in warnings), warnings
    assert "pending_moves" not in result


# Values each member field must not take; each one is ignored or corrected.
BAD_MEMBER_VALUES: dict[str, list[Any]] = {
    "topics": ["clicks", [1, "clicks"], {"clicks": 1}, None],
    "host": [5, "", ["a"]],
    "rack": [5, "", {"r": 1}],
    "capacity": [0, -1, "2", float("nan"), float("inf"), True],
    "epoch": [-1, 1.5, "3", False],
    "previous_active": ["x", [0], {"ghost": [0]}, {"clicks": "0"}, {"clicks": [99]}, {"clicks": [-1]}],
    "previous_standby": ["x", {"ghost": [0]}, {"clicks": [0]}, {"joins-changelog": [99]}],
    "local_offsets": [
        "x",
        {"ghost": {"0": 1}},
        {"clicks": {"0": 1}},
        {"joins-changelog": {"x": 1}},
        {"joins-changelog": {"0": "x"}},
        {"joins-changelog": {"0": -1}},
        {"joins-changelog": {"00": 1}},
        {"joins-changelog": [0]},
    ],
    "typo": [1],
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(sorted(BAD_MEMBER_VALUES)), st.data())
def test_a_bad_member_field_gets_a_warning_naming_member_and_field(
    scn: dict[str, Any], field: str, data: st.DataObject
) -> None:
    member = data.draw(st.sampled_from(sorted(scn["members"])))
    value = copy.deepcopy(data.draw(st.sampled_from(BAD_MEMBER_VALUES[field])))
    scn["members"][member][field] = value
    warnings = plan(scn)["warnings"]
    assert any(repr(member) in w and field in w for w in warnings), (member, field, value, warnings)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_standbys_named_on_other_topics_change_nothing_but_the_warnings(
    scn: dict[str, Any], rnd: random.Random
) -> None:
    """A previous standby of a topic that holds no state is ignored, not half-used."""
    noisy = json.loads(json.dumps(scn))
    for member in noisy["members"].values():
        member.setdefault("previous_standby", {})["clicks"] = [0]
    assert plan(noisy)["members"] == plan(scn)["members"]
    check.task_owner(noisy, plan(noisy))


def test_a_members_warning_is_not_hidden_behind_other_members_warnings() -> None:
    """Warnings are capped at 20 per kind; a member's odd field still shows, or is named."""
    members: dict[str, dict[str, Any]] = {f"w{k:02d}": {"topics": [*JOIN, "ghost"]} for k in range(25)}
    members["w99"] = {"previous_standby": {"gone": [1]}}
    warnings = plan(_join(members))["warnings"]
    assert any("'w99'" in w and "previous_standby" in w and "gone" in w for w in warnings), warnings
    crowd = {f"w{k:02d}": {"previous_standby": {"clicks": [0]}} for k in range(30)}
    warnings = plan(_join(crowd))["warnings"]
    hidden = [w for w in warnings if w.startswith("... and 10 more")]
    assert hidden and all(f"'w{k:02d}'" in hidden[0] for k in range(20, 30)), warnings


def test_numbers_beyond_64_bits_are_planned_around_not_crashed_on() -> None:
    """The planner works in int64 arrays; Python ints from JSON are unbounded."""
    scn = _join({"w1": {"local_offsets": {"joins-changelog": {"1": 2**64, "2": 2**63 - 1}}}, "w2": {}})
    scn["standby_replicas"] = 2**63
    assignment = plan(scn)
    assert not any("internal planner error" in w for w in assignment["warnings"]), assignment["warnings"]
    check.check_standbys({**scn, "standby_replicas": 1}, assignment, check.task_owner(scn, assignment))
