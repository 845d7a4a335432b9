"""Smoke test: every baseline returns a valid scenario-format assignment; Faust's paths run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from assignor.comparisons.baselines import faust_copartitioned, faust_full, range_assign, round_robin
from assignor.comparisons.metrics import measure
from benchmarks import bench_planner
from benchmarks.scenarios import EVENTS, parse_size, steady

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "scenario.json"
BASELINES: list[Callable[[Any], dict[str, Any]]] = [
    faust_full,
    faust_copartitioned,
    round_robin,
    range_assign,
]


def scenarios() -> list[dict[str, Any]]:
    base = steady(parse_size("3x12"), 1)
    return [json.loads(EXAMPLE.read_text()), *(event(base) for event in EVENTS.values())]


@pytest.mark.parametrize("strategy", BASELINES, ids=lambda f: f.__name__)
def test_baseline_returns_valid_assignment(strategy: Callable[[Any], dict[str, Any]]) -> None:
    for sc in scenarios():
        out = strategy(sc)
        assert set(out) == {"epoch", "members", "unassigned", "warnings"}
        assert out["unassigned"] == {}
        assert out["epoch"] == max(m.get("epoch", 0) for m in sc["members"].values()) + 1
        for m in out["members"].values():
            assert all(ps == sorted(set(ps)) for ps in m["active"].values())
        met = measure(sc, out)
        assert met.invalid == 0
        if strategy is not round_robin:  # round-robin splits groups unless P % M == 0
            assert met.copart_violations == 0


def test_faust_paths_place_standbys_off_the_active() -> None:
    sc = steady(parse_size("3x12"), 1)
    for strategy in (faust_full, faust_copartitioned):
        met = measure(sc, strategy(sc))
        assert (met.standby_missing, met.standby_on_active, met.moves) == (0, 0, 0)


def test_bench_smoke_runs_without_writing() -> None:
    args = ["--quick", "--sizes", "3x12", "--replicas", "1", "--repeats", "1", "--events", "leave-1,join-1"]
    assert bench_planner.main(args) == 0
