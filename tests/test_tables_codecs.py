"""What a join does with one input record before joining it (tables/records/codecs.py), per form."""

from __future__ import annotations

import typing
from datetime import UTC, datetime

import faust
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.records.codecs import (
    DROPPED,
    MAX_TS_MS,
    Accepted,
    Rejected,
    SideCodec,
    key_check,
    value_form,
)

app = faust.App("codecs-test", broker="kafka://127.0.0.1:1")


class Order(faust.Record, serializer="json"):
    order_id: int
    customer: str
    amount: float
    note: typing.Optional[str] = None  # noqa: UP045 - Faust reads typing.Optional


class Strict(faust.Record, serializer="json", validation=True):
    count: int


def codec(
    value_type: typing.Any = Order,
    serializer: str | None = "json",
    key_type: typing.Any = int,
    **kw: typing.Any,
) -> SideCodec:
    def loads_value(raw: bytes) -> typing.Any:
        return app.serializers.loads_value(value_type, raw, serializer=serializer)

    def loads_key(raw: bytes) -> typing.Any:
        return app.serializers.loads_key(key_type, raw, serializer="raw")

    return SideCodec(
        "orders", key_check(key_type, "raw", loads_key), value_form(value_type, serializer, loads_value), **kw
    )


def order(**changes: typing.Any) -> bytes:
    return orjson.dumps({"order_id": 7, "customer": "c", "amount": 1.5, **changes})


def test_a_good_record_is_accepted_with_the_kafka_timestamp_and_offset_id() -> None:
    checked = codec().check(b"7", order(), 42, 1_000)
    assert checked == Accepted(1_000, (42).to_bytes(8, "big"))


@pytest.mark.parametrize(
    ("key", "value", "category", "reason"),
    [
        (None, order(), "null_key", "null Kafka key"),
        (b"x", order(), "wrong_type", "key b'x' is not an int"),
        (b"7", b"{not json", "undecodable", "malformed JSON: JSONDecodeError"),
        (b"7", b"[1]", "wrong_type", "value is a JSON list, not an object"),
        (b"7", b"null", "wrong_type", "value is a JSON null, not an object"),
        (b"7", order(customer=None), "wrong_type", "missing or null field 'customer'"),
        (b"7", order(order_id="7"), "wrong_type", "field 'order_id' is str, expected int"),
        (b"7", order(order_id=True), "wrong_type", "field 'order_id' is bool, expected int"),
        (b"7", order(note=3), "wrong_type", "field 'note' is int, expected str or None"),
    ],
)
def test_bad_records_are_rejected_with_a_reason(
    key: bytes | None, value: bytes, category: str, reason: str
) -> None:
    assert codec().check(key, value, 0, 1) == Rejected(reason, category)  # type: ignore[arg-type]


def test_a_null_value_is_dropped_and_defaults_fill_optional_fields() -> None:
    assert codec().check(b"7", None, 0, 1) is DROPPED
    assert isinstance(codec().check(b"7", order(amount=2), 0, 1), Accepted)  # an int is a float
    stored = codec().value(order())
    assert isinstance(stored, Order) and stored.note is None and stored.customer == "c"


def test_size_limit_and_timestamps_from_a_field_or_a_function() -> None:
    assert codec(max_value_bytes=10).check(b"7", order(), 0, 1) == Rejected(
        f"value of {len(order())} bytes exceeds 10", "too_large"
    )
    by_field = codec(timestamp="order_id")
    assert by_field.check(b"7", order(order_id=123), 0, None) == Accepted(123, (0).to_bytes(8, "big"))
    when = datetime(2026, 1, 2, tzinfo=UTC)
    by_function = codec(timestamp=lambda o: when)
    checked = by_function.check(b"7", order(), 0, None)
    assert isinstance(checked, Accepted) and checked.ts == int(when.timestamp() * 1000)
    assert isinstance(checked.value, Order)
    floats = codec(timestamp=lambda o: 1.5).check(b"7", order(), 0, None)
    assert isinstance(floats, Rejected) and floats.category == "timestamp"
    assert codec().check(b"7", order(), 0, None) == Rejected("the record has no Kafka timestamp", "timestamp")
    assert codec(timestamp="note").check(b"7", order(), 0, None) == Rejected(
        "missing or null timestamp field 'note'", "timestamp"
    )


@pytest.mark.parametrize("ts", [-1, MAX_TS_MS + 1, 2**63 + 5])
def test_timestamps_outside_the_epoch_to_year_9999_are_rejected(ts: int) -> None:
    """A huge timestamp would overflow the state's 64-bit time keys."""
    checked = codec(timestamp="order_id").check(b"7", order(order_id=ts), 0, None)
    assert isinstance(checked, Rejected) and checked.category == "timestamp"


def test_ids_validation_hooks_and_model_validation() -> None:
    by_id = codec(record_id="customer").check(b"7", order(customer="abc"), 5, 1)
    assert isinstance(by_id, Accepted) and by_id.record_id == b"abc"
    hooked = codec(validate=lambda key, o: None if key == o.order_id else "key does not match")
    assert isinstance(hooked.check(b"7", order(), 0, 1), Accepted)
    assert hooked.check(b"8", order(), 0, 1) == Rejected("key does not match", "rejected")
    strict = codec(Strict)
    assert isinstance(strict.check(b"7", b'{"count": 1}', 0, 1), Accepted)
    rejected = strict.check(b"7", b'{"count": "x"}', 0, 1)
    assert isinstance(rejected, Rejected) and rejected.category == "wrong_type"


def test_raw_str_json_and_faust_forms() -> None:
    raw = codec(None, "raw", bytes)
    assert isinstance(raw.check(b"k", b"\xff\x00", 0, 1), Accepted) and raw.value(b"\xff") == b"\xff"
    text = codec(str, "raw", str)
    assert text.check(b"k", b"\xff", 0, 1) == Rejected("value is not UTF-8 text", "undecodable")
    assert text.value("é".encode()) == "é"
    assert key_check(str, "raw", bytes)(b"\xff") == Rejected("key is not UTF-8 text", "undecodable")
    anything = codec(None, "json", bytes)
    assert anything.value(b'{"a": [1]}') == {"a": [1]}
    pickled = codec(list, "pickle", bytes)  # Faust's registry decides
    rejected = pickled.check(b"k", b"not a pickle", 0, 1)
    assert isinstance(rejected, Rejected) and rejected.category == "undecodable"


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            f: st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(2**63), 2**63 - 1),
                st.floats(allow_nan=False),
                st.text(max_size=3),
            )
            for f in ("order_id", "customer", "amount", "note")
        },
    )
)
def test_accepted_records_always_build_and_rejected_ones_say_why(value: dict[str, typing.Any]) -> None:
    """Whatever JSON object comes, the check never raises; what it accepts builds a record
    whose fields have the declared types."""
    checked = codec().check(b"7", orjson.dumps(value), 0, 1)
    if isinstance(checked, Rejected):
        assert checked.reason and checked.category == "wrong_type"
        return
    built = codec().value(orjson.dumps(value))
    assert type(built.order_id) is int and type(built.customer) is str
    assert type(built.amount) in (int, float) and (built.note is None or type(built.note) is str)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "order_id": st.integers(-(2**63), 2**63 - 1),
            "customer": st.text(max_size=5),
            "amount": st.floats(allow_nan=False, allow_infinity=False),
        },
        optional={"note": st.one_of(st.none(), st.text(max_size=3)), "extra": st.integers()},
    )
)
def test_records_made_without_faust_s_constructor_equal_faust_s(value: dict[str, typing.Any]) -> None:
    """The fast path for plain fields builds the same record as Faust's from_data."""
    form = value_form(Order, "json", lambda raw: None)
    assert form._plain  # type: ignore[attr-defined]
    fast, faust_made = form.build(dict(value)), Order.from_data(dict(value))
    assert fast == faust_made and fast.asdict() == faust_made.asdict()
    assert Order.loads(fast.dumps()) == faust_made
    assert not value_form(Strict, "json", lambda raw: None)._plain  # type: ignore[attr-defined]


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            f: st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(2**63), 2**63 - 1),
                st.floats(allow_nan=False),
                st.text(max_size=2),
            )
            for f in ("order_id", "customer", "amount", "note", "extra")
        },
    )
)
def test_the_compiled_check_accepts_exactly_what_the_field_by_field_check_does(
    value: dict[str, typing.Any],
) -> None:
    form = value_form(Order, "json", lambda raw: None)
    slow = form._reason(dict(value))  # type: ignore[attr-defined]
    assert form._well_formed(dict(value)) == (not isinstance(slow, Rejected))  # type: ignore[attr-defined]
