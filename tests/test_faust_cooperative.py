"""Cooperative rebalancing in the adapter (issue 38): the setting, the wire's version 3, and the
leader's choice of a cooperative round, in process with the real adapter. The live rebalance
on real worker processes is tests/test_app_cooperative.py."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import faust
import pytest
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from assignor import wire
from assignor.faust_adapter.cooperative import keep_states
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join
from assignor.faust_adapter.settings import SettingsError, TandemSettings
from assignor.wire import Assignment, RebalanceStats, Subscription

JOIN = ["impressions", "clicks", "cl"]
N = 6


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(N)) if topic in JOIN else None


def _assignor(protocol: str = "cooperative") -> TandemAssignor:
    app = faust.App(f"coop-{uuid.uuid4().hex[:8]}", broker="kafka://127.0.0.1:1",
                    PartitionAssignor=TandemAssignor, web_enabled=False)  # fmt: skip
    declare_join(app, ["impressions", "clicks"], "cl")
    assignor: TandemAssignor = app.assignor  # type: ignore[assignment]
    # Warm-ups off: the plan is the sticky, balanced one (no holds on caught-up owners).
    assignor.settings = dataclasses.replace(assignor.settings, rebalance_protocol=protocol, warmups=False)
    return assignor


def _member(
    name: str, owned: list[int], version: int = wire.VERSION_COOPERATIVE
) -> ConsumerProtocolMemberMetadata:
    sub = Subscription(epoch=5 if owned else 0, url=f"http://{name}:6066", host=name,
                       previous_active={t: owned for t in JOIN} if owned else {})  # fmt: skip
    return ConsumerProtocolMemberMetadata(version, JOIN, wire.encode_subscription(sub))


def _scale_out(newcomer_version: int = wire.VERSION_COOPERATIVE) -> dict[str, ConsumerProtocolMemberMetadata]:
    """Two owners of three partitions each, and an empty newcomer: two tasks must move."""
    return {
        "a": _member("a", [0, 1, 2]),
        "b": _member("b", [3, 4, 5]),
        "new": _member("new", [], newcomer_version),
    }


def _decoded(out: dict[str, object]) -> dict[str, Assignment]:
    return {m: wire.decode_assignment(a.user_data) for m, a in out.items()}  # type: ignore[attr-defined]


# -- the setting -------------------------------------------------------------------------------


def test_the_setting_defaults_to_cooperative_and_reads_the_environment() -> None:
    assert TandemSettings.from_env({}).rebalance_protocol == "cooperative"
    assert TandemSettings.from_env({"TANDEM_REBALANCE_PROTOCOL": "Cooperative"}).cooperative
    assert not TandemSettings.from_env({"TANDEM_REBALANCE_PROTOCOL": "eager"}).cooperative


def test_a_bad_protocol_names_the_setting() -> None:
    with pytest.raises(
        SettingsError, match="TANDEM_REBALANCE_PROTOCOL must be 'eager' or 'cooperative', not 'coop'"
    ):
        TandemSettings.from_env({"TANDEM_REBALANCE_PROTOCOL": "coop"})


def test_the_metadata_version_announces_cooperative_rounds() -> None:
    assert _assignor("cooperative").version == wire.VERSION_COOPERATIVE
    assert _assignor("eager").version == wire.VERSION_WARMUPS
    assert _assignor("cooperative").metadata(JOIN).version == wire.VERSION_COOPERATIVE


# -- the wire ------------------------------------------------------------------------------------


cooperative_assignments = st.builds(
    Assignment,
    epoch=st.integers(0, 2**40),
    active=st.dictionaries(
        st.sampled_from(JOIN), st.lists(st.integers(0, 500), min_size=1, unique=True).map(sorted)
    ),
    stats=st.builds(RebalanceStats, *[st.integers(0, 10**6)] * 7),
    warmup=st.dictionaries(st.just("cl"), st.lists(st.integers(0, 500), min_size=1, unique=True).map(sorted)),
    revoking=st.dictionaries(
        st.sampled_from(JOIN), st.lists(st.integers(0, 500), min_size=1, unique=True).map(sorted)
    ),
    incoming=st.dictionaries(
        st.sampled_from(JOIN), st.lists(st.integers(0, 500), min_size=1, unique=True).map(sorted)
    ),
    follow_up=st.booleans(),
    cooperative=st.booleans(),
)


@given(cooperative_assignments)
@settings(max_examples=200, deadline=None)
def test_cooperative_assignments_round_trip(assignment: Assignment) -> None:
    data = wire.encode_assignment(assignment)
    assert wire.decode_assignment(data) == assignment
    if assignment.has_cooperative:
        assert data[2] == wire.VERSION_COOPERATIVE


def test_an_eager_round_is_version_2_bytes_at_most() -> None:
    plain = Assignment(epoch=3, active={"impressions": [1]})
    assert wire.encode_assignment(plain)[2] == wire.VERSION


def test_a_reader_without_cooperative_rounds_gets_none_of_it() -> None:
    coop = Assignment(epoch=3, active={"impressions": [1]}, revoking={"impressions": [2]}, follow_up=True,
                      cooperative=True)  # fmt: skip
    old = wire.for_reader(coop, wire.VERSION_WARMUPS)
    assert not old.has_cooperative and old.active == coop.active
    assert wire.encode_assignment(old)[2] == wire.VERSION
    assert wire.for_reader(coop, wire.VERSION_COOPERATIVE) is coop


def test_bad_cooperative_flags_are_refused() -> None:
    data = bytearray(wire.encode_assignment(Assignment(cooperative=True)))
    assert data[-1] == 2 and data[3] == 0  # flags last, not compressed
    data[-1] = 4
    with pytest.raises(wire.WireError, match="cooperative flags 4"):
        wire.decode_assignment(bytes(data))


# -- the leader ----------------------------------------------------------------------------------


def test_a_cooperative_group_revokes_first_and_assigns_in_the_follow_up() -> None:
    leader = _assignor()
    got = _decoded(leader.assign(_Cluster(), _scale_out()))
    assert all(a.cooperative for a in got.values())
    assert not got["new"].active, "a task changed owner in the round that revoked it"
    revoked = {p for m in ("a", "b") for p in got[m].revoking.get("impressions", [])}
    assert len(revoked) == 2 and got["new"].incoming["impressions"] == sorted(revoked)
    for name, owned in (("a", {0, 1, 2}), ("b", {3, 4, 5})):
        kept = set(got[name].active["impressions"])
        assert kept == owned - set(got[name].revoking.get("impressions", [])), name
        assert set(got[name].revoking.get("cl", [])) == set(got[name].revoking.get("impressions", []))
    assert all(a.follow_up for a in got.values())
    assert leader.released() is False, "the leader revoked nothing of its own, nor of an eager member"


def test_the_follow_up_assigns_what_was_revoked() -> None:
    leader = _assignor()
    first = _decoded(leader.assign(_Cluster(), _scale_out()))
    group = {name: _member(name, first[name].active.get("impressions", [])) for name in first}
    second = _decoded(leader.assign(_Cluster(), group))
    assert second["new"].active["impressions"] == first["new"].incoming["impressions"]
    assert not any(a.revoking or a.follow_up for a in second.values())
    assert all(a.cooperative for a in second.values())


def test_one_eager_member_makes_the_round_eager() -> None:
    leader = _assignor()
    got = _decoded(leader.assign(_Cluster(), _scale_out(newcomer_version=wire.VERSION_WARMUPS)))
    assert not any(a.cooperative or a.revoking for a in got.values())
    assert len(got["new"].active["impressions"]) == 2, "an eager round moves at once"


def test_after_a_cooperative_round_an_eager_newcomer_still_gets_nothing_owned_at_once() -> None:
    """The members of a cooperative group kept running what they own through this rebalance:
    an eager member joining must not be handed it in the same round (the leader asks for the
    follow-up itself if it revoked from a member that does not)."""
    leader = _assignor()
    leader._own = Assignment(epoch=5, active={t: [0, 1, 2] for t in JOIN}, cooperative=True)
    got = _decoded(leader.assign(_Cluster(), _scale_out(newcomer_version=wire.VERSION_WARMUPS)))
    assert not got["new"].active and not got["new"].cooperative  # stripped for an eager reader
    assert got["a"].cooperative and got["a"].follow_up


def test_a_revoking_member_lists_what_it_releases_as_owned_until_released() -> None:
    member = _assignor()
    own = Assignment(epoch=6, active={t: [0, 1] for t in JOIN}, revoking={t: [2] for t in JOIN},
                     follow_up=True, cooperative=True)  # fmt: skip
    member.on_assignment(_protocol_assignment(own))
    assert member.cooperative_round and member.rebalance_protocol == "cooperative"
    assert member.subscription().previous_active == {t: [0, 1, 2] for t in JOIN}
    assert member.released() is True
    assert member.subscription().previous_active == {t: [0, 1] for t in JOIN}
    assert member.released() is False


def test_the_view_shows_the_protocol_and_what_a_cooperative_round_revokes_pends_and_keeps() -> None:
    member = _assignor()
    assert (
        member.cooperative_view()["group_runs"] == "eager"
        and member.cooperative_view()["announced"] == "cooperative"
    )
    own = Assignment(epoch=6, active={"impressions": [0]}, revoking={"impressions": [2]},
                     incoming={"impressions": [4]}, follow_up=True, cooperative=True)  # fmt: skip
    member.on_assignment(_protocol_assignment(own))
    member.note_round(7, True, [TopicPartition("impressions", 0)], [TopicPartition("impressions", 2)], [])
    view = member.cooperative_view()
    assert view["setting"] == "cooperative" and view["group_runs"] == "cooperative"
    assert (view["revoked"], view["pending"], view["kept"]) == (
        ["impressions:2"],
        ["impressions:4"],
        ["impressions:0"],
    )
    assert view["follow_up"] is True
    [round_] = view["rounds"]
    assert (round_["kept"], round_["revoked"], round_["newly_assigned"]) == (
        ["impressions:0"],
        ["impressions:2"],
        [],
    )
    assert round_["pending"] == ["impressions:4"] and round_["protocol"] == "cooperative"
    assert _assignor("eager").cooperative_view()["announced"] == "eager"


def _protocol_assignment(own: Assignment) -> ConsumerProtocolMemberAssignment:
    partitions = sorted((t, p) for t, p in own.active.items())
    return ConsumerProtocolMemberAssignment(wire.VERSION_COOPERATIVE, partitions, wire.encode_assignment(own))


# -- the group coordinator's new assignment ----------------------------------------------------


def test_kept_partitions_keep_their_fetch_state_across_a_new_assignment() -> None:
    """aiokafka's own assign_from_subscribed makes fresh states (positions refreshed from the
    committed offsets); keep_states moves the kept partitions' states to the new assignment."""

    async def run() -> None:
        state = SubscriptionState()
        state.subscribe({"impressions"})
        kept, revoked, added = (TopicPartition("impressions", p) for p in (0, 1, 2))
        state.assign_from_subscribed({kept, revoked})
        old = state.subscription.assignment
        old.state_value(kept).seek(1234)
        old.state_value(kept).pause()
        keep_states(state, {kept, added})
        new = state.subscription.assignment
        assert new is not old and not old.active and new.active
        assert new.state_value(kept).position == 1234 and new.state_value(kept).paused
        assert new.state_value(kept)._assignment is new  # commit refreshes go to the live one
        assert not new.state_value(added).has_valid_position  # fetched from its committed offset
        assert new.state_value(revoked) is None
        keep_states(state, {kept, added})  # unchanged: the very same assignment
        assert state.subscription.assignment is new and not state.reassignment_in_progress

    asyncio.run(run())
