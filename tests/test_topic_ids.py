"""Topic ids (KIP-516) from the broker's metadata (tables/kafka/topics.py `topic_ids`): what tells
a changelog from an earlier topic of the same name. On the embedded broker (tansu 0.6.0 answers
Metadata v10 with ids)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tables.kafka.topics import topic_ids
from tables.testing import EmbeddedBroker, create_topics

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]


async def _delete(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


def test_a_topic_created_again_has_another_id_and_an_unknown_one_none(
    broker: EmbeddedBroker, unique: str
) -> None:
    first, second, unknown = f"ids-a-{unique}", f"ids-b-{unique}", f"ids-none-{unique}"
    asyncio.run(create_topics(broker.bootstrap, {first: 2, second: 1}))
    ids = asyncio.run(topic_ids(broker.bootstrap, [first, second, unknown]))
    assert set(ids) == {first, second}, ids  # the unknown one is left out, and not created
    assert all(len(topic_id) == 32 and int(topic_id, 16) for topic_id in ids.values()), ids
    assert ids[first] != ids[second]
    assert asyncio.run(topic_ids(broker.bootstrap, [first])) == {first: ids[first]}  # stable

    asyncio.run(_delete(broker.bootstrap, first))
    assert asyncio.run(topic_ids(broker.bootstrap, [first, unknown])) == {}
    asyncio.run(create_topics(broker.bootstrap, {first: 2}))
    again = asyncio.run(topic_ids(broker.bootstrap, [first, second]))
    assert again[second] == ids[second] and again[first] != ids[first], (ids, again)
