"""simulate: churn scenarios are what they claim, and a small sweep runs on Spark."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline import simulate
from pipeline.simulate import ChurnSpec, churn, steady_state
from tests.spark_fixtures import spark_session


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    return spark_session()


def everything_to_first(scenario: dict[str, Any]) -> dict[str, Any]:
    """A deliberately bad pluggable strategy: the first member takes every partition."""
    first = sorted(scenario["members"])[0]
    active = {t: list(range(n)) for t, n in scenario["topics"].items()}
    return {"epoch": 1, "members": {first: {"active": active, "standby": {}}},
            "unassigned": {}, "warnings": []}  # fmt: skip


def owners(scenario: dict[str, Any], topic: str = "impressions") -> Counter[int]:
    return Counter(
        p for d in scenario["members"].values() for p in d.get("previous_active", {}).get(topic, [])
    )


@pytest.mark.parametrize("scenario", range(40))
def test_steady_state_is_a_balanced_assignment_with_standbys_off_host(scenario: int) -> None:
    spec = ChurnSpec.draw(3, scenario)
    state = steady_state(spec, np.random.default_rng(scenario))
    assert owners(state) == Counter(range(spec.partitions))  # each task exactly once
    counts = [len(d["previous_active"].get("impressions", [])) for d in state["members"].values()]
    assert max(counts) - min(counts) <= 1
    members = state["members"]
    for m, d in members.items():
        for p in d["previous_standby"].get("ad-joins-changelog", []):
            owner = next(
                o for o, od in members.items() if p in od["previous_active"].get("ad-joins-changelog", [])
            )
            assert members[owner]["host"] != d["host"] and owner != m


@pytest.mark.parametrize("scenario", range(40))
def test_churn_applies_its_event(scenario: int) -> None:
    spec = ChurnSpec.draw(3, scenario)
    before = steady_state(spec, np.random.default_rng([3, scenario, 1]))
    after = churn(spec, np.random.default_rng([3, scenario, 1]))
    grown = {"join": spec.changed, "leave": -spec.changed, "restart": 0, "replace": 0}
    assert len(after["members"]) == spec.members + grown[spec.event]
    fresh = [m for m, d in after["members"].items() if d["epoch"] == 0]
    assert len(fresh) == (0 if spec.event == "leave" else spec.changed)
    if spec.event == "restart":
        assert all(not after["members"][m]["previous_active"] for m in fresh)
        assert set(after["members"]) == set(before["members"])


@pytest.mark.spark
def test_small_sweep_on_spark(spark: SparkSession, tmp_path: Path) -> None:
    bad = "tests.test_pipeline_simulate:everything_to_first"
    names = ["tandem", "round-robin", bad]
    available = simulate.available_strategies()
    assert "tandem" in available
    args = ["--out", str(tmp_path), "--scenarios", "24", "--slices", "4", "--seed", "5",
            "--strategies", ",".join(names)]  # fmt: skip
    assert simulate.main(args) == 0
    rows = pq.read_table(str(tmp_path / "results")).to_pylist()
    assert len(rows) == 24 * 3
    assert {r["scenario"] for r in rows} == set(range(24))
    by = {name: [r for r in rows if r["strategy"] == name] for name in names}
    assert all(r["error"] is None for r in rows)
    # The optimum is the fewest moves among balanced assignments: a balanced answer never beats it.
    assert all(r["excess"] >= 0 for r in by["tandem"] if r["spread_total"] <= 1)
    crowded = [r for r in by[bad] if r["event"] != "leave" or r["members"] - r["changed"] > 1]
    assert crowded and all(r["spread_total"] > 1 for r in crowded)
    assert sum(r["copart_violations"] for r in by["round-robin"]) > 0
    png = (tmp_path / "simulate.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    summary = (tmp_path / "summary.md").read_text()
    assert all(name in summary for name in names)
