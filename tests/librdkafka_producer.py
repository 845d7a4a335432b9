"""A real second client for tests: produce with confluent-kafka (librdkafka).

librdkafka is under confluent-kafka (Python, Go, .NET), node-rdkafka and kcat; its
default partitioner, `consistent_random`, is a CRC32 of the key, not Kafka's murmur2
(docs/partitioners.md). Tests use this module to put records where such a producer
really puts them, on the embedded broker (which librdkafka 2.16 talks to; see
/work/shared/embedded-broker.md, "Other clients").

    delivered = produce_with_librdkafka(broker.bootstrap, "clicks", [(b"auction-1", b"{...}")])
    delivered[0].partition  # where librdkafka's default partitioner put it

The topic must exist (`tables.testing.create_topics`): librdkafka partitions a record only
once it knows the topic's partition count.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaError, Message, Producer

# librdkafka's `partitioner` values (its CONFIGURATION.md); `consistent_random` is its default.
LibrdkafkaPartitioner = Literal[
    "random",
    "consistent",
    "consistent_random",
    "murmur2",
    "murmur2_random",
    "fnv1a",
    "fnv1a_random",
]
Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True)
class Delivered:
    """Where the broker stored one record, as librdkafka's delivery report says."""

    key: bytes | None
    partition: int
    offset: int


class DeliveryFailed(RuntimeError):
    """librdkafka reported an error for a record, or did not deliver everything in time."""


def produce_with_librdkafka(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    partitioner: LibrdkafkaPartitioner = "consistent_random",
    headers: Headers | None = None,
    timeout_s: float = 30.0,
) -> list[Delivered]:
    """Produce (key, value) pairs in order with librdkafka's `partitioner`, no partition given.

    Returns one `Delivered` per record, in the order of `records`. `headers` go on every
    record. Raises DeliveryFailed if any record fails or is not acknowledged in `timeout_s`.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": partitioner,
            "linger.ms": 5,
            "acks": "all",
            # The embedded broker ages nothing out; keep librdkafka's own retries short.
            "message.timeout.ms": int(timeout_s * 1000),
        }
    )
    delivered: list[Delivered | None] = [None] * len(records)
    errors: list[str] = []

    def on_delivery(index: int, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(f"record {index}: {error}")
            return
        delivered[index] = Delivered(message.key(), message.partition(), message.offset())

    deadline = time.monotonic() + timeout_s
    for index, (key, value) in enumerate(records):
        _produce_one(producer, topic, key, value, headers, functools.partial(on_delivery, index), deadline)
    remaining = producer.flush(max(0.0, deadline - time.monotonic()))
    missing = [i for i, d in enumerate(delivered) if d is None]
    if errors or remaining or missing:
        shown = errors[:5] or [f"{len(missing)} records not acknowledged in {timeout_s} s"]
        raise DeliveryFailed(f"librdkafka could not deliver to {topic}: {'; '.join(shown)}")
    return [d for d in delivered if d is not None]


def _produce_one(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
    callback: functools.partial[None],
    deadline: float,
) -> None:
    """Queue one record, serving delivery reports while librdkafka's local queue is full."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=list(headers or []), on_delivery=callback)
            producer.poll(0)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise DeliveryFailed(f"librdkafka's queue for {topic} stayed full") from None
            producer.poll(0.1)
