"""A join batch defers the garbage collection to its end (tables/runtime/gcpacing.py): observed
through the collector's own callbacks, on real cyclic garbage."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tables.runtime.gcpacing import collection_deferred
from tables.settings import RuntimeSettings


class Node:
    """A cycle (node -> itself): only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs, at 700 allocations."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    saved = gc.get_threshold()
    gc.collect()
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*saved)


def cyclic_garbage(count: int) -> weakref.ref[Node]:
    """`count` cycles dropped at once; a weak reference to the first tells when it is freed."""
    nodes = [Node() for _ in range(count)]
    first = weakref.ref(nodes[0])
    del nodes
    return first


def test_a_batch_is_not_collected_midway_and_its_garbage_is_collected_after_it(
    collections: list[int],
) -> None:
    with collection_deferred(1_000_000):
        assert gc.get_threshold() == (1_000_000, 10, 10)
        garbage = cyclic_garbage(20_000)  # ~30 collections' worth at 700
        assert collections == []
        assert garbage() is not None
    assert gc.get_threshold() == (700, 10, 10)
    cyclic_garbage(1_000)  # the next allocations find the collection due
    assert collections
    assert garbage() is None


def test_without_deferral_the_same_garbage_is_collected_midway(collections: list[int]) -> None:
    cyclic_garbage(20_000)
    assert len(collections) >= 10


def test_a_batch_allocating_past_the_raised_threshold_is_still_collected(collections: list[int]) -> None:
    with collection_deferred(5_000):
        cyclic_garbage(20_000)
        assert collections  # at 5,000 allocations, not at the batch's end


def test_interleaved_batches_restore_the_threshold_when_the_last_one_ends(collections: list[int]) -> None:
    first, second = collection_deferred(1_000_000), collection_deferred(1_000_000)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # batches of two joins end in any order
    assert gc.get_threshold()[0] == 1_000_000
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_failing_batch_restores_the_threshold(collections: list[int]) -> None:
    with pytest.raises(RuntimeError), collection_deferred(1_000_000):
        raise RuntimeError("the batch failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_zero_or_a_lower_threshold_leaves_the_collector_as_the_app_set_it(collections: list[int]) -> None:
    with collection_deferred(0):
        assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(90_000, 5, 5)
    with collection_deferred(50_000):
        assert gc.get_threshold() == (90_000, 5, 5)
    assert gc.get_threshold() == (90_000, 5, 5)


def test_the_batch_threshold_defaults_to_a_million_and_is_refused_negative_by_name() -> None:
    assert RuntimeSettings.from_env({}).gc_batch_threshold == 1_000_000
    assert RuntimeSettings.from_env({"TANDEM_GC_BATCH_THRESHOLD": "0"}).gc_batch_threshold == 0
    with pytest.raises(ValueError, match="TANDEM_GC_BATCH_THRESHOLD"):
        RuntimeSettings.from_env({"TANDEM_GC_BATCH_THRESHOLD": "-1"})
