"""Warm-ups in the adapter (issue 12): the wire format, the leader's planning inputs and the
end-offset lookup, in process with the real adapter and, for the lookup, the real broker.

The whole flow on real worker processes is tests/test_app_scale_out.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import wire
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join
from assignor.faust_adapter.probes import end_offsets
from assignor.faust_adapter.settings import SettingsError, TandemSettings
from assignor.group_scenario import Join, MemberInfo, Warmups, build_scenario
from assignor.wire import Assignment, RebalanceStats, Subscription
from tables.testing import EmbeddedBroker, create_topics

JOIN = ["impressions", "clicks", "cl"]
N = 4
END = 50_000


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(N)) if topic in JOIN else None


def _leader(**settings: object) -> TandemAssignor:
    app = faust.App(f"warm-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1",
                    PartitionAssignor=TandemAssignor, web_enabled=False)  # fmt: skip
    declare_join(app, ["impressions", "clicks"], "cl")
    assignor: TandemAssignor = app.assignor  # type: ignore[assignment]
    assignor.settings = dataclasses.replace(assignor.settings, **settings)  # type: ignore[arg-type]
    return assignor


def _member(
    name: str, owned: list[int], offsets: dict[int, int], version: int = wire.VERSION_WARMUPS
) -> ConsumerProtocolMemberMetadata:
    sub = Subscription(epoch=5 if owned else 0, url=f"http://{name}:6066", host=name,
                       previous_active={t: owned for t in JOIN} if owned else {},
                       local_offsets={"cl": offsets} if offsets else {})  # fmt: skip
    return ConsumerProtocolMemberMetadata(version, JOIN, wire.encode_subscription(sub))


def _group(newcomer_version: int = wire.VERSION_WARMUPS) -> dict[str, ConsumerProtocolMemberMetadata]:
    """Two caught-up owners of two partitions each, and an empty newcomer."""
    return {
        "a": _member("a", [0, 1], {p: END - 1 for p in range(N)}),
        "b": _member("b", [2, 3], {p: END - 1 for p in range(N)}),
        "new": _member("new", [], {}, newcomer_version),
    }


def _decoded(out: dict[str, object]) -> dict[str, Assignment]:
    return {m: wire.decode_assignment(a.user_data) for m, a in out.items()}  # type: ignore[attr-defined]


# -- the wire ------------------------------------------------------------------------------


def test_assignment_without_warmups_is_version_1_bytes() -> None:
    plain = Assignment(epoch=3, active={"t": [1]}, standby={"cl": [2]}, topic_groups=[["t"]])
    data = wire.encode_assignment(plain)
    assert data[2] == wire.VERSION == 1
    assert wire.decode_assignment(data) == plain


def test_warmups_round_trip_as_version_2() -> None:
    warm = Assignment(epoch=3, standby={"cl": [2]}, warmup={"cl": [0, 3]},
                      stats=RebalanceStats(tasks=4, kept=4, pending=2, warmups=2))  # fmt: skip
    data = wire.encode_assignment(warm)
    assert data[2] == wire.VERSION_WARMUPS
    assert wire.decode_assignment(data) == warm


def test_a_version_1_reader_gets_warmups_as_standbys_in_version_1_bytes() -> None:
    warm = Assignment(epoch=3, standby={"cl": [2]}, warmup={"cl": [0, 3]},
                      stats=RebalanceStats(tasks=4, kept=4, pending=2, warmups=2))  # fmt: skip
    old = wire.for_reader(warm, wire.VERSION)
    data = wire.encode_assignment(old)
    assert data[2] == wire.VERSION
    # What a version-1 worker's reader accepts (it refuses any other version).
    reader = wire._Reader(data, wire.KIND_ASSIGNMENT, (wire.VERSION,))
    assert reader.version == 1
    assert wire.decode_assignment(data).standby == {"cl": [0, 2, 3]} and not old.warmup
    assert wire.for_reader(warm, wire.VERSION_WARMUPS) is warm


def test_subscriptions_stay_version_1_and_refuse_version_2() -> None:
    data = bytearray(wire.encode_subscription(Subscription(epoch=1)))
    assert data[2] == wire.VERSION
    data[2] = wire.VERSION_WARMUPS
    with pytest.raises(wire.WireError, match="version"):
        wire.decode_subscription(bytes(data))


# -- the leader --------------------------------------------------------------------------------


def test_a_newcomer_gets_warmups_not_cold_actives() -> None:
    leader = _leader(acceptable_recovery_lag=100, max_warmup_replicas=2)
    leader._end_offsets = {"cl": {p: END for p in range(N)}}
    got = _decoded(leader.assign(_Cluster(), _group()))
    assert not got["new"].active, "a cold move happened while caught-up owners exist"
    assert got["a"].active["impressions"] == [0, 1] and got["b"].active["impressions"] == [2, 3]
    assert len(got["new"].warmup.get("cl", [])) >= 1
    assert got["new"].stats.pending >= 1 and got["new"].stats.warmups == len(got["new"].warmup["cl"])
    assert not set(got["new"].warmup["cl"]) & set(got["new"].standby.get("cl", []))
    assert leader._end_offsets == {}, "end offsets are for one round only"


def test_a_newcomer_that_cannot_read_warmups_tails_them_as_standbys() -> None:
    leader = _leader(acceptable_recovery_lag=100, max_warmup_replicas=2)
    out = leader.assign(_Cluster(), _group(newcomer_version=wire.VERSION))
    new = out["new"]
    assert new.user_data[2] == wire.VERSION  # type: ignore[attr-defined]
    decoded = wire.decode_assignment(new.user_data)  # type: ignore[attr-defined]
    assert not decoded.warmup and decoded.standby.get("cl")


def test_caught_up_warmup_moves_the_task() -> None:
    """The newcomer reports its warm-ups (as standbys, with offsets at the end): they move."""
    leader = _leader(acceptable_recovery_lag=100, max_warmup_replicas=2)
    first = _decoded(leader.assign(_Cluster(), _group()))["new"]
    warmed = first.warmup["cl"]
    sub = Subscription(epoch=first.epoch, url="http://new:6066", host="new",
                       previous_standby={"cl": sorted(set(warmed) | set(first.standby.get("cl", [])))},
                       local_offsets={"cl": {p: END - 1 for p in warmed}})  # fmt: skip
    group = _group()
    group["new"] = ConsumerProtocolMemberMetadata(wire.VERSION_WARMUPS, JOIN, wire.encode_subscription(sub))
    for name in ("a", "b"):  # the owners now hold the epoch the first round gave them
        owned = [0, 1] if name == "a" else [2, 3]
        state = Subscription(epoch=first.epoch, url=f"http://{name}:6066", host=name,
                             previous_active={t: owned for t in JOIN},
                             local_offsets={"cl": {p: END - 1 for p in range(N)}})  # fmt: skip
        data = wire.encode_subscription(state)
        group[name] = ConsumerProtocolMemberMetadata(wire.VERSION_WARMUPS, JOIN, data)
    leader._end_offsets = {"cl": {p: END for p in range(N)}}
    second = _decoded(leader.assign(_Cluster(), group))
    assert set(warmed) <= set(second["new"].active.get("impressions", [])), second["new"]


def test_warmups_off_plans_as_before() -> None:
    members = {
        m: MemberInfo(frozenset(JOIN), wire.decode_subscription(md.user_data)) for m, md in _group().items()
    }
    counts = dict.fromkeys(JOIN, N)
    off = build_scenario(members, counts, [JOIN], {"cl"}, 1, [Join(("impressions", "clicks"), "cl")], 100)
    assert not {"acceptable_recovery_lag", "max_warmup_replicas", "changelog_end_offsets"} & set(off)
    on = build_scenario(members, counts, [JOIN], {"cl"}, 1, [], 100, Warmups(100, 2, {"cl": {0: END}}))
    assert on["acceptable_recovery_lag"] == 100 and on["max_warmup_replicas"] == 2
    assert on["changelog_end_offsets"] == {"cl": {0: END}}


def test_member_reports_warmups_as_previous_standbys() -> None:
    member = _leader()
    member._adopt(Assignment(epoch=7, standby={"cl": [1]}, warmup={"cl": [3]}), "faust")
    assert member.subscription().previous_standby == {"cl": [1, 3]}
    assert member.standbys() == {"cl": [1]} and member.warmups() == {"cl": [3]}
    assert {tp.partition for tp in member.assigned_standbys()} == {1, 3}


def test_settings_from_env() -> None:
    env = {"TANDEM_WARMUPS": "0", "TANDEM_MAX_WARMUP_REPLICAS": "5",
           "TANDEM_PROBING_REBALANCE_INTERVAL_S": "2.5", "TANDEM_END_OFFSETS_TIMEOUT_MS": "300"}  # fmt: skip
    s = TandemSettings.from_env(env)
    assert (s.warmups, s.max_warmup_replicas, s.probing_rebalance_interval_s, s.end_offsets_timeout_ms) == (
        False, 5, 2.5, 300,
    )  # fmt: skip
    d = TandemSettings.from_env({})
    assert (d.warmups, d.acceptable_recovery_lag, d.max_warmup_replicas, d.probing_rebalance_interval_s) == (
        True, 10_000, 2, 600.0,
    )  # fmt: skip
    with pytest.raises(SettingsError):
        TandemSettings.from_env({"TANDEM_MAX_WARMUP_REPLICAS": "-1"})


# -- the end-offset lookup ------------------------------------------------------------------


def test_a_failed_lookup_degrades_to_no_end_offsets_in_bounded_time() -> None:
    leader = _leader(end_offsets_timeout_ms=500)  # its broker, 127.0.0.1:1, never answers

    async def run() -> float:
        started = time.monotonic()
        await leader.prepare_assignment()
        return time.monotonic() - started

    assert asyncio.run(run()) < 2.0
    assert leader._end_offsets == {}


@pytest.mark.broker
def test_end_offsets_from_fetch_responses_are_exact(broker: EmbeddedBroker, unique: str) -> None:
    """The embedded broker's ListOffsets is short when a batch holds several records: the
    lookup the leader uses reads the fetch response's high watermark instead."""
    topic = f"{unique}-cl"
    sent = {0: 1000, 1: 0, 2: 37}

    async def run() -> dict[str, dict[int, int]]:
        await create_topics(broker.bootstrap, {topic: 3})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
        await producer.start()
        try:
            for partition, count in sent.items():
                for i in range(count):
                    await producer.send(topic, f"v{i}".encode(), key=b"k", partition=partition)
            await producer.flush()
        finally:
            await producer.stop()
        return await end_offsets([broker.bootstrap], {topic, f"{unique}-none"}, True, 10.0)

    assert asyncio.run(run()) == {topic: sent}


@pytest.mark.broker
def test_the_last_leader_looks_up_end_offsets_while_it_joins(broker: EmbeddedBroker, unique: str) -> None:
    """join_starting() starts the lookup (the broker holds the JoinGroup meanwhile) and
    prepare_assignment() hands its result to the round's plan."""
    changelog = f"{unique}-join-changelog"
    app = faust.App(f"warm-{unique}", broker=f"kafka://{broker.bootstrap}",
                    PartitionAssignor=TandemAssignor, web_enabled=False)  # fmt: skip
    declare_join(app, [f"{unique}-a", f"{unique}-b"], changelog)
    leader: TandemAssignor = app.assignor  # type: ignore[assignment]
    leader.settings = dataclasses.replace(leader.settings, fetch_high_watermarks=True)
    leader._epoch = leader._led_epoch = 3  # it planned the last round

    async def run() -> dict[str, dict[int, int]]:
        await create_topics(broker.bootstrap, {changelog: 2})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20)
        await producer.start()
        try:
            for i in range(25):
                await producer.send(changelog, b"v", key=b"k", partition=i % 2)
            await producer.flush()
        finally:
            await producer.stop()
        leader.join_starting()
        assert leader._lookup is not None, "the last leader starts the lookup with its JoinGroup"
        await leader.prepare_assignment()
        return leader._end_offsets

    assert asyncio.run(run()) == {changelog: {0: 13, 1: 12}}
