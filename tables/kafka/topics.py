"""The join's own topics: created with its partition count, the changelog compacted."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError


async def create_topics(
    bootstrap: str,
    counts: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]] | None = None,
    replication_factor: int = 1,
) -> None:
    """Create topics with their partition counts; existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        for name, count in counts.items():
            topic = NewTopic(
                name, count, replication_factor, topic_configs=dict((configs or {}).get(name, {}))
            )
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([topic])
    finally:
        await admin.close()


def changelog_configs(retention_ms: int | None) -> dict[str, str]:
    """A join changelog's topic settings: compacted, and deleted by time once no record
    in it can still be needed (the join writes no tombstones for expired records)."""
    if retention_ms is None:
        return {"cleanup.policy": "compact"}
    return {"cleanup.policy": "compact,delete", "retention.ms": str(retention_ms)}
