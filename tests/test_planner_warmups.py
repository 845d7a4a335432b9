"""The contract's warm-up rules W1-W5 (docs/scenario-format.md, "Warm-up replicas"), checked
with hypothesis against independent checks (tests/planner_checks.py), plus examples."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignor import plan
from tests import planner_checks as check
from tests.planner_strategies import warmup_scenarios
from tests.test_planner_properties import _shuffled

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _budget(scn: dict[str, Any]) -> int:
    return int(scn.get("max_warmup_replicas", 2))


def _previous_owner(scn: dict[str, Any], task: check.Task) -> str | None:
    """The fenced previous owner, if it may still own the task."""
    owner = check.fenced_claims(scn).get(task)
    group = check.groups_of(scn)[task[0]]
    return owner if owner in check.eligible(scn, group) else None


def _pending_by_task(scn: dict[str, Any], assignment: dict[str, Any]) -> dict[check.Task, dict[str, Any]]:
    moves = assignment["pending_moves"]
    by_task = {check.task_of(scn, m["topics"], m["partition"]): m for m in moves}
    assert len(by_task) == len(moves), "a task is pending at most once"
    return by_task


# -- the output's shape ---------------------------------------------------------------------


@FAST
@given(warmup_scenarios())
def test_output_keys_and_pending_moves_sorted(scn: dict[str, Any]) -> None:
    result = plan(scn)
    assert set(result) == {"epoch", "members", "unassigned", "warnings", "pending_moves"}
    for entry in result["members"].values():
        assert set(entry) == {"active", "standby", "warmup"}
        for partitions in entry["warmup"].values():
            assert partitions == sorted(set(partitions))
    keys = [(m["topics"][0], m["partition"]) for m in result["pending_moves"]]
    assert keys == sorted(keys)
    for move in result["pending_moves"]:
        assert move["topics"] == sorted(move["topics"]) and move["from"] != move["to"]
        assert set(move) == {"topics", "partition", "from", "to", "warmup"}


# -- W1: the target -------------------------------------------------------------------------


@FAST
@given(warmup_scenarios(uniform=True))
def test_w1_target_is_valid_copartitioned_and_balanced(scn: dict[str, Any]) -> None:
    target = check.target_owners(scn, plan(scn))
    assert check.is_balanced(scn, target)


@FAST
@given(warmup_scenarios())
def test_w1_target_follows_kip54_with_unequal_subscriptions(scn: dict[str, Any]) -> None:
    for move in scn["members"].values():
        move["capacity"] = 1
    target = check.target_owners(scn, plan(scn))
    _, total = check.counts(target)
    groups = check.groups_of(scn)
    for (g, _), holder in target.items():
        for other in check.eligible(scn, groups[g]):
            assert total.get(other, 0) >= total[holder] - 1, (holder, other, total)


@settings(max_examples=120, deadline=None)
@given(warmup_scenarios(max_members=3, max_partitions=4, uniform=True, lone_topics=False))
def test_w1_target_sticky_and_warm_as_the_exhaustive_oracle(scn: dict[str, Any]) -> None:
    """Kept, then moved onto caught-up members, then onto holders of state (the members of
    finite lag: a standby without offsets is empty), as many as any balanced assignment."""
    target = check.target_owners(scn, plan(scn))
    held = check.warm_holders(scn)
    assert check.kept_caught_warm(scn, target, held) == check.oracle_best_with_lags(scn)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(warmup_scenarios(uniform=True))
def test_w1_no_task_on_a_lagging_holder_could_go_to_a_caught_up_member(scn: dict[str, Any]) -> None:
    """Issue 31: one more task on a member that holds state but is not caught up never outweighs
    one on a caught-up member. No task the target puts on such a holder could go to an eligible
    caught-up member instead (alone, or in exchange for one of that member's tasks) in a
    balanced target that keeps as many tasks and moves more onto caught-up members."""
    target = check.target_owners(scn, plan(scn))
    assert check.better_caught_up_exchange(scn, target) is None


# -- W2: no cold move while a warm owner exists -----------------------------------------------


@FAST
@given(warmup_scenarios())
def test_w2_a_move_to_a_member_not_caught_up_is_held_on_a_caught_up_one(scn: dict[str, Any]) -> None:
    result = plan(scn)
    output = check.task_owner(scn, result)
    target = check.target_owners(scn, result)
    pending = _pending_by_task(scn, result)
    groups = check.groups_of(scn)
    for task, to in target.items():
        previous = _previous_owner(scn, task)
        caught = [m for m in check.eligible(scn, groups[task[0]]) if check.caught_up(scn, task, m)]
        held = (
            check.is_stateful(scn, task) and to != previous and not check.caught_up(scn, task, to) and caught
        )
        if not held:
            assert task not in pending and output[task] == to, (task, to, previous, caught)
            continue
        assert task in pending, f"task {task} moves to {to}, not caught up, while {caught} are"
        holder = output[task]
        if previous is not None:
            assert holder == previous
        else:
            assert holder in caught
            assert check.lag(scn, task, holder) == min(check.lag(scn, task, m) for m in caught)


# -- W3: the budget ---------------------------------------------------------------------------


@FAST
@given(warmup_scenarios())
def test_w3_the_budget_goes_to_the_least_behind_targets_first(scn: dict[str, Any]) -> None:
    result = plan(scn)
    moves = result["pending_moves"]
    warm = [m for m in moves if m["warmup"]]
    assert len(warm) == min(_budget(scn), len(moves))
    order = [check.task_of(scn, m["topics"], m["partition"]) for m in moves]

    def rank(i: int) -> tuple[float, int]:
        return check.lag(scn, order[i], moves[i]["to"]), i

    by_rank = sorted(range(len(moves)), key=rank)
    assert {i for i in by_rank[: len(warm)]} == {i for i, m in enumerate(moves) if m["warmup"]}
    expected = {order[i]: {m["to"]} for i, m in enumerate(moves) if m["warmup"]}
    assert check.warmups_of(scn, result) == expected


# -- W4: placement ----------------------------------------------------------------------------


@FAST
@given(warmup_scenarios())
def test_w4_warm_ups_are_off_the_active_and_not_standbys(scn: dict[str, Any]) -> None:
    result = plan(scn)
    owners = check.task_owner(scn, result)
    warmups = check.warmups_of(scn, result)
    replicas = scn["standby_replicas"]
    groups = check.groups_of(scn)
    for task, owner in owners.items():
        if not check.is_stateful(scn, task):
            continue
        warm = warmups.get(task, set())
        standbys = check.standbys_of(scn, result, task)
        assert owner not in warm and not warm & standbys and owner not in standbys
        candidates = check.eligible(scn, groups[task[0]])
        k = min(replicas, len(candidates) - 1 - len(warm))
        assert len(standbys) == max(k, 0), (task, standbys, warm, k)
        host = check._host(scn["members"], owner)
        others = [m for m in candidates if m != owner and m not in warm]
        off_host = [m for m in others if check._host(scn["members"], m) != host]
        placed_off_host = sum(1 for m in standbys if check._host(scn["members"], m) != host)
        assert placed_off_host == min(max(k, 0), len(off_host))


# -- W5: convergence --------------------------------------------------------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(warmup_scenarios())
def test_w5_feeding_back_completes_warm_ups_and_converges(scn: dict[str, Any]) -> None:
    result = plan(scn)
    budget = _budget(scn)
    first = len(result["pending_moves"])
    if budget == 0:  # nothing moves: the same output (unless a hold made a new previous owner)
        pending = _pending_by_task(scn, result)
        if not any(move["from"] != _previous_owner(scn, task) for task, move in pending.items()):
            again = plan(check.feed_back_warmups(scn, result))
            assert again["members"] == result["members"]
            assert again["pending_moves"] == result["pending_moves"]
        return
    limit = math.ceil(first / budget) + 1
    rounds = 0
    while result["pending_moves"]:
        assert rounds < limit, f"still {len(result['pending_moves'])} pending after {rounds} rounds"
        scn, result = _next_round(scn, result)
        rounds += 1
    fed = plan(check.feed_back_warmups(scn, result))
    assert fed["members"] == result["members"] and fed["pending_moves"] == []


def _next_round(scn: dict[str, Any], result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One W5 round, checked: warm-up moves complete, no move is added, the target stays.

    When a task was held on a member other than its previous owner, that member becomes its
    previous owner and the target may change (the contract's exception): no tie-break can keep
    it (test_w5_two_first_rounds_can_feed_back_the_same_input), and exact stickiness may even
    keep a warm-up's task where it was held (test_w5_a_hold_on_a_non_owner_can_outweigh_a_warm_up).
    Then what holds is that the pending count does not grow; the caller checks the bound."""
    pending = _pending_by_task(scn, result)
    target = check.target_owners(scn, result)
    fed = check.feed_back_warmups(scn, result)
    again = plan(fed)
    now = _pending_by_task(fed, again)
    assert len(now) <= len(pending), "a pending move was added"
    held_elsewhere = any(move["from"] != _previous_owner(scn, task) for task, move in pending.items())
    if held_elsewhere:
        return fed, again
    owners = check.task_owner(fed, again)
    warmed = [task for task, move in pending.items() if move["warmup"]]
    for task in warmed:
        assert owners[task] == pending[task]["to"], f"warm-up move {pending[task]} not completed"
    assert set(now) <= set(pending), "a pending move was added"
    assert len(now) <= len(pending) - len(warmed)
    assert check.target_owners(fed, again) == target
    return fed, again


def test_w5_a_hold_on_a_non_owner_can_outweigh_a_warm_up() -> None:
    """w1 owned join task 0 and holds the lone ledger task's state; w2 holds the join's state;
    w0 (join only) is empty. Balance sends join 1 to w0 (held on w2) and the ledger task to w2
    (held on w1), both warming up. Fed back, w2 owns join 1 and w1 the ledger task: keeping
    both (the exact stickiness of W1) beats completing the warm-ups, so w0 takes join 0 next."""
    join = ["clicks", "impressions", "joins-changelog"]
    everything = [*join, "ledger-changelog"]
    scn: dict[str, Any] = {
        "topics": {"clicks": 2, "impressions": 2, "joins-changelog": 2, "ledger-changelog": 1},
        "copartition_groups": [join],
        "changelog_topics": ["joins-changelog", "ledger-changelog"],
        "members": {
            "w0": {"topics": join},
            "w1": {
                "topics": everything,
                "previous_active": {"clicks": [0]},
                "local_offsets": {"ledger-changelog": {"0": 0}},
            },  # fmt: skip
            "w2": {"topics": everything, "local_offsets": {"joins-changelog": {"0": 0, "1": 0}}},
        },
        "acceptable_recovery_lag": 0,
    }

    def moves(result: dict[str, Any]) -> list[tuple[str, int, str, str, bool]]:
        pending = result["pending_moves"]
        return [(m["topics"][0], m["partition"], m["from"], m["to"], m["warmup"]) for m in pending]

    result = plan(scn)
    assert moves(result) == [("clicks", 1, "w2", "w0", True), ("ledger-changelog", 0, "w1", "w2", True)]
    scn, result = _next_round(scn, result)
    assert moves(result) == [("clicks", 0, "w1", "w0", True)]
    kept = check.kept_and_warm_with_lags(scn, check.target_owners(scn, result), check.warm_holders(scn))
    assert kept[0] == 2, "the target keeps join 1 on w2 and the ledger task on w1"
    scn, result = _next_round(scn, result)
    assert result["pending_moves"] == [] and result["members"]["w0"]["active"]["clicks"] == [0]


def _four_tasks(owned: int, w1: dict[str, int], w2: dict[str, int]) -> dict[str, Any]:
    """w0 owns one of four tasks and has all their state; w1 and w2 report `w1`/`w2`; w3 is empty."""
    topics = ["clicks", "impressions", "joins-changelog"]
    full = {"joins-changelog": {str(p): 1000 for p in range(4)}}
    return {
        "topics": {t: 4 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "members": {
            "w0": {
                "topics": topics,
                "epoch": 1,
                "previous_active": {"impressions": [owned]},
                "local_offsets": full,
            },
            "w1": {"topics": topics, "local_offsets": {"joins-changelog": w1}},
            "w2": {"topics": topics, "local_offsets": {"joins-changelog": w2}},
            "w3": {"topics": topics},
        },
        "acceptable_recovery_lag": 0,
    }


def test_w5_two_first_rounds_can_feed_back_the_same_input() -> None:
    """Why a hold on a non-owner may change the target: w0 owning task 0 (then 3 waits for w3)
    and w0 owning task 3 with w1, w2 behind on tasks 1, 2 (then 0 waits for w3) feed back the
    same second round, which cannot keep both targets."""
    first, other = _four_tasks(0, {}, {}), _four_tasks(3, {"1": 500}, {"2": 500})
    moves = [plan(first)["pending_moves"], plan(other)["pending_moves"]]
    assert [[(m["partition"], m["to"], m["warmup"]) for m in ms] for ms in moves] == [
        [(1, "w1", True), (2, "w2", True), (3, "w3", False)],
        [(0, "w3", False), (1, "w1", True), (2, "w2", True)],
    ]
    fed = check.feed_back_warmups(first, plan(first))
    assert fed == check.feed_back_warmups(other, plan(other))
    again = plan(fed)
    assert set(_pending_by_task(fed, again)) <= {(0, 0), (0, 3)} and len(again["pending_moves"]) == 1
    for partition, member in ((1, "w1"), (2, "w2")):
        assert partition in again["members"][member]["active"]["joins-changelog"]


def test_w5_with_no_budget_a_plain_standby_does_not_change_the_held_move() -> None:
    """Found by hypothesis (test_w5_feeding_back_completes_warm_ups_and_converges). w1 owned
    join tasks 0-4; w0 is 1000 behind on 0, 1, 4 and w3 on 0, 1; both are at the end of 2, 3.
    w1 keeps two of 0, 1, 4 and one is held for w0 (budget 0: no warm-up). That round gave w0
    a plain standby of another of the three, 1000 behind as well: fed back, the move must not
    switch to it ("with 0: feeding back changes nothing"). Only a caught-up previous standby
    (a warm-up that caught up) is preferred among equally fresh holders."""
    join = ["clicks", "impressions", "joins-changelog"]
    everything = [*join, "audit", "ledger-changelog"]
    scn: dict[str, Any] = {
        "topics": {"clicks": 6, "impressions": 6, "joins-changelog": 6, "audit": 1, "ledger-changelog": 1},
        "copartition_groups": [join],
        "changelog_topics": ["joins-changelog", "ledger-changelog"],
        "standby_replicas": 1,
        "members": {
            "w0": {"topics": everything, "local_offsets": {"joins-changelog": {str(p): 0 for p in range(5)}}},
            "w1": {"topics": everything, "previous_active": {"joins-changelog": [0, 1, 2, 3, 4]}},
            "w2": {"topics": everything},
            "w3": {"topics": everything, "local_offsets": {"joins-changelog": {str(p): 0 for p in range(4)}}},
        },
        "acceptable_recovery_lag": 0,
        "max_warmup_replicas": 0,
        "changelog_end_offsets": {
            "joins-changelog": {"0": 1000, "1": 1000, "4": 1000},
            "ledger-changelog": {},
        },
    }
    result = plan(scn)
    [move] = result["pending_moves"]
    assert (move["from"], move["to"], move["warmup"]) == ("w1", "w0", False)
    assert move["partition"] in (0, 1, 4)
    for _ in range(3):  # nothing completes without a budget: every round is the first
        scn = check.feed_back_warmups(scn, result)
        again = plan(scn)
        assert again["members"] == result["members"]
        assert again["pending_moves"] == result["pending_moves"]


# -- determinism, bad input -------------------------------------------------------------------


@FAST
@given(warmup_scenarios(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_json_order(scn: dict[str, Any], rnd: random.Random) -> None:
    assert plan(_shuffled(scn, rnd)) == plan(scn)


BAD_WARMUP_INPUT = [
    ({"acceptable_recovery_lag": -1}, "acceptable_recovery_lag -1", 0, 2),
    ({"acceptable_recovery_lag": 1.5}, "acceptable_recovery_lag 1.5", 0, 2),
    ({"acceptable_recovery_lag": None}, "acceptable_recovery_lag None", 0, 2),
    ({"acceptable_recovery_lag": 50, "max_warmup_replicas": -3}, "max_warmup_replicas -3", 50, 2),
    ({"acceptable_recovery_lag": 50, "max_warmup_replicas": "1"}, "max_warmup_replicas '1'", 50, 2),
    ({"acceptable_recovery_lag": 50, "max_warmup_replicas": True}, "max_warmup_replicas True", 50, 2),
]


def _restart_scenario(extra: dict[str, Any]) -> dict[str, Any]:
    """w0 owned every task; w1 and w2 join, w1 with state 30 records behind on partition 0."""
    topics = ["a", "a-changelog"]
    offsets = {str(p): 1000 for p in range(6)}
    return {
        "topics": {"a": 6, "a-changelog": 6},
        "copartition_groups": [topics],
        "changelog_topics": ["a-changelog"],
        "members": {
            "w0": {
                "topics": topics,
                "epoch": 1,
                "previous_active": {"a": list(range(6))},
                "local_offsets": {"a-changelog": offsets},
            },  # fmt: skip
            "w1": {"topics": topics, "local_offsets": {"a-changelog": {"0": 970}}},
            "w2": {"topics": topics},
        },
        **extra,
    }


def test_bad_warm_up_values_are_warnings_and_defaults() -> None:
    for extra, shown, lag, budget in BAD_WARMUP_INPUT:
        result = plan(_restart_scenario(extra))
        assert any(shown in w for w in result["warnings"]), (extra, result["warnings"])
        warm = [m for m in result["pending_moves"] if m["warmup"]]
        assert len(warm) == min(budget, len(result["pending_moves"])), extra
        # w1 is 30 behind on partition 0: caught up only if the lag used allows 30.
        assert any(m["partition"] == 0 for m in result["pending_moves"]) == (lag < 30), (extra, result)


def test_malformed_end_offsets_fall_back_to_the_highest_reported() -> None:
    for ends in ("x", {"a": {"0": 5}}, {"a-changelog": "x"}, {"a-changelog": {"0": -5, "x": 1, "9": 1}}):
        result = plan(_restart_scenario({"acceptable_recovery_lag": 50, "changelog_end_offsets": ends}))
        assert any("changelog_end_offsets" in w for w in result["warnings"]), ends
        assert not any(m["partition"] == 0 for m in result["pending_moves"]), (ends, result)
    ends = {"a-changelog": {"0": 1100}}
    given = plan(_restart_scenario({"acceptable_recovery_lag": 50, "changelog_end_offsets": ends}))
    assert given["warnings"] == [] and any(m["partition"] == 0 for m in given["pending_moves"])


# -- examples -----------------------------------------------------------------------------------


def _scale_out(members: int, partitions: int, budget: int) -> dict[str, Any]:
    """`members` workers own every task with one standby each, all caught up; one more joins."""
    topics = ["clicks", "impressions", "joins-changelog"]
    scenario: dict[str, Any] = {"topics": {t: partitions for t in topics}, "copartition_groups": [topics],
                                "changelog_topics": ["joins-changelog"], "standby_replicas": 1}  # fmt: skip
    first = plan({**scenario, "members": {f"w{i}": {"topics": topics} for i in range(members)}})
    scenario["members"] = {}
    for name, entry in first["members"].items():
        held = entry["active"].get("joins-changelog", []) + entry["standby"].get("joins-changelog", [])
        scenario["members"][name] = {
            "topics": topics,
            "epoch": first["epoch"],
            "previous_active": entry["active"],
            "previous_standby": entry["standby"],
            "local_offsets": {"joins-changelog": {str(p): 50_000 for p in held}},
        }
    scenario["members"]["new"] = {"topics": topics}
    return scenario | {"acceptable_recovery_lag": 100, "max_warmup_replicas": budget}


def test_scale_out_moves_nothing_cold_and_converges_in_the_promised_rounds() -> None:
    scn = _scale_out(members=3, partitions=12, budget=2)
    result = plan(scn)
    assert result["members"]["new"]["active"] == {}, "nothing moves to the new member cold"
    moves = result["pending_moves"]
    assert len(moves) == 3 and sum(m["warmup"] for m in moves) == 2
    assert all(m["to"] == "new" for m in moves)
    rounds = 0
    while result["pending_moves"]:
        scn, result = _next_round(scn, result)
        rounds += 1
    assert rounds <= math.ceil(3 / 2) + 1
    assert len(result["members"]["new"]["active"]["joins-changelog"]) == 3


def test_with_warm_ups_off_nothing_in_the_output_changes() -> None:
    scn = _scale_out(members=3, partitions=12, budget=2)
    for key in ("acceptable_recovery_lag", "max_warmup_replicas"):
        del scn[key]
    result = plan(scn)
    assert set(result) == {"epoch", "members", "unassigned", "warnings"}
    assert all(set(entry) == {"active", "standby"} for entry in result["members"].values())
    assert len(result["members"]["new"]["active"]["joins-changelog"]) == 3  # moved cold, at once


def test_cli_summary_shows_warm_ups_and_pending_moves() -> None:
    scn = _scale_out(members=3, partitions=8, budget=1)
    out = subprocess.run(
        [sys.executable, "-m", "assignor", "plan", "-", "--summary"],
        input=json.dumps(scn), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "warm-ups" in out.splitlines()[0]
    assert "pending moves 2 (warming up 1, waiting 1), balance spread once done 0" in out
    assert "moves to new once caught up (warm-up replica)" in out
    assert "moves to new once caught up (waits for a warm-up slot)" in out


def test_among_caught_up_holders_the_freshest_takes_a_task_then_a_previous_standby() -> None:
    """W1's reading of property 5: caught-up first, then the freshest (a standby only breaks a tie)."""
    topics = ["a", "a-changelog"]

    def owner_left(other: int) -> dict[str, Any]:
        """The owner left; ws was its standby, 50 behind; wa (lower id) reports `other`."""
        return {
            "topics": {"a": 1, "a-changelog": 1},
            "copartition_groups": [topics],
            "changelog_topics": ["a-changelog"],
            "members": {
                "wa": {"topics": topics, "local_offsets": {"a-changelog": {"0": other}}},
                "ws": {
                    "topics": topics,
                    "previous_standby": {"a-changelog": [0]},
                    "local_offsets": {"a-changelog": {"0": 950}},
                },  # fmt: skip
            },
            "acceptable_recovery_lag": 100,
            "changelog_end_offsets": {"a-changelog": {"0": 1000}},
        }

    fresher = plan(owner_left(1000))
    assert fresher["members"]["wa"]["active"] == {"a": [0], "a-changelog": [0]}
    assert fresher["pending_moves"] == []
    tied = plan(owner_left(950))
    assert tied["members"]["ws"]["active"] == {"a": [0], "a-changelog": [0]}


def test_a_caught_up_warm_up_takes_its_task_not_another_it_is_as_fresh_on() -> None:
    """w1 is at the end of task 0 and warms up task 1 (held on w0, no previous owner): fed
    back, w0 owns both and w1 is as fresh on both; the move with the warm-up completes."""
    topics = ["clicks", "impressions", "joins-changelog"]
    scn: dict[str, Any] = {
        "topics": {t: 2 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "members": {
            "w0": {
                "topics": topics,
                "previous_active": {"joins-changelog": [0]},
                "local_offsets": {"joins-changelog": {"0": 0, "1": 0}},
            },  # fmt: skip
            "w1": {"topics": topics, "local_offsets": {"joins-changelog": {"0": 0}}},
        },
        "acceptable_recovery_lag": 0,
    }
    result = plan(scn)
    assert [(m["partition"], m["to"], m["warmup"]) for m in result["pending_moves"]] == [(1, "w1", True)]
    scn, result = _next_round(scn, result)
    assert result["pending_moves"] == [] and result["members"]["w1"]["active"]["joins-changelog"] == [1]


def test_w1_a_caught_up_member_outweighs_one_more_task_on_a_lagging_holder() -> None:
    """Issue 31 in two tasks: wa is at the end of partition 0 and 1000 behind on 1; wb is 7
    behind on 0 and has nothing of 1. Putting 0 on wb and 1 on wa places both on holders of
    their state, but neither caught up; W1 wants 0 on the caught-up wa (and 1, which nobody is
    caught up on, moves cold to wb): one task moves now instead of none."""
    scn: dict[str, Any] = {
        "topics": {"ledger-changelog": 2},
        "changelog_topics": ["ledger-changelog"],
        "members": {
            "wa": {"topics": ["ledger-changelog"], "local_offsets": {"ledger-changelog": {"0": 400, "1": 0}}},
            "wb": {"topics": ["ledger-changelog"], "local_offsets": {"ledger-changelog": {"0": 393}}},
        },
        "acceptable_recovery_lag": 0,
        "changelog_end_offsets": {"ledger-changelog": {"0": 400, "1": 1000}},
    }
    result = plan(scn)
    assert result["pending_moves"] == []
    assert result["members"]["wa"]["active"] == {"ledger-changelog": [0]}
    assert result["members"]["wb"]["active"] == {"ledger-changelog": [1]}


@FAST
@given(warmup_scenarios())
def test_w1_tier_units_count_the_moves_of_a_placement_that_keeps_the_most(scn: dict[str, Any]) -> None:
    """The tiers' cost units are sized by how many open tasks move when the most are kept,
    found by a flow over (group, member) counts: it must be what the task-level flow moves (a
    smaller count would let a lower tier outweigh a keep; a larger one wastes cost range)."""
    from assignor.core import actives

    checked: list[tuple[int, int]] = []
    real = actives._solve_flow

    def spy(problem: Any, residual: Any, flow_tasks: Any, pooled: Any, group_of: Any, placed: Any) -> None:
        bound = actives._moves_bound(problem, residual, flow_tasks, pooled, group_of)
        real(problem, residual, flow_tasks, pooled, group_of, placed)
        moved = int((placed[flow_tasks] != problem.owner[flow_tasks]).sum())
        checked.append((bound, max(moved, 1)))

    actives._solve_flow = spy  # type: ignore[assignment]
    try:
        plan(scn)
    finally:
        actives._solve_flow = real  # type: ignore[assignment]
    assert all(bound == moved for bound, moved in checked), checked
