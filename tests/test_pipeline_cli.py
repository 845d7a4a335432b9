"""Every pipeline job is a command with --help (no Spark needed to ask)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.__main__ import JOBS
from pipeline.__main__ import main as pipeline_main
from pipeline.join import build_parser as join_parser
from pipeline.join import join_of


@pytest.mark.parametrize("job", sorted(JOBS))
def test_each_job_has_help(job: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        pipeline_main([job, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m pipeline {job}" in out
    if job not in ("produce",):
        assert "--master" in out and "local[*]" in out


def test_unknown_job_lists_the_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert pipeline_main(["nope"]) == 2
    out = capsys.readouterr().out
    assert all(job in out for job in JOBS)


def test_module_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.reconcile", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "--strict-duplicates" in done.stdout and "--app" in done.stdout


def test_the_jobs_find_the_declared_joins_by_name() -> None:
    """`--app` imports the module (no worker); `--join` picks one of its joins, named when missing."""
    found = join_of(join_parser().parse_args(["--app", "tests.apps.two_joins", "--join", "wide"]))
    assert found.join == "wide" and found.spec().input_topics == ("b1", "b2")
    with pytest.raises(SystemExit, match=r"declares 2 joins: name one with --join \(narrow, wide\)"):
        join_of(join_parser().parse_args(["--app", "tests.apps.two_joins"]))
    with pytest.raises(SystemExit, match="no join 'nope'; its joins: narrow, wide"):
        join_of(join_parser().parse_args(["--app", "tests.apps.two_joins", "--join", "nope"]))
    assert join_of(join_parser().parse_args(["--app", "examples.orders"])).join == "paid"


def test_each_join_kind_has_its_twin_and_another_kind_is_refused_by_name() -> None:
    """`join` and `reconcile` find the twin by `spec.kind.name`; a kind without one stops them
    with a message naming the kinds that have one."""
    from pipeline.twins import UnknownKind, kind_module

    trades = join_of(join_parser().parse_args(["--app", "examples.trades"]))
    assert trades.join == "enrich" and trades.spec().kind.name == "temporal" and trades.spec().audit
    assert kind_module("temporal").twin is not kind_module("windowed").twin
    with pytest.raises(
        UnknownKind, match=r"kind 'nope' yet \(twins exist for: windowed, temporal, self, global\)"
    ):
        kind_module("nope")
