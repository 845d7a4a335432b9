"""Patches of aiokafka's group membership that Tandem's assignor needs.

- `install_group_join()`: one JoinGroup offering every protocol (aiokafka 0.14 sends one
  JoinGroup per assignor); the leader calls each assignor's `prepare_assignment()`
  (changelog end offsets for warm-ups) before it assigns, bounded in time.
- `delay_follower_sync()`: a follower's SyncGroup after the leader's (the embedded broker
  answers an early follower a second late).
- `request_rejoin()`: asks the group coordinator for a rebalance (probing rebalances), and
  `rejoin_after_followers()` for Tandem's own requests on the coordinator's loop (a
  cooperative round's follow-up): not before the round's delayed followers have synced.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiokafka.errors as errors
from aiokafka.consumer import group_coordinator as gc
from aiokafka.protocol.group import JoinGroupRequest
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import AppT

from assignor import internals

log = logging.getLogger(__name__)


def request_rejoin(app: AppT) -> bool:
    """Ask the group coordinator for a rebalance (from any thread): False if the consumer has
    not started. aiokafka's coordinator then rejoins the group with fresh metadata."""
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None) if thread is not None else None
    if consumer is None or consumer._coordinator is None:
        return False
    thread.thread_loop.call_soon_threadsafe(rejoin_after_followers, consumer._coordinator)  # type: ignore[union-attr]
    return True


# The follower SyncGroup delay this process runs with (`delay_follower_sync`), and when this
# member's last round ended (its SyncGroup answered), per coordinator.
_FOLLOWER_SYNC_DELAY = {"seconds": 0.0}
_SYNCED_AT = "_tandem_synced_at"


def rejoin_after_followers(coordinator: Any) -> None:
    """`coordinator.request_rejoin()`, on its loop, once every follower of the round that just
    ended has sent its delayed SyncGroup (twice the delay after this member's own sync).
    On the embedded broker a follower's SyncGroup that reaches it after a new JoinGroup is
    never answered: the follower waits out its request timeout, out of the group, and a
    partition revoked for it stays unowned meanwhile. A member released its revoked
    partitions, or a warm-up caught up, well within that time after a round; without the
    delay (real Kafka) the request is immediate."""
    delay = _FOLLOWER_SYNC_DELAY["seconds"]
    synced_at = getattr(coordinator, _SYNCED_AT, None)
    loop = asyncio.get_running_loop()
    wait = 0.0 if delay <= 0 or synced_at is None else synced_at + 2 * delay - loop.time()
    if wait <= 0:
        coordinator.request_rejoin()
    else:
        loop.call_later(wait, coordinator.request_rejoin)


_ORIGINAL_JOIN = gc.CoordinatorGroupRebalance.perform_group_join
_FATAL = (
    errors.InconsistentGroupProtocolError,
    errors.InvalidSessionTimeoutError,
    errors.InvalidGroupIdError,
)


def install_group_join() -> None:
    """Idempotent: one JoinGroup offering every protocol (only multi-protocol consumers change).

    aiokafka sends its JoinGroup inside the loop over the consumer's assignors, so a
    consumer offering ``[tandem, faust]`` first joins offering only ``tandem``: that can
    settle the group on a protocol a stock Faust worker does not speak (the broker then
    rejects it with InconsistentGroupProtocol), and every rebalance costs two joins."""
    gc.CoordinatorGroupRebalance.perform_group_join = _perform_group_join


async def _perform_group_join(self: Any) -> tuple[str, bytes] | None:
    for assignor in self._assignors:
        starting = getattr(assignor, "join_starting", None)
        if starting is not None:
            starting()  # e.g. look up end offsets while the broker holds the JoinGroup
    if len(self._assignors) < 2:
        joined = await _ORIGINAL_JOIN(self)
    else:
        joined = await _join_every_protocol(self)
    if joined is not None:
        setattr(self._coordinator, _SYNCED_AT, asyncio.get_running_loop().time())
    return joined


async def _join_every_protocol(self: Any) -> tuple[str, bytes] | None:
    protocols = [(a.name, _encoded(a.metadata(self._subscription.topics))) for a in self._assignors]
    response = await _join(self, protocols)
    if response is None:
        return None
    error_type = errors.for_code(response.error_code)
    if error_type is errors.NoError:
        return await _on_joined(self, response)
    await _on_join_error(self, error_type)
    return None


def _encoded(metadata: Any) -> bytes:
    return metadata if isinstance(metadata, bytes) else metadata.encode()


async def _join(self: Any, protocols: list[tuple[str, bytes]]) -> Any:
    """JoinGroup once (twice when the broker asks for a member id, KIP-394)."""
    coordinator = self._coordinator
    while True:
        request = JoinGroupRequest(
            self.group_id,
            self._session_timeout_ms,
            self._rebalance_timeout_ms,
            coordinator.member_id,
            coordinator._group_instance_id,
            gc.ConsumerProtocol.PROTOCOL_TYPE,
            protocols,
        )
        try:
            response = await coordinator._send_req(request)
        except errors.KafkaError:
            return None  # connection error: the coordinator lookup backs off
        if not self._subscription.active:
            return None  # subscription changed: restart the join
        if errors.for_code(response.error_code) is not errors.MemberIdRequired:
            return response
        coordinator.member_id = response.member_id


async def _on_joined(self: Any, response: Any) -> tuple[str, bytes] | None:
    coordinator = self._coordinator
    coordinator.member_id = response.member_id
    coordinator.generation = response.generation_id
    log.info(
        "Joined group %r (generation %s) with member_id %s, protocol %s",
        self.group_id,
        response.generation_id,
        response.member_id,
        response.group_protocol,
    )
    if response.leader_id == response.member_id:
        for assignor in self._assignors:
            prepare = getattr(assignor, "prepare_assignment", None)
            if prepare is not None:
                await prepare()  # bounded in time by the assignor; never raises
        assignment = await self._on_join_leader(response)
    else:
        assignment = await self._on_join_follower()
    return None if assignment is None else (response.group_protocol, assignment)


async def _on_join_error(self: Any, error_type: type[Exception]) -> None:
    coordinator = self._coordinator
    if error_type is errors.GroupLoadInProgressError:
        await asyncio.sleep(self._retry_backoff_ms / 1000)
    elif error_type is errors.UnknownMemberIdError:
        coordinator.reset_generation()
    elif error_type in (errors.GroupCoordinatorNotAvailableError, errors.NotCoordinatorForGroupError):
        coordinator.coordinator_dead()
    elif error_type in _FATAL:
        log.error("Attempt to join group failed due to fatal error: %s", error_type())
        raise error_type()
    elif error_type is errors.GroupAuthorizationFailedError:
        raise error_type(self.group_id)
    else:
        raise errors.KafkaError(repr(error_type()))


def delay_follower_sync(seconds: float) -> None:
    """Send a follower's SyncGroup `seconds` after its JoinGroup answer, so that it reaches
    the embedded broker after the leader's (once per process; it has one group consumer)."""
    original = gc.CoordinatorGroupRebalance._on_join_follower
    if getattr(original, "tandem_delay", None) is not None or seconds <= 0:
        return

    async def on_join_follower(self: Any) -> Any:
        await asyncio.sleep(seconds)
        return await original(self)

    on_join_follower.tandem_delay = seconds  # type: ignore[attr-defined]
    gc.CoordinatorGroupRebalance._on_join_follower = on_join_follower
    _FOLLOWER_SYNC_DELAY["seconds"] = seconds


internals.require(
    __name__, gc.CoordinatorGroupRebalance, "perform_group_join", "_on_join_follower", "_on_join_leader"
)
internals.require(
    __name__,
    gc.CoordinatorGroupRebalance,
    "_assignors",
    "_subscription",
    "_coordinator",
    "group_id",
    "_session_timeout_ms",
    "_rebalance_timeout_ms",
    "_retry_backoff_ms",
    instance=True,
)
internals.require(__name__, gc.GroupCoordinator, "request_rejoin", "reset_generation", "coordinator_dead")
internals.require(__name__, gc.GroupCoordinator, "_send_req", "_group_instance_id", instance=True)
internals.require(__name__, AIOKafkaConsumerThread, "thread_loop", "_consumer", instance=True)
