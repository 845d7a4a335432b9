"""Sizes at 1000 workers x 10,000 partitions x 3 topics, one standby, with the real planner.

Kafka's default message limit is 1 MiB; the JoinGroup response to the leader
holds every member's subscription, the leader's SyncGroup every assignment.
"""

from __future__ import annotations

from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import plan, wire
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join, tandem

MIB = 1024 * 1024
WORKERS, PARTITIONS = 1000, 10_000
TOPICS = {"impressions": PARTITIONS, "clicks": PARTITIONS, "ads-joins-changelog": PARTITIONS}
CHANGELOG = "ads-joins-changelog"

pytestmark = pytest.mark.timeout(240)


class Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(TOPICS[topic])) if topic in TOPICS else None


def _steady_state() -> dict[str, Any]:
    """A real plan of the group, used as every member's previous generation."""
    members = {
        f"w{i:04d}": {"topics": sorted(TOPICS), "host": f"host-{i}", "rack": f"rack-{i % 3}"}
        for i in range(WORKERS)
    }
    return plan(
        {
            "topics": TOPICS,
            "copartition_groups": [sorted(TOPICS)],
            "changelog_topics": [CHANGELOG],
            "standby_replicas": 1,
            "members": members,
        }
    )


def _subscription(member: str, held: dict[str, Any], epoch: int) -> wire.Subscription:
    index = int(member[1:])
    state = held["active"].get(CHANGELOG, []) + held["standby"].get(CHANGELOG, [])
    return wire.Subscription(
        epoch=epoch,
        url=f"http://worker-{index}.tandem.internal:6066",
        host=f"host-{index}",
        rack=f"rack-{index % 3}",
        previous_active=held["active"],
        previous_standby=held["standby"],
        # Realistic offsets: hundreds of millions of records per partition.
        local_offsets={CHANGELOG: {p: 300_000_000 + 7919 * p for p in state}},
    )


def test_subscriptions_and_assignments_stay_under_one_mib() -> None:
    previous = _steady_state()
    assert len(previous["members"]) == WORKERS
    metadata = {
        member: ConsumerProtocolMemberMetadata(
            wire.VERSION,
            sorted(TOPICS),
            wire.encode_subscription(_subscription(member, held, previous["epoch"])),
        )
        for member, held in previous["members"].items()
    }
    app = faust.App("scale-test", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)
    declare_join(app, ["impressions", "clicks"], CHANGELOG)
    assignor = tandem(app)
    assignments = assignor.assign(Cluster(), metadata)  # type: ignore[arg-type]

    subscriptions_size = sum(len(md.encode()) for md in metadata.values())
    assignments_size = sum(len(a.encode()) for a in assignments.values())
    routing_size = len(wire.encode_routing(assignor.routing))  # type: ignore[arg-type]
    print(
        f"\n{WORKERS} workers x {PARTITIONS} partitions x {len(TOPICS)} topics, one standby:"
        f" subscriptions {subscriptions_size / 1024:.0f} KiB,"
        f" assignments {assignments_size / 1024:.0f} KiB,"
        f" routing table {routing_size / 1024:.0f} KiB"
    )
    assert subscriptions_size < MIB
    assert assignments_size < MIB
    assert routing_size < MIB
    # Sticky at steady state, and every member got its own part only.
    own = wire.decode_assignment(assignments["w0001"].user_data)
    assert own.active == previous["members"]["w0001"]["active"]
    assert own.stats.kept == PARTITIONS and own.stats.moved_cold == 0


def test_the_stock_fallback_entry_is_small_too() -> None:
    """Both protocols travel in a JoinGroup; the stock entry carries ours hidden inside."""
    app = faust.App("scale-stock", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)
    assignor = tandem(app)
    held = {"active": {t: list(range(0, PARTITIONS, WORKERS)) for t in TOPICS}, "standby": {}}
    assignor._own = wire.Assignment(active=held["active"])
    md = assignor.stock.metadata(set(TOPICS))
    assert len(md.encode()) * WORKERS < MIB
