"""Idempotence through churn (property 9 and property 6's "standbys stay where they were").

A plan fed back as the previous assignment must come back unchanged after any
history: members joining, leaving and restarting with local state, on shared
hosts and racks, with several stateful groups and R = 1 or 2. Standby
placement used to stall its balance repair and leave a member above its share,
so feeding the plan back moved standbys (issue 14).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings

from assignor import plan
from tests import planner_checks as check
from tests.planner_strategies import apply_churn, churn_histories

ALL = ["a-in", "a-side", "a-changelog", "b-in", "b-changelog", "c-changelog"]
# Found by hypothesis on the old planner, shrunk: R = 2, two hosts, one member joins.
SMALLEST_FAILURE = (
    {
        "topics": {"a-in": 1, "a-side": 1, "a-changelog": 1, "b-in": 1, "b-changelog": 1, "c-changelog": 6},
        "copartition_groups": [ALL[:3], ALL[3:5]],
        "changelog_topics": ["a-changelog", "b-changelog", "c-changelog"],
        "standby_replicas": 2,
        "members": {
            f"w0{k}": {"topics": ALL, "host": host, "capacity": 1}
            for k, host in enumerate(["h1", "h1", "h0", "h0", "h1"])
        },
    },
    [("join", (0, {"topics": ALL, "host": "h0", "capacity": 1}))],
)


@example(SMALLEST_FAILURE)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(churn_histories())
def test_every_plan_through_churn_is_a_fixed_point(history: tuple[dict[str, Any], list[Any]]) -> None:
    scenario, events = history
    assignment = plan(scenario)
    for event in [None, *events]:
        if event is not None:
            scenario = apply_churn(check.feed_back(scenario, assignment), event)
            assignment = plan(scenario)
        check.task_owner(scenario, assignment)
        check.check_standbys(scenario, assignment, check.task_owner(scenario, assignment))
        again = plan(check.feed_back(scenario, assignment))
        assert again["members"] == assignment["members"], _moved(assignment, again)
        assert again["unassigned"] == assignment["unassigned"]


def _moved(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Which members' actives or standbys changed when the plan was fed back."""
    lines = []
    for member, entry in first["members"].items():
        other = second["members"].get(member, {})
        for kind in ("active", "standby"):
            if entry.get(kind) != other.get(kind):
                lines.append(f"{member} {kind}: {entry.get(kind)} -> {other.get(kind)}")
    return "; ".join(lines)
