"""Shared fixtures: a real embedded broker (never a mock of Kafka)."""

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
