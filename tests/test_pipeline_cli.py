"""Every pipeline job is a command with --help (no Spark needed to ask)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.__main__ import JOBS
from pipeline.__main__ import main as pipeline_main


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
    assert done.returncode == 0 and "--allow-duplicates" in done.stdout
