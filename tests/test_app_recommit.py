"""A worker commits a join input's offset again when it has not moved (tables/kafka/consumer.py,
`_recommits_due`): if the group's committed offset on the broker falls behind what the worker
recorded as committed (seen in cooperative chaos runs, cause not isolated), the worker puts it
back without any new record arriving. Faust alone commits an offset once and never again while
it does not move, so the group would keep the old offset, and read everything after it again
at the next failure.

A real worker on the embedded broker; the drift is made by hand: an OffsetCommit with the
worker's own member id and generation (the broker takes it as the worker's) sets one input
partition's offset back to 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.client import CoordinationType
from aiokafka.errors import for_code
from aiokafka.protocol.commit import OffsetCommitRequest

from app.cluster import wait_for
from tables.testing import EmbeddedBroker, uncommitted
from tests.workers import PARTITIONS, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(150)]


async def _commit_as(bootstrap: str, group: str, member: str, topic: str, offset: int) -> int | None:
    """Commit `offset` for partition 0 of `topic` as `member`, trying each generation in turn
    (the broker refuses every other one with ILLEGAL_GENERATION and stores nothing): the
    generation that took it, or None."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        for generation in range(50):
            request = OffsetCommitRequest(group, generation, member, -1, [(topic, [(0, offset, "")])])
            response = await client.send(node, request)
            if for_code(response.topics[0][1][0][1]).__name__ == "NoError":
                return generation
        return None
    finally:
        await client.close()


def test_an_offset_set_back_on_the_broker_is_committed_again(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        worker = c.worker("w1", "host-a").start()
        c.wait_covered()
        traffic = c.traffic(unique)
        c.send(traffic, 100)
        assert traffic.expected <= c.joins(traffic.expected)
        s = c.settings
        inputs = [s.impressions, s.clicks]

        def backlog() -> int:
            return asyncio.run(uncommitted(broker.bootstrap, s.app_id, inputs, PARTITIONS))

        assert wait_for(lambda: backlog() == 0, 60), "the worker did not commit its inputs"
        view = worker.view()
        assert view is not None and view["member"] is not None
        member = view["member"]["id"]
        taken = asyncio.run(_commit_as(broker.bootstrap, s.app_id, member, s.impressions, 0))
        assert taken is not None, "no generation of the worker's took the commit"
        assert backlog() > 0  # the group's offset fell behind the worker's record of it
        # No new record arrives: the worker commits the unmoved offset again.
        assert wait_for(lambda: backlog() == 0, 60), f"offset not committed again; logs in {tmp_path}"
