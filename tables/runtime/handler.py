"""The app's handler of one join, supervised: it runs as a task of its own that iterates the
join's results (`JoinResults`); a batch's results are handed over, and the batch goes on
only once the handler has asked past the last. A result that makes the handler raise is
dead-lettered and the handler restarted; one that keeps failing stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from tables.kafka.handler_sends import handler_task
from tables.operators.base import Match
from tables.records.codecs import SideCodec
from tables.records.sides import Letter
from tables.runtime.output import Collector, handler_error_letter
from tables.runtime.results import Feed, JoinResults, Serializers
from tables.runtime.stats import JoinStats
from tables.spec import JoinSpec

log = logging.getLogger(__name__)

HANDLER_FAILURES_WITHOUT_PROGRESS = 3


class Handler:
    """The handler task of one join, and what it is handed."""

    def __init__(
        self,
        spec: JoinSpec,
        left: SideCodec,
        right: SideCodec,
        collector: Collector,
        serializers: Serializers,
        stats: JoinStats,
    ) -> None:
        self.spec = spec
        self.left, self.right = left, right
        self.collector = collector
        self.serializers = serializers
        self.stats = stats
        self.feed = Feed()
        self.task: asyncio.Task[None] | None = None
        self._failures = 0

    def start(self) -> None:
        """Start the handler if it is not running."""
        if self.task is not None and not self.task.done():
            return
        results: JoinResults[Any, Any, Any] = JoinResults(
            self.spec.app,
            self.feed,
            self.spec.left.name,
            self.left.key,
            self.left.value,
            self.right.value,
            self.collector.outbox,
            self.serializers,
        )
        self.task = handler_task(
            self.spec.handler(results),
            self.collector.faust_sends,
            f"tandem-handler-{self.spec.name}",
        )

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        self.task = None

    async def handle(
        self, items: list[tuple[int, Match]], built: dict[int, tuple[bytes, Any]], letters: list[Letter]
    ) -> None:
        """Hand the batch's results (with the values built on arrival) to the handler; wait
        until it has asked past the last. A result that makes the handler raise is
        dead-lettered (into `letters`), and the handler restarted."""
        self.feed.built = built
        try:
            done = self.feed.start(items)
            while True:
                task = self.task
                assert task is not None
                await asyncio.wait({done, task}, return_when=asyncio.FIRST_COMPLETED)
                if done.done():
                    self._failures = 0
                    return
                start = self._failed(task, items, letters)
                self.start()
                if start >= len(items):
                    self.feed.finish()
                    return
                done = self.feed.start(items, start)
        finally:
            self.feed.built = {}

    def _failed(self, task: asyncio.Task[None], items: list[tuple[int, Match]], letters: list[Letter]) -> int:
        """Dead-letter what the handler was handling when it stopped; where to go on."""
        error = None if task.cancelled() else task.exception()
        at = max(self.feed.index - 1, 0)
        self.stats.handler_restarts += 1
        self._failures += 1
        if self._failures > HANDLER_FAILURES_WITHOUT_PROGRESS:
            raise RuntimeError(f"the handler of join {self.spec.name!r} keeps failing") from error
        reason = f"the handler raised {error!r}" if error else "the handler returned instead of iterating"
        log.error("tandem: join %r: %s; result dead-lettered, handler restarted", self.spec.name, reason,
                  exc_info=error)  # fmt: skip
        if error is None:
            return at
        partition, match = items[at]
        letters.append(handler_error_letter(partition, match, reason))
        return at + 1
