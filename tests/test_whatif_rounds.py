"""The what-if (assignor/whatif.py) against what the leader really plans (issue 38, item 6).

A group of real Tandem assignors in process (each its own Faust app, as in a worker): every
round, each member's own `subscription()` goes through the wire to the leader's `assign`,
and each member adopts its part of the leader's answer. The what-if reads the group as the
workers' views describe it (the member's subscription and the planner settings of
tables/web/view.py) before the change; its prediction of every round, the change's and the
ones that follow on their own (probing rebalances for warm-ups, cooperative follow-ups), must
be the leader's plan of that round: actives, standbys and warm-ups of every worker.

The demo's group (app/demo.py): three workers on host-a, host-b, host-a, 6 partitions,
standby replicas 1, warm-ups on; the demo kills the first worker.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import wire
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join
from assignor.whatif import Change, Step, WhatIfError, predict, read_group, scenario_of
from tables.web.view import _planner

INPUTS = ["clicks", "impressions"]
CHANGELOG = "ad-join-changelog"
TOPICS = sorted([*INPUTS, CHANGELOG])
PARTITIONS = 6
END = 500  # each changelog partition's end offset (the next offset to be written)


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(PARTITIONS)) if topic in TOPICS else None


class Worker:
    """One worker's assignor, and the changelog offsets its disk holds."""

    def __init__(
        self, name: str, host: str, rack: str, member_id: str, warmups: bool = True, protocol: str = "eager"
    ) -> None:
        self.name, self.member_id = name, member_id
        self.app = faust.App("whatif-rounds", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor,
                             web_enabled=False, canonical_url=f"http://{name}:6066")  # fmt: skip
        declare_join(self.app, INPUTS, CHANGELOG)
        self.assignor: TandemAssignor = self.app.assignor  # type: ignore[assignment]
        settings = self.assignor.settings
        self.assignor.settings = dataclasses.replace(
            settings, host=host, rack=rack, standby_replicas=1, warmups=warmups, acceptable_recovery_lag=50,
            rebalance_protocol=protocol,
        )  # fmt: skip
        self.offsets: dict[int, int] = {}  # partition -> the last changelog offset on disk
        self.assignor.local_offsets.append(lambda: {CHANGELOG: dict(self.offsets)} if self.offsets else {})

    def held(self) -> dict[str, list[int]]:
        """Actives, standbys and warm-ups of the join's changelog, as the member holds them."""
        a = self.assignor
        return {
            "active": a.actives().get(CHANGELOG, []),
            "standby": a.standbys().get(CHANGELOG, []),
            "warmup": a.warmups().get(CHANGELOG, []),
        }

    def catch_up(self, everything: bool) -> None:
        """Tail to the changelog's end: what it runs, and (`everything`) its replicas too; a
        replica given in the last round has not caught up yet otherwise."""
        before = set(self.offsets)
        for kind, partitions in self.held().items():
            for p in partitions:
                if kind == "active" or everything or p in before:
                    self.offsets[p] = END - 1

    def view(self) -> dict[str, Any]:
        """The parts of the worker's /tandem/ view the what-if reads (tables/web/view.py)."""
        state = self.assignor.subscription()
        member = {
            "id": self.member_id,
            "topics": INPUTS,
            "epoch": state.epoch,
            "url": state.url,
            "host": state.host,
            "rack": state.rack,
            "capacity": state.capacity,
            "previous_active": state.previous_active,
            "previous_standby": state.previous_standby,
            "local_offsets": {t: {str(p): o for p, o in by.items()} for t, by in state.local_offsets.items()},
        }
        joins = {"ad-join": {"changelog": CHANGELOG}}
        return {"worker": self.name, "joins": joins, "planner": _planner(self.app), "member": member}


def snapshot(workers: list[Worker], protocol: str | None) -> dict[str, Any]:
    """The group.json the what-if reads from any worker."""
    views = []
    for w in workers:
        view = w.view()
        if protocol is not None:
            view["planner"]["protocol"] = protocol
        views.append({"url": f"http://{w.name}:6066", "ok": True, "view": view})
    groups = [{"topics": TOPICS, "partitions": PARTITIONS, "owners": []}]
    return {"workers": views, "routing": {"epoch": 1, "urls": [], "groups": groups}}


def rebalance(workers: list[Worker]) -> dict[str, dict[str, list[int]]]:
    """One round: every member's subscription to the leader (the first), the leader's answer to
    every member. Members that announce cooperative rounds (TANDEM_REBALANCE_PROTOCOL) get them
    from the leader's own `assign`; a member that revokes releases at once, as its group
    coordinator does before asking for the follow-up (assignor/faust_adapter/cooperative.py)."""
    leader = workers[0].assignor
    metadata = {
        w.member_id: ConsumerProtocolMemberMetadata(
            w.assignor.version, INPUTS, wire.encode_subscription(w.assignor.subscription())
        )
        for w in workers
    }
    leader._end_offsets = {CHANGELOG: dict.fromkeys(range(PARTITIONS), END)}  # the broker's answer
    answers = leader.assign(_Cluster(), metadata)
    for w in workers:
        w.assignor.on_assignment(answers[w.member_id])
        w.assignor.released()
    return {w.name: w.held() for w in workers}


def predicted(step: Step, workers: list[Worker]) -> dict[str, dict[str, list[int]]]:
    """Each worker's actives, standbys and warm-ups of the changelog in the what-if's step."""
    found = {}
    for w in workers:
        planned = step.planned_for(w.name)
        found[w.name] = {
            kind: planned.get(kind, {}).get(CHANGELOG, []) for kind in ("active", "standby", "warmup")
        }
    return found


def demo_group(protocol: str = "eager", warmups: bool = True) -> list[Worker]:
    """The demo's three workers, formed and settled: every replica at the changelog's end."""
    labels = [
        ("worker-1", "host-a", "rack-1"),
        ("worker-2", "host-b", "rack-2"),
        ("worker-3", "host-a", "rack-1"),
    ]
    workers = [
        Worker(name, host, rack, f"m{i}-{uuid.uuid4().hex[:6]}", warmups, protocol)
        for i, (name, host, rack) in enumerate(labels)
    ]
    for _ in range(4):  # forming, then probing rounds until no move is pending
        rebalance(workers)
        for w in workers:
            w.catch_up(everything=True)
    assert not any(w.held()["warmup"] for w in workers), "the group did not settle"
    return workers


def test_the_demo_takeover_is_predicted_with_its_warm_up_and_the_probing_rebalance() -> None:
    """The demo kills worker-1: its two partitions have their standbys on worker-2 (the only
    other host). The leader keeps both on worker-2, caught up, and gives worker-3 a warm-up
    for one of them (W2), which moves in the probing rebalance once it has caught up."""
    workers = demo_group()
    steps = predict(snapshot(workers, None), Change("leave", name="worker-1"))
    survivors = workers[1:]
    assert [s.round for s in steps] == ["change", "probing"], [s.title for s in steps]
    takeover = rebalance(survivors)
    assert predicted(steps[0], survivors) == takeover
    assert steps[0].pending_moves and any(held["warmup"] for held in takeover.values())
    assert steps[0].actives() == {w.name: w.held()["active"] for w in survivors}
    for w in survivors:
        w.catch_up(everything=True)  # the warm-up caught up: its worker asks for the probe
    probed = rebalance(survivors)
    assert predicted(steps[1], survivors) == probed
    assert not steps[1].pending_moves and not any(held["warmup"] for held in probed.values())
    assert sorted(len(held["active"]) for held in probed.values()) == [3, 3]


def test_a_worker_joins_with_a_warm_up_then_takes_its_partitions_in_the_probing_rebalances() -> None:
    workers = demo_group()
    steps = predict(snapshot(workers, None), Change("join", count=1, host="host-c", rack="rack-3"))
    # The new worker's Kafka member id sorts after the others', as the what-if assumes for it.
    workers.append(Worker("new-1", "host-c", "rack-3", "zz-new"))
    for i, step in enumerate(steps):
        assert predicted(step, workers) == rebalance(workers), (i, step.title)
        for w in workers:
            w.catch_up(everything=True)
    assert steps[0].pending_moves and not steps[-1].pending_moves
    assert len(steps[-1].actives()["new-1"]) >= 1


@pytest.mark.parametrize("warmups", [True, False])
def test_cooperative_a_worker_joins_revoked_first_then_assigned_in_the_follow_up(warmups: bool) -> None:
    """KIP-429: a round revokes what moves to the newcomer (nobody runs it in that round), the
    revoking members rejoin at once (the follow-up round, with the newcomer's new replicas not
    caught up yet) and the newcomer gets it there. With warm-ups the move waits for a warm-up
    first: the revoking round is the probing rebalance."""
    workers = demo_group("cooperative", warmups)
    steps = predict(snapshot(workers, "cooperative"), Change("join", count=1, host="host-c", rack="rack-3"))
    rounds = [s.round for s in steps]
    expected = ["change", "probing", "follow-up"] if warmups else ["change", "follow-up"]
    assert rounds[: len(expected)] == expected, [s.title for s in steps]
    workers.append(Worker("new-1", "host-c", "rack-3", "zz-new", warmups, "cooperative"))
    for i, step in enumerate(steps):
        got = rebalance(workers)
        assert predicted(step, workers) == got, (i, step.title)
        revoked = {m["partition"] for m in step.revoking}
        assert not revoked & {p for held in got.values() for p in held["active"]}  # no owner this round
        for w in workers:
            w.catch_up(everything=not step.follow_up)  # a follow-up comes at once
    revoking = next(s for s in steps if s.revoking)
    follow_up = steps[steps.index(revoking) + 1]
    for move in revoking.revoking:
        assert move["partition"] in follow_up.actives()[move["to"]]
    assert not steps[-1].follow_up and not steps[-1].pending_moves


@pytest.mark.parametrize("protocol", [None, "eager", "cooperative"])
def test_the_scenario_names_the_protocol_the_workers_report_and_nothing_when_they_do_not(
    protocol: str | None,
) -> None:
    """A named protocol breaks the planner's ties canonically (docs/planner.md): the what-if
    names it exactly when the workers' planner settings do, as the leader does."""
    scenario = scenario_of(read_group(snapshot(demo_group(), protocol)))
    assert scenario.get("protocol") == protocol
    assert scenario["changelog_end_offsets"] == {CHANGELOG: dict.fromkeys(range(PARTITIONS), END)}


def test_the_protocol_can_be_chosen_for_the_prediction() -> None:
    """`what-if --protocol cooperative` on a group whose workers name none: the cooperative
    rounds, as if the workers reported it; an unknown protocol is refused by name."""
    workers = demo_group()
    change = Change("join", count=1, host="host-c", rack="rack-3")
    chosen = predict(snapshot(workers, None), change, protocol="cooperative")
    reported = predict(snapshot(workers, "cooperative"), change)
    assert [s.as_dict() for s in chosen] == [s.as_dict() for s in reported]
    assert any(s.revoking for s in chosen)
    with pytest.raises(WhatIfError, match="unknown protocol 'sticky'"):
        predict(snapshot(workers, None), change, protocol="sticky")


def test_a_restart_is_predicted_round_by_round_its_worker_back_warm_from_its_disk() -> None:
    """worker-2 stops (its partitions to their standbys), then a new process comes back on its
    disk (a new member id, no history, the offsets it had): every predicted round is the
    leader's, and what it gets back is warm."""
    workers = demo_group()
    steps = predict(snapshot(workers, None), Change("restart", name="worker-2"))
    old = workers.pop(1)
    back = Worker("worker-2", "host-b", "rack-2", "zz-worker-2")  # sorts last, as the what-if assumes
    back.offsets = dict(old.offsets)  # the same data dir
    stopped = [s for s in steps if s.title.startswith("worker-2 stops")]
    assert len(stopped) == 1 and stopped[0] is steps[0]
    assert predicted(steps[0], workers) == rebalance(workers)
    for w in workers:
        w.catch_up(everything=False)  # it comes back before any new replica has caught up
    workers.append(back)
    for i, step in enumerate(steps[1:], 1):
        assert predicted(step, workers) == rebalance(workers), (i, step.title)
        for w in workers:
            w.catch_up(everything=True)
    returned = {m["worker"]: m for m in steps[1].as_dict()["joins"]["ad-join"]}["worker-2"]
    assert returned["actives_after"] and not returned["moved_cold"]
