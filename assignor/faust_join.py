"""One JoinGroup that offers every protocol: a fix for aiokafka 0.14's group join.

aiokafka sends its JoinGroup inside the loop over the consumer's assignors, so a
consumer offering ``[tandem, faust]`` first joins offering only ``tandem`` and
then joins again offering both. The first join can settle the group on a
protocol a stock Faust worker does not speak (the broker then rejects that
worker with InconsistentGroupProtocol) and every rebalance costs two joins.
This module replaces ``CoordinatorGroupRebalance.perform_group_join`` with the
same logic, the JoinGroup moved after the loop. Consumers with one assignor
(everything but Tandem's) keep aiokafka's own method untouched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiokafka.errors as errors
from aiokafka.consumer import group_coordinator as gc
from aiokafka.protocol.group import JoinGroupRequest

log = logging.getLogger(__name__)

_ORIGINAL = gc.CoordinatorGroupRebalance.perform_group_join
_FATAL = (
    errors.InconsistentGroupProtocolError,
    errors.InvalidSessionTimeoutError,
    errors.InvalidGroupIdError,
)


def install() -> None:
    """Idempotent: patch aiokafka's group join (only multi-protocol consumers change)."""
    gc.CoordinatorGroupRebalance.perform_group_join = _perform_group_join  # type: ignore


async def _perform_group_join(self: Any) -> tuple[str, bytes] | None:
    if len(self._assignors) < 2:
        return await _ORIGINAL(self)
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
    elif error_type in (
        errors.GroupCoordinatorNotAvailableError,
        errors.NotCoordinatorForGroupError,
    ):
        coordinator.coordinator_dead()
    elif error_type in _FATAL:
        log.error("Attempt to join group failed due to fatal error: %s", error_type())
        raise error_type()
    elif error_type is errors.GroupAuthorizationFailedError:
        raise error_type(self.group_id)
    else:
        raise errors.KafkaError(repr(error_type()))
