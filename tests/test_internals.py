"""Every private Faust and aiokafka name Tandem reads or patches is declared, next to its use,
to assignor/internals.py, and a missing one refuses the start, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tables  # noqa: F401 - imports every layer, so every module has declared its names
import tables.web  # noqa: F401
from assignor import internals

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_versions_have_every_declared_name() -> None:
    assert internals.problems() == []
    users = {internal.user for internal in internals.required()}
    # The patch modules of both layers declare what they use.
    for module in (
        "assignor.faust_adapter.group_consumer",
        "assignor.faust_adapter.group",
        "assignor.faust_adapter.faust_tables",
        "assignor.faust_adapter.partition_assignor",
        "tables.kafka.consumer",
        "tables.kafka.table_stores",
        "tables.kafka.batches",
        "tables.kafka.handler_sends",
        "tables.records.codecs",  # Record._options: a model's fields
    ):
        assert module in users, module


@pytest.mark.parametrize(
    "internal",
    [i for i in internals.required() if not i.instance],
    ids=lambda i: i.label,
)
def test_a_missing_class_or_module_name_is_named(
    internal: internals.Internal, monkeypatch: pytest.MonkeyPatch
) -> None:
    for owner in getattr(internal.owner, "__mro__", (internal.owner,)):  # overrides too
        if internal.name in vars(owner):
            monkeypatch.delattr(owner, internal.name)
    with pytest.raises(internals.IncompatibleInternals, match=f"{internal.label} is missing"):
        internals.check()


@pytest.mark.parametrize(
    "internal",
    [i for i in internals.required() if i.instance],
    ids=lambda i: i.label,
)
def test_an_instance_name_is_found_in_its_owners_code_and_a_renamed_one_is_not(
    internal: internals.Internal,
) -> None:
    assert internal.present()
    renamed = internals.Internal(internal.owner, internal.name + "_renamed", internal.user, instance=True)
    assert not renamed.present()


def test_a_worker_refuses_to_start_naming_the_missing_internal(tmp_path: Path) -> None:
    """An app that declares a join, on a Faust whose consumer lost a private method Tandem
    overrides: the app refuses at once (at the join's declaration), naming the method."""
    script = "import faust.transport.consumer as c\ndel c.Consumer._new_offset\nimport examples.orders\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "IncompatibleInternals" in done.stderr
    assert "Consumer._new_offset is missing (used by tables.kafka.consumer)" in done.stderr
