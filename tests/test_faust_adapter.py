"""The Faust adapter's translation, in process: Faust/Kafka state <-> scenario <-> plan."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import uuid
import zlib
from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.exceptions import ImproperlyConfigured
from faust.types import TP
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignor import wire
from assignor.faust_adapter.group_consumer import TandemConsumer, TandemConsumerThread, install_consumer
from assignor.faust_adapter.partition_assignor import (
    STOCK_KEY,
    RoutingUnavailable,
    TandemAssignor,
    declare_join,
    install,
    tandem,
)
from assignor.faust_adapter.settings import SettingsError, TandemSettings
from assignor.group_scenario import (
    CopartitionError,
    Join,
    MemberInfo,
    build_scenario,
    copartition_groups,
    fresh_offsets,
    kafka_partitions,
    verify_copartitioned,
)

IMP, CLK, CHANGELOG = "impressions", "clicks", "ads-joins-changelog"
COUNTS = {IMP: 4, CLK: 4, "audit": 3}


class Cluster:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.counts[topic])) if topic in self.counts else None


def make_app(port: int = 6066, **conf: Any) -> faust.App:
    app = faust.App(
        f"adapter-{uuid.uuid4().hex[:8]}",
        broker="kafka://127.0.0.1:1",
        PartitionAssignor=TandemAssignor,
        web_port=port,
        web_enabled=False,
        **conf,
    )
    declare_join(app, [IMP, CLK], CHANGELOG)
    return app


def metadata(assignor: TandemAssignor, topics: tuple[str, ...] = (IMP, CLK)) -> Any:
    return assignor.metadata(set(topics))


def plan_round(
    leader: TandemAssignor, members: dict[str, TandemAssignor], counts: dict[str, int] = COUNTS
) -> dict[str, ConsumerProtocolMemberAssignment]:
    """One generation: every member subscribes, the leader assigns, everyone adopts."""
    out = leader.assign(Cluster(counts), {m: metadata(a) for m, a in members.items()})
    for member, assignor in members.items():
        assignor.on_assignment(out[member])
    return out


# ---------------------------------------------------------------- settings


def test_settings_defaults_env_and_overrides() -> None:
    default = TandemSettings.from_env({})
    assert default.standby_replicas == 1 and default.capacity == 1.0 and default.rack == ""
    assert default.host  # this machine's name
    env = {
        "TANDEM_STANDBY_REPLICAS": "2",
        "TANDEM_RACK": "eu-1a",
        "TANDEM_CAPACITY": "2.5",
        "TANDEM_HOST": "node-a",
        "TANDEM_ACCEPTABLE_RECOVERY_LAG": "50",
    }
    configured = TandemSettings.from_env(env, defaults={"standby_replicas": 0})
    assert configured == TandemSettings(2, "node-a", "eu-1a", 2.5, 50)
    assert TandemSettings.from_env(env, rack="eu-1b").rack == "eu-1b"
    assert TandemSettings.from_env({}, defaults={"standby_replicas": 0}).standby_replicas == 0


@pytest.mark.parametrize(
    "env",
    [
        {"TANDEM_STANDBY_REPLICAS": "two"},
        {"TANDEM_CAPACITY": "0"},
        {"TANDEM_CAPACITY": "nan"},
        {"TANDEM_ACCEPTABLE_RECOVERY_LAG": "-1"},
    ],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        TandemSettings.from_env(env)


def test_the_app_setting_and_environment_reach_the_assignor(monkeypatch: Any) -> None:
    monkeypatch.setenv("TANDEM_RACK", "rack-9")
    app = make_app(table_standby_replicas=2)
    assert tandem(app).settings.standby_replicas == 2 and tandem(app).settings.rack == "rack-9"


def test_a_stock_app_is_refused() -> None:
    app = faust.App(f"stock-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1")
    with pytest.raises(ImproperlyConfigured, match="PartitionAssignor"):
        tandem(app)


def test_install_offers_tandem_first_then_stock() -> None:
    app = make_app()
    assignor = install(app, local_offsets=lambda: {CHANGELOG: {1: 5}})
    assert issubclass(app.transport.Consumer, TandemConsumer)
    assert [p.name for p in assignor.protocols()] == ["tandem", "faust"]
    assert assignor.subscription().local_offsets == {CHANGELOG: {1: 5}}


def test_local_offsets_of_the_wrong_shape_are_refused_at_install() -> None:
    """{partition: offset} (what a single state's local_offsets() returns) used to be taken
    silently and then ignored at every JoinGroup: no warm placement after a restart."""
    app = make_app()
    with pytest.raises(TypeError, match="changelog topic -> partition -> offset"):
        install(app, local_offsets=lambda: {0: 5, 1: 7})
    with pytest.raises(TypeError, match="changelog topic -> partition -> offset"):
        install(app, local_offsets=lambda: [(CHANGELOG, 0, 5)])


def test_the_routing_error_names_the_function_where_it_lives() -> None:
    from assignor.faust_adapter import routing as faust_routing
    from assignor.faust_adapter.routing import RoutingUnavailable

    app = make_app()
    assignor = install(app)
    with pytest.raises(RoutingUnavailable, match="assignor.faust_adapter.routing.fetch_routing") as caught:
        assignor._owner_url(TP("elsewhere", 0))
    assert "fetch_routing" in dir(faust_routing) and "faust_adapter.fetch_routing" not in str(caught.value)


# ---------------------------------------------------------------- pure translation


def test_copartition_groups_declared_then_tables_then_lone() -> None:
    joins = [Join((IMP, CLK), CHANGELOG)]
    counts = {IMP: 4, CLK: 4, CHANGELOG: 4, "orders": 6, "orders-table-changelog": 6, "audit": 3}
    subs = [frozenset({IMP, CLK, "orders", "orders-table-changelog", "audit"})]
    groups = copartition_groups(joins, counts, {"orders-table-changelog"}, subs)
    assert groups == [
        sorted([CHANGELOG, CLK, IMP]),
        ["orders", "orders-table-changelog"],
        ["audit"],
    ]


def test_scenario_members_host_the_changelog_of_joins_they_consume() -> None:
    joins = [Join((IMP, CLK), CHANGELOG)]
    members = {
        "a": MemberInfo(frozenset({IMP, CLK}), wire.Subscription(epoch=3, host="h1", rack="r1")),
        "b": MemberInfo(frozenset({"audit"}), wire.NO_HISTORY),
    }
    counts = {IMP: 4, CLK: 4, CHANGELOG: 4, "audit": 3}
    groups = copartition_groups(joins, counts, set(), [m.subscription for m in members.values()])
    scenario = build_scenario(members, counts, groups, {CHANGELOG}, 1, joins)
    assert scenario["members"]["a"]["topics"] == sorted([IMP, CLK, CHANGELOG])
    assert scenario["members"]["a"]["epoch"] == 3 and scenario["members"]["a"]["rack"] == "r1"
    assert scenario["members"]["b"]["topics"] == ["audit"] and "host" not in scenario["members"]["b"]
    assert scenario["copartition_groups"] == [sorted([IMP, CLK, CHANGELOG])]
    assert scenario["changelog_topics"] == [CHANGELOG]


def test_stale_local_state_is_not_warm() -> None:
    def info(offsets: dict[int, int]) -> MemberInfo:
        return MemberInfo(frozenset(), wire.Subscription(local_offsets={CHANGELOG: offsets}))

    members = {"fresh": info({0: 1_000_000, 1: 10}), "stale": info({0: 10, 1: 10})}
    kept = fresh_offsets(members, acceptable_lag=1000)
    assert kept["fresh"] == {CHANGELOG: {0: 1_000_000, 1: 10}}
    assert kept["stale"] == {CHANGELOG: {1: 10}}


def test_the_consumer_fetches_subscribed_actives_and_table_standbys_only() -> None:
    own = wire.Assignment(
        active={IMP: [0], CLK: [0], CHANGELOG: [0], "t-changelog": [1]},
        standby={CHANGELOG: [2], "t-changelog": [3]},
    )
    subscription = frozenset({IMP, CLK, "t-changelog"})
    assert kafka_partitions(own, subscription, {"t-changelog"}) == [
        (CLK, [0]),
        (IMP, [0]),
        ("t-changelog", [1, 3]),
    ]


def test_mismatched_join_names_topics_and_counts() -> None:
    joins = [Join((IMP, CLK), CHANGELOG)]
    verify_copartitioned(joins, {IMP: 4, CLK: 4})  # a changelog not created yet is fine
    with pytest.raises(CopartitionError, match=f"{CLK}=3, {IMP}=4"):
        verify_copartitioned(joins, {IMP: 4, CLK: 3, CHANGELOG: 4})


# ---------------------------------------------------------------- the assignor, in process


def test_faust_internals_see_the_plan() -> None:
    apps = {m: make_app(port) for m, port in (("m1", 7001), ("m2", 7002))}
    members = {m: tandem(app) for m, app in apps.items()}
    out = plan_round(members["m1"], members)
    a1, a2 = members["m1"], members["m2"]
    # Co-partitioned on the wire: both inputs, same partitions; the changelog is not fetched.
    wire_tps = dict(out["m1"].assignment)
    assert set(wire_tps) == {IMP, CLK} and wire_tps[IMP] == wire_tps[CLK]
    assert a1.actives()[CHANGELOG] == wire_tps[IMP]
    assert a1.standbys() == {CHANGELOG: a2.actives()[CHANGELOG]}
    assert {tp.partition for tp in a1.assigned_actives() if tp.topic == IMP} == set(wire_tps[IMP])
    assert a1.is_standby(TP(CHANGELOG, a2.actives()[CHANGELOG][0]))
    assert a1.is_active(TP(IMP, wire_tps[IMP][0]))
    assert a1.group_for_topic(IMP) == a1.group_for_topic(CHANGELOG)
    assert a1.group_for_topic("output-topic") >= 0  # stock raises KeyError here
    info = a1.last_rebalance
    assert info is not None and info.protocol == "tandem" and info.epoch == 1
    assert info.stats.tasks == 4 and info.stats.moved_cold + info.stats.moved_warm == 4


def test_epoch_and_previous_assignment_go_back_in_the_next_subscription() -> None:
    members = {m: tandem(make_app(port)) for m, port in (("m1", 7001), ("m2", 7002))}
    plan_round(members["m1"], members)
    sub = members["m2"].subscription()
    assert sub.epoch == 1 and sub.previous_active == members["m2"].actives()
    assert sub.previous_standby == members["m2"].standbys()
    out = plan_round(members["m1"], members)  # a second generation keeps everything
    info = members["m1"].last_rebalance
    assert info is not None and info.epoch == 2 and info.stats.kept == 4
    assert wire.decode_assignment(out["m2"].user_data).epoch == 2


def test_a_restarted_worker_is_recognised_by_its_local_state() -> None:
    members = {m: tandem(make_app(port)) for m, port in (("m1", 7001), ("m2", 7002))}
    plan_round(members["m1"], members)
    held = members["m2"].actives()[CHANGELOG]
    # m2 restarts: epoch 0, no previous assignment, but its RocksDB state is on disk.
    restarted = tandem(make_app(7002))
    restarted.local_offsets = [lambda: {CHANGELOG: {p: 1000 for p in held}}]
    assert restarted.subscription().epoch == 0 and not restarted.subscription().previous_active
    members["m2"] = restarted
    del members["m1"]  # and m1 is gone meanwhile: m2 takes everything
    plan_round(restarted, members)
    info = restarted.last_rebalance
    assert info is not None and info.stats.moved_warm >= len(held)


def test_unreadable_member_data_means_no_history_and_the_leader_survives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leader = tandem(make_app(7001))
    good = metadata(leader)
    bad = ConsumerProtocolMemberMetadata(1, [IMP, CLK], b"\x00not ours at all")
    with caplog.at_level(logging.WARNING):
        out = leader.assign(Cluster(COUNTS), {"good": good, "bad": bad})
    assert "bad" in caplog.text and "no history" in caplog.text
    assert dict(out["bad"].assignment) and dict(out["good"].assignment)


def test_unsubscribed_partition_counts_and_unknown_topics() -> None:
    leader = tandem(make_app(7001))
    md = metadata(leader, (IMP, CLK, "not-created-yet"))
    out = leader.assign(Cluster(COUNTS), {"m": md})
    assert {t for t, _ in out["m"].assignment} == {IMP, CLK}


def test_key_store_own_partitions_then_the_routing_table() -> None:
    apps = {m: make_app(port) for m, port in (("m1", 7001), ("m2", 7002))}
    members = {m: tandem(app) for m, app in apps.items()}
    plan_round(members["m1"], members)
    follower = members["m2"]
    own = follower.actives()[IMP][0]
    other = members["m1"].actives()[IMP][0]
    assert follower._owner_url(TP(IMP, own)).port == 7002
    with pytest.raises(RoutingUnavailable):
        follower._owner_url(TP(IMP, other))
    follower.set_routing(members["m1"].routing)  # what fetch_routing does
    assert follower._owner_url(TP(IMP, other)).port == 7001
    tables = follower.external_topics_metadata()
    assert sorted(p for tps in tables.values() for p in tps.get(IMP, [])) == [0, 1, 2, 3]


# ---------------------------------------------------------------- the stock protocol


def _stock_member_metadata(url: str) -> ConsumerProtocolMemberMetadata:
    body = {"assignment": {"actives": {}, "standbys": {}}, "url": url, "changelog_distribution": {}}
    return ConsumerProtocolMemberMetadata(4, [IMP, CLK], json.dumps(body).encode())


def test_mixed_group_uses_stock_faust_placement() -> None:
    ours = tandem(make_app(7001))
    mixed = {
        "tandem": ours.stock.metadata({IMP, CLK}),
        "stock": _stock_member_metadata("http://stock:6066"),
    }
    out = ours.stock.assign(Cluster(COUNTS), mixed)
    assert not wire.is_tandem(out["stock"].user_data)
    json.loads(zlib.decompress(out["stock"].user_data))  # what a stock worker reads
    ours.stock.on_assignment(out["tandem"])
    info = ours.last_rebalance
    assert info is not None and info.protocol == "faust"
    assert ours.subscription().previous_active == {t: sorted(p) for t, p in out["tandem"].assignment}


def test_all_tandem_under_the_faust_name_plans_with_tandem() -> None:
    members = {m: tandem(make_app(port)) for m, port in (("m1", 7001), ("m2", 7002))}
    md = {m: a.stock.metadata({IMP, CLK}) for m, a in members.items()}
    hidden = json.loads(md["m1"].user_data)[STOCK_KEY]
    assert wire.decode_subscription(base64.b64decode(hidden)).url.endswith(":7001")
    out = members["m1"].stock.assign(Cluster(COUNTS), md)
    members["m2"].stock.on_assignment(out["m2"])
    info = members["m2"].last_rebalance
    assert info is not None and info.protocol == "tandem" and info.epoch == 1


def test_global_tables_are_read_everywhere_and_tables_get_standbys() -> None:
    apps = {m: make_app(port) for m, port in (("m1", 7001), ("m2", 7002))}
    for app in apps.values():
        app.GlobalTable("settings", default=int, partitions=2)
        app.Table("counts", default=int, partitions=4)
    members = {m: tandem(app) for m, app in apps.items()}
    glob = f"{apps['m1'].conf.id}-settings-changelog"
    counts_changelog = f"{apps['m1'].conf.id}-counts-changelog"
    topics = (IMP, CLK, glob, counts_changelog)
    md = {m: a.metadata(set(topics)) for m, a in members.items()}
    out = members["m1"].assign(Cluster({**COUNTS, glob: 2, counts_changelog: 4}), md)
    for member in members:
        fetched = dict(out[member].assignment)
        assert fetched[glob] == [0, 1]
        # A Faust table's standby is replayed by Faust's consumer, so it is fetched.
        own = wire.decode_assignment(out[member].user_data)
        assert set(fetched[counts_changelog]) == set(
            own.active[counts_changelog] + own.standby[counts_changelog]
        )


async def test_fetch_routing_from_the_leader_over_http() -> None:
    from aiohttp import web

    from assignor.faust_adapter.routing import ROUTING_PATH, fetch_routing

    members = {m: tandem(make_app(port)) for m, port in (("m1", 7001), ("m2", 7002))}
    plan_round(members["m1"], members)
    table = members["m1"].routing
    assert table is not None

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=wire.encode_routing(table))

    server = web.Application()
    server.router.add_get(ROUTING_PATH, serve)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        follower = members["m2"]
        follower._own = wire.Assignment(
            epoch=table.epoch, active=follower.actives(), leader_url=f"http://127.0.0.1:{port}"
        )
        assert await fetch_routing(follower, timeout=5) == table
        assert follower.routing == table
    finally:
        await runner.cleanup()


@given(
    st.integers(1, 5),
    st.lists(st.integers(0, 4), max_size=12),
    st.booleans(),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_group_gets_a_valid_co_partitioned_kafka_assignment(
    size: int, history: list[int], garbage: bool
) -> None:
    """Whatever the members claim, the consumers together fetch each input partition once."""
    counts = {IMP: 6, CLK: 6}
    leader = tandem(make_app(7001))
    md = {}
    for i in range(size):
        held = [p for p, owner in enumerate(history[:6]) if owner == i]
        sub = wire.Subscription(
            epoch=1, url=f"http://w{i}:1", host=f"h{i % 2}", previous_active={IMP: held, CLK: held}
        )
        data = b"\xffjunk" if garbage and i == 0 else wire.encode_subscription(sub)
        md[f"m{i}"] = ConsumerProtocolMemberMetadata(1, [IMP, CLK], data)
    out = leader.assign(Cluster(counts), md)
    seen: dict[str, list[int]] = {IMP: [], CLK: []}
    for assignment in out.values():
        fetched = dict(assignment.assignment)
        assert fetched.get(IMP, []) == fetched.get(CLK, [])
        for topic, partitions in fetched.items():
            seen[topic] += partitions
    assert sorted(seen[IMP]) == sorted(seen[CLK]) == list(range(6))


def test_the_collector_is_paused_while_the_leader_assigns(monkeypatch: Any) -> None:
    """Decoding and encoding every member's data runs without cyclic collections."""
    import gc

    from assignor.faust_adapter import partition_assignor as faust_adapter

    seen: list[bool] = []
    real = faust_adapter.wire.read_subscription

    def spy(data: bytes | None, member: str, limits: Any = None) -> Any:
        seen.append(gc.isenabled())
        return real(data, member, limits)

    monkeypatch.setattr(faust_adapter.wire, "read_subscription", spy)
    apps = {m: make_app() for m in ("w1", "w2")}
    members = {m: tandem(app) for m, app in apps.items()}
    assert gc.isenabled()
    plan_round(members["w1"], members)
    assert seen == [False, False] and gc.isenabled()
    assert members["w1"].actives() or members["w2"].actives()


def test_tandem_refuses_to_start_on_internals_it_was_not_written_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patches of private Faust/aiokafka internals are pinned: another version, or an internal
    that is gone, stops Tandem at install with what is wrong, not later mid-rebalance."""
    from faust.transport.consumer import Consumer as FaustConsumer

    from assignor.internals import PINNED, IncompatibleInternals, check

    check()  # the pinned versions are what is installed
    monkeypatch.setitem(PINNED, "aiokafka", "0.13.0")
    with pytest.raises(IncompatibleInternals, match=r"aiokafka 0\.14\.0 is installed.*0\.13\.0"):
        install(make_app())
    monkeypatch.setitem(PINNED, "aiokafka", "0.14.0")
    monkeypatch.delattr(FaustConsumer, "_new_offset")
    with pytest.raises(IncompatibleInternals, match="Consumer._new_offset is missing"):
        check()


@pytest.mark.parametrize("joins", [False, True], ids=["assignor alone", "with the join runtime"])
def test_faust_warning_about_a_revoked_partitions_seek_is_kept_at_debug(
    joins: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's fetcher warns when it cannot seek a partition a rebalance revoked meanwhile
    (harmless: nothing to seek); Tandem's consumer keeps that at DEBUG, and its other
    warnings as they are: the assignor's consumer alone, and the join runtime's built on it."""
    from tables.kafka.consumer import take_records

    app = faust.App(f"seek-{uuid.uuid4().hex[:6]}", broker="kafka://127.0.0.1:1", producer_threaded=False)
    if joins:
        take_records(app, object())  # type: ignore[arg-type]  # no record is fetched here
    install_consumer(app)
    consumer_class = app.transport.Consumer
    module = "tables.kafka.consumer" if joins else "assignor.faust_adapter.group_consumer"
    assert consumer_class.logger.name == module  # not "abc"
    with caplog.at_level(logging.DEBUG, logger=module):
        consumer_class.logger.warning(
            "[^--Consumer]: exception performing seek when flow not active IllegalStateError: "
            "No current assignment for partition TP(topic='t', partition=0)"
        )
        consumer_class.logger.warning("[^--Consumer]: something else")
    levels = [(r.levelname, r.getMessage()[:40]) for r in caplog.records]
    assert ("WARNING", "[^--Consumer]: something else") in levels
    assert not any(level == "WARNING" and "performing seek" in message for level, message in levels)
    assert any(r.levelname == "DEBUG" and "nothing to seek" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("runtime_first", [True, False], ids=["runtime first", "assignor first"])
def test_the_join_runtimes_consumer_and_the_assignors_install_compose_in_either_order(
    runtime_first: bool,
) -> None:
    """The join runtime installs its own consumer (tables/kafka/consumer.py); the assignor's
    install keeps it, and gives its thread the group's protocols and fetch tuning."""
    from tables.kafka.consumer import JoinConsumer, JoinConsumerThread, take_records

    app = make_app(producer_threaded=False)
    settings = dataclasses.replace(
        TandemSettings.from_env({}), fetch_max_wait_ms=123, fetch_high_watermarks=True
    )
    steps = [lambda: take_records(app, object()), lambda: install(app, settings=settings)]  # type: ignore[arg-type]
    for step in steps if runtime_first else reversed(steps):
        step()
    assert app.transport.Consumer is JoinConsumer
    thread = app.consumer._thread
    assert type(thread) is JoinConsumerThread
    assert (thread.tuning.fetch_max_wait_ms, thread.tuning.fetch_high_watermarks) == (123, True)
    assert [p.name for p in app.assignor.protocols()] == ["tandem", "faust"]


def test_the_assignor_alone_builds_no_join_consumer() -> None:
    app = make_app()
    install(app)
    assert app.transport.Consumer is TandemConsumer and type(app.consumer._thread) is TandemConsumerThread
