"""A rekeyed input's new key (`JoinInput(topic, key=...)`): from a source record's value, the
Kafka key its repartitioned copy carries, or why it has none. No I/O: the worker's rekeyer
(tables/runtime/rekeyer.py), the test driver and the batch twin (pipeline/) all rekey with it,
so all three place a record alike.

The key is a value field's name or a function of the value (the value as the join's handler
gets it: a `faust.Record`, a dict, ...), serialized as the join's other input serializes its
keys (the join compares keys as bytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faust.types import AppT, TopicT

from tables.records.codecs import Rejected, ValueForm, value_form

KeySpec = str | Callable[[Any], Any] | None

NULL_VALUE = Rejected("null value: a rekeyed input's record needs a value to find its key in", "null_key")


class Rekey:
    """How one rekeyed input's records get their new key."""

    def __init__(
        self, form: ValueForm, key: str | Callable[[Any], Any], dumps: Callable[[Any], bytes]
    ) -> None:
        self.form = form
        self.key = key
        self.dumps = dumps

    def key_of(self, value: bytes | None) -> bytes | Rejected:
        """The new Kafka key of a record with this value, or why it has none (dead-lettered)."""
        if value is None:
            return NULL_VALUE
        payload = self.form.check(value)
        if isinstance(payload, Rejected):
            return payload
        spec = self.key
        if isinstance(spec, str):
            found = self.form.field(payload, spec)
            if found is None:
                return Rejected(f"missing or null key field {spec!r}", "null_key")
        else:
            try:
                found = spec(self.form.build(payload))
            except Exception as exc:
                return Rejected(
                    f"the key function raised {exc.__class__.__name__}: {str(exc)[:200]}", "wrong_type"
                )
            if found is None:
                return Rejected("the key function returned None", "null_key")
        try:
            return self.dumps(found)
        except Exception as exc:  # a key the join's key serializer cannot write
            return Rejected(
                f"key {found!r:.100} cannot be serialized: {exc.__class__.__name__}", "wrong_type"
            )


def rekey_of(app: AppT, source: TopicT, key: KeySpec, key_type: Any, key_serializer: Any) -> Rekey:
    """The rekeying of `source`'s values by `key`, the new key written with `key_serializer`
    (as `key_type`, Faust's way)."""
    if key is None:
        raise ValueError("not a rekeyed input: key is None")
    value_serializer: Any = source.value_serializer or app.conf.value_serializer  # type: ignore[attr-defined]

    def loads_value(raw: bytes) -> Any:
        return app.serializers.loads_value(source.value_type, raw, serializer=value_serializer)

    def dumps_key(found: Any) -> bytes:
        dumped = app.serializers.dumps_key(key_type, found, serializer=key_serializer)
        return dumped if isinstance(dumped, bytes) else str(dumped).encode()

    form = value_form(source.value_type, value_serializer, loads_value)
    return Rekey(form, key, dumps_key)
