"""Shared fixtures: a real embedded broker (never a mock of Kafka); each loop of the join."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

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
    """The module's tests once with each loop of WindowedJoin.process_many: compiled
    (tables/operators/_fastjoin.pyx) and pure Python (`pytestmark = pytest.mark.usefixtures("join_loop")`)."""
    from tables.operators import windowed as operator

    if request.param == "compiled" and operator.LOOP.built is None:
        pytest.skip(
            "tables.operators._fastjoin is not built (setup.py build_ext --inplace), or TANDEM_PURE_PYTHON=1"
        )
    was = operator.LOOP.active
    operator.LOOP.use(request.param == "compiled")
    yield request.param
    operator.LOOP.use(was)
