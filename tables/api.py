"""Declaring a windowed stream-stream join in a Faust app (`tables.join`).

    orders = app.topic("orders", key_type=int, value_type=Order)
    payments = app.topic("payments", key_type=int, value_type=Payment)

    @join(app, orders, payments, within=timedelta(minutes=10), grace=timedelta(minutes=1), how="left")
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for key, order, payment, ts in results:
            ...

Everything that makes the join correct is the framework's: see tables/runtime/task.py.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypeVar

from faust.types import AppT, TableT, TopicT

from tables.operators.windowed import JoinType, JoinWindow
from tables.records.codecs import IdSpec, TimestampSpec, Validate

if TYPE_CHECKING:
    from tables.runtime.results import JoinResults

K = TypeVar("K")
L = TypeVar("L")
R = TypeVar("R")

How = Literal["inner", "left", "right", "outer"]
Duration = timedelta | float | int  # a timedelta, or seconds
Partitioner = Literal["murmur2", "crc32", "none"]
Handler = Callable[["JoinResults[Any, Any, Any]"], Awaitable[None]]

DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class JoinDeclarationError(ValueError):
    """A join was declared with something Tandem cannot use; the message names it."""


class JoinResult(NamedTuple, Generic[K, L, R]):
    """One result of a join: the key, each side's value (None where there is no partner)
    and the result's timestamp in milliseconds since the epoch (the later record's)."""

    key: K
    left: L | None
    right: R | None
    timestamp: int


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
    """

    topic: TopicT
    timestamp: TimestampSpec = None
    id: IdSpec = None
    validate: Validate | None = None

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
    window: JoinWindow
    join_type: JoinType
    handler: Handler
    partitioner: Partitioner = "murmur2"
    tables: Sequence[TableT] = ()
    max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)

    @property
    def changelog_topic(self) -> str:
        """The join state's changelog (compacted), named like Faust's table changelogs."""
        return f"{self.app.conf.id}-{self.name}-changelog"

    @property
    def dead_letter_topic(self) -> str:
        """Where records the join cannot use go, with the reason."""
        return f"{self.app.conf.id}-{self.name}-dead-letters"

    @property
    def input_topics(self) -> tuple[str, str]:
        return self.left.name, self.right.name

    def table_changelogs(self) -> list[str]:
        return [t.changelog_topic.get_topic_name() for t in self.tables]


def to_millis(value: Duration | None, what: str) -> int | None:
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
        before=to_millis(before, "before") or 0,
        after=to_millis(after, "after") or 0,
        grace=to_millis(grace, "grace") or 0,
    )


def join_type_of(how: str) -> JoinType:
    try:
        return JoinType(how)
    except ValueError:
        raise JoinDeclarationError(f"how={how!r}: use 'inner', 'left', 'right' or 'outer'") from None


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
    )


def check_spec(spec: JoinSpec, others: Sequence[JoinSpec]) -> None:
    """Refuse, naming the problem, what would make the join wrong or unstartable."""
    if not _TOPIC_NAME.match(spec.name):
        raise JoinDeclarationError(
            f"join name {spec.name!r}: use letters, digits, '.', '_' and '-' (it names topics)"
        )
    left, right = spec.input_topics
    if left == right:
        raise JoinDeclarationError(f"join {spec.name!r}: a self-join of {left!r} is not supported")
    counts = {t.get_topic_name(): t.partitions for t in (spec.left.topic, spec.right.topic) if t.partitions}
    if len(set(counts.values())) > 1:
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
        shared = set(other.input_topics) & set(spec.input_topics)
        if shared:
            raise JoinDeclarationError(
                f"joins {other.name!r} and {spec.name!r} both read {sorted(shared)}: a topic feeds one join"
            )


def join(
    app: AppT,
    left: TopicT | JoinInput,
    right: TopicT | JoinInput,
    *,
    within: Duration | None = None,
    before: Duration | None = None,
    after: Duration | None = None,
    grace: Duration | None = None,
    how: How = "inner",
    name: str | None = None,
    timestamp: TimestampSpec = None,
    id: IdSpec = None,  # noqa: A002 - the option's natural name
    partitioner: Partitioner = "murmur2",
    tables: Sequence[TableT] = (),
    max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
) -> Callable[[Handler], JoinSpec]:
    """Declare a windowed join of two co-partitioned Faust topics by their Kafka key, and the
    handler that consumes its results (like `@app.agent`).

    - `left`, `right`: `app.topic(...)` objects (their key and value types are the join's),
      or `JoinInput(topic, timestamp=..., id=..., validate=...)` for per-input options.
    - Window: `within` (both sides), or `before`/`after` relative to the left record; and
      `grace`, how late (in event time) a record may still arrive. timedelta or seconds.
    - `how`: "inner", "left", "right" or "outer": unmatched records of the named side(s) are
      emitted once no partner can still arrive (never a spurious unmatched result).
    - `name`: names the changelog `{app id}-{name}-changelog` and the dead-letter topic
      `{app id}-{name}-dead-letters`; the handler's name by default.
    - `timestamp`, `id`: as in `JoinInput`, for both inputs.
    - `partitioner`: how producers partition the inputs' keys ("murmur2", Kafka's default;
      "crc32", librdkafka's default; "none" turns the check off). A record on the wrong
      partition could never meet its partner: it is dead-lettered.
    - `tables`: Faust tables the handler updates. They live on the join's partitions (same
      partition count, placed and replicated with the join), and the handler writes to the
      partition of the result it is handling.
    - `max_value_bytes`: larger values are dead-lettered (None: no limit).

    The handler receives a `JoinResults` stream; it may send to topics and update tables.
    Input offsets are committed only after the handler has taken every result they
    produced, its sends are acknowledged, and the join's state is in its changelog.
    """

    def register(handler: Handler) -> JoinSpec:
        from tables.runtime.task import runtime_of

        spec = JoinSpec(
            app=app,
            name=name or handler.__name__.replace("_", "-"),
            left=as_input(left, timestamp, id),
            right=as_input(right, timestamp, id),
            window=window_of(within, before, after, grace),
            join_type=join_type_of(how),
            handler=handler,
            partitioner=partitioner,
            tables=tuple(tables),
            max_value_bytes=max_value_bytes,
        )
        runtime = runtime_of(app)
        check_spec(spec, runtime.specs())
        runtime.add(spec)
        return spec

    return register
