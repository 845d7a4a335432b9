"""What installing the project puts on a user's import path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_reference_app_is_not_installed_so_a_users_own_app_module_wins(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import faust\napp = faust.App('mine')\nMINE = True\n")
    probe = "import app, tables, assignor; print(getattr(app, 'MINE', False), tables.join.__module__)"
    # What the install puts on the path, not a PYTHONPATH set to a checkout (a worktree's tests).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "tables.api"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = subprocess.run(
        [sys.executable, "-c", "import app"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No module named 'app'" in missing.stderr


@pytest.mark.parametrize(
    ("module", "user"),
    [
        ("tables.operators._fastjoin", "tables.operators.windowed.LOOP"),
        ("tables.records._fastcheck", "tables.records.codecs.CHECK"),
    ],
    ids=["join loop", "input check"],
)
def test_the_install_builds_the_compiled_parts(module: str, user: str) -> None:
    """`make`'s install builds the compiled join loop and input check (setup.py) and the join
    runs them (`LOOP.active`, `CHECK.active`): where a C compiler is missing the install only warns, so CI
    (CI=true) checks they were built, or every test of them would skip and the worker would
    run the slower Python code (docs/tables.md, "The compiled loop", "The compiled check")."""
    user_module, _, part = user.rpartition(".")
    probe = f"import {user_module} as user, {module}; print(user.{part}.active)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=Path(__file__).resolve().parent.parent,
        env={k: v for k, v in os.environ.items() if k != "TANDEM_PURE_PYTHON"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and os.environ.get("CI") != "true":
        pytest.skip(f"{module} is not built here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
