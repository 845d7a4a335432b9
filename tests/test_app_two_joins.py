"""Several joins in one app, each its own co-partition group with its own partition count."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, read_records, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parent.parent


def test_two_joins_with_their_own_partition_counts(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    prefix = f"tj{unique}-"
    counts = {f"{prefix}a1": 2, f"{prefix}a2": 2, f"{prefix}b1": 4, f"{prefix}b2": 4, f"{prefix}out": 4}
    asyncio.run(create_topics(broker.bootstrap, counts))
    env = {
        **embedded_env(),
        "TWO_JOINS_BROKER": f"kafka://{broker.bootstrap}",
        "TWO_JOINS_APP_ID": f"two-{unique}",
        "TWO_JOINS_PREFIX": prefix,
    }
    workers = []
    for name in ("w1", "w2"):
        worker = WorkerProcess(name, "tests.apps.two_joins", tmp_path, dict(env), cwd=REPO)
        worker.extra_env |= {
            "TWO_JOINS_WEB_PORT": str(worker.port),
            "TWO_JOINS_DATA_DIR": str(tmp_path / name),
        }
        workers.append(worker.start())
    try:
        assert wait_for(lambda: _owned(workers) == {"narrow": [0, 1], "wide": [0, 1, 2, 3]}, 60), _owned(
            workers
        )
        views = [w.view() for w in workers]
        for view in views:
            assert view is not None
            assert view["joins"]["narrow"]["partitions"] == 2 and view["joins"]["wide"]["partitions"] == 4
            active = view["assignment"]["active"]
            # Each join's changelog goes with its own inputs, partition by partition.
            assert active.get(f"two-{unique}-narrow-changelog", []) == active.get(f"{prefix}a1", [])
            assert active.get(f"two-{unique}-wide-changelog", []) == active.get(f"{prefix}b1", [])
        asyncio.run(_produce(broker.bootstrap, prefix))
        expected = {f"narrow:x{i}+y{i}" for i in range(20)} | {f"wide:u{i}+v{i}" for i in range(20)}
        assert wait_for(lambda: _outputs(broker, prefix) >= expected, 30), expected - _outputs(broker, prefix)
    finally:
        for worker in workers:
            worker.stop(15)


def _owned(workers: list[WorkerProcess]) -> dict[str, list[int]]:
    owned: dict[str, list[int]] = {}
    for worker in workers:
        worker.check()
        for name, join in ((worker.view() or {}).get("joins") or {}).items():
            if join["restoring"]:
                return {}
            owned.setdefault(name, []).extend(join["actives"])
    return {name: sorted(p) for name, p in owned.items()}


async def _produce(bootstrap: str, prefix: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(20):
            for topic, value in (("a1", f"x{i}"), ("a2", f"y{i}"), ("b1", f"u{i}"), ("b2", f"v{i}")):
                await producer.send(f"{prefix}{topic}", f'"{value}"'.encode(), key=f"k{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()


def _outputs(broker: EmbeddedBroker, prefix: str) -> set[str]:
    records = asyncio.run(read_records(broker.bootstrap, f"{prefix}out", 4))
    return {r.value.decode().strip('"') for r in records}
