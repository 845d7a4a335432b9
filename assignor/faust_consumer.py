"""Faust's aiokafka consumer, offering ``[tandem, faust]`` and checking joins at start-up.

Faust builds its consumer with ``partition_assignment_strategy=[app.assignor]``
(and falls back to round-robin when the app has no Faust tables). This
subclass offers the Tandem assignor's protocols instead, in preference order,
and before joining the group stops the worker if a declared join's topics have
different partition counts.
"""

from __future__ import annotations

import logging
from typing import Any

import aiokafka
from aiokafka.client import AIOKafkaClient
from faust.transport.drivers.aiokafka import (
    AIOKafkaConsumerThread,
    Consumer,
    server_list,
)

from assignor.faust_scenario import verify_copartitioned

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 20.0


class TandemConsumerThread(AIOKafkaConsumerThread):
    async def on_start(self) -> None:
        await self._verify_joins()
        await super().on_start()

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        protocols = getattr(self.app.assignor, "protocols", None)
        if protocols is not None:
            # aiokafka reads this list when it creates its group coordinator, in start().
            consumer._partition_assignment_strategy = tuple(protocols())
        return consumer

    async def _verify_joins(self) -> None:
        joins = getattr(self.app.assignor, "joins", [])
        if not joins:
            return
        counts = await broker_partition_counts(
            server_list(self.transport.url, self.transport.default_port),
            {t for j in joins for t in j.all_topics},
        )
        verify_copartitioned(joins, counts)  # raises: the worker must not join the group


class TandemConsumer(Consumer):
    def _new_consumer_thread(self) -> TandemConsumerThread:
        return TandemConsumerThread(self, loop=self.loop, beacon=self.beacon)


async def broker_partition_counts(bootstrap: list[str], topics: set[str]) -> dict[str, int]:
    """Partition counts of the topics that exist on the broker (missing ones are left out)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    try:
        await client.bootstrap()
        cluster = await client.fetch_all_metadata()
    finally:
        await client.close()
    counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
    return {t: n for t, n in counts.items() if n}
