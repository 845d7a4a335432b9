"""The reference worker with its join body replaced by a no-op: `faust -A
benchmarks.consume_only_app worker` consumes the same topics with the same agent,
batching, consumer settings, assignor and state start-up as `faust -A app worker`,
and only records how far it has read. Its rate is the raw consume rate of a
worker, the baseline of benchmarks/bench_worker.py."""

from __future__ import annotations

from typing import Any

from faust.types import TP

import app as _reference

app = _reference.app
_worker = app.tandem  # type: ignore[attr-defined]


async def _consume_only(events: list[Any]) -> None:
    positions, ack = _worker.positions, _worker.ack
    for event in events:
        message = event.message
        positions[TP(message.topic, message.partition)] = message.offset
        await ack(event)


_worker.handle_batch = _consume_only
