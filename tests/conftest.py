"""Shared fixtures: a real embedded broker (never a mock of Kafka); each loop of the join."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tables.testing import EmbeddedBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One tansu broker for the test session; each test uses its own topics and group ids."""
    with EmbeddedBroker(log_dir=tmp_path_factory.mktemp("broker")) as running:
        yield running


@pytest.fixture
def unique() -> str:
    """A fresh suffix for topic names and group ids (the broker keeps old groups)."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module", params=["compiled", "python"])
def join_loop(request: pytest.FixtureRequest) -> Iterator[str]:
    """The module's tests once with each loop of WindowedJoin.process_many and of
    StoredIndexJoin.process_many: compiled (tables/operators/_fastjoin.pyx, _fastwindow.pyx) and
    pure Python (`pytestmark = pytest.mark.usefixtures("join_loop")`)."""
    from tables.operators import stored_window
    from tables.operators import windowed as operator

    loops = (operator.LOOP, stored_window.STORED_LOOP)
    if request.param == "compiled" and any(loop.built is None for loop in loops):
        pytest.skip(
            "tables.operators._fastjoin or _fastwindow is not built (setup.py build_ext --inplace), "
            "or TANDEM_PURE_PYTHON=1"
        )
    was = [loop.active for loop in loops]
    for loop in loops:
        loop.use(request.param == "compiled")
    yield request.param
    for loop, active in zip(loops, was, strict=True):
        loop.use(active)


WINDOW_INDEXES = ("memory", "spilling", "rocksdb")


@pytest.fixture(params=WINDOW_INDEXES)
def window_join(request: pytest.FixtureRequest) -> Any:
    """A maker of the windowed join with each index (TANDEM_WINDOW_INDEX): in memory; budgeted
    with a budget of 0 bytes, so that it spills to the state after its first call (in memory
    for that call, in RocksDB's layout from the next: a spill mid-stream); in the state."""
    from tables.operators.budgeted_window import BudgetedJoin, IndexBudget
    from tables.operators.stored_window import StoredIndexJoin
    from tables.operators.windowed import WindowedJoin

    def make(state: Any, window: Any, join_type: Any, ids: bool = False) -> Any:
        if request.param == "memory":
            return WindowedJoin(state, window, join_type, ids)
        if request.param == "rocksdb":
            return StoredIndexJoin(state, window, join_type, ids, filter_bytes=64)
        return BudgetedJoin(state, window, join_type, ids, IndexBudget(0), filter_bytes=64)

    make.mode = request.param  # type: ignore[attr-defined]
    return make
