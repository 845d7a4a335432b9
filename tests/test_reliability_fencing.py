"""A zombie with a stale epoch claiming partitions is fenced (the real adapter, real bytes).

Each member's JoinGroup user data is a real encoded `wire.Subscription`; the
leader is the real `TandemAssignor.assign()`. A zombie (a member that slept
through rebalances: its epoch is old) claims every partition of the join. Its
claims lose to the current owners' higher epoch: they keep their partitions,
and the zombie gets only what balance gives a new member, never a contested
partition by its claim. The same zombie with a *newer* epoch would win: the
epoch, not the claim, decides.
"""

from __future__ import annotations

import dataclasses
import uuid

import faust
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import wire
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join
from assignor.wire import Subscription

JOIN = ["impressions", "clicks", "cl"]
N = 6
OWNED = {"a": [0, 1], "b": [2, 3], "c": [4, 5]}


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(N)) if topic in JOIN else None


def _leader() -> TandemAssignor:
    app = faust.App(f"fence-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1",
                    PartitionAssignor=TandemAssignor, web_enabled=False)  # fmt: skip
    declare_join(app, ["impressions", "clicks"], "cl")
    assignor: TandemAssignor = app.assignor  # type: ignore[assignment]
    # Fencing alone: without warm-ups a new member gets its balanced share in this round
    # (with them, its share would wait for warm-ups: tests/test_faust_warmups.py).
    assignor.settings = dataclasses.replace(assignor.settings, warmups=False)
    return assignor


def _member(epoch: int, partitions: list[int], name: str) -> ConsumerProtocolMemberMetadata:
    sub = Subscription(epoch=epoch, url=f"http://{name}:6066", host=name,
                       previous_active={t: partitions for t in JOIN})  # fmt: skip
    return ConsumerProtocolMemberMetadata(wire.VERSION, JOIN, wire.encode_subscription(sub))


def _plan(zombie_epoch: int) -> tuple[dict[str, set[int]], wire.RebalanceStats]:
    """Each member's join partitions, and the group's stats as the leader sent them."""
    leader = _leader()
    members = {m: _member(5, p, m) for m, p in OWNED.items()}
    members["zombie"] = _member(zombie_epoch, list(range(N)), "zombie")
    out = leader.assign(_Cluster(), members)
    actives: dict[str, set[int]] = {}
    stats = None
    for member, assignment in out.items():
        by_topic = {t: set(p) for t, p in assignment.assignment}
        # Co-partitioned on the wire: both inputs and the changelog, the same partitions.
        assert by_topic.get("impressions", set()) == by_topic.get("clicks", set())
        actives[member] = by_topic.get("impressions", set())
        decoded = wire.decode_assignment(assignment.user_data)
        assert decoded.epoch > max(5, zombie_epoch), "the new generation's epoch is above all"
        stats = decoded.stats
    every = sorted(p for ps in actives.values() for p in ps)
    assert every == list(range(N)), f"a partition owned twice or not at all: {actives}"
    assert stats is not None
    return actives, stats


def test_stale_zombie_claims_are_fenced(caplog: pytest.LogCaptureFixture) -> None:
    actives, stats = _plan(zombie_epoch=2)
    # Balance gives the zombie at most 2 of 6 (4 members), as to any new member; every
    # other partition stays with the owner whose epoch is current.
    assert 1 <= len(actives["zombie"]) <= 2
    for member, partitions in OWNED.items():
        assert actives[member] <= set(partitions), f"{member} got another's partition: {actives}"
    assert stats.kept == N - len(actives["zombie"]), stats
    assert "zombie wins" not in caplog.text and "claimed by" in caplog.text


def test_the_epoch_decides_not_the_claim(caplog: pytest.LogCaptureFixture) -> None:
    """Control: the very same claims with a newer epoch win over the owners'."""
    actives, stats = _plan(zombie_epoch=9)
    assert "zombie wins" in caplog.text
    assert stats.kept == len(actives["zombie"]) == 2, (stats, actives)


def test_a_tie_at_the_top_voids_the_contested_claims() -> None:
    """A zombie that forged the owners' epoch does not win by its claim: a tie voids it."""
    actives, stats = _plan(zombie_epoch=5)
    assert len(actives["zombie"]) <= 2
    assert stats.kept == 0, stats
