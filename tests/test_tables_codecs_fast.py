"""`SideCodec.accept`, the per-record fast path of the join runtime, against `SideCodec.check`
(tables/records/codecs.py): on the same random records and join options both decide alike (the same
rejection with the same reason, the same timestamp, id and built value), and call the join's
`validate` the same number of times; and the results handed to the handler, built in one
loop, against one match at a time. `accept` and `value` are the compiled ones where
tables.records._fastcheck is built and covers the options (tests/test_tables_fastcheck.py drives
both against the Python accept)."""

from __future__ import annotations

import typing
from datetime import UTC, datetime

import faust
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.operators.windowed import Match
from tables.records.codecs import MAX_TS_MS, Accepted, SideCodec, key_check, value_form
from tables.runtime.results import Feed, JoinResult, JoinResults

app = faust.App("codecs-fast-test", broker="kafka://127.0.0.1:1")


class Event(faust.Record, serializer="json"):
    event_id: str
    auction_id: str
    ts: int


class Optional(faust.Record, serializer="json"):
    event_id: str
    ts: typing.Any = None
    note: typing.Optional[str] = None  # noqa: UP045 - Faust reads typing.Optional


class Validated(faust.Record, serializer="json", validation=True):
    event_id: str
    ts: int


VALUE_TYPES: dict[str, tuple[typing.Any, str]] = {
    "record": (Event, "json"),
    "record with defaults": (Optional, "json"),
    "validated record": (Validated, "json"),
    "json": (None, "json"),
    "raw": (bytes, "raw"),
    "str": (str, "raw"),
}


def make_codec(value_kind: str, key_type: typing.Any, options: dict[str, typing.Any]) -> SideCodec:
    value_type, serializer = VALUE_TYPES[value_kind]

    def loads_value(raw: bytes) -> typing.Any:
        return app.serializers.loads_value(value_type, raw, serializer=serializer)

    def loads_key(raw: bytes) -> typing.Any:
        return app.serializers.loads_key(key_type, raw, serializer="raw")

    return SideCodec(
        "events",
        key_check(key_type, "raw", loads_key),
        value_form(value_type, serializer, loads_value),
        **options,
    )


def _field(value: typing.Any, name: str) -> typing.Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


class Validate:
    """A join's own check that counts its calls (both paths must call it alike)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, key: typing.Any, value: typing.Any) -> str | None:
        self.calls += 1
        if _field(value, "event_id") == "bad":
            return "a bad event"
        return None


def _timestamp_of(value: typing.Any) -> typing.Any:
    return _field(value, "ts")


def _id_of(value: typing.Any) -> typing.Any:
    found = _field(value, "event_id")
    if found == "boom":
        raise ValueError("no id")
    return found


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.just(True),
    st.integers(-5, 2**63),
    st.sampled_from([0, 1_700_000_000_000, MAX_TS_MS, MAX_TS_MS + 1, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "bad", "boom", "a-1", "2024-05-01T10:00:00", "not a time", "é"]),
    st.lists(st.integers(0, 3), max_size=2),
)
# Mostly well-formed events with one field changed, removed or added: most records get
# far into the checks, and every way out is taken.
_good = st.fixed_dictionaries(
    {
        "event_id": st.sampled_from(["e-1", "a-1", "bad", "boom", "", "7"]),
        "auction_id": st.sampled_from(["a-1", "7", ""]),
        "ts": st.one_of(
            st.sampled_from([0, 1_700_000_000_000, MAX_TS_MS, MAX_TS_MS + 1]), st.integers(0, 2**50)
        ),
    }
)


def _changed(
    good: dict[str, typing.Any], name: str | None, new: typing.Any, removed: bool
) -> dict[str, typing.Any]:
    if name is None:
        return good
    if removed:
        return {k: v for k, v in good.items() if k != name}
    return {**good, name: new}


_edge_times = st.sampled_from([True, False, -1, MAX_TS_MS + 1, 1.5, "2024-05-01T10:00:00", "nope", None, [1]])
_objects = st.one_of(
    st.builds(
        _changed,
        _good,
        st.sampled_from([None, "event_id", "auction_id", "ts", "note", "extra"]),
        _scalars,
        st.booleans(),
    ),
    st.builds(_changed, _good, st.sampled_from(["ts", "note", "event_id"]), _edge_times, st.just(False)),
)
_values = st.one_of(
    _objects.map(orjson.dumps),
    _objects.map(orjson.dumps),
    _objects.map(orjson.dumps),
    st.just(None),
    _scalars.map(orjson.dumps),
    st.sampled_from([b"", b"{", b"\xff\xfe", b"[1, 2]", b'{"event_id": NaN}', b"x" * 300]),
)
_keys = st.sampled_from([b"a-1", b"7", b"a-1", b"7", b"a-1", b"-3", b"", b"\xff", b"x y", None])
_message_ts = st.one_of(st.integers(0, 2**42), st.sampled_from([None, -1]))


@settings(max_examples=2000, deadline=None)
@given(
    st.sampled_from(sorted(VALUE_TYPES)),
    st.sampled_from([str, str, int, bytes]),
    st.sampled_from([None, "ts", "note", _timestamp_of]),
    st.sampled_from([None, "event_id", "ts", _id_of]),
    st.booleans(),
    st.sampled_from([None, 64]),
    st.lists(st.tuples(_keys, _values, st.integers(0, 2**40), _message_ts), max_size=8),
)
def test_accept_decides_as_check_does(
    value_kind: str,
    key_type: typing.Any,
    timestamp: typing.Any,
    record_id: typing.Any,
    validated: bool,
    max_value_bytes: int | None,
    records: list[tuple[bytes | None, bytes | None, int, int | None]],
) -> None:
    checks, accepts = Validate(), Validate()
    options = {"timestamp": timestamp, "record_id": record_id, "max_value_bytes": max_value_bytes}
    reference = make_codec(value_kind, key_type, {**options, "validate": checks if validated else None})
    fast = make_codec(value_kind, key_type, {**options, "validate": accepts if validated else None})
    for key, value, offset, message_ts in records:
        expected = reference.check(key, value, offset, message_ts)
        got = fast.accept(key, value, offset, message_ts)
        if type(expected) is Accepted:
            assert type(got) is tuple
            ts, found_id, built = got
            assert (ts, found_id) == (expected.ts, expected.record_id)
            assert type(built) is type(expected.value)
            assert _fields(built) == _fields(expected.value)
        else:
            assert got == expected
    assert accepts.calls == checks.calls


def _fields(value: typing.Any) -> typing.Any:
    return value.asdict() if isinstance(value, faust.Record) else value


def test_the_common_case_takes_the_fast_path_and_keeps_the_built_record() -> None:
    """The reference app's form: a Record in JSON, time and id from its fields, validated."""
    codec = make_codec("record", str, {"timestamp": "ts", "record_id": "event_id", "validate": Validate()})
    now = int(datetime.now(UTC).timestamp() * 1000)
    got = codec.accept(b"a-1", orjson.dumps({"event_id": "e1", "auction_id": "a-1", "ts": now}), 5, None)
    assert type(got) is tuple and got[:2] == (now, b"e1")
    assert type(got[2]) is Event and got[2].auction_id == "a-1" and got[2].ts == now


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"a-1", b"7", b"x y"]),
            st.one_of(st.none(), _good.map(orjson.dumps)),
            st.one_of(st.none(), _good.map(orjson.dumps)),
            st.integers(0, MAX_TS_MS),
        ),
        max_size=12,
    ),
    st.sampled_from(["record", "record with defaults", "validated record", "json", "raw"]),
)
def test_results_are_built_as_one_match_at_a_time_builds_them(
    matches: list[tuple[bytes, bytes | None, bytes | None, int]], value_kind: str
) -> None:
    """The handler's results, built in one loop over a batch's matches with each form's
    own `stored`, equal what `_result` gives per match with the generic decode."""
    codec = make_codec(value_kind, str, {})
    form = codec.form

    def as_before(raw: bytes) -> typing.Any:
        return form.build(form.check(raw)) if value_kind == "raw" else form.build(orjson.loads(raw))

    def results(
        value_of: typing.Callable[[bytes], typing.Any],
    ) -> JoinResults[typing.Any, typing.Any, typing.Any]:
        return JoinResults(app, Feed(), "events", codec.key, value_of, value_of, [], None)  # type: ignore[arg-type]

    def kept(raw: bytes | None) -> bytes | None:  # the state keeps only what its check accepted
        return raw if raw is not None and type(codec.check(b"k", raw, 0, 1)) is Accepted else None

    found = [Match(key, kept(left), kept(right), ts) for key, left, right, ts in matches]
    expected = [results(as_before)._result(m) for m in found]
    got = results(codec.value)._results(found)
    assert [type(r) for r in got] == [JoinResult] * len(found)
    assert [tuple(map(_fields, r)) for r in got] == [tuple(map(_fields, r)) for r in expected]
