"""Cooperative rounds (KIP-429) in aiokafka's group coordinator and in Faust's rebalance handlers.

aiokafka 0.14 and Faust 0.15 rebalance eagerly, whatever the assignor plans
(docs/planner.md, section 9, has every line this replaces). When the group's last round
was cooperative (the leader said so in this member's assignment: wire version 3):

- `_on_join_prepare` revokes nothing and leaves the fetcher running: no
  "reassignment in progress" gate, no `on_partitions_revoked`. Commits are held while the
  member is in the join (the broker refuses them once the join is answered, and aiokafka
  would then ask for yet another rebalance): Faust keeps their offsets and commits them
  after the round (`CommitFailedError`, which Faust's driver retries later).
- `_on_join_complete`, for a cooperative assignment: the listener is called with only the
  partitions this member loses (Faust's handler, narrowed below, pauses, drains and commits
  those, and nothing else); then the new assignment keeps the `TopicPartitionState` of every
  partition that stays (its fetch position, its pause), and the listener's
  `on_partitions_assigned` gets the full assignment, which Faust reads as such (it works out
  the newly assigned itself, `faust/app/base.py` `_update_assignment`). A member that revoked
  something asks for the follow-up rebalance once it has released it.
- Faust's handlers (`narrow_faust_handlers`): the revoke pauses, drains and commits only the
  revoked partitions (not `stop_flow`, `flow_control.suspend/clear` and the pause of the whole
  assignment; the join runtime's consumer hands over only those: `wait_empty_of`); the
  assign drains nothing (the join runtime waits for its own batch in flight) and pauses only
  the newly assigned ones until recovery resumes them, and the seek to committed offsets
  that follows recovery seeks only those (the kept ones go on from where they are). Faust's
  table recovery replays only the table partitions that moved here (or turned from standby
  to active): a kept one's store is current, and replaying it under a partition still
  writing could overwrite newer values (`_recover_only_what_moved`).

An assignment of an eager round (a member without the setting joined) after this member kept
its partitions through the join: everything is revoked first, as an eager prepare would have
done, then the eager assignment is taken. Every private name is declared to
`internals.require` below and checked at start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import aiokafka.errors as errors
from aiokafka.consumer import group_coordinator as gc
from aiokafka.consumer.subscription_state import (
    Assignment,
    Subscription,
    SubscriptionState,
    TopicPartitionState,
)
from aiokafka.protocol.group import JoinGroupRequest
from aiokafka.structs import TopicPartition
from faust.app.base import App as FaustApp
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer as FaustConsumer

from assignor import internals, wire
from assignor.faust_adapter.group import rejoin_after_followers

log = logging.getLogger(__name__)

HELD_COMMIT = (
    "Commit cannot be completed since the group has already rebalanced (held by Tandem: a cooperative "
    "rebalance is in progress; Faust commits these offsets after it)"
)


class CooperativeMember(Protocol):
    """What the coordinator asks of Tandem's assignor (partition_assignor.TandemAssignor)."""

    @property
    def cooperative_round(self) -> bool: ...

    def released(self) -> bool: ...

    def note_round(
        self,
        generation: int,
        cooperative: bool,
        kept: Iterable[Any],
        revoked: Iterable[Any],
        added: Iterable[Any],
    ) -> None: ...


def _member(coordinator: Any) -> CooperativeMember | None:
    for assignor in coordinator._assignors:
        if hasattr(assignor, "cooperative_round") and hasattr(assignor, "released"):
            return assignor
    return None


def _is_cooperative(user_data: bytes) -> bool:
    """Whether an assignment's user data is a cooperative round's (wire version 3)."""
    try:
        return wire.is_tandem(user_data) and wire.decode_assignment(user_data).cooperative
    except wire.WireError:
        return False


_ORIGINAL_PREPARE = gc.GroupCoordinator._on_join_prepare
_ORIGINAL_COMPLETE = gc.GroupCoordinator._on_join_complete
_ORIGINAL_COMMIT = gc.GroupCoordinator.commit_offsets


def install_cooperative() -> None:
    """Idempotent: aiokafka's coordinator runs cooperative rounds when its assignment says so
    (members without the setting never get one: they behave exactly as before)."""
    gc.GroupCoordinator._on_join_prepare = _on_join_prepare
    gc.GroupCoordinator._on_join_complete = _on_join_complete
    gc.GroupCoordinator.commit_offsets = _commit_offsets


async def _on_join_prepare(self: Any, previous_assignment: Any) -> None:
    member = _member(self)
    self._tandem_owned = set(previous_assignment.tps) if previous_assignment is not None else set()
    self._tandem_member_id = self.member_id
    # A member the group no longer knows (its generation was reset: a session that expired)
    # may have had its partitions given to others already: it gives them all up (KIP-429's
    # "partitions lost"), as an eager member would.
    lost = self.generation < 0 or self.member_id == JoinGroupRequest.UNKNOWN_MEMBER_ID
    if previous_assignment is None or member is None or not member.cooperative_round or lost:
        self._tandem_kept = False
        await _ORIGINAL_PREPARE(self, previous_assignment)
        return
    self._tandem_kept = self._tandem_joining = True
    self._group_subscription = None
    try:
        await self._maybe_do_last_autocommit(previous_assignment)
    except errors.KafkaError as err:
        log.error("OffsetCommit failed before join, ignoring: %s", err)
    log.info(
        "tandem: cooperative rebalance of group %s: %s partition(s) keep running through it",
        self.group_id,
        len(previous_assignment.tps),
    )


async def _commit_offsets(self: Any, assignment: Any, offsets: Any) -> None:
    if getattr(self, "_tandem_joining", False):
        raise errors.CommitFailedError(HELD_COMMIT)
    await _ORIGINAL_COMMIT(self, assignment, offsets)


async def _on_join_complete(
    self: Any, generation: int, member_id: str, protocol: str, member_assignment_bytes: bytes
) -> None:
    self._tandem_joining = False
    kept = getattr(self, "_tandem_kept", False)
    self._tandem_kept = False
    if kept and member_id != getattr(self, "_tandem_member_id", member_id):
        # Dropped from the group during the join (a new member id): partitions lost, as above.
        log.warning("tandem: this member left the group during the join: its partitions are lost")
        await _eager_revoke(self)
        kept = False
    member = _member(self)
    assignor = self._lookup_assignor(protocol)
    assert assignor, f"invalid assignment protocol: {protocol}"
    assignment = gc.ConsumerProtocol.ASSIGNMENT.decode(member_assignment_bytes)
    cooperative = member is not None and _is_cooperative(assignment.user_data)
    owned: set[TopicPartition] = getattr(self, "_tandem_owned", set())
    if not cooperative or not kept:
        if kept:  # an eager round after a cooperative one: revoke everything first
            await _eager_revoke(self)
            kept = False
        # An eager round, or the first cooperative one (everything was revoked at the prepare).
        await _ORIGINAL_COMPLETE(self, generation, member_id, protocol, member_assignment_bytes)
        if member is not None:
            member.note_round(generation, cooperative, (), owned, assignment.partitions())
    else:
        await _cooperative_complete(self, assignor, assignment)
        if member is not None:
            assigned = set(assignment.partitions())
            member.note_round(generation, True, owned & assigned, owned - assigned, assigned - owned)
    if member is not None and member.released():
        log.info("tandem: revoked partitions released: asking for the follow-up rebalance")
        rejoin_after_followers(self)


async def _eager_revoke(self: Any) -> None:
    old = self._subscription.subscription.assignment if self._subscription.subscription else None
    self._subscription.begin_reassignment()
    everything = set(old.tps) if old is not None else set()
    log.info("tandem: an eager round after a cooperative one: revoking %s", sorted(everything))
    await _listener(self, "on_partitions_revoked", everything)


async def _cooperative_complete(self: Any, assignor: Any, assignment: Any) -> None:
    state: SubscriptionState = self._subscription
    old = state.subscription.assignment
    owned = set(old.tps) if old is not None and old.active else set()
    assigned = set(assignment.partitions())
    revoked, added = owned - assigned, assigned - owned
    prior_actives = set(assignor.assigned_actives())  # Faust's actives before this round
    assignor.on_assignment(assignment)
    log.info(
        "tandem: cooperative round: kept %s, revoked %s, newly assigned %s",
        len(owned & assigned),
        sorted(revoked),
        sorted(added),
    )
    # Read before the listener, whose revoke marks Faust's app as rebalancing again.
    app = getattr(_member(self), "app", None)
    settled = app is not None and getattr(app, "rebalancing", True) is False
    with narrowing(self, True, settled, prior_actives):
        await _listener(self, "on_partitions_revoked", revoked)  # released before reassigning
        keep_states(state, assigned)
        subscription = state.subscription
        await self._stop_commit_offsets_refresh_task()
        self.start_commit_offsets_refresh_task(subscription.assignment)
        await _listener(self, "on_partitions_assigned", assigned)


def keep_states(state: SubscriptionState, assigned: set[TopicPartition]) -> None:
    """The new assignment, with the fetch state (position, pause) of every partition that
    stays: aiokafka's `assign_from_subscribed` makes fresh states that refresh their positions
    from the committed offsets. Unchanged: the same object, so no fetch is even interrupted."""
    subscription: Subscription = state.subscription
    old: Assignment | None = subscription.assignment
    if old is not None and old.active and set(old.tps) == assigned:
        subscription._reassignment_in_progress = False
        state._notify_assignment_waiters()
        return
    state.assign_from_subscribed(assigned)  # waiters run after this returns: states are moved first
    new: Assignment = subscription.assignment
    if old is None:
        return
    for tp in assigned & set(old.tps):
        kept = old.state_value(tp)
        kept._assignment = new
        new._tp_state[tp] = kept


async def _listener(self: Any, callback: str, partitions: set[TopicPartition]) -> None:
    listener = self._subscription.listener
    if not listener:
        return
    try:
        result = getattr(listener, callback)(partitions)
        if asyncio.iscoroutine(result):
            await result
    except Exception:
        log.exception("listener %s of group %s failed %s", listener, self.group_id, callback)


# ---------------------------------------------------------------- Faust's side


class _Narrowing:
    """Whether the rebalance callbacks now running belong to a cooperative round."""

    def __init__(self) -> None:
        self.active = False
        self.seek_only: set[Any] | None = None
        # Faust had finished its last rebalance (its recovery resumed the streams) when this
        # round began: a round that changes nothing here then needs no recovery at all.
        self.settled = False
        # The partitions (changelogs included) this worker had active before the round.
        self.prior_actives: set[Any] = set()


# Per consumer: its subscription state, which its group coordinator and the app both reach.
_NARROWING: weakref.WeakKeyDictionary[Any, _Narrowing] = weakref.WeakKeyDictionary()


class narrowing:  # noqa: N801 (a context manager, used like a function)
    def __init__(
        self, coordinator: Any, active: bool, settled: bool = False, prior_actives: set[Any] | None = None
    ) -> None:
        self.state = _NARROWING.setdefault(coordinator._subscription, _Narrowing())
        self.active = active
        self.settled = settled
        self.prior_actives = prior_actives or set()

    def __enter__(self) -> None:
        self.state.active = self.active
        self.state.settled = self.settled
        self.state.prior_actives = self.prior_actives

    def __exit__(self, *exc: object) -> None:
        self.state.active = False


def _state_of(app: Any) -> _Narrowing | None:
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None) if thread is not None else None
    subscription = getattr(consumer, "_subscription", None)
    return _NARROWING.get(subscription) if subscription is not None else None


Revoke = Callable[[set[Any]], Awaitable[None]]
Assign = Callable[..., Awaitable[None]]


def narrow_faust_handlers(consumer: FaustConsumer) -> None:
    """Wrap the app's rebalance handlers that Faust's consumer calls (set in its __init__)."""
    app = consumer.app
    consumer._on_partitions_revoked = functools.partial(_revoke, app, consumer._on_partitions_revoked)
    consumer._on_partitions_assigned = functools.partial(_assign, app, consumer._on_partitions_assigned)


async def _revoke(app: Any, original: Revoke, revoked: set[Any]) -> None:
    state = _state_of(app)
    if state is None or not state.active or app.should_stop:
        await original(revoked)
        return
    try:
        app.tables.on_partitions_revoked(revoked)
        if revoked:
            consumer = app.consumer
            consumer.pause_partitions(revoked)
            await _wait_empty_of(app, consumer, revoked)  # hands the revoked over, commits
            await app._producer_flush(log)
        await app.on_partitions_revoked.send(revoked)
    except Exception as exc:
        await app.crash(exc)


async def _wait_empty_of(app: Any, consumer: Any, revoked: set[Any]) -> None:
    """Faust's wait for the events in flight before a revoke's commit (`_consumer_wait_empty`),
    told which partitions go: a consumer that can (the join runtime's, `wait_empty_of`) hands
    over only those, and its joins go on with the others."""
    if not app.conf.stream_wait_empty:
        return
    narrowed = getattr(consumer, "wait_empty_of", None)
    if narrowed is None:
        await consumer.wait_empty()
    else:
        await narrowed(revoked)


async def _assign(app: Any, original: Assign, assigned: set[Any], generation_id: int = 0) -> None:
    state = _state_of(app)
    if state is None or not state.active or app.should_stop:
        if state is not None:
            state.seek_only = None
        await original(assigned, generation_id)
        return
    app.unassigned = not assigned
    revoked, newly_assigned = app._update_assignment(assigned)
    state.seek_only = set(newly_assigned)
    try:
        # Nothing is drained here: the revoke handed over what goes, and the join runtime's
        # handler of the assignment waits for its batch in flight itself (JoinTask.assign).
        await app.agents.on_rebalance(revoked, newly_assigned)
        await app.topics.maybe_wait_for_subscriptions()
        if not revoked and not newly_assigned and state.settled:
            await _unchanged(app, assigned)
            return
        app.consumer.pause_partitions(newly_assigned)  # until recovery resumes them
        await app.topics.on_partitions_assigned(assigned)
        await app.tables.on_rebalance(assigned, revoked, newly_assigned, generation_id)
        # Before anything else runs (the recovery starts when this task yields):
        _recover_only_what_moved(app, state.prior_actives)
        await app.on_partitions_assigned.send(assigned)
    except Exception as exc:
        await app.crash(exc)


def _recover_only_what_moved(app: Any, prior_actives: set[Any]) -> None:
    """Take the table partitions this worker had active before the round and still has out of
    the recovery Faust just planned. Faust restarts its recovery for every active table
    partition and replays each changelog from its store's persisted offset: a kept partition,
    still running (not paused), would meanwhile write newer values that the replay of its own
    older changelog records could overwrite; and pausing it instead stops it for the whole
    recovery. Its store is current already (this worker wrote it, and nobody else did), so it
    has nothing to recover. A partition that turned from standby to active, or was newly
    assigned, is recovered as before."""
    recovery = app.tables._recovery
    kept = prior_actives & set(app.assignor.assigned_actives())
    for tp in kept & set(recovery.active_tps):
        recovery.active_tps.discard(tp)
        recovery.active_offsets.pop(tp, None)
        table = recovery.tp_to_table.get(tp)
        if table is not None:
            recovery.actives_for_table.get(table, set()).discard(tp)


async def _unchanged(app: Any, assigned: set[Any]) -> None:
    """A round that changes nothing of this worker's Kafka assignment, after Faust had
    finished the last one: its tables' actives and standbys are what they were (they are in
    the Kafka assignment), so Faust's recovery is not restarted and nothing is paused. The
    app's signal still goes out (the join runtime takes its own standby and warm-up changes),
    and the rebalance Faust's listener began is ended (after its own return bookkeeping)."""
    state = _state_of(app)
    if state is not None:
        state.seek_only = None
    await app.on_partitions_assigned.send(assigned)
    tables = app.tables
    app.loop.call_soon(_rebalance_ended, app, tables)


def _rebalance_ended(app: Any, tables: Any) -> None:
    tables.on_actives_ready()
    tables.on_standbys_ready()
    app.on_rebalance_end()


async def seek_to_committed(app: Any, seek: Callable[..., Awaitable[Any]]) -> Any:
    """Faust's seek of every assigned partition to its committed offset after a rebalance,
    narrowed, after a cooperative round, to the newly assigned partitions: `seek(*tps)` seeks
    those only (aiokafka's `seek_to_committed`), `seek()` every one."""
    state = _state_of(app)
    only = state.seek_only if state is not None else None
    if state is not None:
        state.seek_only = None
    if only is None:
        return await seek()
    if not only:
        return {}
    return await seek(*(TopicPartition(tp.topic, tp.partition) for tp in only))


def blocked_by(app: Any) -> list[str]:
    """Why this app cannot run cooperative rounds safely (empty: it can)."""
    reasons = []
    if getattr(app, "in_transaction", False):
        reasons.append("exactly-once (processing_guarantee) ends every transaction at a rebalance")
    return reasons


internals.require(
    __name__,
    gc.GroupCoordinator,
    "_on_join_prepare",
    "_on_join_complete",
    "commit_offsets",
    "_lookup_assignor",
)
internals.require(
    __name__,
    gc.GroupCoordinator,
    "_maybe_do_last_autocommit",
    "_stop_commit_offsets_refresh_task",
    "start_commit_offsets_refresh_task",
    "request_rejoin",
)
internals.require(
    __name__,
    gc.GroupCoordinator,
    "_assignors",
    "_subscription",
    "_group_subscription",
    "group_id",
    instance=True,
)
internals.require(__name__, SubscriptionState, "assign_from_subscribed", "begin_reassignment", "listener")
internals.require(__name__, SubscriptionState, "_notify_assignment_waiters")
internals.require(__name__, Subscription, "_reassignment_in_progress", instance=True)
internals.require(__name__, Assignment, "_tp_state", instance=True)
internals.require(__name__, TopicPartitionState, "_assignment", instance=True)
internals.require(__name__, gc.ConsumerProtocol, "ASSIGNMENT")
internals.require(__name__, FaustConsumer, "_on_partitions_revoked", "_on_partitions_assigned", instance=True)
internals.require(
    __name__,
    FaustApp,
    "_update_assignment",
    "_producer_flush",
    "in_transaction",
    "unassigned",
)
internals.require(__name__, gc.GroupCoordinator, "generation", "member_id", instance=True)
internals.require(__name__, JoinGroupRequest, "UNKNOWN_MEMBER_ID")
internals.require(__name__, FaustApp, "rebalancing", "on_rebalance_end")
internals.require(__name__, TableManager, "on_actives_ready", "on_standbys_ready", "_recovery")
internals.require(
    __name__, Recovery, "active_tps", "active_offsets", "actives_for_table", "tp_to_table", instance=True
)
