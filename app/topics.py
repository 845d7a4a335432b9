"""Create the join's topics up front, all with one partition count (co-partitioning)."""

from __future__ import annotations

import contextlib

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from app.settings import Settings


async def create_topics(bootstrap: str, settings: Settings) -> list[str]:
    """Create every topic the join uses; existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        for name in settings.topics():
            # The join state's changelog is compacted, like Faust's own changelogs.
            configs = {"cleanup.policy": "compact"} if name == settings.changelog else {}
            topic = NewTopic(name, settings.partitions, settings.replication_factor, topic_configs=configs)
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([topic])
    finally:
        await admin.close()
    return settings.topics()
