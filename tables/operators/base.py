"""What the worker loop asks of a join, whatever its kind: the `Operator` of one partition
over its state, and the `JoinKind` that makes it from a declaration.

A join kind is a new operator and a declaration, never a change to the worker loop
(docs/tables.md, "Join kinds"). Operators are pure: they read and write an ordered
key-value state (tables/operators/kv.py) and return matches; they never decode keys or
values (bytes in, bytes out), and never do I/O. The runtime feeds each partition's records
in event-time order across both inputs (tables/records/alignment.py), hands the matches to
the handler, and writes `take_changes()` to the changelog before the state.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import blake2b
from typing import Any, Literal, NamedTuple, Protocol

from tables.operators.kv import KV

Side = Literal["left", "right"]  # the two inputs, in declaration order
# One input record as the operator takes it: side, join key, event time (ms), id, value (None:
# a table's delete; a stream's null values never reach an operator).
Event = tuple[Side, bytes, int, bytes, bytes | None]
# An input record as the runtime releases it: the key None for a null-keyed record of a side
# whose lone records are results (`null_key_sides`); `join_events` answers those itself.
InputEvent = tuple[Side, bytes | None, int, bytes, bytes | None]


class Match(NamedTuple):
    """One result: the join key and both sides' serialized values (None: no partner). The key
    is None only for a null-keyed record given with no partner (`join_events`)."""

    key: bytes | None
    left: bytes | None
    right: bytes | None
    timestamp: int  # the result's event time (ms)


_LEN = struct.Struct(">I")
_TS = struct.Struct(">q")
_NULL = b"\xff\xff\xff\xff"  # no partner (a Kafka value is never 4 GiB long)


def fingerprint(key: bytes | None, left: bytes | None, right: bytes | None, ts: int) -> bytes:
    """A result's audit fingerprint (a join's `audit` option; the batch twin on Spark computes it
    from the raw input, docs/pipeline.md): BLAKE2b-128 of the key, the left and right values as
    read from the inputs (each length-prefixed, a missing partner or a null key marked) and the
    timestamp."""
    parts = [_NULL] if key is None else [_LEN.pack(len(key)), key]
    for value in (left, right):
        if value is None:
            parts.append(_NULL)
        else:
            parts += (_LEN.pack(len(value)), value)
    parts.append(_TS.pack(ts))
    return blake2b(b"".join(parts), digest_size=16).digest()


class Operator(Protocol):
    """The join of one partition over its state.

    `stream_time` is the largest event time seen on the partition (None: nothing yet); it
    only moves forward, and decides what is late and what falls due."""

    stream_time: int | None

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        """Join each event in turn, in the order given: the matches it makes and whatever
        falls due as stream time moves (e.g. unmatched records past their window)."""
        ...

    def advance(self, stream_time: int) -> list[Match]:
        """Stream time moves to at least `stream_time` without a record (the end of a
        bounded input, a test driver's clock): what falls due by then."""
        ...

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of what changed since the last call (None: a delete)."""
        ...

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record, emitting nothing."""
        ...

    def finish_restore(self) -> None:
        """The changelog has been applied up to its end: tidy up, silently."""
        ...

    def counters(self) -> Mapping[str, int]:
        """Records dropped by the operator, by reason ("late", "duplicates", ...), kept
        with the state: the view and metrics show them."""
        ...

    @property
    def live_records(self) -> int | None:
        """Records the operator holds in memory (the windowed join's index), for the view and
        metrics; None for a kind that holds none in memory."""
        ...

    def index_memory(self) -> dict[str, int] | None:
        """The operator's index of its live records: {"entries": n, "bytes": in memory}, for the
        view and metrics; None for a kind without one."""
        ...


class JoinKind(Protocol):
    """What a declared join computes: its operator, and what the runtime and the topics
    need to know of it."""

    @property
    def name(self) -> str:
        """The kind's name: "windowed", "temporal"."""
        ...

    @property
    def how(self) -> str:
        """The declared `how`: "inner", "left", ..."""
        ...

    @property
    def table_side(self) -> Side | None:
        """The side read as a table (each record an update of its key, a null value a delete,
        the record id its offset), or None: both sides are streams."""
        ...

    @property
    def unscanned(self) -> tuple[bytes, ...]:
        """State key prefixes the operator reads by key only, never by range (its batch
        overlay need not index them)."""
        ...

    def operator(self, state: KV, ids: bool) -> Operator:
        """The operator of one partition over `state` (`ids`: records carry declared ids)."""
        ...

    def emits_unmatched(self) -> bool:
        """Whether a result may lack a partner (left, right, outer)."""
        ...

    def retention_ms(self) -> int | None:
        """How long the changelog must keep a record (None: compaction only, forever)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The kind's parameters for the view, metrics and tools (JSON)."""
        ...


def counters_of(operators: Iterable[Operator]) -> dict[str, int]:
    """Counters summed over operators (the partitions of one join on a worker)."""
    total: dict[str, int] = {}
    for operator in operators:
        for name, value in operator.counters().items():
            total[name] = total.get(name, 0) + value
    return total


def null_key_sides(kind: JoinKind) -> frozenset[Side]:
    """The sides whose null-keyed records are results with no partner (Kafka Streams 3.7+,
    KIP-962): the sides whose unmatched records `how` emits (left: the left side; right: the
    right; outer: both), never a table. A null-keyed record of any other side cannot be
    joined, and is dead-lettered (`null_key`)."""
    how = kind.how
    sides: set[Side] = set()
    if how in ("left", "outer"):
        sides.add("left")
    if how in ("right", "outer"):
        sides.add("right")
    sides.discard(kind.table_side)
    return frozenset(sides)


def join_events(
    process_many: Callable[[Sequence[Event]], list[Match]], events: Sequence[InputEvent]
) -> list[Match]:
    """The matches of `events` in order: the keyed ones through the operator (`process_many`),
    each null-keyed one (only released for `null_key_sides`) a result of its own at once, with
    no partner and its own time. It has no key to meet a partner by, is not held, and does not
    move stream time: it cannot change any other record's result."""
    if not any(event[1] is None for event in events):
        return process_many(events)  # type: ignore[arg-type]  # every key is bytes
    matches: list[Match] = []
    run: list[Event] = []
    for event in events:
        side, key, ts, _, value = event
        if key is not None:
            run.append(event)  # type: ignore[arg-type]
            continue
        if run:
            matches += process_many(run)
            run = []
        matches.append(Match(None, value, None, ts) if side == "left" else Match(None, None, value, ts))
    if run:
        matches += process_many(run)
    return matches
