"""Faust's aiokafka consumer as a member of a Tandem group: `TandemConsumer` (installed per app
by `install_consumer`) and its consumer thread.

- It offers the assignor's protocols in preference order (Faust offers one), sets the fetch
  wait (Faust hard-codes 1500 ms), and can read end offsets for Faust's table recovery from
  fetch responses (the embedded broker's ListOffsets is short).
- It runs start-up checks (`add_start_check`: the joins' co-partitioning) before joining the
  group.
- It keeps Faust's warning about the seek of a partition a rebalance revoked at DEBUG.

The join runtime's consumer (tables/kafka/consumer.py) extends both classes; this module
knows nothing of it. Every private name used here is declared to `internals.require` below,
and checked at start.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiokafka
from faust.exceptions import ImproperlyConfigured
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer
from faust.types import TP, AppT

from assignor import internals
from assignor.clients import app_settings
from assignor.faust_adapter.cooperative import narrow_faust_handlers, seek_to_committed
from assignor.faust_adapter.probes import fetched_high_watermarks

log = logging.getLogger(__name__)

StartCheck = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class FetchTuning:
    """An app's fetch settings (TandemSettings: TANDEM_FETCH_MAX_WAIT_MS, ...)."""

    fetch_max_wait_ms: int | None = None  # None: Faust's own
    fetch_high_watermarks: bool = False  # end offsets from fetch responses, not ListOffsets


_start_checks: weakref.WeakKeyDictionary[Any, list[StartCheck]] = weakref.WeakKeyDictionary()
_tuning: weakref.WeakKeyDictionary[Any, FetchTuning] = weakref.WeakKeyDictionary()


def add_start_check(app: AppT, check_: StartCheck) -> None:
    """Run `check_()` before the worker joins its group; it raises to stop it."""
    _start_checks.setdefault(app, []).append(check_)


class TandemConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer thread, offering the assignor's protocols, with the app's fetch tuning."""

    @property
    def tuning(self) -> FetchTuning:
        return _tuning.get(self.app) or FetchTuning()

    async def on_start(self) -> None:
        for start_check in _start_checks.get(self.app, []):
            await start_check()
        await super().on_start()

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        protocols = getattr(self.app.assignor, "protocols", None)
        if protocols is not None:
            # aiokafka reads this list when it creates its group coordinator, in start().
            consumer._partition_assignment_strategy = tuple(protocols())
        if self.tuning.fetch_max_wait_ms is not None:
            consumer._fetch_max_wait_ms = self.tuning.fetch_max_wait_ms  # read by the fetcher in start()
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        """End offsets for Faust's table recovery: from fetch responses, where the broker's
        ListOffsets answers short (Faust then stops with ConsistencyError)."""
        if not self.tuning.fetch_high_watermarks:
            return await super()._highwaters(partitions)
        return await fetched_high_watermarks(app_settings(self.app, "probe"), list(partitions))


class TandemConsumer(Consumer):
    """Faust's consumer with `TandemConsumerThread`, the class a subclass may replace."""

    consumer_thread: type[TandemConsumerThread] = TandemConsumerThread

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # mode gives the class its module's logger
        _quiet_revoked_seeks(cls.logger)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        narrow_faust_handlers(self)  # cooperative rounds: only what moves stops (cooperative.py)

    def _new_consumer_thread(self) -> TandemConsumerThread:
        return self.consumer_thread(self, loop=self.loop, beacon=self.beacon)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        thread = self._thread

        async def seek(*partitions: Any) -> Any:
            return await thread.call_thread(thread._ensure_consumer().seek_to_committed, *partitions)

        return await seek_to_committed(self.app, seek)


def install_consumer(
    app: AppT, fetch_max_wait_ms: int | None = None, fetch_high_watermarks: bool = False
) -> None:
    """Make `app` build its consumer as a TandemConsumer (this app's transport only), or keep
    the TandemConsumer subclass it already has (the join runtime's: tables/kafka/consumer.py)."""
    transport = app.transport
    if not issubclass(transport.Consumer, Consumer):
        raise ImproperlyConfigured(f"Tandem needs Faust's aiokafka transport, not {type(transport).__name__}")
    _tuning[app] = FetchTuning(fetch_max_wait_ms, fetch_high_watermarks)
    if not issubclass(transport.Consumer, TandemConsumer):
        transport.Consumer = TandemConsumer  # type: ignore[misc]


class _RevokedSeek(logging.Filter):
    """Faust's fetcher, given records while a rebalance stopped the flow, seeks every
    partition it held back to its committed offset, and warns when one was revoked in the
    meantime ("exception performing seek when flow not active ... No current assignment for
    partition"). A revoked partition needs no seek (its next owner reads it from the
    committed offset, and the join runtime sets its own inputs back itself): the line is kept
    at DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "exception performing seek when flow not active" in message and "No current assignment" in message:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg, record.args = f"{message} (a partition revoked by the rebalance: nothing to seek)", ()
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


def _quiet_revoked_seeks(logger: logging.Logger) -> None:
    """Idempotent: Faust's warning about a revoked partition's seek is kept at DEBUG (Faust's
    consumer logs through the logger of its class's module)."""
    if not any(isinstance(f, _RevokedSeek) for f in logger.filters):
        logger.addFilter(_RevokedSeek(logger))


_quiet_revoked_seeks(TandemConsumer.logger)

internals.require(__name__, Consumer, "_new_consumer_thread", "seek_to_committed")
internals.require(__name__, AIOKafkaConsumerThread, "call_thread", "_ensure_consumer")
internals.require(__name__, AIOKafkaConsumerThread, "_create_worker_consumer", "_highwaters", "on_start")
internals.require(
    __name__, aiokafka.AIOKafkaConsumer, "_partition_assignment_strategy", "_fetch_max_wait_ms", instance=True
)
