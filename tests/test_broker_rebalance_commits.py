"""What the embedded broker answers to an OffsetCommit while its group rebalances (issue 38):
the finding of docs/operations.md, "Commits during a rebalance", kept as a test so that a
new broker build that changes it is noticed. Two members speak the group protocol by hand
(JoinGroup, SyncGroup, OffsetCommit), so each commit lands in a known state of the group."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.client import CoordinationType
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.errors import for_code
from aiokafka.protocol.commit import OffsetCommitRequest
from aiokafka.protocol.group import JoinGroupRequest, SyncGroupRequest

from tables.testing import EmbeddedBroker, create_topics

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]


class _Member:
    def __init__(self, client: AIOKafkaClient, node: int, group: str, topic: str) -> None:
        self.client, self.node, self.group, self.topic = client, node, group, topic
        self.member_id = ""
        self.generation = -1

    async def join(self) -> Any:
        meta = ConsumerProtocolMemberMetadata(0, [self.topic], b"").encode()
        while True:
            request = JoinGroupRequest(
                self.group, 6000, 6000, self.member_id, None, "consumer", [("range", meta)]
            )
            response = await self.client.send(self.node, request)
            self.member_id = response.member_id
            if for_code(response.error_code).__name__ != "MemberIdRequired":
                assert response.error_code == 0, for_code(response.error_code)
                self.generation = response.generation_id
                return response

    async def sync(self, assignments: list[tuple[str, bytes]]) -> None:
        request = SyncGroupRequest(self.group, self.generation, self.member_id, None, assignments)
        response = await self.client.send(self.node, request)
        assert response.error_code == 0, for_code(response.error_code)

    async def commit(self, generation: int) -> str:
        request = OffsetCommitRequest(
            self.group, generation, self.member_id, -1, [(self.topic, [(0, 5, "")])]
        )
        response = await self.client.send(self.node, request)
        return str(for_code(response.topics[0][1][0][1]).__name__)


async def _commits_through_a_rebalance(bootstrap: str, group: str, topic: str) -> dict[str, str]:
    await create_topics(bootstrap, {topic: 1})
    clients = [AIOKafkaClient(bootstrap_servers=bootstrap) for _ in range(2)]
    for client in clients:
        await client.bootstrap()
    try:
        node = await clients[0].coordinator_lookup(CoordinationType.GROUP, group)
        a, b = (_Member(c, node, group, topic) for c in clients)
        assignment = ConsumerProtocolMemberAssignment(0, [(topic, [0])], b"").encode()
        await a.join()
        await a.sync([(a.member_id, assignment)])
        old = a.generation
        found = {"stable": await a.commit(old)}
        b_joins = asyncio.ensure_future(b.join())  # the group prepares a rebalance: A still runs
        await asyncio.sleep(0.5)
        found["preparing, old generation"] = await a.commit(old)
        joined, _ = await asyncio.gather(a.join(), b_joins)
        found["completing, old generation"] = await a.commit(old)
        found["completing, new generation"] = await a.commit(a.generation)
        leader, follower = (a, b) if joined.leader_id == a.member_id else (b, a)
        members = [(m.member_id, assignment) for m in (a, b)]
        await asyncio.gather(leader.sync(members), follower.sync([]))
        found["stable again, new generation"] = await a.commit(a.generation)
        found["stable again, old generation"] = await a.commit(old)
        return found
    finally:
        for client in clients:
            await client.close()


def test_the_embedded_broker_takes_commits_through_a_rebalance_and_refuses_only_a_stale_generation(
    broker: EmbeddedBroker, unique: str
) -> None:
    found = asyncio.run(
        _commits_through_a_rebalance(broker.bootstrap, f"commits-{unique}", f"commits-{unique}")
    )
    assert found == {
        "stable": "NoError",
        # Kafka's broker takes these too (PreparingRebalance, the member's current generation)...
        "preparing, old generation": "NoError",
        # ...and refuses these with REBALANCE_IN_PROGRESS (CompletingRebalance): tansu takes them.
        "completing, old generation": "NoError",
        "completing, new generation": "NoError",
        "stable again, new generation": "NoError",
        "stable again, old generation": "IllegalGenerationError",
    }, found
