"""A self-join on real workers (tests/apps/self_join_app.py) through a SIGKILL and a restart:
every pair of two different clicks of a user within the window, in both orders, and nothing
else (issue 39, item 3)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, read_records, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 2
WINDOW_MS = 10_000
USERS = 8
PER_USER = 24  # a click every 3 s: each meets the 3 before and the 3 after it


def _worker(broker: EmbeddedBroker, unique: str, tmp_path: Path) -> WorkerProcess:
    worker = WorkerProcess("w1", "tests.apps.self_join_app", tmp_path, cwd=REPO)
    worker.extra_env = {
        **embedded_env(),
        "SELF_APP_BROKER": f"kafka://{broker.bootstrap}",
        "SELF_APP_ID": f"selfjoin-{unique}",
        "SELF_APP_PREFIX": f"sj{unique}-",
        "APP_DATADIR": str(tmp_path / "w1"),
        "WEB_PORT": str(worker.port),
    }
    return worker


def _clicks(base_ms: int) -> list[tuple[str, str, int]]:
    """(user, click, time): each user's clicks 3 s apart, produced in time order."""
    return sorted(
        ((f"u{u}", f"u{u}-c{i}", base_ms + i * 3_000 + u) for u in range(USERS) for i in range(PER_USER)),
        key=lambda c: c[2],
    )


def expected_pairs(clicks: list[tuple[str, str, int]]) -> set[tuple[str, str]]:
    """Every ordered pair of two different clicks of one user within the window."""
    return {
        (user, f"{a}+{b}")
        for user, a, ta in clicks
        for other, b, tb in clicks
        if other == user and a != b and abs(ta - tb) <= WINDOW_MS
    }


async def _produce(bootstrap: str, topic: str, clicks: list[tuple[str, str, int]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for user, click, ts in clicks:
            await producer.send(topic, f'"{click}"'.encode(), key=user.encode(), timestamp_ms=ts)
        await producer.flush()
    finally:
        await producer.stop()


def _pairs(broker: EmbeddedBroker, topic: str) -> list[tuple[str, str]]:
    records = asyncio.run(read_records(broker.bootstrap, topic, PARTITIONS))
    return [(r.key.decode(), r.value.decode().strip('"')) for r in records]


def test_a_self_join_through_a_sigkill_and_a_restart(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    clicks_topic, pairs_topic = f"sj{unique}-clicks", f"sj{unique}-pairs"
    asyncio.run(create_topics(broker.bootstrap, {clicks_topic: PARTITIONS, pairs_topic: PARTITIONS}))
    clicks = _clicks(int(time.time() * 1000) - 3_600_000)
    half = len(clicks) // 2
    expected = expected_pairs(clicks)
    asyncio.run(_produce(broker.bootstrap, clicks_topic, clicks[:half]))
    worker = _worker(broker, unique, tmp_path).start()
    try:
        assert wait_for(lambda: worker.check() or len(_pairs(broker, pairs_topic)) > 0, 120, 0.2)
        worker.kill()
        assert set(_pairs(broker, pairs_topic)) < expected  # mid-way, and nothing spurious so far
        asyncio.run(_produce(broker.bootstrap, clicks_topic, clicks[half:]))
        worker = _worker(broker, unique, tmp_path).start()  # the same data dir
        assert wait_for(lambda: worker.check() or set(_pairs(broker, pairs_topic)) >= expected, 180), sorted(
            expected - set(_pairs(broker, pairs_topic))
        )[:10]
        found = set(_pairs(broker, pairs_topic))
        assert found == expected, sorted(found - expected)[:10]  # none spurious: never a click with itself
        view = worker.view() or {}
        assert view["joins"]["sessions"]["kind"] == "self", view["joins"]["sessions"]
    finally:
        worker.stop(15)
