"""What installing the project puts on a user's import path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_reference_app_is_not_installed_so_a_users_own_app_module_wins(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import faust\napp = faust.App('mine')\nMINE = True\n")
    probe = "import app, tables, assignor; print(getattr(app, 'MINE', False), tables.join.__module__)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "tables.api"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = subprocess.run(
        [sys.executable, "-c", "import app"], cwd=elsewhere, capture_output=True, text=True, timeout=60
    )
    assert "No module named 'app'" in missing.stderr
