"""The compiled per-input-record check (tables/records/_fastcheck.pyx) against the Python accept it
hands odd records to (`SideCodec._accept`, the reference) and against `SideCodec.check`, on
random records and join options: the same decision (the same rejection and reason, or the
same exception), the same timestamp and id, the same built record (its type and its
`__dict__`, in order), and `validate` called as many times with the same arguments. And the
compiled `RecordForm.stored` against the Python one; and which configurations it covers."""

from __future__ import annotations

import copy
import json
import re
import types
import typing
from collections.abc import Callable, Iterator
from functools import partial

import faust
import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import TP
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tables.records import codecs, sides
from tables.records.codecs import DROPPED, MAX_TS_MS, Accepted, SideCodec, key_check, value_form
from tests.tables_helpers import compiled_at_import

fastcheck = pytest.importorskip(
    "tables.records._fastcheck",
    reason="tables.records._fastcheck is not built (python setup.py build_ext --inplace)",
)

app = faust.App("fastcheck-test", broker="kafka://127.0.0.1:1")


class Event(faust.Record, serializer="json"):
    event_id: str
    auction_id: str
    ts: int


class Inner(faust.Record, serializer="json"):
    x: int


class Wide(faust.Record, serializer="json"):
    """Every kind of field a plain model has: each JSON type, a union, nullables, defaults."""

    event_id: str
    ts: int
    score: float
    flag: bool
    tags: list[str]
    attrs: dict[str, int]
    either: typing.Union[int, str]  # noqa: UP007 - Faust reads typing.Union
    inner: Inner
    maybe: typing.Optional[int]  # noqa: UP045 - Faust reads typing.Optional
    note: typing.Optional[str] = None  # noqa: UP045
    count: int = 7
    label: str = "none"
    ratio: float = 0.5


class Loose(faust.Record, serializer="json"):
    """Not plain (an Any field): Faust builds it, and the check is the Python one."""

    event_id: str
    ts: typing.Any = None


class Validated(faust.Record, serializer="json", validation=True):
    event_id: str
    ts: int


MODELS: dict[str, typing.Any] = {"event": Event, "wide": Wide, "json": None}


def mostly(*strategies: st.SearchStrategy[typing.Any]) -> st.SearchStrategy[typing.Any]:
    """One of the strategies, each as likely (`st.one_of` leans to some: here most records
    must be good enough to go far into the checks)."""
    return st.sampled_from(strategies).flatmap(lambda strategy: strategy)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, MAX_TS_MS, MAX_TS_MS + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "bad", "a-1", "7", "é", "2024-05-01T10:00:00", "\U0001f600"]),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 3), max_size=2),
)
_times = mostly(
    *[st.integers(0, MAX_TS_MS)] * 4,
    st.sampled_from([0, 1_700_000_000_000, MAX_TS_MS, MAX_TS_MS + 1, -1, 2**63, 2**64 - 1, True, False]),
)
# A well-formed value of each field (by name, across the models).
VALID: dict[str, st.SearchStrategy[typing.Any]] = {
    "event_id": st.sampled_from(["e-1", "a-1", "bad", "raise", "odd", "falsy", "mutate", "", "7", "é"]),
    "auction_id": st.sampled_from(["a-1", "7", "", "-3"]),
    "ts": _times,
    "score": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 5)),
    "flag": st.booleans(),
    "tags": st.lists(st.sampled_from(["t", ""]), max_size=2),
    "attrs": st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
    "either": st.one_of(st.integers(-3, 3), st.sampled_from(["x", ""])),
    "inner": st.fixed_dictionaries({"x": st.integers(0, 3)}),
    "maybe": st.one_of(st.none(), st.integers(0, 3)),
    "note": st.one_of(st.none(), st.sampled_from(["n", "2024-05-01T10:00:00"])),
    "count": st.one_of(st.none(), st.integers(0, 3)),
    "label": st.one_of(st.none(), st.sampled_from(["l", ""])),
    "ratio": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
}


def fields_of(model: typing.Any) -> list[str]:
    return list(model._options.fields) if model is not None else ["event_id", "auction_id", "ts"]


@st.composite
def json_objects(draw: st.DrawFn, model: typing.Any) -> dict[str, typing.Any]:
    """An object of the model, well formed as often as not: else with fields left out (null,
    or a default where there is one), changed to another type, or added."""
    obj = {name: draw(VALID[name]) for name in fields_of(model)}
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        name = draw(st.sampled_from([*fields_of(model), "extra"]))
        if draw(st.booleans()):
            obj.pop(name, None)
        else:
            obj[name] = draw(_scalars)
    if draw(st.booleans()):  # the fields in another order than the model declares them
        obj = dict(reversed(list(obj.items())))
    return obj


def dumps(value: typing.Any) -> bytes:
    """JSON as a producer writes it (the json module: ints past 64 bits too, which orjson
    reads as floats from 2**64 on)."""
    return json.dumps(value, ensure_ascii=False).encode()


def values(model: typing.Any) -> st.SearchStrategy[typing.Any]:
    objects = json_objects(model).map(dumps)
    return mostly(
        *[objects] * 8,
        objects.map(bytearray),  # not bytes: the reference decides
        st.none(),
        _scalars.map(dumps),
        st.sampled_from([b"", b"{", b"\xff\xfe", b"[1, 2]", b'{"ts": NaN}', b'{"ts": 1}{', b"x" * 300]),
        st.binary(max_size=8),
    )


_keys = mostly(
    *[st.sampled_from([b"a-1", b"7", b"-3", b"0", b"123456789012345678", b"\xc3\xa9"])] * 6,
    st.sampled_from([b"-0", b"007", b"", b"-", b"\xff", b"x y", b"1_000", b" 5", b"+5", b"5 ", b"\x00"]),
    st.sampled_from([b"9" * 18, b"-" + b"9" * 18, b"9" * 19, b"-" + b"9" * 19, b"1" * 40]),
    st.integers(-(10**20), 10**20).map(lambda i: str(i).encode()),
    st.binary(max_size=4),
    st.sampled_from([None, "a-1", bytearray(b"7")]),  # not bytes: the reference decides
)
_offsets = mostly(
    *[st.integers(0, 2**40)] * 4, st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, True])
)
_message_ts = mostly(
    *[st.integers(0, 2**42)] * 4,
    st.sampled_from([None, -1, 0, MAX_TS_MS, MAX_TS_MS + 1, 2**63, 2**64, True, False, 1.5]),
)


class Validate:
    """A join's `validate` that logs its calls (key, and the value as it got it): by event id
    it rejects, raises, gives a reason that is not a str, gives a falsy one, or changes the
    record it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[typing.Any, ...]] = []

    def __call__(self, key: typing.Any, value: typing.Any) -> typing.Any:
        self.calls.append((type(key), key, type(value), _state(value)))
        event_id = value.get("event_id") if isinstance(value, dict) else getattr(value, "event_id", None)
        if event_id == "bad":
            return "a bad event"
        if event_id == "raise":
            raise ValueError("validate raised")
        if event_id == "odd":
            return ["not", "a", "str"]
        if event_id == "falsy":
            return ""
        if event_id == "mutate" and isinstance(value, faust.Record):
            value.ts = "changed"  # type: ignore[assignment]
            value.event_id = 12  # type: ignore[assignment]
        return None


def _state(value: typing.Any) -> typing.Any:
    """What a built value holds, copied: a Record's `__dict__` in order, else the value."""
    if isinstance(value, faust.Record):
        return copy.deepcopy(list(vars(value).items()))
    return copy.deepcopy(value)


def outcome(decide: Callable[[], typing.Any]) -> tuple[typing.Any, ...]:
    """A decision as comparable data: accepted (types and values), a Rejected, dropped, or
    the exception raised."""
    try:
        got = decide()
    except Exception as error:
        return ("raised", type(error), str(error))
    if type(got) is Accepted:
        got = (got.ts, got.record_id, got.value)
    if type(got) is tuple:
        ts, record_id, built = got
        return ("accepted", type(ts), ts, type(record_id), record_id, type(built), _state(built))
    if got is DROPPED:
        return ("dropped",)
    return ("rejected", type(got), got)


def stored_outcome(stored: Callable[[typing.Any], typing.Any], raw: typing.Any) -> tuple[typing.Any, ...]:
    """`stored(raw)` as comparable data (its type and state), or the exception raised."""
    try:
        got = stored(raw)
    except Exception as error:
        return ("raised", type(error), str(error))
    return ("made", type(got), _state(got))


def make_codec(model: typing.Any, key_type: typing.Any, options: dict[str, typing.Any]) -> SideCodec:
    def loads_key(raw: bytes) -> typing.Any:
        return app.serializers.loads_key(key_type, raw, serializer="raw")

    return SideCodec(
        "events", key_check(key_type, "raw", loads_key), value_form(model, "json", None), **options
    )


@pytest.fixture(scope="module", autouse=True)
def compiled_check() -> Iterator[None]:
    """The compiled check whatever TANDEM_PURE_PYTHON says: the one under test here."""
    was = codecs.CHECK.fast, codecs.CHECK.bound, codecs.CHECK.built
    codecs.CHECK.fast = codecs.CHECK.bound = codecs.CHECK.built = fastcheck
    yield
    codecs.CHECK.fast, codecs.CHECK.bound, codecs.CHECK.built = was


@settings(max_examples=1500, deadline=None)
def codecs_for(
    names: tuple[str, ...],
    model: typing.Any,
    key_type: typing.Any,
    timestamp: str | None,
    record_id: str | None,
    max_value_bytes: int | None,
    validated: bool,
    max_future_ms: int | None = None,
    max_record_bytes: int | None = None,
) -> tuple[dict[str, Validate], dict[str, SideCodec]]:
    """One codec per name with the same options, each with its own counting `validate`."""
    calls = {name: Validate() for name in names}
    made = {
        name: make_codec(
            model,
            key_type,
            {
                "timestamp": timestamp,
                "record_id": record_id,
                "max_value_bytes": max_value_bytes,
                "validate": calls[name] if validated else None,
                "max_future_ms": max_future_ms,
                "max_record_bytes": max_record_bytes,
            },
        )
        for name in names
    }
    return calls, made


@given(
    st.sampled_from(sorted(MODELS)),
    st.sampled_from([str, str, int, bytes]),
    st.sampled_from([None, None, "ts", "ts", "ts", "note", "score", "missing", ""]),
    st.sampled_from([None, None, "event_id", "event_id", "event_id", "ts", "note", "label", "missing", ""]),
    st.booleans(),
    st.sampled_from([None, None, None, 64, 400, 0, -1, 10**30]),
    st.sampled_from([None, None, 3_600_000, 0, 10**20]),  # max_future: times past now + it are refused
    st.sampled_from([None, None, 40, 120, 0, 10**30]),  # max_record_bytes: key, id and value together
    st.data(),
)
def test_the_compiled_accept_decides_as_the_python_accept_and_check(
    model_name: str,
    key_type: typing.Any,
    timestamp: str | None,
    record_id: str | None,
    validated: bool,
    max_value_bytes: int | None,
    max_future_ms: int | None,
    max_record_bytes: int | None,
    data: st.DataObject,
) -> None:
    model = MODELS[model_name]
    records = data.draw(st.lists(st.tuples(_keys, values(model), _offsets, _message_ts), max_size=8))
    calls, made = codecs_for(
        ("check", "python", "compiled"),
        model,
        key_type,
        timestamp,
        record_id,
        max_value_bytes,
        validated,
        max_future_ms,
        max_record_bytes,
    )
    compiled = made["compiled"]
    covered = record_id != "" and not (model is None and validated)
    assert compiled.compiled is covered
    handed: list[tuple[typing.Any, ...]] = []

    def handoff(*record: typing.Any) -> typing.Any:
        handed.append(record)
        return compiled.python_accept(*record)

    # The codec's compiled accept, made again with a handoff that tells which records go there.
    accept = compiled._compiled_accept(handoff) or compiled.accept
    for key, value, offset, message_ts in records:
        record = (key, value, offset, message_ts)
        by_check = outcome(partial(made["check"].check, *record))
        by_python = outcome(partial(made["python"].python_accept, *record))
        before = len(handed)
        by_compiled = outcome(partial(accept, *record))
        assert by_compiled == by_python == by_check
        if covered:
            event(f"{'handed over' if len(handed) > before else 'compiled'}: {by_compiled[0]}")
    assert calls["compiled"].calls == calls["python"].calls == calls["check"].calls


def _checked_state(
    run: Callable[[], typing.Any], letters: list[typing.Any], built: dict[int, typing.Any]
) -> tuple[typing.Any, ...]:
    """A loop over a fetch's records (`check_records`) as comparable data: what it returned
    (or raised), the dead letters, and each value built on arrival (its type and state)."""
    try:
        got = run()
    except Exception as error:
        got = ("raised", type(error), str(error))
    else:
        got = (list(got.offsets), list(got.stamps), list(got.events), got.nulls)
    kept = {key: (value, type(made), _state(made)) for key, (value, made) in built.items()}
    return got, list(letters), kept


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(sorted(MODELS)),
    st.sampled_from([str, str, int, bytes]),
    st.sampled_from([None, "ts", "ts", "missing"]),
    st.sampled_from([None, "event_id", "event_id", "ts", ""]),
    st.booleans(),
    st.sampled_from([None, None, 64, 0]),
    st.sampled_from(["left", "right"]),
    st.data(),
)
def test_the_compiled_loop_over_a_fetch_checks_as_the_python_loop(
    model_name: str,
    key_type: typing.Any,
    timestamp: str | None,
    record_id: str | None,
    validated: bool,
    max_value_bytes: int | None,
    side: str,
    data: st.DataObject,
) -> None:
    """`check_records` compiled (`check_many`, one call per fetched partition) against the
    Python loop with the Python accept (the reference): the same events, offsets, times, null
    count, dead letters (reason and all) and values built on arrival, or the same exception;
    `validate` called as often with the same arguments. On aiokafka's own record objects."""
    model = MODELS[model_name]
    drawn = data.draw(st.lists(st.tuples(_keys, values(model), _offsets, _message_ts), max_size=12))
    records = [
        ConsumerRecord("events", 3, offset, message_ts, 0, key, value, None, 0, 0, [])
        for key, value, offset, message_ts in drawn
    ]
    calls, made = codecs_for(
        ("python", "compiled"), model, key_type, timestamp, record_id, max_value_bytes, validated
    )
    made["python"].accept = made["python"].python_accept  # the reference: no compiled part
    tp = TP("events", 3)
    runs = {}
    for name, loop in (("python", sides.python_check_records), ("compiled", sides.check_records)):
        letters: list[typing.Any] = []
        built: dict[int, typing.Any] = {}
        run = partial(loop, made[name], side, tp, records, letters, built)  # type: ignore[arg-type]
        runs[name] = _checked_state(run, letters, built)
    assert runs["compiled"] == runs["python"]
    assert calls["compiled"].calls == calls["python"].calls
    event(f"compiled accept: {made['compiled'].compiled}")


_good_keys = {
    str: st.sampled_from([b"a-1", b"7", b"", b"\xc3\xa9", b"x y"]),
    int: mostly(
        *[st.integers(-(10**18) + 1, 10**18 - 1).map(lambda i: str(i).encode())] * 3,
        st.sampled_from([b"0", b"-0", b"000000000000000007"]),  # a leading zero: the Python check's
        # past 18 digits (int64's range, and past it), which the Python check reads
        st.sampled_from([b"9" * 19, b"-" + b"9" * 19, b"9223372036854775807", b"9223372036854775808"]),
        st.integers(10**18, 10**40).map(lambda i: str(i).encode()),
    ),
    bytes: st.binary(max_size=6),
}


_edge_ints = st.sampled_from([-1, 0, MAX_TS_MS, MAX_TS_MS + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, True, 1.0])


def _in_range(value: typing.Any, top: int) -> bool:
    return type(value) is int and 0 <= value <= top


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(sorted(MODELS)),
    st.sampled_from([str, int, bytes]),
    st.sampled_from([None, "ts"]),
    st.sampled_from([None, "event_id", "ts"]),  # a str id field, and an int one
    st.booleans(),
    st.sampled_from([None, 10**6]),
    st.data(),
)
def test_well_formed_records_stay_on_the_compiled_path(
    model_name: str,
    key_type: typing.Any,
    timestamp: str | None,
    record_id: str | None,
    validated: bool,
    max_value_bytes: int | None,
    data: st.DataObject,
) -> None:
    """Well-formed records are decided by the compiled code alone (the Python accept is not
    called), as the Python accept decides them: accepted, rejected by `validate`, or its
    exception; one with its time, offset or int key just past the edge is handed over."""
    model = MODELS[model_name]
    if model is None and validated:
        return  # not covered: a JSON value is the one `validate` gets, and may change
    good = {**VALID, "ts": mostly(*[st.integers(0, MAX_TS_MS)] * 3, _edge_ints)}
    objects = st.fixed_dictionaries({name: good[name] for name in fields_of(model)})
    record = st.tuples(
        _good_keys[key_type],
        objects,
        mostly(*[st.integers(0, 2**63 - 1)] * 3, _edge_ints),
        mostly(*[st.integers(0, MAX_TS_MS)] * 3, _edge_ints),
    )
    calls, made = codecs_for(
        ("python", "compiled"), model, key_type, timestamp, record_id, max_value_bytes, validated
    )
    handed: list[typing.Any] = []

    def handoff(*record: typing.Any) -> typing.Any:
        handed.append(record)
        return made["compiled"].python_accept(*record)

    accept = made["compiled"]._compiled_accept(handoff)
    assert accept is not None
    for key, obj, offset, message_ts in data.draw(st.lists(record, min_size=1, max_size=6)):
        one = (key, dumps(obj), offset, message_ts)
        before = len(handed)
        assert outcome(partial(accept, *one)) == outcome(partial(made["python"].python_accept, *one))
        ts = orjson.loads(one[1])["ts"]  # as decoded: 2**64 and up are floats
        edge = (
            (model is not None and type(ts) is not int)  # a field declared int
            or not _in_range(message_ts if timestamp is None else ts, MAX_TS_MS)
            or (record_id is None and not _in_range(offset, 2**63 - 1))
            or (record_id == "ts" and type(ts) is not int)  # an id that is no str or int
            or (key_type is int and not re.fullmatch(rb"0|-?[1-9][0-9]{0,17}", key))
        )
        assert len(handed) - before == edge
    assert calls["compiled"].calls == calls["python"].calls


def test_the_reference_apps_events_take_the_compiled_path() -> None:
    """app/join.py's options on app/records.py's events: compiled, and decided as in Python."""
    from app.records import MAX_VALUE_BYTES, Click, Impression, check_event
    from app.traffic import ad_events

    base_ts = 1_700_000_000_000

    def validate(key: str, event: typing.Any) -> str | None:
        return check_event(key, event, now_ms=base_ts)

    options = {"timestamp": "ts", "record_id": "event_id", "max_value_bytes": MAX_VALUE_BYTES}
    codecs_of = {
        "left": make_codec(Impression, str, {**options, "validate": validate}),
        "right": make_codec(Click, str, {**options, "validate": validate}),
    }
    assert all(codec.compiled for codec in codecs_of.values())
    assert make_codec(Impression, str, {**options, "validate": check_event}).compiled
    for offset, (side, ad_event) in enumerate(ad_events(200, base_ts=base_ts)):
        codec = codecs_of[side]
        key, value = ad_event["auction_id"].encode(), orjson.dumps(ad_event)
        got = codec.accept(key, value, offset, None)
        assert outcome(partial(codec.accept, key, value, offset, None)) == outcome(
            partial(codec.python_accept, key, value, offset, None)
        )
        assert type(got) is tuple and got[:2] == (ad_event["ts"], ad_event["event_id"].encode())
        assert type(got[2]) is (Impression if side == "left" else Click)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["event", "wide"]), st.data())
def test_the_compiled_stored_makes_what_the_python_one_makes(model_name: str, data: st.DataObject) -> None:
    """`RecordForm.stored` decodes what the state keeps: a record accepted on arrival (or
    anything else, which must fail alike)."""
    model = MODELS[model_name]
    form = value_form(model, "json", None)
    python = codecs._compile_build(model, form.fields, dict(model._options.defaults), from_bytes=True)
    assert form.stored is not python
    for raw in data.draw(st.lists(values(model).filter(lambda v: v is not None), max_size=8)):
        assert stored_outcome(form.stored, raw) == stored_outcome(python, raw)
        # A checked record is Faust's own construction. Not compared for Wide: its nested
        # record is checked as a dict only, and Faust builds it (or fails) when it is read.
        if model is Event and type(form.check(bytes(raw))) is dict:
            expected = model.from_data(orjson.loads(raw), preferred_type=model)
            assert form.stored(raw).asdict() == expected.asdict()


@pytest.mark.parametrize(
    ("what", "model", "key_type", "options"),
    [
        ("a timestamp function", Event, str, {"timestamp": lambda v: v.ts}),
        ("an id function", Event, str, {"record_id": lambda v: v.event_id}),
        ("an empty id field name", Event, str, {"record_id": ""}),
        ("a record that validates itself", Validated, str, {}),
        ("a model that is not plain", Loose, str, {}),
        ("a JSON value with validate", None, str, {"validate": lambda k, v: None}),
        ("a key of another type", Event, float, {}),
        ("a size limit that is not an int", Event, str, {"max_value_bytes": 64.0}),
    ],
)
def test_configurations_the_compiled_check_does_not_cover_take_the_python_one(
    what: str, model: typing.Any, key_type: typing.Any, options: dict[str, typing.Any]
) -> None:
    codec = make_codec(model, key_type, options)
    assert not codec.compiled, what
    assert codec.accept is codec.python_accept


def test_a_model_with_more_fields_than_the_compiled_check_takes_keeps_the_python_one() -> None:
    fields = {f"f{i}": int for i in range(fastcheck.MOST_FIELDS + 1)}
    big = type("Big", (faust.Record,), {"__annotations__": fields, "__module__": __name__}, serializer="json")
    codec = make_codec(big, str, {})
    assert codec.form._plain and not codec.compiled  # type: ignore[attr-defined]
    assert type(codec.value) is types.FunctionType  # the Python stored
    raw = dumps(dict.fromkeys(fields, 1))
    assert codec.accept(b"k", raw, 3, 5) == (5, b"\x00" * 7 + b"\x03", None)


def test_raw_and_str_values_take_the_python_check() -> None:
    for value_type in (bytes, str):
        form = value_form(value_type, "raw", None)
        codec = SideCodec("events", key_check(str, "raw", None), form)  # type: ignore[arg-type]
        assert not codec.compiled and codec.accept is codec.python_accept


def test_the_check_is_chosen_once_at_import_and_switched_for_new_codecs() -> None:
    """Compiled unless TANDEM_PURE_PYTHON=1 (read once, at import); `use_compiled` chooses for
    the codecs made after it."""
    assert not compiled_at_import("tables.records.codecs.CHECK", "1")
    assert compiled_at_import("tables.records.codecs.CHECK", "0")
    was = codecs.CHECK.active
    try:
        codecs.CHECK.use(False)
        assert not codecs.CHECK.active
        assert not make_codec(Event, str, {}).compiled
        assert type(value_form(Event, "json", None).stored) is types.FunctionType  # the Python one
        codecs.CHECK.use(True)
        assert codecs.CHECK.active
        assert make_codec(Event, str, {}).compiled
        assert type(value_form(Event, "json", None).stored) is not types.FunctionType
    finally:
        codecs.CHECK.use(was)
