"""What a join does with one input record before joining it: decode, check, and take
its join key, timestamp and id (docs/join-semantics.md, "Records"). No I/O.

A side is described by the Faust topic it reads (its `key_type`, `value_type` and
serializers) plus the join's options. Common forms take fast paths (JSON with orjson,
`faust.Record` fields checked by their annotations, raw bytes and str, int keys); any
other form goes through Faust's own serializers. A record that cannot be used is
`Rejected` with a reason (it goes to the join's dead-letter topic) and a category
from a small fixed set (for counters and metrics).

JSON is decoded by orjson (strict RFC 8259, UTF-8 only): NaN, Infinity, lone
surrogates, a byte order mark and non-UTF-8 text are malformed JSON.

The per-record check of the common configurations also exists compiled
(tables/records/_fastcheck.pyx), used where it is built: `CHECK.active` says whether it is, and
`SideCodec.compiled` whether a side's configuration takes it.
"""

from __future__ import annotations

import struct
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
from faust.models.record import Record
from faust.serializers import codecs as faust_codecs

from assignor import internals
from tables.compiled import CompiledPart

Category = Literal[
    "null_key",  # no Kafka key: it cannot be joined by key
    "too_large",  # value over the join's size limit, or a record its changelog cannot carry
    "undecodable",  # the serializer could not read it
    "wrong_type",  # decoded, but the declared types reject it
    "timestamp",  # no usable timestamp
    "future_timestamp",  # its time is further ahead of the worker's clock than the join's max_future
    "rejected",  # the join's own `validate` check said no
    "wrong_partition",  # its key belongs to another partition (the producer's partitioner)
    "handler_error",  # a result of it made the join's handler raise
]
CATEGORIES: tuple[Category, ...] = typing.get_args(Category)

# Kafka timestamps are milliseconds since the epoch, never negative; past year 9999 a
# value is corrupt, and near 2**63 it would overflow the state's time keys.
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
OUT_OF_RANGE = "timestamp out of range (0 to year 9999 in ms since the epoch)"
_OFFSET = struct.Struct(">Q")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

TimestampSpec = str | Callable[[Any], "int | datetime"] | None
IdSpec = str | Callable[[Any], "str | bytes | int"] | None
Validate = Callable[[Any, Any], "str | None"]
# key, value, offset, Kafka timestamp -> (ts, record id, built value or None) | Rejected | Dropped
Accept = Callable[[bytes | None, bytes | None, int, int | None], Any]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that cannot be joined, and why."""

    reason: str
    category: Category


class Dropped:
    """A record with a null value: dropped and counted, never joined (Kafka Streams 3.8+)."""


DROPPED = Dropped()


@dataclass(frozen=True, slots=True)
class Accepted:
    """A record to join: its timestamp (ms) and its id within its side and key."""

    ts: int
    record_id: bytes
    value: Any = None  # the decoded value, when it was built to check the record


def unwritable(key: bytes, record_id: bytes, value: bytes | None, limit: int | None) -> Rejected | None:
    """Why a record is too large for the join's changelog (whose records hold its key, its id
    and its value: a producer's `max_request_size` less room for the rest), or None. Taken, it
    could never be written, and its batch would fail at every restart."""
    size = len(key) + len(record_id) + (0 if value is None else len(value))
    if limit is None or size <= limit:
        return None
    return Rejected(
        f"key, id and value of {size} bytes exceed {limit}, what the changelog can carry", "too_large"
    )


class Horizon:
    """The latest event time a side accepts: the wall clock plus the join's `max_future`
    (None: up to year 9999). One record stamped far ahead would move stream time there, and
    every later record of its partition would be late; such a record is `future_timestamp`.

    `ceiling` is the bound as of the clock last read: the clock only moves on, so a time at or
    below it is accepted without reading the clock; a time above it reads the clock again
    (the compiled check keeps its own ceiling the same way, tables/records/_fastcheck.pyx)."""

    __slots__ = ("max_future_ms", "ceiling")

    def __init__(self, max_future_ms: int | None) -> None:
        self.max_future_ms = max_future_ms
        self.ceiling = MAX_TS_MS if max_future_ms is None else -1

    def refused(self, ts: int) -> Rejected | None:
        """Why `ts` (above `ceiling`, or negative) is refused, or None once the clock allows it."""
        if not 0 <= ts <= MAX_TS_MS:
            return Rejected(OUT_OF_RANGE, "timestamp")
        if self.max_future_ms is None:
            return None
        self.ceiling = min(MAX_TS_MS, time.time_ns() // 1_000_000 + self.max_future_ms)
        if ts <= self.ceiling:
            return None
        when = (_EPOCH + timedelta(milliseconds=ts)).isoformat(timespec="milliseconds")
        return Rejected(
            f"timestamp {when} is more than max_future ({self.max_future_ms} ms) ahead of the worker's clock",
            "future_timestamp",
        )


def timestamp_ms(when: Any, what: str) -> int | str:
    """Milliseconds since the epoch from an int or a datetime (naive = UTC), or why not."""
    if type(when) is int:
        return when
    if isinstance(when, datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return int(when.timestamp() * 1000)
    if isinstance(when, str):
        try:
            return timestamp_ms(datetime.fromisoformat(when), what)
        except ValueError:
            return f"{what} {when[:40]!r} is not an ISO 8601 time"
    return f"{what} is {type(when).__name__}: give milliseconds as an int, or a datetime"


# -- value forms ----------------------------------------------------------------


def _checker(annotation: Any) -> Callable[[Any], bool] | None:
    """A fast check of a decoded JSON value against a field annotation; None = anything."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        checks = [_checker(a) for a in inner]
        if any(c is None for c in checks):
            return None
        return lambda v: v is None or any(c(v) for c in checks)  # type: ignore[misc]
    simple: dict[Any, Callable[[Any], bool]] = {
        str: lambda v: type(v) is str,
        int: lambda v: type(v) is int,
        bool: lambda v: type(v) is bool,
        float: lambda v: type(v) in (float, int),
        list: lambda v: type(v) is list,
        dict: lambda v: type(v) is dict,
    }
    if annotation in simple:
        return simple[annotation]
    if origin in simple:
        return simple[origin]
    if isinstance(annotation, type) and issubclass(annotation, Record):
        return lambda v: type(v) is dict
    return None  # datetimes, decimals, anything else: Faust decides when it builds it


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation)).replace("NoneType", "None")
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


@dataclass(frozen=True)
class _Field:
    name: str
    annotation: Any
    required: bool  # no default
    nullable: bool
    check: Callable[[Any], bool] | None


def record_fields(model: type[Record]) -> list[_Field]:
    """The fields of a `faust.Record` and how to check each in decoded JSON."""
    options = model._options
    fields = []
    for name, annotation in options.fields.items():
        optional = name in options.optionalset
        nullable = optional or type(None) in typing.get_args(annotation)
        fields.append(_Field(name, annotation, not optional, nullable, _checker(annotation)))
    return fields


class ValueForm:
    """How one side's values are read: `check` on every input, `build` for results."""

    needs_object = False  # build the value for every input (the record's own validation)

    def check(self, raw: bytes) -> Any:
        """The decoded payload (dict for JSON objects) or a Rejected."""
        raise NotImplementedError

    def build(self, payload: Any) -> Any:
        """The value handed to the app, from what `check` returned."""
        return payload

    def stored(self, raw: bytes) -> Any:
        """The app's value of a record that was checked when it arrived."""
        return self.build(self.check(raw))

    def field(self, payload: Any, name: str) -> Any:
        return payload.get(name) if type(payload) is dict else getattr(payload, name, None)


class RawForm(ValueForm):
    def check(self, raw: bytes) -> Any:
        return raw


class StrForm(ValueForm):
    def check(self, raw: bytes) -> Any:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return Rejected("value is not UTF-8 text", "undecodable")


class JsonForm(ValueForm):
    """JSON values of one kind: objects (a topic whose value type is None or dict), arrays
    (list), or anything JSON (typing.Any: `accepts` None); another kind is `wrong_type`."""

    def __init__(self, accepts: type | None = dict) -> None:
        self.accepts = accepts

    def check(self, raw: bytes) -> Any:
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return Rejected(f"malformed JSON: {exc.__class__.__name__}", "undecodable")
        if self.accepts is not None and type(payload) is not self.accepts:
            kind = "null" if payload is None else type(payload).__name__
            wanted = "an object" if self.accepts is dict else "an array"
            return Rejected(f"value is a JSON {kind}, not {wanted}", "wrong_type")
        return payload


class RecordForm(JsonForm):
    """A `faust.Record` in JSON: every field present with its declared type (checked on the
    decoded JSON, without building the record), built only for results.

    Both the check and the construction are compiled once per model into plain Python
    functions (they run for every record: a generic loop over the fields cost several
    times more)."""

    def __init__(self, model: type[Record]) -> None:
        super().__init__(dict)
        self.model = model
        self.fields = record_fields(model)
        options = model._options
        # A model that validates or converts its own fields must be built to be checked.
        self.needs_object = bool(options.validation or options.coerce)
        # Checked fields of plain JSON types need no conversion: the record can be made
        # without Faust's generic constructor (several times slower, once per record).
        self._plain = (
            not self.needs_object
            and not hasattr(model, "__post_init__")
            and all(f.check is not None for f in self.fields)
        )
        self._well_formed = _compile_check(self.fields)
        self._make = _compile_build(model, self.fields, dict(options.defaults)) if self._plain else None
        # `_well_formed` and `_make` in one pass over the fields (None: not well formed).
        self._checked_make = (
            _compile_build(model, self.fields, dict(options.defaults), checked=True) if self._plain else None
        )
        # The same model for the compiled check (tables/records/_fastcheck.pyx), where it is built.
        self._fast_model = _fast_model(model, self.fields, dict(options.defaults)) if self._plain else None
        if self._make is not None:  # once per result side: decode and build in one call
            self.stored = _compile_build(  # type: ignore[method-assign, assignment]
                model, self.fields, dict(options.defaults), from_bytes=True
            )
            if CHECK.fast is not None and self._fast_model is not None:
                self.stored = CHECK.fast.stored(self.stored, orjson.loads, self._fast_model)  # type: ignore[method-assign]

    def check(self, raw: bytes) -> Any:
        payload = super().check(raw)
        if type(payload) is dict and self._well_formed(payload):
            return payload
        if isinstance(payload, Rejected):
            return payload
        if type(payload) is not dict:
            kind = "null" if payload is None else type(payload).__name__
            return Rejected(f"value is a JSON {kind}, not an object", "wrong_type")
        return self._reason(payload)

    def _reason(self, payload: dict[str, Any]) -> Any:
        """Why a JSON object is not the record (the slow path, for bad records only)."""
        for f in self.fields:
            found = payload.get(f.name)
            if found is None:
                if f.required and not f.nullable:
                    return Rejected(f"missing or null field {f.name!r}", "wrong_type")
                continue
            if f.check is not None and not f.check(found):
                return Rejected(
                    f"field {f.name!r} is {type(found).__name__}, expected {_type_name(f.annotation)}",
                    "wrong_type",
                )
        return payload

    def build(self, payload: Any) -> Any:
        if self._make is None:
            return self.model.from_data(payload, preferred_type=self.model)
        return self._make(payload)

    def stored(self, raw: bytes) -> Any:
        return self.build(orjson.loads(raw))  # checked on arrival: decode and build only


_TYPE_TESTS: dict[Any, str] = {
    str: "type(v) is str",
    int: "type(v) is int",
    bool: "type(v) is bool",
    float: "(type(v) is float or type(v) is int)",
    list: "type(v) is list",
    dict: "type(v) is dict",
}


def _type_test(annotation: Any) -> str | None:
    """A Python expression testing `v` against a field annotation; None = anything."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        tests = [_type_test(a) for a in typing.get_args(annotation) if a is not type(None)]
        if any(t is None for t in tests):
            return None
        return "(" + " or ".join(tests) + ")"  # type: ignore[arg-type]
    if annotation in _TYPE_TESTS:
        return _TYPE_TESTS[annotation]
    if origin in _TYPE_TESTS:
        return _TYPE_TESTS[origin]
    if isinstance(annotation, type) and issubclass(annotation, Record):
        return "type(v) is dict"
    return None


# One value of each type orjson decodes to, in the order of the compiled check's type bits
# (tables/records/_fastcheck.pyx, KIND_NAMES; a seventh bit stands for anything else).
_KIND_SAMPLES: tuple[Any, ...] = ("", 0, True, 0.5, [], {})
_ANY_KIND = (1 << (len(_KIND_SAMPLES) + 1)) - 1


def _type_mask(annotation: Any) -> int:
    """The type bits `_type_test(annotation)` accepts, for the compiled check: its own test
    run on one value of each type (it tests `type(v)` only), so the two cannot differ."""
    test = _type_test(annotation)
    if test is None:
        return _ANY_KIND
    accepts = eval(f"lambda v: {test}")  # noqa: S307 - built from fixed tests
    return sum(1 << bit for bit, sample in enumerate(_KIND_SAMPLES) if accepts(sample))


def _compile_check(fields: list[_Field]) -> Callable[[dict[str, Any]], bool]:
    """`well_formed(payload)`: every field as `RecordForm._reason` would accept it."""
    lines = ["def well_formed(p):", "    g = p.get"]
    for f in fields:
        test = _type_test(f.annotation)
        lines.append(f"    v = g({f.name!r})")
        if f.required and not f.nullable:
            lines.append(f"    if v is None{' or not ' + test if test else ''}: return False")
        elif test:
            lines.append(f"    if v is not None and not {test}: return False")
    lines.append("    return True")
    scope: dict[str, Any] = {}
    exec("\n".join(lines), scope)  # noqa: S102 - code built from field names and fixed tests
    return scope["well_formed"]


def _compile_build(
    model: type[Record],
    fields: list[_Field],
    defaults: dict[str, Any],
    from_bytes: bool = False,
    checked: bool = False,
) -> Callable[[Any], Any]:
    """`make(payload)`: the record, as Faust's from_data makes it for plain fields; with
    `from_bytes`, `make(raw)` of a value checked on arrival (decoded with orjson first);
    with `checked`, None unless the payload is well formed (`_compile_check`'s tests)."""
    parts = ['"__evaluated_fields__": set()']
    scope: dict[str, Any] = {"M": model, "new": model.__new__, "loads": orjson.loads}
    lines = ["def make(p):", "    g = loads(p).get" if from_bytes else "    g = p.get"]
    for i, f in enumerate(fields):
        lines.append(f"    v{i} = v = g({f.name!r})")
        test = _type_test(f.annotation)  # of `v`
        if checked and f.required and not f.nullable:
            lines.append(f"    if v is None{' or not ' + test if test else ''}: return None")
        elif checked and test:
            lines.append(f"    if v is not None and not {test}: return None")
        if f.name in defaults:
            scope[f"d{i}"] = defaults[f.name]
            parts.append(f"{f.name!r}: d{i} if v{i} is None else v{i}")
        else:
            parts.append(f"{f.name!r}: v{i}")
    lines += ["    r = new(M)", "    r.__dict__ = {" + ", ".join(parts) + "}", "    return r"]
    source = "\n".join(lines)
    exec(source, scope)  # noqa: S102 - code built from field names
    return scope["make"]


class FaustForm(ValueForm):
    """Anything else: Faust's own serializer registry decides."""

    needs_object = True

    def __init__(self, loads: Callable[[bytes], Any]) -> None:
        self.loads = loads

    def check(self, raw: bytes) -> Any:
        try:
            return self.loads(raw)
        except Exception as exc:  # the registry raises many kinds
            return Rejected(f"undecodable: {exc.__class__.__name__}: {str(exc)[:200]}", "undecodable")


def value_form(value_type: Any, serializer: str | None, loads: Callable[[bytes], Any]) -> ValueForm:
    """The form for a topic's value type and serializer (serializer None = the app's default)."""
    if isinstance(value_type, type) and issubclass(value_type, Record) and serializer in ("json", None):
        return RecordForm(value_type)
    if serializer == "raw" and value_type in (None, bytes):
        return RawForm()
    if serializer == "raw" and value_type is str:
        return StrForm()
    if serializer == "json" and value_type in (None, dict):
        return JsonForm(dict)
    if serializer == "json" and value_type is list:
        return JsonForm(list)
    if serializer == "json" and value_type is typing.Any:
        return JsonForm(None)
    return FaustForm(loads)


# -- key forms --------------------------------------------------------------------


def raw_key(raw: bytes) -> Any:
    """A key of raw bytes, as it is."""
    return raw


def int_key(raw: bytes) -> Any:
    """A key of an int as Faust writes one (`str(n).encode()`): ASCII digits, `-` first if
    negative, no leading zero. Only those: `int()` also reads b"07", b" 7", b"+7" and b"0_7" as
    7, other Kafka keys (on other partitions, maybe) joined as one."""
    digits = raw[1:] if raw[:1] == b"-" else raw
    if not digits.isdigit() or (digits[:1] == b"0" and raw != b"0"):
        return Rejected(f"key {raw[:40]!r} is not an int", "wrong_type")
    try:
        return int(raw)
    except ValueError:  # past Python's 4,300 digits
        return Rejected(f"key {raw[:40]!r} is not an int", "wrong_type")


def str_key(raw: bytes) -> Any:
    """A key of UTF-8 text."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return Rejected("key is not UTF-8 text", "undecodable")


# The key checks the compiled accept does itself (tables/records/_fastcheck.pyx), by their kind.
_KEY_KINDS: dict[Callable[[bytes], Any], int] = {raw_key: 0, str_key: 1, int_key: 2}


def key_check(key_type: Any, serializer: str | None, loads: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A function of the key's bytes that returns the key, or a Rejected."""
    if serializer in ("raw", None) and key_type in (None, bytes):
        return raw_key
    if serializer in ("raw", None) and key_type is int:
        return int_key
    if serializer in ("raw", None) and key_type is str:
        return str_key

    def faust_key(raw: bytes) -> Any:
        try:
            return loads(raw)
        except Exception as exc:
            return Rejected(f"undecodable key: {exc.__class__.__name__}: {str(exc)[:200]}", "undecodable")

    return exact_int_key(serializer, faust_key) if key_type is int else faust_key


def exact_int_key(serializer: str | None, faust_key: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """An int key in another serializer than raw (JSON): Faust's `int(decoded)` takes `1.5`,
    `true` and `"1"` as 1, so records of different keys would join as one. Only an integer is
    a key (what Faust writes for one); any other decoded value is `wrong_type`."""

    def int_key_of(raw: bytes) -> Any:
        try:
            payload = faust_codecs.loads(serializer, raw)
        except Exception:
            return faust_key(raw)  # it says why
        if type(payload) is not int:
            kind = "null" if payload is None else type(payload).__name__
            return Rejected(f"key {raw[:40]!r} is {kind}, not an int", "wrong_type")
        return faust_key(raw)

    return int_key_of


# -- one side -------------------------------------------------------------------


class SideCodec:
    """Everything the join checks and extracts on one side's records."""

    def __init__(
        self,
        topic: str,
        key: Callable[[bytes], Any],
        form: ValueForm,
        *,
        timestamp: TimestampSpec = None,
        record_id: IdSpec = None,
        validate: Validate | None = None,
        max_value_bytes: int | None = None,
        deletes: bool = False,
        max_future_ms: int | None = None,
        max_record_bytes: int | None = None,
        null_keys: bool = False,
    ) -> None:
        """`deletes`: the side is a table, whose null value deletes its key from the record's
        Kafka timestamp on (accepted, with the offset as its id, and no value); else a null
        value is dropped (`DROPPED`). `max_future_ms`: how far ahead of the wall clock a
        record's time may be (`Horizon`; None: no bound but year 9999). `max_record_bytes`: the
        key, id and value together, at most (`unwritable`; None: no bound). `null_keys`: a
        record with no Kafka key is checked like any other (and accepted with its key None: it
        will be a result with no partner, KIP-962) instead of dead-lettered as `null_key`."""
        self.null_keys = null_keys
        self.horizon = Horizon(max_future_ms)
        self.max_record_bytes = max_record_bytes
        self.topic = topic
        self.deletes = deletes
        self.key = key
        self.form = form
        self.timestamp = timestamp
        self.record_id = record_id
        self.validate = validate
        self.max_value_bytes = max_value_bytes
        # Build the value for every input only when something needs the object itself.
        self.builds = form.needs_object or callable(timestamp) or callable(record_id) or validate is not None
        # The Python accept: the reference, and what the compiled one hands odd records to.
        self.python_accept: Accept = self._accept()
        compiled = self._compiled_accept(self.python_accept)
        # Whether this side's records are checked by the compiled accept (tables/records/_fastcheck.pyx);
        # if not, `python_reason` says why.
        self.compiled = compiled is not None
        self.accept: Accept = compiled if compiled is not None else self.python_accept
        # `value(raw)`: the app's value of a stored record (decoded again: state keeps the
        # bytes); the form's own function, without a call in between (once per result side).
        self.value: Callable[[bytes], Any] = form.stored

    def check(
        self, key: bytes | None, value: bytes | None, offset: int, message_ts: int | None
    ) -> Accepted | Rejected | Dropped:
        """Decide what to do with one input record."""
        if key is None and not self.null_keys:
            # A keyless record lands on an arbitrary partition, away from its partner:
            # it would silently never join. Rejecting it makes the loss visible.
            return Rejected("null Kafka key", "null_key")
        if value is None:
            if key is None:
                return DROPPED  # (a table's side never takes null keys)
            return self._delete(key, offset, message_ts) if self.deletes else DROPPED
        limit = self.max_value_bytes
        if limit is not None and len(value) > limit:
            return Rejected(f"value of {len(value)} bytes exceeds {limit}", "too_large")
        decoded_key = None if key is None else self.key(key)
        if type(decoded_key) is Rejected:
            return decoded_key
        payload = self.form.check(value)
        if type(payload) is Rejected:
            return payload
        built = None
        if self.builds:
            try:
                built = self.form.build(payload)
            except Exception as exc:  # a model's own validation, conversions
                return Rejected(f"{exc.__class__.__name__}: {str(exc)[:200]}", "wrong_type")
            if self.validate is not None:
                reason = self.validate(decoded_key, built)
                if reason:
                    return Rejected(str(reason), "rejected")
        ts = self._timestamp(payload, built, message_ts)
        if type(ts) is not int:
            return Rejected(str(ts), "timestamp")
        if not 0 <= ts <= self.horizon.ceiling and (refused := self.horizon.refused(ts)) is not None:
            return refused
        record_id = self._record_id(payload, built, offset)
        if type(record_id) is Rejected:
            return record_id
        # (record_id is bytes here: `type(...) is` is the hot path's test, which mypy does not narrow)
        if (too_large := unwritable(key or b"", record_id, value, self.max_record_bytes)) is not None:  # type: ignore[arg-type]
            return too_large
        return Accepted(ts, record_id, built)  # type: ignore[arg-type]

    def _delete(self, key: bytes, offset: int, message_ts: int | None) -> Accepted | Rejected:
        """A table's delete: its key checked, its time the Kafka record's (a null value has no
        field to read a time from), its id the offset."""
        decoded_key = self.key(key)
        if type(decoded_key) is Rejected:
            return decoded_key
        if type(message_ts) is not int or not 0 <= message_ts <= MAX_TS_MS:
            return Rejected("a delete (null value) without a usable Kafka timestamp", "timestamp")
        if message_ts > self.horizon.ceiling and (refused := self.horizon.refused(message_ts)) is not None:
            return refused
        record_id = _OFFSET.pack(offset)
        if (too_large := unwritable(key, record_id, None, self.max_record_bytes)) is not None:
            return too_large
        return Accepted(message_ts, record_id, None)

    def _timestamp(self, payload: Any, built: Any, message_ts: int | None) -> int | str:
        spec = self.timestamp
        if spec is None:
            if message_ts is None or message_ts < 0:
                return "the record has no Kafka timestamp"
            return message_ts
        if isinstance(spec, str):
            found = self.form.field(payload, spec)
            if found is None:
                return f"missing or null timestamp field {spec!r}"
            if type(found) is bool:
                return f"timestamp field {spec!r} is bool"
            return timestamp_ms(found, f"timestamp field {spec!r}")
        try:
            return timestamp_ms(spec(built), "the timestamp function's result")
        except Exception as exc:
            return f"the timestamp function raised {exc.__class__.__name__}: {str(exc)[:200]}"

    def _record_id(self, payload: Any, built: Any, offset: int) -> bytes | Rejected:
        spec = self.record_id
        if spec is None:
            return _OFFSET.pack(offset)  # read twice = the same record
        if isinstance(spec, str):
            found = self.form.field(payload, spec)
            if found is None:
                return Rejected(f"missing or null id field {spec!r}", "wrong_type")
        else:
            try:
                found = spec(built)
            except Exception as exc:
                return Rejected(f"the id function raised {exc.__class__.__name__}: {exc}", "wrong_type")
        if isinstance(found, bytes):
            return found
        return str(found).encode()

    def _compiled_accept(self, python_accept: Accept) -> Accept | None:
        """The compiled accept (tables/records/_fastcheck.pyx) of this side, or None (and
        `python_reason` says why): not built, not in use (`CHECK.use`, TANDEM_PURE_PYTHON=1),
        or a configuration it does not cover. It covers raw, str and int keys; a plain Record
        in JSON (`RecordForm._plain`), or JSON objects without `validate`; the time from a
        field or the Kafka timestamp; the id from a field or the offset. It hands every other
        record to `python_accept`."""
        fast = CHECK.fast
        model, reason = self._fast_form()
        key_kind = next((kind for check, kind in _KEY_KINDS.items() if check is self.key), None)
        timestamp, record_id, limit = self.timestamp, self.record_id, self.max_value_bytes
        if fast is None:
            reason = "tables/records/_fastcheck is not built, or TANDEM_PURE_PYTHON=1"
        elif key_kind is None:
            reason = "its key is decoded by Faust (compiled: raw bytes, str and int keys, raw serializer)"
        elif not (timestamp is None or type(timestamp) is str):
            reason = "its timestamp is a function"
        elif not (record_id is None or (type(record_id) is str and record_id)):
            reason = "its id is a function"  # (an empty id name takes the reference's slow steps)
        elif not (limit is None or type(limit) is int):
            reason = "its max_value_bytes is not an int"
        elif not (self.max_record_bytes is None or type(self.max_record_bytes) is int):
            reason = "its max_record_bytes is not an int"
        self.python_reason: str | None = reason
        if reason is not None:
            return None
        return fast.accept(  # type: ignore[union-attr]
            python_accept,
            orjson.loads,
            key_kind,
            model,
            timestamp,
            record_id,
            self.validate,
            self.builds,
            limit,
            MAX_TS_MS,
            Rejected,
            self.horizon.max_future_ms,
            self.max_record_bytes,
        )

    def _fast_form(self) -> tuple[Any, str | None]:
        """The compiled check's model of this side's values (None: a JSON object), or why the
        values are not checked there."""
        form = self.form
        if type(form) is RecordForm:
            if form._fast_model is not None:
                return form._fast_model, None
            return None, (
                f"its values' model {form.model.__name__} validates or converts its fields, has a field "
                f"of a type the compiled check cannot test, or more than 64 fields"
            )
        if type(form) is JsonForm:
            if form.accepts is not dict:
                return None, "its values are JSON of any kind or arrays (only objects are compiled)"
            if self.builds:
                # `validate` gets the decoded JSON itself and may change it before the time and
                # the id are read from it: only the Python accept keeps that order.
                return None, "its JSON values have validate="
            return None, None
        return None, f"its values are not JSON ({type(form).__name__})"

    def _accept(self) -> Accept:
        """`check` for the join's per-record loop: what it decides, with (ts, record id, built
        value) for an accepted record instead of an `Accepted`. The common case (a Record
        in JSON checked without building it twice, fields named for the time and the id)
        runs as one function over local names; anything unusual takes `check`'s own steps,
        so both decide alike (tests/test_tables_codecs_fast.py drives both)."""
        key_of, form, validate, builds = self.key, self.form, self.validate, self.builds
        limit = self.max_value_bytes
        form_check, build = form.check, form.build
        record = type(form) is RecordForm
        well_formed = form._well_formed if record else None  # type: ignore[attr-defined]
        checked_make = None  # checks and builds a plain Record in one pass
        if record and form._make is not None:  # type: ignore[attr-defined]
            build = form._make  # type: ignore[attr-defined]
            if builds:
                checked_make = form._checked_make  # type: ignore[attr-defined]
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        ts_field = self.timestamp if isinstance(self.timestamp, str) else None
        ts_from_message = self.timestamp is None
        id_field = self.record_id if isinstance(self.record_id, str) else None
        id_from_offset = self.record_id is None
        slow_timestamp, slow_record_id, pack_offset = self._timestamp, self._record_id, _OFFSET.pack
        delete = self._delete if self.deletes else None
        horizon, record_limit = self.horizon, self.max_record_bytes

        null_keys, check = self.null_keys, self.check

        def accept(key: bytes | None, value: bytes | None, offset: int, message_ts: int | None) -> Any:
            if key is None:
                if not null_keys:
                    return Rejected("null Kafka key", "null_key")
                found = check(key, value, offset, message_ts)  # rare: the reference's steps
                return (found.ts, found.record_id, found.value) if type(found) is Accepted else found
            if value is None:
                if delete is None:
                    return DROPPED
                found = delete(key, offset, message_ts)
                return found if type(found) is Rejected else (found.ts, found.record_id, None)  # type: ignore[union-attr]
            if limit is not None and len(value) > limit:
                return Rejected(f"value of {len(value)} bytes exceeds {limit}", "too_large")
            decoded_key = key_of(key)
            if type(decoded_key) is Rejected:
                return decoded_key
            built = None
            if record:
                try:
                    payload = loads(value)
                except decode_error as exc:
                    return Rejected(f"malformed JSON: {exc.__class__.__name__}", "undecodable")
                if type(payload) is not dict:
                    payload = form_check(value)  # the reason, as check finds it
                elif checked_make is not None:
                    if (built := checked_make(payload)) is None:
                        payload = form_check(value)
                elif not well_formed(payload):  # type: ignore[misc]
                    payload = form_check(value)
            else:
                payload = form_check(value)
            if type(payload) is Rejected:
                return payload
            if builds:
                if built is None:
                    try:
                        built = build(payload)
                    except Exception as exc:  # a model's own validation, conversions
                        return Rejected(f"{exc.__class__.__name__}: {str(exc)[:200]}", "wrong_type")
                if validate is not None:
                    reason = validate(decoded_key, built)
                    if reason:
                        return Rejected(str(reason), "rejected")
            if ts_field is not None and type(payload) is dict and type(ts := payload.get(ts_field)) is int:
                pass  # an int field: milliseconds as they are
            elif ts_from_message and type(message_ts) is int and message_ts >= 0:
                ts = message_ts
            else:
                ts = slow_timestamp(payload, built, message_ts)
                if type(ts) is not int:
                    return Rejected(str(ts), "timestamp")
            if not 0 <= ts <= horizon.ceiling and (refused := horizon.refused(ts)) is not None:
                return refused
            if id_from_offset:
                record_id = pack_offset(offset)
            elif id_field and type(payload) is dict and type(given := payload.get(id_field)) is str:
                record_id = given.encode()
            else:
                record_id = slow_record_id(payload, built, offset)  # type: ignore[assignment]
                if type(record_id) is Rejected:
                    return record_id
            if record_limit is not None and len(key) + len(record_id) + len(value) > record_limit:
                return unwritable(key, record_id, value, record_limit)
            return ts, record_id, built

        return accept


# -- the compiled check ------------------------------------------------------------

# tables/records/_fastcheck.pyx, where it is built and in use for the codecs made from now on.
CHECK: CompiledPart[types.ModuleType] = CompiledPart(
    "tables.records._fastcheck", lambda module: module, "the per-record input check"
)
_NO_DEFAULT = object()


def _fast_model(model: type[Record], fields: list[_Field], defaults: dict[str, Any]) -> Any:
    """A plain model's fields as the compiled check takes them (tables/records/_fastcheck.pyx
    `model`), or None where it is not built or the model has too many fields for it."""
    built = CHECK.built
    if built is None or len(fields) > built.MOST_FIELDS:
        return None
    return built.model(
        model,
        [f.name for f in fields],
        [_type_mask(f.annotation) for f in fields],
        [f.required and not f.nullable for f in fields],
        [defaults.get(f.name, _NO_DEFAULT) for f in fields],
        _NO_DEFAULT,
    )


def _model_options_probe() -> list[str]:
    """What `record_fields` and `JsonForm` read of a Faust model's `_options` (private)."""

    class Probe(Record):
        field: int

    options = Probe._options
    wanted = ("fields", "optionalset", "defaults", "validation", "coerce")
    return [f"faust.Record._options.{name} is gone" for name in wanted if not hasattr(options, name)]


internals.require(__name__, Record, "_options")
internals.require_probe(__name__, _model_options_probe)
