"""Seed examples from KIP-315 and KIP-54, Faust's known failures, fencing and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from assignor import plan, plan_with_stats
from tests import planner_checks as check

ROOT = Path(__file__).resolve().parents[1]
JOIN = ["impressions", "clicks"]


def _join_scenario(previous: dict[str, list[int]], partitions: int = 10) -> dict[str, Any]:
    return {
        "topics": {t: partitions for t in JOIN},
        "copartition_groups": [list(JOIN)],
        "members": {
            m: {"topics": list(JOIN), "epoch": 1, "previous_active": {t: list(ps) for t in JOIN}}
            for m, ps in previous.items()
        },
    }


def _active(assignment: dict[str, Any], member: str, topic: str) -> list[int]:
    return assignment["members"].get(member, {}).get("active", {}).get(topic, [])


def test_kip315_member_leaves_only_its_partitions_move() -> None:
    before = {"A": [0, 1, 2], "B": [3, 4, 5], "C": [6, 7], "D": [8, 9]}
    scn = _join_scenario({m: ps for m, ps in before.items() if m != "D"})
    after = plan(scn)
    for member, partitions in before.items():
        if member != "D":
            for topic in JOIN:
                assert set(partitions) <= set(_active(after, member, topic))
    assert sorted(len(_active(after, m, "clicks")) for m in "ABC") == [3, 3, 4]
    assert set(_active(after, "C", "clicks")) & {8, 9}, "C was short: it takes one of D's"


KIP54_TOPICS = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}


def test_kip54_example1_removal_keeps_every_surviving_partition() -> None:
    round_robin = {
        "C0": {"t0": [0], "t1": [1], "t3": [0]},
        "C2": {"t1": [0], "t2": [1]},
    }  # C1 (t0p1, t2p0, t3p1) has left
    scn = {
        "topics": KIP54_TOPICS,
        "members": {
            m: {"topics": list(KIP54_TOPICS), "epoch": 1, "previous_active": prev}
            for m, prev in round_robin.items()
        },
    }
    after = plan(scn)
    assert after["members"]["C0"]["active"] == {"t0": [0], "t1": [1], "t2": [0], "t3": [0]}
    assert after["members"]["C2"]["active"] == {"t0": [1], "t1": [0], "t2": [1], "t3": [1]}


def _kip54_example2(members: list[str], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    subscriptions = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    return {
        "topics": {"t0": 1, "t1": 2, "t2": 3},
        "members": {
            m: {"topics": subscriptions[m], "epoch": 1, "previous_active": (previous or {}).get(m, {})}
            for m in members
        },
    }


def test_kip54_example2_unequal_subscriptions_balance() -> None:
    after = plan(_kip54_example2(["C0", "C1", "C2"]))
    assert after["members"]["C0"]["active"] == {"t0": [0]}
    assert after["members"]["C1"]["active"] == {"t1": [0, 1]}
    assert after["members"]["C2"]["active"] == {"t2": [0, 1, 2]}


def test_kip54_example3_removal_preserves_the_rest() -> None:
    previous = {"C1": {"t1": [0, 1]}, "C2": {"t2": [0, 1, 2]}}  # example 2's result, C0 gone
    after = plan(_kip54_example2(["C1", "C2"], previous))
    assert after["members"]["C1"]["active"] == {"t0": [0], "t1": [0, 1]}
    assert after["members"]["C2"]["active"] == {"t2": [0, 1, 2]}


def test_faust_gap_scale_out_with_standbys_gives_the_new_worker_its_share() -> None:
    topics = ["impressions", "clicks", "joins-changelog"]
    half = {"w1": list(range(6)), "w2": list(range(6, 12))}
    members: dict[str, Any] = {
        m: {
            "topics": topics,
            "epoch": 4,
            "previous_active": {t: ps for t in topics},
            "previous_standby": {"joins-changelog": half["w2" if m == "w1" else "w1"]},
        }
        for m, ps in half.items()
    }
    members["w3"] = {"topics": topics}
    scn = {
        "topics": {t: 12 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "standby_replicas": 1,
        "members": members,
    }
    result = plan_with_stats(scn)
    assert result.stats.actives == {"w1": 4, "w2": 4, "w3": 4}
    assert result.stats.kept == 8 and result.stats.moved_cold + result.stats.moved_warm == 4
    assert result.stats.standbys == {"w1": 4, "w2": 4, "w3": 4}


def test_faust_gap_lone_single_partition_topics_do_not_pile_up() -> None:
    topics = {f"t{i}": 1 for i in range(5)}
    scn = {"topics": topics, "members": {m: {"topics": list(topics)} for m in ["a", "b", "c"]}}
    result = plan_with_stats(scn)
    assert sorted(result.stats.actives.values()) == [1, 2, 2]


def test_restarted_member_gets_its_partitions_back_from_local_state() -> None:
    topics = ["impressions", "clicks", "joins-changelog"]
    scn = {
        "topics": {t: 6 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "members": {
            "w1": {"topics": topics, "epoch": 3, "previous_active": {t: [0, 1] for t in topics}},
            "w2": {"topics": topics, "epoch": 3, "previous_active": {t: [2, 3] for t in topics}},
            # w3 restarted: no history in memory, but its RocksDB files survived.
            "w3": {"topics": topics, "local_offsets": {"joins-changelog": {"4": 900, "5": 950}}},
        },
    }
    result = plan_with_stats(scn)
    assert _active(result.assignment, "w3", "clicks") == [4, 5]
    assert (result.stats.kept, result.stats.moved_warm, result.stats.moved_cold) == (4, 2, 0)


def test_warm_promotion_prefers_the_freshest_state() -> None:
    topics = ["impressions", "clicks", "joins-changelog"]
    scn = {
        "topics": {t: 2 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "members": {
            "a": {"topics": topics, "epoch": 2, "previous_active": {t: [0] for t in topics}},
            "stale": {"topics": topics, "local_offsets": {"joins-changelog": {"1": 10}}},
            "fresh": {"topics": topics, "local_offsets": {"joins-changelog": {"1": 500}}},
        },
    }
    after = plan(scn)
    assert _active(after, "fresh", "clicks") == [1]


def test_higher_epoch_claim_wins_and_a_tie_voids_both() -> None:
    scn = _join_scenario({"old": [0, 1], "new": [0]}, partitions=2)
    scn["members"]["old"]["epoch"] = 3  # a zombie from an older generation
    scn["members"]["new"]["epoch"] = 5
    after = plan(scn)
    assert _active(after, "new", "clicks") == [0] and _active(after, "old", "clicks") == [1]
    assert any("new wins" in w for w in after["warnings"])
    scn["members"]["old"]["epoch"] = 5
    tie = plan_with_stats(scn)
    assert tie.stats.kept == 1  # partition 1 only: nobody keeps the tied partition 0
    assert any("tie" in w for w in tie.assignment["warnings"])


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s["members"]["w1"]["topics"].append("nope"), "unknown topics"),
        (lambda s: s["members"]["w1"]["previous_active"].update({"clicks": [0, 99]}), "invalid partitions"),
        (lambda s: s["members"]["w1"].update({"epoch": -4}), "epoch -4"),
        (lambda s: s["topics"].update({"clicks": 5}), "mismatched partition counts"),
        (lambda s: s["members"]["w2"].update({"topics": ["clicks"]}), "part of co-partition group"),
        (lambda s: s.update({"copartition_groups": [["ghost"], JOIN]}), "no known topic"),
        (lambda s: s["members"].update({"w3": "\x00garbage"}), "unreadable"),
        (lambda s: s["members"]["w1"].update({"capacity": 0}), "capacity 0"),
        (lambda s: s.update({"standby_replicas": "two"}), "standby_replicas"),
    ],
)
def test_bad_input_gives_a_warning_and_a_valid_assignment(mutate: Any, expected: str) -> None:
    scn = _join_scenario({"w1": [0, 1], "w2": [2]}, partitions=4)
    mutate(scn)
    assignment = plan(scn)
    assert any(expected in w for w in assignment["warnings"]), assignment["warnings"]
    cleaned = json.loads(json.dumps(scn))
    cleaned["members"] = {m: d for m, d in cleaned["members"].items() if isinstance(d, dict)}
    for d in cleaned["members"].values():
        d["topics"] = [t for t in d["topics"] if t in cleaned["topics"]]
    counts = {cleaned["topics"][t] for t in JOIN}
    if len(counts) == 1 and all(isinstance(g, list) for g in cleaned.get("copartition_groups", [])):
        cleaned["copartition_groups"] = [JOIN]
        check.task_owner(cleaned, assignment)


def test_group_nobody_can_take_is_unassigned_with_a_reason() -> None:
    scn = {"topics": {"a": 2, "b": 1}, "members": {"w": {"topics": ["a"]}}}
    assignment = plan(scn)
    assert assignment["unassigned"] == {"b": [0]}
    assert any("unassigned" in w for w in assignment["warnings"])


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "assignor", "plan", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_cli_reads_a_file_and_stdin_identically() -> None:
    example = ROOT / "docs" / "examples" / "scenario.json"
    from_file = _cli(str(example))
    from_stdin = _cli("-", stdin=example.read_text())
    assert from_file.returncode == 0 and from_file.stdout == from_stdin.stdout
    assert json.loads(from_file.stdout) == plan(json.loads(example.read_text()))


def test_cli_summary_and_garbage() -> None:
    summary = _cli("--summary", str(ROOT / "docs" / "examples" / "scenario.json"))
    assert summary.returncode == 0
    assert "tasks retained 7, moved warm 1, moved cold 5" in summary.stdout
    garbage = _cli("-", stdin="{not json")
    assert garbage.returncode == 0
    assert "not valid JSON" in json.loads(garbage.stdout)["warnings"][0]


def test_an_internal_error_still_yields_a_valid_copartitioned_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import assignor.core.plan as planner

    def broken(problem: object) -> None:
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(planner, "place_actives", broken)
    scn = _join_scenario({"w1": [0, 1], "w2": [2, 3], "w3": []}, partitions=6)
    assignment = plan(scn)
    assert "solver exploded" in assignment["warnings"][0]
    owners = check.task_owner(scn, assignment)
    assert sorted(owners.values()).count("w3") == 2  # balanced per group, not sticky


def test_numbers_beyond_int64_are_warnings_not_failures() -> None:
    scn = _join_scenario({"w1": [0, 1], "w2": [2, 3]}, partitions=4)
    scn["members"]["w1"]["epoch"] = 2**80
    scn["members"]["w2"]["previous_active"]["clicks"] = [2, 3, 2**70]
    assignment = plan(scn)
    assert not any("internal planner error" in w for w in assignment["warnings"])
    assert any("invalid partitions" in w for w in assignment["warnings"])
    assert assignment["epoch"] == 2**80 + 1
    assert _active(assignment, "w1", "clicks") == [0, 1] and _active(assignment, "w2", "clicks") == [2, 3]


def test_a_members_standbys_spread_so_its_failure_promotes_warm_on_several_survivors() -> None:
    topics = ["impressions", "clicks", "joins-changelog"]
    hosts = {"w1": "a", "w2": "a", "w3": "b", "w4": "b"}
    scn: dict[str, Any] = {
        "topics": {t: 12 for t in topics},
        "copartition_groups": [topics],
        "changelog_topics": ["joins-changelog"],
        "standby_replicas": 1,
        "members": {m: {"topics": topics, "host": h} for m, h in hosts.items()},
    }
    before = plan(scn)
    survivors = {
        m: {
            "topics": topics,
            "host": hosts[m],
            "epoch": before["epoch"],
            "previous_active": before["members"][m]["active"],
            "previous_standby": before["members"][m]["standby"],
        }
        for m in hosts
        if m != "w3"
    }
    after = plan_with_stats({**scn, "members": survivors})
    # w3's three tasks: standbys only on host a (w1, w2), spread over both; w4 shares
    # w3's host, so at most two can be promoted warm under balance.
    assert (after.stats.kept, after.stats.moved_warm, after.stats.moved_cold) == (9, 2, 1)


def test_an_absurd_partition_count_is_ignored_not_allocated() -> None:
    scn = _join_scenario({"w1": [0], "w2": [1]}, partitions=2)
    scn["topics"]["audit"] = 2**31
    scn["members"]["w1"]["topics"].append("audit")
    assignment = plan(scn)
    assert any("'audit' has partition count" in w for w in assignment["warnings"])
    assert _active(assignment, "w1", "clicks") == [0]


def test_a_member_joining_many_lone_topics_takes_only_its_share() -> None:
    """The 1M benchmark's join shape, scaled down: every quota is 0 or 1 per topic."""
    members, topics, partitions = 60, 30, 60
    names = [f"t{i}" for i in range(topics)]
    scn: dict[str, Any] = {"topics": dict.fromkeys(names, partitions), "members": {}}
    for i in range(members):
        scn["members"][f"w{i:02d}"] = {
            "topics": names,
            "epoch": 3,
            "previous_active": {t: list(range(i, partitions, members)) for t in names},
        }
    scn["members"]["new"] = {"topics": names}
    result = plan_with_stats(scn)
    share = topics * partitions // (members + 1)  # 29.5 -> the newcomer needs 29
    assert result.stats.kept == topics * partitions - share
    assert sorted(set(result.stats.actives.values())) == [share, share + 1]
    check.task_owner(scn, result.assignment)


def test_the_garbage_collector_is_paused_only_while_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import assignor.core.plan as planner

    seen: list[bool] = []
    real = planner.place_actives

    def spy(problem: Any) -> Any:
        seen.append(gc.isenabled())
        return real(problem)

    monkeypatch.setattr(planner, "place_actives", spy)
    scn = _join_scenario({"w1": [0, 1], "w2": [2, 3]}, partitions=4)
    assert gc.isenabled()
    plan(scn)
    assert seen == [False] and gc.isenabled()
    gc.disable()  # a caller that disabled it keeps it disabled
    try:
        plan(scn)
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(planner, "place_actives", lambda _p: 1 / 0)
    assert "internal planner error" in plan(scn)["warnings"][0]
    assert gc.isenabled()  # restored after the fallback too


def test_what_planning_allocates_skips_the_young_generations_unless_the_process_froze_objects() -> None:
    """The collector was paused while planning: the million small lists of a large plan go to
    the oldest generation on the way out, so no young collection walks them; a process that
    froze objects of its own (gc.freeze) keeps them frozen, and the plan's lists stay young."""
    import gc

    scn = _join_scenario({"w1": [0, 1], "w2": [2, 3]}, partitions=4)

    def generation_of(obj: object) -> int | None:
        """0-2, or None when frozen (in no generation)."""
        return next((g for g in range(3) if any(o is obj for o in gc.get_objects(generation=g))), None)

    result = plan(scn)
    assert generation_of(result["members"]["w1"]["active"]["clicks"]) == 2
    frozen = ["the process's own", []]
    gc.freeze()
    try:
        assert generation_of(frozen) is None
        result = plan(scn)
        assert generation_of(frozen) is None, "the process's frozen objects stay frozen"
        assert generation_of(result["members"]["w1"]["active"]["clicks"]) in (0, 1)
    finally:
        gc.unfreeze()
    assert generation_of(frozen) == 2
