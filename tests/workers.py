"""Real worker processes on the session's embedded broker, for the end-to-end tests.

Each test gets its own app id (group id) and topic prefix (docs/embedded-broker.md:
the broker keeps old groups), creates every topic up front with one partition
count, and stops its workers by their process ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.cluster import WorkerProcess, covered, wait_for
from app.settings import Settings, create_topics, from_env
from app.traffic import Traffic, run_traffic
from assignor import clients
from tables.testing import EmbeddedBroker, high_watermarks

PARTITIONS = 6
Done = Callable[[list[dict[str, Any]]], bool]


@dataclasses.dataclass
class Cluster:
    broker: EmbeddedBroker
    settings: Settings
    run_dir: Path
    workers: list[WorkerProcess]
    # How the test's own clients and the workers reach the broker: its bootstrap, or
    # settings with TLS/SASL (a secured front), the workers then given `worker_env`.
    connection: str | Mapping[str, Any] = ""
    worker_env: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.connection = self.connection or self.broker.bootstrap

    def worker(self, name: str, host: str, rack: str = "rack-1", **kw: Any) -> WorkerProcess:
        kw["extra_env"] = {**self.worker_env, **kw.get("extra_env", {})}
        worker = WorkerProcess(
            name,
            host,
            rack,
            clients.bootstrap_of(clients.settings_of(self.connection)),
            self.settings.app_id,
            self.run_dir,
            partitions=PARTITIONS,
            topic_prefix=self.settings.topic_prefix,
            **kw,
        )
        self.workers.append(worker)
        return worker

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def wait_covered(self, timeout: float = 60) -> None:
        def done() -> bool:
            for worker in self.workers:
                worker.check()  # a crashed worker fails now, with its log
            return covered(self.live(), PARTITIONS)

        ok = wait_for(done, timeout)
        assert ok, f"partitions not covered within {timeout} s; logs in {self.run_dir}"

    def send(self, traffic: Traffic, count: int, rate: float = 200.0) -> Traffic:
        stop = asyncio.Event()
        return asyncio.run(run_traffic(self.connection, traffic, rate, stop, limit=count))

    def traffic(self, run: str) -> Traffic:
        return Traffic(self.settings.impressions, self.settings.clicks, run=run)

    def read(self, topic: str, done: Done, timeout: float = 30) -> list[dict[str, Any]]:
        """Records of `topic` until `done(records)` holds (or all there are after `timeout`)."""
        return asyncio.run(_read(self.connection, topic, done, timeout))

    def joins(self, expected: set[str], timeout: float = 30) -> set[str]:
        """Join ids read back, once they cover `expected` (duplicates may come first)."""
        records = self.read(self.settings.joins, lambda rs: expected <= _ids(rs), timeout)
        return _ids(records)

    def highwaters(self, topic: str) -> dict[int, int]:
        """Each partition's end offset, from fetch responses (ListOffsets is short on tansu)."""
        return asyncio.run(high_watermarks(self.connection, topic, PARTITIONS, 15))


def _ids(records: list[dict[str, Any]]) -> set[str]:
    return {r["join_id"] for r in records}


async def _read(
    connection: str | Mapping[str, Any], topic: str, done: Done, timeout: float
) -> list[dict[str, Any]]:
    consumer = clients.consumer(clients.settings_of(connection), auto_offset_reset="earliest")
    consumer.subscribe([topic])
    await consumer.start()
    seen: list[dict[str, Any]] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done(seen) and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            seen.extend(json.loads(r.value) for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return seen


@contextmanager
def cluster(
    broker: EmbeddedBroker,
    unique: str,
    run_dir: Path,
    connection: str | Mapping[str, Any] = "",
    worker_env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    settings = dataclasses.replace(
        from_env(),
        app_id=f"tandem-test-{unique}",
        topic_prefix=f"t{unique}-",
        partitions=PARTITIONS,
    )
    asyncio.run(create_topics(connection or broker.bootstrap, settings))
    running = Cluster(broker, settings, run_dir, [], connection, worker_env or {})
    try:
        yield running
    finally:
        for worker in running.workers:
            worker.kill()  # the test is over: no need to wait for a clean leave
