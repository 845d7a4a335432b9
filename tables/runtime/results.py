"""The stream of a join's results, as its handler sees them.

    async for key, left, right, ts in results:      # one result at a time
        results.send_soon(output, key=key, value=...)
    async for batch in results.batches():           # or all results of a partition at once
        ...

Asking for the next result means the previous one is handled: once the handler has
asked past the last result of a batch, the runtime has the handler's sends
acknowledged, writes the join's changelog and state, and only then lets Faust
commit the input offsets (at-least-once, docs/join-semantics.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

import orjson
from faust.types import AppT, TopicT

from tables.kafka.handler_sends import set_current_partition
from tables.operators.base import Match

K = TypeVar("K")
L = TypeVar("L")
R = TypeVar("R")

# The handler runs on the event loop: it is given results in JoinBatches of at most this many,
# and the loop a turn whenever TURN_S has passed while it asks for the next result (an app's
# loop over a partition's thousands of results held the loop for a second on a busy machine).
BATCH_MAX_RESULTS = 1000
TURN_S = 0.01

Decode = Callable[[bytes], Any]
# topic, partition (None: the key's), key, value, headers, and the partition of the result
# being handled when the record's key is that result's join key (then it is the key's
# partition too, in a topic with the join's partition count).
Outgoing = tuple[str, int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes]], int | None]


class JoinResult(NamedTuple, Generic[K, L, R]):
    """One result of a join: the key, each side's value (None where there is no partner)
    and the result's timestamp in milliseconds since the epoch (the later record's)."""

    key: K
    left: L | None
    right: R | None
    timestamp: int


@dataclass
class JoinBatch(Generic[K, L, R]):
    """The results of one partition, from one batch of input."""

    partition: int
    results: list[JoinResult[K, L, R]]


@dataclass
class Feed:
    """One batch of matches handed to the handler; `done` resolves once it asked past the end."""

    items: list[tuple[int, Match]] = field(default_factory=list)
    index: int = 0  # next to hand out: everything before it has been asked past
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[None] | None = None
    # Values of this batch's inputs built on arrival, by id of their bytes (`Intake.built`):
    # a result takes one (once) instead of building it again from the same bytes.
    built: dict[int, tuple[bytes, Any]] = field(default_factory=dict)

    last_turn: float = field(default_factory=time.monotonic)  # when the handler last let the loop run

    def start(self, items: list[tuple[int, Match]], start_at: int = 0) -> asyncio.Future[None]:
        self.items, self.index = items, start_at
        self.done = asyncio.get_running_loop().create_future()
        self.arrived.set()
        return self.done

    def finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        self.arrived.clear()

    async def next_index(self) -> int:
        while self.index >= len(self.items):
            self.finish()
            await self.arrived.wait()
            self.last_turn = time.monotonic()
        if time.monotonic() - self.last_turn > TURN_S:
            await asyncio.sleep(0)  # the handler has had the loop long enough
            self.last_turn = time.monotonic()
        self.index += 1
        return self.index - 1


_NO_TOPIC = object()  # before the first for_topic (None is no topic either, but an error)


class Serializers:
    """Bytes of keys and values for a topic: fast paths for the common forms, else Faust's."""

    def __init__(self, app: AppT) -> None:
        self.app = app
        self._by_topic: dict[str, tuple[Callable[[Any], bytes | None], Callable[[Any], bytes | None]]] = {}
        # The topic asked for last and its answer: a handler sends to one topic, once per result.
        self._last_topic: object = _NO_TOPIC
        self._last: tuple[str, Callable[[Any], bytes | None], Callable[[Any], bytes | None]]

    def for_topic(
        self, topic: TopicT | str
    ) -> tuple[str, Callable[[Any], bytes | None], Callable[[Any], bytes | None]]:
        if topic is self._last_topic:
            return self._last
        name = topic if isinstance(topic, str) else topic.get_topic_name()
        found = self._by_topic.get(name)
        if found is None:
            found = self._by_topic[name] = (self._key(topic), self._value(topic))
        self._last, self._last_topic = (name, found[0], found[1]), topic
        return self._last

    def _key(self, topic: TopicT | str) -> Callable[[Any], bytes | None]:
        if isinstance(topic, str):
            return _plain
        serializer = topic.key_serializer or self.app.conf.key_serializer  # type: ignore[attr-defined]
        dumps = self.app.serializers.dumps_key

        def key(value: Any) -> bytes | None:
            if value is None or type(value) is bytes:
                return value
            if serializer == "raw" and type(value) in (str, int):
                return str(value).encode()
            return dumps(topic.key_type, value, serializer=serializer)

        return key

    def _value(self, topic: TopicT | str) -> Callable[[Any], bytes | None]:
        if isinstance(topic, str):
            return _plain
        serializer = topic.value_serializer or self.app.conf.value_serializer  # type: ignore[attr-defined]
        dumps = self.app.serializers.dumps_value

        def value(obj: Any) -> bytes | None:
            if obj is None or type(obj) is bytes:
                return obj
            if serializer == "json" and type(obj) in (dict, list, str, int, float):
                return _dumps(obj)
            return dumps(topic.value_type, obj, serializer=serializer)

        return value


def _plain(value: Any) -> bytes | None:
    """A topic given by name: bytes as they are, str as UTF-8, anything else as JSON."""
    if value is None or type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode()
    return _dumps(value)


def _dumps(value: Any) -> bytes:
    """orjson.dumps(value) in a bytes object of its own size. orjson writes into a buffer of
    at least 1 KB (above Python's small-object allocator: glibc's malloc) and shrinks it in
    place; a batch keeps thousands of results alive, each holding most of a kilobyte it does
    not use, and the memory a batch grows into is faulted in page by page, again after the
    last batch freed it: ~1.7 us more per result than the copy (benchmarks/bench_serializers.py)."""
    return bytes(memoryview(orjson.dumps(value)))


class JoinResults(Generic[K, L, R]):
    """What a join handler iterates: its results, and a buffered way to send output."""

    def __init__(
        self,
        app: AppT,
        feed: Feed,
        left_topic: str,
        decode_key: Decode,
        decode_left: Decode,
        decode_right: Decode,
        outbox: list[Outgoing],
        serializers: Serializers,
    ) -> None:
        self.app = app
        self._feed = feed
        self._topic = left_topic
        self._decode_key = decode_key
        self._decode_left = decode_left
        self._decode_right = decode_right
        self._outbox = outbox
        self._serializers = serializers
        self._event: object = None  # keeps Faust's current event alive (a weak reference)
        self.partition: int | None = None  # of the result being handled
        self._keys: set[bytes | None] | frozenset[bytes] = frozenset()  # join keys of what is handled

    def __aiter__(self) -> JoinResults[K, L, R]:
        return self

    async def __anext__(self) -> JoinResult[K, L, R]:
        feed = self._feed
        at = await feed.next_index()
        partition, match = feed.items[at]
        if partition != self.partition:
            self._at_partition(partition)
        self._keys = {match.key}
        return self._result(match)

    async def batches(self) -> AsyncIterator[JoinBatch[K, L, R]]:
        """The results one partition at a time, at most BATCH_MAX_RESULTS a batch (the handler
        may aggregate, then write once per batch)."""
        feed = self._feed
        while True:
            first = await feed.next_index()
            partition = feed.items[first][0]
            end, last = first + 1, min(len(feed.items), first + BATCH_MAX_RESULTS)
            while end < last and feed.items[end][0] == partition:
                end += 1
            feed.index = end
            self._at_partition(partition)
            matches = [m for _, m in feed.items[first:end]]
            self._keys = {m.key for m in matches}
            yield JoinBatch(partition, self._results(matches))

    def _at_partition(self, partition: int) -> None:
        self.partition = partition
        self._event = set_current_partition(self.app, self._topic, partition)

    def _results(self, matches: list[Match]) -> list[JoinResult[K, L, R]]:
        """`_result` of each match, in one loop over local names (it runs once per result)."""
        key_of, left_of, right_of = self._decode_key, self._decode_left, self._decode_right
        new = tuple.__new__  # JoinResult(...) without its Python-level __new__
        take = self._feed.built.pop
        results = []
        for key, left, right, timestamp in matches:
            if left is not None:
                found = take(id(left), None)
                left = found[1] if found is not None and found[0] is left else left_of(left)
            if right is not None:
                found = take(id(right), None)
                right = found[1] if found is not None and found[0] is right else right_of(right)
            results.append(new(JoinResult, (None if key is None else key_of(key), left, right, timestamp)))
        return results

    def _result(self, match: Match) -> JoinResult[K, L, R]:
        return self._results([match])[0]

    def send_soon(
        self,
        topic: TopicT | str,
        key: Any = None,
        value: Any = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Send a record with the join's own producer, in whole batches, acknowledged
        before the join commits. Keys and values are serialized with the topic's types;
        the partition is the key's (Kafka's partitioner), or the result's for no key."""
        name, dumps_key, dumps_value = self._serializers.for_topic(topic)
        raw_key = dumps_key(key)
        if partition is None and raw_key is None:
            partition = self.partition
        # A join key of this partition's results lies on this partition (the key's own).
        same_key = self.partition if raw_key in self._keys else None
        self._outbox.append((name, partition, raw_key, dumps_value(value), headers, same_key))
