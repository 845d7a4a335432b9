"""Declaring a join in a Faust app (`tables.join`), and where each app's join runtime is
made: the composition root of Tandem's layers.

    orders = app.topic("orders", key_type=int, value_type=Order)
    payments = app.topic("payments", key_type=int, value_type=Payment)

    @join(app, orders, payments, within=timedelta(minutes=10), grace=timedelta(minutes=1), how="left")
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for key, order, payment, ts in results:
            ...

Everything that makes the join correct is the framework's: the runtime (tables/runtime/)
runs it, the web layer (tables/web/) shows it; both are made here, once per app.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypedDict, Unpack

from faust.types import AppT, TableT, TopicT

from assignor.faust_adapter import apply_web_defaults
from assignor.internals import check as check_internals
from tables.operators.base import JoinKind
from tables.operators.self_join import SELF_JOIN_TYPES, SelfJoinKind
from tables.operators.windowed_kind import WindowedKind
from tables.records.codecs import IdSpec, TimestampSpec
from tables.runtime.results import JoinResults
from tables.runtime.worker import Runtime
from tables.spec import (
    DEFAULT_MAX_FUTURE,
    DEFAULT_MAX_VALUE_BYTES,
    Duration,
    GlobalKey,
    How,
    JoinDeclarationError,
    JoinInput,
    JoinSpec,
    Partitioner,
    as_input,
    check_spec,
    duration_ms,
    global_kind_of,
    idle_ms_of,
    join_type_of,
    lookup_validation,
    rekeyed,
    temporal_kind_of,
    window_of,
)
from tables.web import register_web

Handler = Callable[[JoinResults[Any, Any, Any]], Coroutine[Any, Any, None]]  # an `async def`: a task runs it

_runtimes: weakref.WeakKeyDictionary[AppT, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(app: AppT) -> Runtime:
    """The app's join runtime, made at its first join with its web pages (when the app
    serves web pages)."""
    runtime = _runtimes.get(app)
    if runtime is None:
        check_internals()
        apply_web_defaults(app)  # before a page is registered: Faust picks its endpoints then
        runtime = _runtimes[app] = Runtime(app)
        if app.conf.web_enabled:
            register_web(app, runtime)
    return runtime


def declared(spec: JoinSpec) -> JoinSpec:
    """A join checked against the declaration's rules and the app's other joins, and handed
    to the app's runtime."""
    runtime = runtime_of(spec.app)
    check_spec(spec, runtime.specs())
    runtime.add(spec)
    return spec


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
    **options: Unpack[JoinOptions],
) -> Callable[[Handler], JoinSpec]:
    """Declare a windowed join of two co-partitioned Faust topics by their Kafka key, and the
    handler that consumes its results (like `@app.agent`).

    - `left`, `right`: `app.topic(...)` objects (their key and value types are the join's),
      or `JoinInput(topic, timestamp=..., id=..., validate=..., key=...)` for per-input options;
      `key=` (a value field's name or a function of the value) joins a topic on another key
      than its Kafka key: Tandem repartitions it (docs/join-semantics.md, "Rekeying").
    - Window: `within` (both sides), or `before`/`after` relative to the left record; and
      `grace`, how late (in event time) a record may still arrive. timedelta or seconds.
    - `how`: "inner", "left", "right" or "outer": unmatched records of the named side(s) are
      emitted once no partner can still arrive (never a spurious unmatched result).
    - A self-join (`left` and `right` the same topic): each record joined with the other
      records of its key within the window, never with itself ("inner" or "left";
      docs/join-semantics.md, "Self-joins").
    - `options` (`JoinOptions`, the same for every kind of join): `name`, `timestamp`, `id`,
      `partitioner`, `tables`, `max_value_bytes`, `max_future`, `audit`, `idle`.

    The handler receives a `JoinResults` stream; it may send to topics and update tables.
    Input offsets are committed only after the handler has taken every result they
    produced, its sends are acknowledged, and the join's state is in its changelog.
    """

    window, join_type = window_of(within, before, after, grace), join_type_of(how)
    if as_input(left, None, None).name != as_input(right, None, None).name:
        return join_of_kind(app, left, right, WindowedKind(window, join_type), **options)
    if join_type not in SELF_JOIN_TYPES:
        raise JoinDeclarationError(
            f"how={how!r}: a self-join is 'inner' or 'left' (its right join is its left join mirrored)"
        )
    return join_of_kind(app, left, right, SelfJoinKind(window, join_type), **options)


def join_table(
    app: AppT,
    stream: TopicT | JoinInput,
    table: TopicT | JoinInput,
    *,
    grace: Duration | None = None,
    history: Duration | None = None,
    how: Literal["inner", "left"] = "inner",
    **options: Unpack[JoinOptions],
) -> Callable[[Handler], JoinSpec]:
    """Declare an enrichment join: each record of `stream` joined with the value `table` held
    for its key **as of the record's event time** (Kafka Streams' stream-table join over a
    versioned table; docs/join-semantics.md, "Enrichment"). Both topics are keyed alike and
    co-partitioned; each table record is an update of its key at its timestamp, a null value
    deleting the key from that time on.

    - `stream`, `table`: `app.topic(...)` objects, or `JoinInput(topic, timestamp=..., ...)`.
    - `grace`: how late (in event time) a table update may arrive and still be seen: a stream
      record's result is emitted once stream time passes its time plus `grace`.
    - `history`: how far back (in event time) table versions are kept (default a day, at
      least `grace`); each key's latest version is kept however old it is.
    - `how`: "inner" (no result without a table value) or "left" (the table value None).
    - `options` (`JoinOptions`): as for `join`; `id` is the stream's record identity (a
      table's records are identified by their offsets).
    - `audit`: as for `join`: write, for every result handed to the handler, a small record
      (its partition, time and fingerprint: of the key, the stream value, the table value or
      none, and the stream record's time) to `{app id}-{name}-audit`, with the batch's output:
      what `python -m pipeline reconcile` compares with the batch twin (docs/pipeline.md).

    The handler is written as for `join`: `async for key, stream_value, table_value, ts in
    results`, `ts` the stream record's time.
    """

    kind = temporal_kind_of(how, grace, history)
    return join_of_kind(app, stream, table, kind, **options)


def join_global(
    app: AppT,
    stream: TopicT | JoinInput,
    table: TopicT,
    *,
    key: GlobalKey,
    how: Literal["inner", "left"] = "inner",
    **options: Unpack[JoinOptions],
) -> Callable[[Handler], JoinSpec]:
    """Declare a global-table join: each record of `stream` joined with the value `table`
    holds **now**, when the record is joined, for a key computed from the record (Kafka
    Streams' KStream-GlobalKTable join; docs/join-semantics.md, "Global tables").

    Every worker holds the whole table (all its partitions) in its own RocksDB store, reads it
    to its end before it joins its group, and keeps reading it while it runs. The table need
    not be keyed or partitioned like the stream: no co-partitioning, no standbys.

    - `stream`: an `app.topic(...)`, or `JoinInput(topic, timestamp=..., id=..., validate=...)`.
    - `table`: an `app.topic(...)`: each record sets its key's value, a null value deletes it.
      Its key type and serializer are how the lookup key is serialized.
    - `key`: the lookup key, from the stream record's value: a field's name, or a function of
      the value. A function that raises sends the record to the dead-letter topic with the
      reason; None (a missing field, or returned) means no key: no partner.
    - `how`: "inner" (no result without a table value) or "left" (the table value None).
    - `options` (`JoinOptions`): as for `join`; `id` is the stream's record identity.

    The handler is written as for `join_table`: `async for key, stream_value, table_value, ts
    in results`, `key` the stream record's key, `ts` its time.
    """

    kind = global_kind_of(app, table, key, how)
    given = stream if isinstance(stream, JoinInput) else JoinInput(stream)
    checked = JoinInput(given.topic, given.timestamp, given.id, lookup_validation(kind, given.validate))
    declare = join_of_kind(app, checked, table, kind, **options)

    def register(handler: Handler) -> JoinSpec:
        spec = declare(handler)
        kind.decode = spec.codecs()["left"].value  # the stream value's bytes -> the app's value
        return spec

    return register


class JoinOptions(TypedDict, total=False):
    """The options every kind of join takes (`join`, `join_table`), each with its default in
    `JOIN_OPTION_DEFAULTS`:

    - `name`: names the changelog `{app id}-{name}-changelog` and the dead-letter topic
      `{app id}-{name}-dead-letters`; the handler's name by default (None).
    - `timestamp`, `id`: as in `JoinInput`, for both inputs (a table's records are identified
      by their offsets: `id` is the stream's only).
    - `partitioner`: how producers partition the inputs' keys ("murmur2", Kafka's default;
      "crc32", librdkafka's default; "none" turns the check off). A record on the wrong
      partition could never meet its partner: it is dead-lettered.
    - `tables`: Faust tables the handler updates. They live on the join's partitions (same
      partition count, placed and replicated with the join), and the handler writes to the
      partition of the result it is handling.
    - `max_value_bytes`: larger values are dead-lettered (None: no limit).
    - `max_future`: a record timed further ahead of the worker's clock is dead-lettered
      (`future_timestamp`) instead of moving stream time (default a day; None: no bound).
    - `audit`: also write, for every result handed to the handler, a small record (its
      partition, time and fingerprint) to `{app id}-{name}-audit`, with the batch's output:
      what `python -m pipeline reconcile` compares with the batch twin (docs/pipeline.md).
    - `idle`: off (None) by default. A timedelta (or seconds): once both inputs of a partition
      have been read to their end and nothing has arrived on it for that long, its stream time
      moves on with the wall clock, so that what waits on it (a grace, a window) is released
      on a quiet partition. Results released so are marked in the audit (`"idle": true`). It
      trades determinism for latency (docs/join-semantics.md, "Idle partitions").
    """

    name: str | None
    timestamp: TimestampSpec
    id: IdSpec
    partitioner: Partitioner
    tables: Sequence[TableT]
    max_value_bytes: int | None
    max_future: Duration | None
    audit: bool
    idle: Duration | None


JOIN_OPTION_DEFAULTS: JoinOptions = {
    "name": None,
    "timestamp": None,
    "id": None,
    "partitioner": "murmur2",
    "tables": (),
    "max_value_bytes": DEFAULT_MAX_VALUE_BYTES,
    "max_future": DEFAULT_MAX_FUTURE,
    "audit": False,
    "idle": None,
}


def join_of_kind(
    app: AppT,
    left: TopicT | JoinInput,
    right: TopicT | JoinInput,
    kind: JoinKind,
    **given: Unpack[JoinOptions],
) -> Callable[[Handler], JoinSpec]:
    """Declare a join of any `kind` (a `JoinKind`: docs/tables.md, "Adding a join kind") and
    the handler of its results, with the options every join takes (`JoinOptions`). `join` and
    `join_table` are this with their own kinds. `id` names the record id of each input but a
    table side's (`kind.table_side`: a table's records are identified by their offsets)."""
    unknown = sorted(set(given) - set(JOIN_OPTION_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown join option(s) {unknown}: the options are {sorted(JOIN_OPTION_DEFAULTS)}")
    options: JoinOptions = {**JOIN_OPTION_DEFAULTS, **given}

    def register(handler: Handler) -> JoinSpec:
        timestamp, record_id = options["timestamp"], options["id"]
        name = options["name"] or handler.__name__.replace("_", "-")
        # A rekeyed input (`JoinInput(key=...)`) is read by the join from its repartition topic.
        left_input, right_input, repartitions = rekeyed(
            app,
            name,
            as_input(left, timestamp, None if kind.table_side == "left" else record_id),
            as_input(right, timestamp, None if kind.table_side == "right" else record_id),
        )
        spec = JoinSpec(
            app=app,
            name=name,
            left=left_input,
            right=right_input,
            repartitions=tuple(repartitions),
            kind=kind,
            handler=handler,
            partitioner=options["partitioner"],
            tables=tuple(options["tables"]),
            max_value_bytes=options["max_value_bytes"],
            max_future_ms=duration_ms(options["max_future"], "max_future"),
            audit=options["audit"],
            idle_ms=idle_ms_of(options["idle"]),
        )
        return declared(spec)

    return register
