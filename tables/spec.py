"""A declared join, checked: what the runtime needs to run it (`JoinSpec`), its inputs
(`JoinInput`), and the declaration's rules. No I/O; `tables.join` (tables/api.py) makes them.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from faust.models.record import Record
from faust.types import AppT, TableT, TopicT

from tables.operators.base import JoinKind, Side, null_key_sides
from tables.operators.global_lookup import GlobalKind
from tables.operators.temporal import TemporalKind
from tables.operators.windowed import JoinType, JoinWindow
from tables.records.codecs import IdSpec, SideCodec, TimestampSpec, Validate, record_fields
from tables.records.rekey import KeySpec, Rekey, rekey_of
from tables.records.sides import side_codec

How = Literal["inner", "left", "right", "outer"]
Duration = timedelta | float | int  # a timedelta, or seconds
Partitioner = Literal["murmur2", "crc32", "none"]
Handler = Callable[[Any], Coroutine[Any, Any, None]]  # async def handler(results: JoinResults[K, L, R])

DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
# How far ahead of the worker's clock a record's time may be (a record past it would move stream
# time there and make its partition's next records late): it is dead-lettered, `future_timestamp`.
DEFAULT_MAX_FUTURE = timedelta(days=1)
# An input record's key, id and value make one record of the join's changelog, which must fit
# the producer's max_request_size: room kept for the rest (the record batch, the time, lengths).
CHANGELOG_ROOM_BYTES = 1024
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class JoinDeclarationError(ValueError):
    """A join was declared with something Tandem cannot use; the message names it."""


@dataclass(frozen=True)
class JoinInput:
    """One input of a join: a Faust topic, and how to read its records' time and identity.

    - `timestamp`: None (the Kafka record's timestamp), the name of a value field holding
      milliseconds since the epoch (an int) or an ISO 8601 time, or a function of the value
      returning milliseconds (an int) or a datetime (naive = UTC).
    - `id`: what makes two records the same record (a duplicate is joined once): None (the
      Kafka offset: a record read twice is one record), a value field's name, or a function
      of the value.
    - `validate`: an extra check, `validate(key, value) -> reason or None`; a reason sends
      the record to the dead-letter topic.
    - `key`: join on another key than the topic's: a value field's name, or a function of the
      value. Tandem then repartitions the topic through `{app id}-{join}-{side}-repartition`
      (docs/join-semantics.md, "Rekeying"); None: the topic's own Kafka key.
    """

    topic: TopicT
    timestamp: TimestampSpec = None
    id: IdSpec = None
    validate: Validate | None = None
    key: KeySpec = None

    @property
    def name(self) -> str:
        names = list(self.topic.topics or [])
        if len(names) != 1 or getattr(self.topic, "pattern", None):
            raise JoinDeclarationError(f"a join input is one topic, not {names or self.topic.pattern!r}")
        return str(names[0])


@dataclass
class JoinSpec:
    """A declared join: everything the runtime needs, checked."""

    app: AppT
    name: str
    left: JoinInput
    right: JoinInput
    kind: JoinKind
    handler: Handler
    partitioner: Partitioner = "murmur2"
    tables: Sequence[TableT] = ()
    max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES
    # Records timed further ahead of the worker's clock are dead-lettered (None: no bound).
    max_future_ms: int | None = int(DEFAULT_MAX_FUTURE / timedelta(milliseconds=1))
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)
    # Write one audit record per result to `audit_topic` (tables/runtime/output.py).
    audit: bool = False
    # Quiet for this long (wall clock, ms) with its inputs read to their end, a partition's
    # stream time follows the wall clock (None: never; docs/join-semantics.md, "Idle partitions").
    idle_ms: int | None = None
    # The inputs read from another topic and rekeyed (`JoinInput(key=...)`): `left`/`right`
    # are then their repartition topics (tables/runtime/rekeyer.py).
    repartitions: Sequence[Repartition] = ()

    @property
    def record_limit(self) -> int:
        """The largest input record the join takes, its key, id and value together: what its
        changelog can carry (the producer's `max_request_size` less CHANGELOG_ROOM_BYTES). A
        record accepted but never written would stop the join at every restart."""
        return int(self.app.conf.producer_max_request_size) - CHANGELOG_ROOM_BYTES

    @property
    def changelog_topic(self) -> str:
        """The join state's changelog (compacted), named like Faust's table changelogs."""
        return f"{self.app.conf.id}-{self.name}-changelog"

    @property
    def dead_letter_topic(self) -> str:
        """Where records the join cannot use go, with the reason."""
        return f"{self.app.conf.id}-{self.name}-dead-letters"

    @property
    def audit_topic(self) -> str:
        """With `audit`: one record per result handed to the handler (its partition, time and
        fingerprint), for `python -m pipeline reconcile`."""
        return f"{self.app.conf.id}-{self.name}-audit"

    @property
    def is_global(self) -> bool:
        """A global-table join: its table (the right input) is read whole by every worker, not
        by the group's consumer (tables/operators/global_lookup.py)."""
        return bool(getattr(self.kind, "is_global", False))

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The topics the group's consumer reads for this join: both inputs, or the stream
        alone for a global-table join."""
        if self.is_global:
            return (self.left.name,)
        return self.left.name, self.right.name

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics the join reads, each once (a self-join reads one)."""
        return tuple(dict.fromkeys(self.input_topics))

    @property
    def ids(self) -> bool:
        """Whether records carry declared ids (an input's `id` option)."""
        return self.left.id is not None or self.right.id is not None

    @property
    def source_topics(self) -> list[str]:
        """The topics a rekeyed input reads (its records rekeyed into its repartition topic)."""
        return [r.source.name for r in self.repartitions]

    def table_changelogs(self) -> list[str]:
        return [t.changelog_topic.get_topic_name() for t in self.tables]

    def codecs(self) -> dict[Side, SideCodec]:
        """Each input's record check (tables/records/sides.py), from its topic and options."""
        table = self.kind.table_side
        unkeyed = null_key_sides(self.kind)
        inputs: tuple[tuple[Side, JoinInput], ...] = (("left", self.left), ("right", self.right))
        return {
            side: side_codec(
                self.app,
                found.topic,
                found.name,
                timestamp=found.timestamp,
                record_id=found.id,
                validate=found.validate,
                max_value_bytes=self.max_value_bytes,
                max_future_ms=self.max_future_ms,
                max_record_bytes=self.record_limit,
                deletes=side == table,
                null_keys=side in unkeyed,
            )  # fmt: skip
            for side, found in inputs
        }


@dataclass(frozen=True)
class Repartition:
    """A rekeyed input: `source` (the declared input, its `key` set) is read, each record
    rekeyed and produced to `topic`, `{app id}-{join}-{side}-repartition`, which the join reads
    as that side's input (keyed by the join key, partitioned by the join's partitioner)."""

    side: Side
    source: JoinInput
    topic: TopicT

    @property
    def name(self) -> str:
        return str(next(iter(self.topic.topics)))

    def rekey(self) -> Rekey:
        """How each source record's new key is found (tables/records/rekey.py)."""
        topic: Any = self.topic
        app = topic.app
        return rekey_of(app, self.source.topic, self.source.key, topic.key_type, topic.key_serializer)


def repartition_topic_name(app: AppT, join: str, side: Side) -> str:
    return f"{app.conf.id}-{join}-{side}-repartition"


def rekeyed(
    app: AppT, join: str, left: JoinInput, right: JoinInput
) -> tuple[JoinInput, JoinInput, list[Repartition]]:
    """The join's inputs with each rekeyed one (`key=`) replaced by its repartition topic: its
    key typed and serialized as the other input's key (the join compares keys as bytes); both
    rekeyed, as JSON. The value is the source's, as it was written."""
    inputs = {"left": left, "right": right}
    repartitions: list[Repartition] = []
    for side, other in (("left", right), ("right", left)):
        found = inputs[side]
        if found.key is None:
            continue
        if other.key is None:
            key_type = other.topic.key_type
            key_serializer = other.topic.key_serializer or app.conf.key_serializer  # type: ignore[attr-defined]
        else:
            key_type, key_serializer = None, "json"
        source = found.topic
        topic = app.topic(
            repartition_topic_name(app, join, side),  # type: ignore[arg-type]
            key_type=key_type,
            value_type=source.value_type,
            key_serializer=key_serializer,
            value_serializer=source.value_serializer,  # type: ignore[attr-defined]
        )
        repartitions.append(Repartition(side, found, topic))  # type: ignore[arg-type]
        inputs[side] = JoinInput(topic, found.timestamp, found.id, found.validate)
    return inputs["left"], inputs["right"], repartitions


def duration_ms(value: Duration | None, what: str) -> int | None:
    """A duration in milliseconds from a timedelta or seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        ms = value / timedelta(milliseconds=1)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        ms = value * 1000
    else:
        raise JoinDeclarationError(f"{what} must be a timedelta or seconds, not {value!r}")
    if ms < 0:
        raise JoinDeclarationError(f"{what} must not be negative, not {value!r}")
    return int(ms)


def idle_ms_of(idle: Duration | None) -> int | None:
    """The `idle` option in ms (None: off); at least a millisecond."""
    found = duration_ms(idle, "idle")
    if found is not None and found < 1:
        raise JoinDeclarationError(f"idle={idle!r}: give a positive duration, or None to turn it off")
    return found


def window_of(
    within: Duration | None, before: Duration | None, after: Duration | None, grace: Duration | None
) -> JoinWindow:
    """`within` = the same bound on both sides; or `before`/`after` (relative to the left
    record: a right record matches when left.ts - before <= right.ts <= left.ts + after)."""
    if within is not None and (before is not None or after is not None):
        raise JoinDeclarationError("give the window as within=... or as before=/after=, not both")
    if within is None and before is None and after is None:
        raise JoinDeclarationError("a join needs a window: within=timedelta(...) or before=/after=")
    if within is not None:
        before = after = within
    return JoinWindow(
        before=duration_ms(before, "before") or 0,
        after=duration_ms(after, "after") or 0,
        grace=duration_ms(grace, "grace") or 0,
    )


def join_type_of(how: str) -> JoinType:
    try:
        return JoinType(how)
    except ValueError:
        raise JoinDeclarationError(f"how={how!r}: use 'inner', 'left', 'right' or 'outer'") from None


DEFAULT_HISTORY = timedelta(days=1)


def temporal_kind_of(how: str, grace: Duration | None, history: Duration | None) -> TemporalKind:
    """An enrichment join's parameters: `how` inner or left; `history`, how far back table
    versions are kept (default a day, at least `grace`)."""
    if how not in ("inner", "left"):
        raise JoinDeclarationError(f"how={how!r}: an enrichment join is 'inner' or 'left'")
    grace_ms = duration_ms(grace, "grace") or 0
    history_ms = duration_ms(history, "history")
    if history_ms is None:
        history_ms = max(grace_ms, duration_ms(DEFAULT_HISTORY, "history") or 0)
    if history_ms < grace_ms:
        raise JoinDeclarationError(
            f"history ({history_ms} ms) must be at least grace ({grace_ms} ms): a record still within "
            "its grace must find the table's versions as of its time"
        )
    return TemporalKind(how, grace_ms, history_ms)


# A global-table join's lookup key: a field of the stream value, or a function of the value.
GlobalKey = str | Callable[[Any], Any]


def global_kind_of(app: AppT, table: TopicT, key: GlobalKey, how: str) -> GlobalKind:
    """A global-table join's parameters: `how` inner or left; `key`, a field name or a function
    of the stream value, whose result is serialized as the table topic's keys are."""
    if how not in ("inner", "left"):
        raise JoinDeclarationError(f"how={how!r}: a global-table join is 'inner' or 'left'")
    if isinstance(table, JoinInput) or not hasattr(table, "topics"):
        raise JoinDeclarationError(
            f"a global table is an app.topic(...), not {table!r} (its records' time and id are not used)"
        )
    if not (isinstance(key, str) and key) and not callable(key):
        raise JoinDeclarationError(f"key={key!r}: name a field of the stream value, or give a function of it")
    topic_name = JoinInput(table).name
    serializer = table.key_serializer or app.conf.key_serializer  # type: ignore[attr-defined]
    key_type = table.key_type
    dumps = app.serializers.dumps_key

    def lookup(value: Any) -> bytes | None:
        found = (
            (value.get(key) if isinstance(value, dict) else getattr(value, key, None))
            if isinstance(key, str)
            else key(value)
        )
        if found is None:
            return None
        dumped = dumps(key_type, found, serializer=serializer)
        return None if dumped is None else bytes(dumped)

    return GlobalKind(how, topic_name, lookup, key_field=key if isinstance(key, str) else None)


def lookup_validation(kind: GlobalKind, validate: Validate | None) -> Validate:
    """The stream's check of a global-table join: the input's own `validate`, then the lookup
    key computed: a key function that raises sends the record to the dead letters, with why."""

    def check(key: Any, value: Any) -> str | None:
        if validate is not None:
            reason = validate(key, value)
            if reason:
                return str(reason)
        try:
            kind.lookup(value)
        except Exception as exc:
            return f"the lookup key function raised {exc.__class__.__name__}: {str(exc)[:200]}"
        return None

    return check


def as_input(value: TopicT | JoinInput, timestamp: TimestampSpec, id_: IdSpec) -> JoinInput:
    """A topic, or a JoinInput; join-wide `timestamp`/`id` apply where the input sets none."""
    if isinstance(value, JoinInput):
        found = value
    elif hasattr(value, "topics"):
        found = JoinInput(value)
    else:
        raise JoinDeclarationError(f"a join input is an app.topic(...) or a JoinInput, not {value!r}")
    return JoinInput(
        found.topic,
        found.timestamp if found.timestamp is not None else timestamp,
        found.id if found.id is not None else id_,
        found.validate,
        found.key,
    )


def _check_field(join: str, side: JoinInput, option: str, field: object) -> None:
    """A field named by `timestamp=` or `id=` must be one of the input's value fields: a
    `faust.Record`'s declared fields, or any key of a JSON object (not checkable here)."""
    if not isinstance(field, str):
        return
    topic = side.topic
    value_type = topic.value_type
    if isinstance(value_type, type) and issubclass(value_type, Record):
        names = [f.name for f in record_fields(value_type)]
        if field not in names:
            raise JoinDeclarationError(
                f"join {join!r}: {option}={field!r} is not a field of {value_type.__name__} (the values of "
                f"{side.name!r}); its fields are {', '.join(names)}"
            )
        return
    serializer = topic.value_serializer or topic.app.conf.value_serializer  # type: ignore[attr-defined]
    if serializer != "json" or value_type not in (None, dict, typing.Any):
        raise JoinDeclarationError(
            f"join {join!r}: {option}={field!r} names a field, but the values of {side.name!r} are not "
            f"JSON objects or a faust.Record (value_type={value_type!r}, value_serializer={serializer!r})"
        )


def _check_self_join(spec: JoinSpec) -> None:
    """A join of a topic with itself: a windowed join (`tables.join`), its one input read one
    way (the topic is read once, each record in both roles)."""
    if spec.kind.name != "self":
        raise JoinDeclarationError(
            f"join {spec.name!r}: a self-join of {spec.left.name!r} is a windowed join: "
            "tables.join(app, t, t, within=...)"
        )
    if spec.repartitions:  # its one topic would be read as two repartition topics
        raise JoinDeclarationError(
            f"join {spec.name!r}: a self-join of {spec.repartitions[0].source.name!r} cannot rekey its "
            "input (key=): join a topic keyed by the join key with itself (rekey it with a join of "
            "its own, or an agent)"
        )
    options = ("timestamp", "id", "validate")
    differ = [o for o in options if getattr(spec.left, o) != getattr(spec.right, o)]
    if differ:
        raise JoinDeclarationError(
            f"join {spec.name!r}: a self-join reads {spec.left.name!r} once: give its {', '.join(differ)} "
            "once (the same JoinInput for both sides, or the join's own options)"
        )


def _check_key(join: str, source: JoinInput) -> None:
    """A rekeyed input's `key=`: a value field's name (checked as `timestamp=` is) or a function."""
    key = source.key
    if not (isinstance(key, str) or callable(key)):
        raise JoinDeclarationError(
            f"join {join!r}: key={key!r} for {source.name!r}: give a value field's name or a function "
            "of the value"
        )
    _check_field(join, source, "key", key)


def _read_topics(spec: JoinSpec) -> tuple[str, str]:
    """The topics the join's two sides read from Kafka: a rekeyed side's source topic."""
    sources = {r.side: r.source.name for r in spec.repartitions}
    return sources.get("left", spec.left.name), sources.get("right", spec.right.name)


def check_spec(spec: JoinSpec, others: Sequence[JoinSpec]) -> None:
    """Refuse, naming the problem, what would make the join wrong or unstartable."""
    if not _TOPIC_NAME.match(spec.name):
        raise JoinDeclarationError(
            f"join name {spec.name!r}: use letters, digits, '.', '_' and '-' (it names topics)"
        )
    if not inspect.iscoroutinefunction(spec.handler):
        raise JoinDeclarationError(
            f"join {spec.name!r}: its handler {getattr(spec.handler, '__name__', spec.handler)!r} must be "
            "an `async def` that iterates its results (`async for key, left, right, ts in results`)"
        )
    for side in (spec.left, spec.right):
        _check_field(spec.name, side, "timestamp", side.timestamp)
        _check_field(spec.name, side, "id", side.id)
    if spec.is_global:
        _check_field(spec.name, spec.left, "key", getattr(spec.kind, "key_field", None))
    if spec.kind.table_side == "right" and spec.right.id is not None:
        raise JoinDeclarationError(
            f"join {spec.name!r}: a table's records are its key's versions in offset order; it takes no "
            f"id= (given {spec.right.id!r} for {spec.right.name!r})"
        )
    for repartition in spec.repartitions:
        _check_key(spec.name, repartition.source)
    left, right = _read_topics(spec)
    if left == right:
        _check_self_join(spec)
    counts = {t.get_topic_name(): t.partitions for t in (spec.left.topic, spec.right.topic) if t.partitions}
    if len(set(counts.values())) > 1 and not spec.is_global:  # a global table is read whole
        raise JoinDeclarationError(
            f"join {spec.name!r}: its inputs must have one partition count, not {counts}"
        )
    if spec.partitioner not in ("murmur2", "crc32", "none"):
        raise JoinDeclarationError(f"partitioner={spec.partitioner!r}: use 'murmur2', 'crc32' or 'none'")
    for table in spec.tables:
        if getattr(table, "is_global", False):
            raise JoinDeclarationError(
                f"table {table.name!r} is global: a join's tables live on its partitions"
            )
        if getattr(table, "use_partitioner", False):
            raise JoinDeclarationError(
                f"table {table.name!r} has use_partitioner=True: a join's tables are written on the "
                "partition of the result being handled"
            )
    for other in others:
        if other.name == spec.name:
            raise JoinDeclarationError(f"two joins named {spec.name!r} in one app")
