"""What installing the project puts on a user's import path, and what its wheel holds: the
`faust-tandem` distribution, its `tandem` console script, `py.typed` and `__version__`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
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
        ("tables.operators._fastwindow", "tables.operators.stored_window.STORED_LOOP"),
        ("tables.records._fastcheck", "tables.records.codecs.CHECK"),
    ],
    ids=["join loop", "stored index loop", "input check"],
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


# -- the distribution: what `pip install faust-tandem` gets -------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# What the build reads (pyproject.toml's [tool.setuptools.packages.find] and readme; setup.py).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "tables", "assignor", "pipeline")
TYPED_PACKAGES = ("tables", "assignor", "pipeline")


def _source_version() -> str:
    """tables/_version.py, read as text: the one place the version is written."""
    text = (ROOT / "tables" / "_version.py").read_text()
    return text.split('__version__ = "', 1)[1].split('"', 1)[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a copy of the sources (the checkout is left as it was)."""
    source = tmp_path_factory.mktemp("source")
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "build", "*.egg-info")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=skip)
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a directory of its own; its console scripts in `bin/`."""
    target = tmp_path_factory.mktemp("installed")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def _run_installed(installed: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A command of the install, from a directory that is not the checkout, with only the
    install on PYTHONPATH (dependencies come from this interpreter's environment)."""
    elsewhere = installed.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run(list(args), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)


def test_the_distribution_is_faust_tandem_with_one_version(wheel: Path) -> None:
    """`tandem` on the package index is another project's; the version is tables/_version.py's."""
    assert wheel.name.startswith(f"faust_tandem-{_source_version()}-")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "Name: faust-tandem" in headers
    assert f"Version: {_source_version()}" in headers


def test_the_wheel_is_typed_and_ships_no_test_scaffolding(wheel: Path) -> None:
    """PEP 561's marker in each package; the SASL/TLS test front stays in tests/ (issue 35)."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for package in TYPED_PACKAGES:
        assert f"{package}/py.typed" in names, f"{package}/py.typed is not in the wheel"
    assert not any(name.startswith("tests/") for name in names)
    assert "tables/testing/secure.py" not in names
    assert "tables/testing/driver.py" in names  # the public test kit stays


def test_the_installed_package_reports_its_version(installed: Path) -> None:
    probe = (
        "import importlib.metadata as m, tables; "
        "print(tables.__file__); print(tables.__version__); print(m.version('faust-tandem'))"
    )
    done = _run_installed(installed, sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    where, version, metadata_version = done.stdout.split()
    assert Path(where).is_relative_to(installed), where
    assert version == metadata_version == _source_version()


def test_the_console_script_lists_its_commands(installed: Path) -> None:
    script = installed / "bin" / "tandem"
    assert script.exists(), "the wheel installs no `tandem` script"
    done = _run_installed(installed, str(script), "--help")
    assert done.returncode == 0, done.stderr
    for command in ("dev", "plan", "what-if", "pipeline"):
        assert f"\n  {command} " in done.stdout, done.stdout
    version = _run_installed(installed, str(script), "--version")
    assert version.stdout.strip() == f"tandem {_source_version()}"
    unknown = _run_installed(installed, str(script), "no-such-command")
    assert unknown.returncode == 2
    assert "unknown command 'no-such-command'" in unknown.stderr


def test_tandem_plan_is_python_m_assignor_plan(installed: Path) -> None:
    """A subcommand hands its arguments to the module's own main: the same output."""
    scenario = str(ROOT / "docs" / "examples" / "scenario.json")
    by_script = _run_installed(installed, str(installed / "bin" / "tandem"), "plan", "--summary", scenario)
    by_module = _run_installed(installed, sys.executable, "-m", "assignor", "plan", "--summary", scenario)
    assert by_script.returncode == 0, by_script.stderr
    assert by_script.stdout == by_module.stdout
    assert "active tasks" in by_script.stdout


@pytest.mark.parametrize("command", ["dev", "what-if", "pipeline"])
def test_each_other_subcommand_reaches_its_module(installed: Path, command: str) -> None:
    """`--help` of each: the module's own parser (or job list) answers, not tandem's."""
    done = _run_installed(installed, str(installed / "bin" / "tandem"), command, "--help")
    assert done.returncode == 0, done.stderr
    expected = {"dev": "--workers", "what-if": "--worker", "pipeline": "reconcile"}[command]
    assert expected in done.stdout
    assert "usage: tandem <command>" not in done.stdout
