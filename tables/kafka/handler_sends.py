"""Faust sends queued by a join handler, produced with the batch's own output.

A Faust table updated in the handler queues one changelog message per update
(`Table.__setitem__` -> `send_changelog` -> `producer.send_soon`), which Faust's producer
buffer sends one at a time: ~50 us a message (docs/bench/worker.md). The handler runs as a
task (`handler_task`) whose queued messages with a partition known are collected instead
(`collect_handler_sends`); the runtime produces them in whole record batches and completes
each as Faust would (`settle_sends`).

`set_current_partition()` makes Faust tables, updated outside an agent, write to a given
partition (Faust reads the partition from the current event).
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

import faust.streams
from aiokafka.structs import RecordMetadata
from faust.events import Event
from faust.transport.producer import Producer as FaustProducer
from faust.types import TP, AppT
from faust.types.tuples import FutureMessage, Message, PendingMessage

from assignor import internals
from tables.kafka.batches import Triple

# The list a join handler's task collects its Faust sends into (None: any other task).
_HANDLER_SENDS: contextvars.ContextVar[list[FutureMessage] | None] = contextvars.ContextVar(
    "tandem_handler_sends", default=None
)
# What settle_sends and the collector read of a queued message (faust.types.tuples.PendingMessage).
_PENDING_FIELDS = ("channel", "key", "value", "partition", "timestamp", "headers", "callback")


def send_problems() -> list[str]:
    missing = [name for name in _PENDING_FIELDS if name not in PendingMessage._fields]
    return [f"PendingMessage.{name} is missing" for name in missing]


def handler_task(
    coro: Coroutine[Any, Any, None], sends: list[FutureMessage], name: str
) -> asyncio.Task[None]:
    """Run a join handler as a task whose Faust sends are collected into `sends` (once
    `collect_handler_sends` is installed): see there."""
    context = contextvars.copy_context()
    context.run(_HANDLER_SENDS.set, sends)
    return asyncio.create_task(coro, name=name, context=context)


def collect_handler_sends(app: AppT) -> None:
    """Idempotent: a message Faust queues (`send_soon`) from a join handler's own task, with
    its partition known and its key and value serialized to bytes, is appended to that
    handler's list (`handler_task`) instead of Faust's producer buffer. A table updated in
    the handler queues one changelog message per update, which Faust's buffer sends one at a
    time, each its own produce call and future: ~50 us a message (docs/bench/worker.md).
    The runtime produces the collected ones in whole record batches with the batch's other
    output and completes them (`settle_sends`): same records, same order per partition, same
    callbacks (a table's persisted offset). Anything else (another task, no partition yet, a
    timestamp of its own, a transaction) takes Faust's way, unchanged."""
    producer = app.producer
    if getattr(producer, "_tandem_collects", False):
        return
    faust_send_soon = producer.send_soon

    def send_soon(fut: FutureMessage) -> None:
        sends = _HANDLER_SENDS.get()
        message = fut.message
        if (
            sends is None
            or message.partition is None
            or message.timestamp is not None
            or type(message.key) not in (bytes, type(None))
            or type(message.value) not in (bytes, type(None))
            or app.in_transaction
        ):
            faust_send_soon(fut)
        else:
            sends.append(fut)

    producer.send_soon = send_soon  # type: ignore[method-assign]
    producer._tandem_collects = True  # type: ignore[attr-defined]


def collected_records(sends: Sequence[FutureMessage]) -> dict[tuple[str, int], list[FutureMessage]]:
    """Collected messages by topic and partition, in the order they were queued."""
    found: dict[tuple[str, int], list[FutureMessage]] = {}
    for fut in sends:
        message = fut.message
        found.setdefault((message.channel.get_topic_name(), message.partition), []).append(fut)  # type: ignore[arg-type]
    return found


def send_record(fut: FutureMessage) -> Triple:
    """(key, value, headers) of a collected message, as Faust's producer would send it."""
    message = fut.message
    headers = message.headers
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    return message.key, message.value, headers or ()


def settle_sends(futs: Sequence[FutureMessage], acks: Sequence[tuple[RecordMetadata, int]]) -> None:
    """Complete collected messages sent as record batches whose acks (a batch's first
    record's metadata, its record count) came in the messages' order: each gets its own
    offset, then its callback runs (a table's `_on_changelog_sent`), as Faust does on an ack."""
    at = 0
    for ack, count in acks:
        tp = ack.topic_partition
        for i in range(count):
            fut = futs[at]
            at += 1
            fut.set_result(
                RecordMetadata(
                    ack.topic, ack.partition, tp, ack.offset + i, ack.timestamp, ack.timestamp_type,
                    ack.log_start_offset,
                )
            )  # fmt: skip
            callback = fut.message.callback
            if callback is not None:
                callback(fut)


def fail_sends(futs: Iterable[FutureMessage], error: BaseException) -> None:
    """Collected messages that could not be sent: their futures say why, as Faust's do."""
    for fut in futs:
        if not fut.done():
            fut.set_exception(error)


def set_current_partition(app: AppT, topic: str, partition: int) -> Event:
    """Make Faust tables updated from here on, in this task, write to `partition`, as if
    an event of `topic` partition `partition` were being processed."""
    message = Message(topic, partition, -1, 0.0, 0, None, None, None, None, tp=TP(topic, partition))
    event = Event(app, None, None, None, message)
    faust.streams._current_event.set(weakref.ref(event))
    return event  # the caller keeps it alive: Faust holds a weak reference


internals.require(__name__, FaustProducer, "send_soon")
internals.require(__name__, faust.streams, "_current_event")
internals.require_probe(__name__, send_problems)
