"""Tests of file modes run a child as `nobody` (root ignores file modes): the check that
they can, shared by the store-level and the worker-level fault tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NOBODY = 65534
REPO = Path(__file__).resolve().parents[1]


def skip_unless_nobody_can_run_tandem() -> None:
    """Skip, saying why, unless this is root with setpriv and `nobody` can run this
    checkout's Python (a clone inside a mode-700 directory cannot; .ci/run opens the
    checkout for these tests)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a child as nobody (root ignores file modes)")
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-c", "import faust, tables"],
        cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(
            f"nobody cannot run {sys.executable} with {REPO} (a directory on the way is not "
            f"world-readable: chmod o+rx it): {probe.stderr.strip()[-200:]}"
        )
