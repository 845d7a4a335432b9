"""A hostile member of a Tandem group, as its own process: a real aiokafka consumer that joins
the group with the `tandem` protocol and sends hostile subscription user data
(tests/hostile_payloads.py), for tests/test_reliability_hostile_member.py.

    python -m tests.hostile_member BOOTSTRAP GROUP TOPIC PAYLOAD

Prints "assigned <partitions>" after each assignment, and "led the group" if it is ever the
leader (the test wants a real worker to lead). SIGTERM: leaves the group and exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from tables.testing import FAST_GROUP_SETTINGS
from tests.hostile_payloads import PAYLOADS


class HostileAssignor(AbstractPartitionAssignor):
    """Speaks the `tandem` protocol name, with hostile bytes as its user data."""

    name = "tandem"
    version = 2
    payload = b""

    @classmethod
    def metadata(cls, topics: Any) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), cls.payload)

    @classmethod
    def assign(cls, cluster: Any, members: Any) -> dict[str, ConsumerProtocolMemberAssignment]:
        print("led the group", flush=True)
        return {m: ConsumerProtocolMemberAssignment(cls.version, [], b"") for m in members}

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        print(f"assigned {sorted(assignment.assignment)}", flush=True)


async def main(bootstrap: str, group: str, topic: str, payload: str) -> None:
    HostileAssignor.payload = PAYLOADS[payload]()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        partition_assignment_strategy=(HostileAssignor,),
        session_timeout_ms=FAST_GROUP_SETTINGS["session_timeout_ms"],
        heartbeat_interval_ms=FAST_GROUP_SETTINGS["heartbeat_interval_ms"],
        request_timeout_ms=FAST_GROUP_SETTINGS["request_timeout_ms"],
        enable_auto_commit=False,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    print(f"started, sending {payload} ({len(HostileAssignor.payload)} bytes)", flush=True)
    try:
        while not stop.is_set():
            await consumer.getmany(timeout_ms=200)
    finally:
        await consumer.stop()  # leaves the group
    print("left", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
