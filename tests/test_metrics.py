"""Assignment metrics on small hand-made cases with known answers, and the optimum by brute force."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from assignor.comparisons.metrics import groups, measure, optimum_moves, previous_owners


def member(topics: list[str], **fields: Any) -> dict[str, Any]:
    return {"topics": topics, **fields}


def out(
    members: dict[str, dict[str, list[int]]], standby: dict[str, dict[str, list[int]]] | None = None
) -> dict[str, Any]:
    standby = standby or {}
    names = set(members) | set(standby)
    return {
        "epoch": 1,
        "unassigned": {},
        "warnings": [],
        "members": {m: {"active": members.get(m, {}), "standby": standby.get(m, {})} for m in names},
    }


def test_groups_lone_topics_after_copartition_groups() -> None:
    sc = {"topics": {"a": 4, "b": 4, "c": 2}, "copartition_groups": [["a", "b"]]}
    assert groups(sc) == [(("a", "b"), 4), (("c",), 2)]


def test_new_member_takes_half_two_moves() -> None:
    sc = {
        "topics": {"t": 4},
        "members": {"w1": member(["t"], epoch=3, previous_active={"t": [0, 1, 2, 3]}), "w2": member(["t"])},
    }
    m = measure(sc, out({"w1": {"t": [0, 1]}, "w2": {"t": [2, 3]}}))
    assert (m.tasks, m.moves, m.spread_group, m.spread_total, m.idle) == (4, 2, 0, 0, 0)
    assert optimum_moves(sc) == 2
    lazy = measure(sc, out({"w1": {"t": [0, 1, 2, 3]}}))
    assert (lazy.moves, lazy.spread_total, lazy.idle) == (0, 4, 1)


def test_warm_and_cold_moves() -> None:
    topics = ["in", "log"]
    sc = {
        "topics": {"in": 3, "log": 3},
        "copartition_groups": [topics],
        "changelog_topics": ["log"],
        "members": {
            "w1": member(topics, previous_active={"in": [0, 1, 2], "log": [0, 1, 2]}),
            "w2": member(topics, previous_standby={"log": [1]}),
            "w3": member(topics, local_offsets={"log": {"2": 10}}),
        },
    }
    warm = measure(
        sc,
        out({"w1": {t: [0] for t in topics}, "w2": {t: [1] for t in topics}, "w3": {t: [2] for t in topics}}),
    )
    assert (warm.moves, warm.warm, warm.cold, warm.copart_violations) == (2, 2, 0, 0)
    cold = measure(
        sc,
        out({"w1": {t: [0] for t in topics}, "w2": {t: [2] for t in topics}, "w3": {t: [1] for t in topics}}),
    )
    assert (cold.moves, cold.warm, cold.cold) == (2, 0, 2)


def test_copartition_violation_and_invalid() -> None:
    sc = {
        "topics": {"a": 2, "b": 2},
        "copartition_groups": [["a", "b"]],
        "members": {"w1": member(["a", "b"]), "w2": member(["a", "b"])},
    }
    m = measure(sc, out({"w1": {"a": [0, 1], "b": [1]}, "w2": {"b": [0]}}))
    assert (m.copart_violations, m.invalid) == (1, 0)
    missing = measure(sc, out({"w1": {"a": [0, 1], "b": [1]}}))
    assert (missing.invalid, missing.copart_violations) == (1, 1)


def test_fencing_highest_epoch_wins_tie_voids() -> None:
    sc = {
        "topics": {"t": 2},
        "members": {
            "w1": member(["t"], epoch=5, previous_active={"t": [0, 1]}),
            "w2": member(["t"], epoch=3, previous_active={"t": [0]}),
            "w3": member(["t"], epoch=5, previous_active={"t": [1]}),
        },
    }
    assert previous_owners(sc) == {(0, 0): "w1"}


def test_standby_placement_counts() -> None:
    topics = ["in", "log"]
    sc = {
        "topics": {"in": 2, "log": 2},
        "copartition_groups": [topics],
        "changelog_topics": ["log"],
        "standby_replicas": 1,
        "members": {
            "w1": member(topics, host="a"),
            "w2": member(topics, host="a"),
            "w3": member(topics, host="b"),
        },
    }
    act = {"w1": {"in": [0], "log": [0]}, "w2": {"in": [1], "log": [1]}}
    m = measure(sc, out(act, {"w2": {"log": [0]}, "w1": {"log": [1]}}))
    assert (m.standby_same_host, m.standby_missing, m.standby_on_active) == (2, 0, 0)
    m = measure(sc, out(act, {"w1": {"log": [0]}, "w3": {"log": [1]}}))
    assert (m.standby_same_host, m.standby_missing, m.standby_on_active) == (0, 1, 1)


def test_optimum_total_balance_binds() -> None:
    # Per group alone, w1 could keep both; total balance forces one move.
    sc = {
        "topics": {"a": 1, "b": 1},
        "members": {"w1": member(["a", "b"], previous_active={"a": [0], "b": [0]}), "w2": member(["a", "b"])},
    }
    assert optimum_moves(sc) == 1


def test_optimum_needs_equal_subscriptions() -> None:
    sc = {"topics": {"a": 1, "b": 1}, "members": {"w1": member(["a"]), "w2": member(["a", "b"])}}
    with pytest.raises(ValueError):
        optimum_moves(sc)


def brute_force_moves(sc: dict[str, Any]) -> int:
    """Fewest moves over every balanced assignment (tiny cases only)."""
    gs = groups(sc)
    members = sorted(sc["members"])
    tasks = [(g, p) for g, (_, n) in enumerate(gs) for p in range(n)]
    prev = previous_owners(sc)
    total, n_m = len(tasks), len(members)
    best = total
    for owners in itertools.product(members, repeat=len(tasks)):
        per_member = [owners.count(m) for m in members]
        if max(per_member) > -(-total // n_m) or min(per_member) < total // n_m:
            continue
        if not all(_group_balanced(owners, tasks, g, n, members) for g, (_, n) in enumerate(gs)):
            continue
        best = min(best, sum(1 for t, o in zip(tasks, owners, strict=True) if prev.get(t) != o))
    return best


def _group_balanced(
    owners: tuple[str, ...], tasks: list[tuple[int, int]], g: int, n: int, members: list[str]
) -> bool:
    counts = [sum(1 for t, o in zip(tasks, owners, strict=True) if t[0] == g and o == m) for m in members]
    return n // len(members) <= min(counts) and max(counts) <= -(-n // len(members))


@pytest.mark.parametrize("seed", range(40))
def test_optimum_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n_members = rng.randint(2, 3)
    sizes = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))][: 7 // n_members + 1]
    topics = {f"t{i}": n for i, n in enumerate(sizes)}
    names = [f"w{i}" for i in range(n_members)]
    held: dict[str, dict[str, list[int]]] = {m: {} for m in names}
    for t, n in topics.items():
        for p in range(n):
            owner = rng.choice([*names, None])
            if owner:
                held[owner].setdefault(t, []).append(p)
    sc = {
        "topics": topics,
        "members": {m: member(list(topics), epoch=1, previous_active=held[m]) for m in names},
    }
    assert optimum_moves(sc) == brute_force_moves(sc)
