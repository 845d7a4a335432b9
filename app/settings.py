"""The reference app's settings, read from the environment (one process = one worker).

Defaults suit real Kafka on localhost; the demo and the tests set the fast group
timings the embedded broker needs (docs/embedded-broker.md). Tandem's own settings
(standby replicas, host, rack, fetch wait, ...) are read by Tandem from the same
environment (`TANDEM_*`, docs/operations.md).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default) or default


def _int(name: str, default: int) -> int:
    return int(_env(name, str(default)))


JOIN_NAME = "ad-join"


@dataclass(frozen=True)
class Settings:
    broker: str
    app_id: str
    data_dir: Path
    web_port: int
    web_bind: str
    url: str
    standby_replicas: int
    # The worker's name (TANDEM_WORKER) is read in one place only, with one default:
    # tables/web/metrics.py `worker_name` (docs/operations.md).
    host: str
    partitions: int
    replication_factor: int
    session_timeout_ms: int
    heartbeat_ms: int
    request_timeout_ms: int
    topic_prefix: str
    # A Kafka client properties file (security.protocol, sasl.*, ssl.*) for a secured cluster.
    client_config: str | None = None
    # The join window: a click within `join_after_ms` after its impression, `join_grace_ms` late.
    join_after_ms: int = 10 * 60 * 1000
    join_grace_ms: int = 60 * 1000

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
        """The join's dead-letter topic (named by Tandem after the app id and the join)."""
        return f"{self.app_id}-{JOIN_NAME}-dead-letters"

    @property
    def audit(self) -> str:
        """The join's audit topic (one record per result; app/join.py declares `audit=True`)."""
        return f"{self.app_id}-{JOIN_NAME}-audit"

    @property
    def changelog(self) -> str:
        """The join state's changelog (named by Tandem; a fresh app id starts fresh state)."""
        return f"{self.app_id}-{JOIN_NAME}-changelog"

    def topics(self) -> list[str]:
        """The topics the app's producers and readers use, all with one partition count."""
        return [self.impressions, self.clicks, self.joins]


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
        host=host,
        partitions=_int("TANDEM_PARTITIONS", 6),
        replication_factor=_int("TANDEM_REPLICATION_FACTOR", 1),
        session_timeout_ms=_int("TANDEM_SESSION_TIMEOUT_MS", 10000),
        heartbeat_ms=_int("TANDEM_HEARTBEAT_MS", 1000),
        request_timeout_ms=_int("TANDEM_REQUEST_TIMEOUT_MS", 30000),
        topic_prefix=_env("TANDEM_TOPIC_PREFIX", ""),
        client_config=os.environ.get("TANDEM_CLIENT_CONFIG") or None,
        join_after_ms=_int("TANDEM_JOIN_AFTER_MS", 10 * 60 * 1000),
        join_grace_ms=_int("TANDEM_JOIN_GRACE_MS", 60 * 1000),
    )


async def create_topics(connection: str | Mapping[str, Any], settings: Settings) -> list[str]:
    """Create the app's topics up front with one partition count (co-partitioning);
    Tandem creates the join's own changelog and dead-letter topic when a worker starts."""
    from tables.kafka.topics import create_topics as create

    await create(
        connection, dict.fromkeys(settings.topics(), settings.partitions), None, settings.replication_factor
    )
    return settings.topics()
