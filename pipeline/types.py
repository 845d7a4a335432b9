"""The Spark column types of a join's keys and values, from their declared Faust types, and
the conversion of each decoded key or value to it (the twin's typed results).

| declared | column |
| --- | --- |
| `faust.Record` (any serializer) | struct of its fields, each by its annotation |
| `int`, `str`, `float`, `bool`, `bytes`, `datetime` | long, string, double, boolean, binary, timestamp |
| `X | None` | X, nullable |
| `list[X]`, `dict[str, X]` | array<X>, map<string, X> |
| raw values (`bytes`, no type) | binary, as read |
| JSON values (`dict`, `list`, no type) | string: the JSON text, as read |
| anything else | string (`str()` of the decoded value) |

An int outside 64 bits becomes null (Spark's long has no room for it).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from faust.models.record import Record

from tables.records.codecs import JsonForm, RawForm, RecordForm, SideCodec, StrForm, int_key, raw_key, str_key

if typing.TYPE_CHECKING:
    from pyspark.sql.types import DataType

Convert = Callable[[Any], Any]
_LONG = (-(2**63), 2**63 - 1)


def _long(value: Any) -> int | None:
    if type(value) is bool or not isinstance(value, int):
        return None if value is None else int(value)
    return value if _LONG[0] <= value <= _LONG[1] else None


def _string(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def column_type(annotation: Any) -> tuple[DataType, Convert]:
    """The Spark type of a declared Python type, and the conversion of a decoded value."""
    from pyspark.sql import types as T

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return column_type(inner[0]) if len(inner) == 1 else (T.StringType(), _string)
    if isinstance(annotation, type) and issubclass(annotation, Record):
        return record_type(annotation)
    simple: dict[Any, tuple[DataType, Convert]] = {
        str: (T.StringType(), _string),
        bool: (T.BooleanType(), lambda v: None if v is None else bool(v)),
        int: (T.LongType(), _long),
        float: (T.DoubleType(), lambda v: None if v is None else float(v)),
        bytes: (T.BinaryType(), lambda v: v),
        datetime: (T.TimestampType(), lambda v: v if v is None or isinstance(v, datetime) else None),
    }
    if annotation in simple:
        return simple[annotation]
    if origin is list and args:
        element, convert = column_type(args[0])
        return T.ArrayType(element), lambda v: None if v is None else [convert(x) for x in v]
    if origin is dict and len(args) == 2 and args[0] is str:
        element, convert = column_type(args[1])
        return T.MapType(
            T.StringType(), element
        ), lambda v: None if v is None else {str(k): convert(x) for k, x in v.items()}
    return T.StringType(), _json_text


def record_type(model: type[Record]) -> tuple[DataType, Convert]:
    """A struct of the record's fields (declaration order)."""
    from pyspark.sql import types as T

    fields = []
    converts: list[tuple[str, Convert]] = []
    for name, annotation in model._options.fields.items():
        kind, convert = column_type(annotation)
        fields.append(T.StructField(name, kind, nullable=True))
        converts.append((name, convert))

    def to_struct(value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        return {name: convert(_field(value, name)) for name, convert in converts}

    return T.StructType(fields), to_struct


def _plain_record(model: type[Record]) -> Callable[[bytes], Any]:
    """The struct of a plain record (`RecordForm._plain`: fields of JSON types, checked on
    arrival) straight from its JSON, as the record would hold it: a field's default where
    it is null or missing; strs, bools, lists and dicts as decoded."""
    fields = []
    for name, annotation in model._options.fields.items():
        _, convert = column_type(annotation)
        fields.append((name, model._options.defaults.get(name), None if convert is _string else convert))
    loads = orjson.loads

    def to_struct(raw: bytes) -> dict[str, Any]:
        found = loads(raw)
        out = {}
        for name, default, convert in fields:
            value = found.get(name)
            if value is None:
                value = default
            out[name] = value if convert is None else convert(value)
        return out

    return to_struct


@dataclass(frozen=True)
class Typed:
    """How one side's raw key or value bytes become a typed column value."""

    spark_type: DataType
    convert: Callable[[bytes], Any]  # raw bytes (already accepted by the side's check) -> value


def key_typed(codec: SideCodec, key_type: Any) -> Typed:
    """The join key's column, from the left input's declared key type and its check."""
    from pyspark.sql import types as T

    if codec.key is raw_key:
        return Typed(T.BinaryType(), lambda raw: raw)
    if codec.key is str_key:
        return Typed(T.StringType(), lambda raw: raw.decode())
    if codec.key is int_key:
        return Typed(T.LongType(), lambda raw: _long(int(raw)))
    kind, convert = column_type(key_type) if key_type is not None else (T.StringType(), _string)
    check = codec.key
    return Typed(kind, lambda raw: convert(check(raw)))


def value_typed(codec: SideCodec, value_type: Any) -> Typed:
    """A side's value column, from its declared value type and its check's form."""
    from pyspark.sql import types as T

    form = codec.form
    if type(form) is RawForm:
        return Typed(T.BinaryType(), lambda raw: raw)
    if type(form) is StrForm or type(form) is JsonForm:
        return Typed(T.StringType(), lambda raw: raw.decode())
    if type(form) is RecordForm:
        kind, convert = record_type(form.model)
        if form._plain:  # checked on arrival: its JSON object is the record, defaults aside
            return Typed(kind, _plain_record(form.model))
        stored = codec.value
        return Typed(kind, lambda raw: convert(stored(raw)))
    kind, convert = column_type(value_type) if value_type is not None else (T.StringType(), _string)
    stored = codec.value
    return Typed(kind, lambda raw: convert(stored(raw)))
