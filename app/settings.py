"""The worker's settings, read from the environment (one process = one worker).

Defaults suit real Kafka on localhost; the demo and the tests set the fast
group timings the embedded broker needs (docs/embedded-broker.md).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default) or default


def _int(name: str, default: int) -> int:
    return int(_env(name, str(default)))


@dataclass(frozen=True)
class Settings:
    broker: str
    app_id: str
    data_dir: Path
    web_port: int
    web_bind: str
    url: str
    standby_replicas: int
    worker: str
    host: str
    rack: str
    partitions: int
    replication_factor: int
    session_timeout_ms: int
    heartbeat_ms: int
    request_timeout_ms: int
    fetch_max_wait_ms: int
    follower_sync_delay_ms: int
    topic_prefix: str
    assignor: str
    state: str
    align_max_wait_ms: int = 2000
    align_max_held: int = 50_000

    @property
    def impressions(self) -> str:
        return f"{self.topic_prefix}impressions"

    @property
    def clicks(self) -> str:
        return f"{self.topic_prefix}clicks"

    @property
    def joins(self) -> str:
        return f"{self.topic_prefix}ad-joins"

    @property
    def dead_letters(self) -> str:
        return f"{self.topic_prefix}ad-dead-letters"

    @property
    def changelog(self) -> str:
        # Per app id like Faust's own changelogs: a fresh app id starts fresh state.
        return f"{self.app_id}-join-state-changelog"

    def topics(self) -> list[str]:
        """Every topic the join needs, all created with the same partition count."""
        return [self.impressions, self.clicks, self.joins, self.dead_letters, self.changelog]


def from_env() -> Settings:
    host = _env("TANDEM_HOST", socket.gethostname())
    app_id = _env("TANDEM_APP_ID", "tandem-ad-join")
    bind = _env("TANDEM_WEB_BIND", "127.0.0.1")
    port = _int("TANDEM_WEB_PORT", 6066)
    return Settings(
        broker=_env("TANDEM_BROKER", "kafka://127.0.0.1:9092"),
        app_id=app_id,
        data_dir=Path(_env("TANDEM_DATA_DIR", f"data/{app_id}/{host}")),
        web_port=port,
        web_bind=bind,
        # How the other workers reach this one's web server (Faust's canonical URL).
        url=_env("TANDEM_URL", f"http://{'127.0.0.1' if bind == '0.0.0.0' else bind}:{port}"),
        standby_replicas=_int("TANDEM_STANDBY_REPLICAS", 1),
        worker=_env("TANDEM_WORKER", host),
        host=host,
        rack=_env("TANDEM_RACK", "default"),
        partitions=_int("TANDEM_PARTITIONS", 6),
        replication_factor=_int("TANDEM_REPLICATION_FACTOR", 1),
        session_timeout_ms=_int("TANDEM_SESSION_TIMEOUT_MS", 10000),
        heartbeat_ms=_int("TANDEM_HEARTBEAT_MS", 1000),
        request_timeout_ms=_int("TANDEM_REQUEST_TIMEOUT_MS", 30000),
        # Faust's own value; the embedded broker needs a short one (docs/embedded-broker.md).
        fetch_max_wait_ms=_int("TANDEM_FETCH_MAX_WAIT_MS", 1500),
        # 0 on Kafka; on the embedded broker, a follower that syncs before the leader
        # waits a whole second (docs/embedded-broker.md).
        follower_sync_delay_ms=_int("TANDEM_FOLLOWER_SYNC_DELAY_MS", 0),
        topic_prefix=_env("TANDEM_TOPIC_PREFIX", ""),
        assignor=_env("TANDEM_ASSIGNOR", "tandem"),
        # "tables" (RocksDB, tables/) or "interim" (in-memory + files, app/state.py).
        state=_env("TANDEM_STATE", "tables"),
        # Event-time alignment of the two inputs (app/alignment.py): how long an input
        # that delivers nothing may hold the other back, and how many records at most.
        align_max_wait_ms=_int("TANDEM_ALIGN_MAX_WAIT_MS", 2000),
        align_max_held=_int("TANDEM_ALIGN_MAX_HELD", 50_000),
    )
