"""The join runtime's settings (tables/settings.py) and the garbage collection threshold a
worker sets when it starts."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tables.runtime.gcpacing import raise_gc_threshold
from tables.settings import RuntimeSettings


@pytest.fixture
def gc_settings() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        yield
    finally:
        gc.set_threshold(*saved)


def test_gc_threshold_defaults_to_50000_and_reads_the_environment() -> None:
    assert RuntimeSettings.from_env({}).gc_threshold == 50_000
    assert RuntimeSettings.from_env({"TANDEM_GC_THRESHOLD": "0"}).gc_threshold == 0
    assert RuntimeSettings.from_env({"TANDEM_GC_THRESHOLD": "1234"}).gc_threshold == 1234


def test_a_negative_or_malformed_gc_threshold_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="TANDEM_GC_THRESHOLD"):
        RuntimeSettings.from_env({"TANDEM_GC_THRESHOLD": "-1"})
    with pytest.raises(ValueError, match="TANDEM_GC_THRESHOLD"):
        RuntimeSettings.from_env({"TANDEM_GC_THRESHOLD": "lots"})


def test_the_threshold_is_raised_keeping_the_older_generations(gc_settings: None) -> None:
    raise_gc_threshold(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_a_higher_threshold_set_by_the_app_is_kept_and_zero_changes_nothing(gc_settings: None) -> None:
    gc.set_threshold(90_000, 5, 5)
    raise_gc_threshold(50_000)
    assert gc.get_threshold() == (90_000, 5, 5)
    gc.set_threshold(700, 10, 10)
    raise_gc_threshold(0)
    assert gc.get_threshold() == (700, 10, 10)


def test_an_alignment_cap_below_four_batches_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tables.settings"):
        RuntimeSettings.from_env({"TANDEM_ALIGN_MAX_HELD": "16000", "TANDEM_BATCH_MAX_RECORDS": "4000"})
        assert not caplog.records
        RuntimeSettings.from_env({"TANDEM_ALIGN_MAX_HELD": "15999", "TANDEM_BATCH_MAX_RECORDS": "4000"})
    assert [r.getMessage() for r in caplog.records] == [
        "TANDEM_ALIGN_MAX_HELD=15999 is below four batches (TANDEM_BATCH_MAX_RECORDS=4000): a backlog may "
        "fill it and force records out of event-time order (docs/operations.md)"
    ]


def test_the_join_s_record_batch_size_reads_the_environment_and_must_be_positive() -> None:
    assert RuntimeSettings.from_env({}).send_batch_bytes == 512 * 1024
    assert RuntimeSettings.from_env({"TANDEM_SEND_BATCH_BYTES": "16384"}).send_batch_bytes == 16384
    with pytest.raises(ValueError, match="TANDEM_SEND_BATCH_BYTES"):
        RuntimeSettings.from_env({"TANDEM_SEND_BATCH_BYTES": "0"})
