"""What a join's task (tables/runtime/task.py) and its intake (tables/runtime/intake.py) need
from Kafka, as small interfaces (ports), each with two implementations: Faust's and
aiokafka's on a worker, and the in-memory ones of the test driver (tables/testing/memory.py).

- fetched records: whole fetches handed to `JoinTask.take` (its own loop cuts them into
  batches) or one batch to `JoinTask.batch`. Worker: Tandem's consumer (`Runtime.take`);
  driver: `MemoryInputs.fetch`.
- high watermarks and committed offsets (`InputOffsets`). Worker: `ConsumerOffsets` (Faust's
  consumer); driver: `MemoryInputs`.
- the producer and its acknowledgements (`Producer`: whole record batches, each answered by
  a future). Worker: the aiokafka producer inside Faust's producer (`Runtime.producer`);
  driver: `MemoryProducer`, which also stands in for Faust's producer (`topic.send()`,
  `send_soon` and the Faust tables of the handler).
- pause and resume (`JoinTask.paused()`: the inputs not to fetch now). Worker: the consumer
  leaves them out of its fetches; driver: `MemoryInputs.fetch(paused)`.
- seek (`Worker.rewind`: input partitions set back to their first record not done). Worker:
  `Runtime.rewind` (the consumer thread's seek); driver: `MemoryInputs.seek`.
- the changelog read back (`JoinState.recovery`). Worker: `Recovery` (an aiokafka consumer);
  driver: `MemoryRecovery`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from faust.types import TP, AppT

from tables.kafka.consumer import committed_offsets


class InputOffsets(Protocol):
    """Where each input partition ends and where this consumer started reading it."""

    def highwater(self, tp: TP) -> int | None:
        """The partition's high watermark (the next offset to be written); None until known."""
        ...

    def committed(self) -> Mapping[TP, int | None]:
        """The offsets this consumer committed (or started from), per input partition."""
        ...


class Producer(Protocol):
    """The aiokafka producer surface the output path uses (tables/kafka/batches.py): whole
    record batches, each answered by a future that resolves on the broker's acknowledgement."""

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any: ...

    async def partitions_for(self, topic: str) -> set[int]: ...


class ConsumerOffsets:
    """`InputOffsets` from Faust's consumer."""

    def __init__(self, app: AppT) -> None:
        self.app = app

    def highwater(self, tp: TP) -> int | None:
        try:
            return self.app.consumer.highwater(tp)
        except Exception:  # not assigned (yet), or the consumer not started
            return None

    def committed(self) -> Mapping[TP, int | None]:
        return committed_offsets(self.app)
