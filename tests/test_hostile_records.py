"""Hostile input records (issue 36, the record path): each one is dead-lettered with its reason
and the join goes on. Run on the real codecs (compiled check and pure Python), the real
operator over RocksDB files, the real output path (tables/testing/driver.py)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import faust
import orjson
import pytest

from tables import JoinInput, JoinResults, TandemAssignor, join
from tables.records import codecs
from tables.records.codecs import MAX_TS_MS
from tables.runtime.output import LETTER_KEEPS_BYTES
from tables.testing import JoinTestDriver

counter = itertools.count()


class Order(faust.Record, serializer="json"):
    order_id: int
    ts: int


class Payment(faust.Record, serializer="json"):
    order_id: int
    ts: int


@pytest.fixture(params=["compiled", "python"])
def record_check(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test once with the compiled per-record check (tables/records/_fastcheck.pyx) and
    once with the pure-Python one, the reference."""
    if request.param == "compiled" and codecs.CHECK.built is None:
        pytest.skip("tables.records._fastcheck is not built (setup.py build_ext --inplace)")
    was = codecs.CHECK.active
    codecs.CHECK.use(request.param == "compiled")
    yield request.param
    codecs.CHECK.use(was)


def orders_app(
    key_serializer: str = "raw", big_result: int | None = None, key_type: Any = int, **options: Any
) -> tuple[Any, dict[str, Any]]:
    """A join of orders and payments by an int order id, times from the records' `ts`, one
    partition (one stream time); the handler sends each result's order id (the result of
    order `big_result` 300 KB large, with the join's own producer: `send_soon`)."""
    app = faust.App(f"hostile-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    topics = {
        name: app.topic(
            name, key_type=key_type, key_serializer=key_serializer, value_type=model, partitions=1
        )
        for name, model in (("orders", Order), ("payments", Payment))
    }
    topics["out"] = app.topic("paid", key_type=int, key_serializer="json", value_serializer="json")

    @join(
        app, JoinInput(topics["orders"], timestamp="ts"), JoinInput(topics["payments"], timestamp="ts"),
        within=timedelta(seconds=10), grace=timedelta(seconds=1), **options,
    )  # fmt: skip
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for order_id, _order, _payment, ts in results:
            if big_result is None:
                await topics["out"].send(key=order_id, value={"ts": ts})
            else:
                padding = "x" * (300_000 if order_id == big_result else 10)
                results.send_soon(topics["out"], key=order_id, value={"ts": ts, "padding": padding})

    return paid, topics


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


async def send_pair(driver: JoinTestDriver, key: bytes, ts: int) -> None:
    for topic, value in (("orders", {"order_id": 0, "ts": ts}), ("payments", {"order_id": 0, "ts": ts + 5})):
        await driver.send(topic, key=key, value=orjson.dumps(value), timestamp=ts, raw=True)


# -- Finding 2: one far-future timestamp stops a partition ---------------------------------


@pytest.mark.usefixtures("record_check")
async def test_a_far_future_record_is_dead_lettered_and_does_not_make_the_next_ones_late() -> None:
    paid, topics = orders_app()
    async with JoinTestDriver(paid, partitions=1) as d:
        end_of_time = {"order_id": 1, "ts": MAX_TS_MS}  # 9999-12-31T23:59:59.999Z, a valid time
        await d.send("orders", key=b"1", value=orjson.dumps(end_of_time), timestamp=0, raw=True)
        now = now_ms()
        await send_pair(d, b"2", now)
        await send_pair(d, b"3", now + 1_000)
        await d.advance(stream_time=now + 60_000)
        assert sorted(s.key for s in d.sent(topics["out"])) == [2, 3]
        (letter,) = d.dead_letters()
        assert letter["category"] == "future_timestamp" and letter["offset"] == 0
        assert "9999-12-31T23:59:59.999+00:00 is more than max_future" in letter["reason"]
        assert d.counters()["late"] == 0


@pytest.mark.usefixtures("record_check")
async def test_max_future_is_set_per_join_and_none_turns_it_off() -> None:
    now = now_ms()
    for max_future, refused in ((timedelta(minutes=1), True), (None, False), (timedelta(days=1), False)):
        paid, topics = orders_app(max_future=max_future)
        async with JoinTestDriver(paid, partitions=1) as d:
            await send_pair(d, b"1", now + 3_600_000)  # an hour ahead
            categories = [letter["category"] for letter in d.dead_letters()]
            assert categories == (["future_timestamp"] * 2 if refused else []), max_future


# -- Finding 8: an int-key join takes 1.5 and true as 1 -----------------------------------


@pytest.mark.usefixtures("record_check")
async def test_an_int_key_join_dead_letters_keys_that_are_not_integers() -> None:
    paid, topics = orders_app(key_serializer="json")
    async with JoinTestDriver(paid, partitions=1) as d:
        now = now_ms()
        await send_pair(d, b"1.5", now)
        await send_pair(d, b"true", now + 10)
        await send_pair(d, b"[1]", now + 20)
        await send_pair(d, b"1", now + 30)
        await send_pair(d, b'"1"', now + 40)  # a JSON string of digits: Faust's int("1")
        await d.advance(stream_time=now + 60_000)
        assert [s.key for s in d.sent(topics["out"])] == [1]
        letters = d.dead_letters()
        assert [letter["category"] for letter in letters] == ["wrong_type"] * 8
        assert [letter["key"] for letter in letters[::2]] == ["1.5", "true", "[1]", '"1"']
        assert "is float, not an int" in letters[0]["reason"]
        assert "is bool, not an int" in letters[2]["reason"]


# -- Finding 1: a poison record crash-loops the worker ---------------------------------------

POISON = b"\x01" * 1_000_000  # 6,001,140 bytes of JSON as a dead letter's text, kept whole


def limit_producer(driver: JoinTestDriver, max_request_size: int) -> None:
    """The producer's max_request_size, as Faust's `producer_max_request_size` sets it on
    aiokafka's producer (the driver's in-memory producer has none by itself)."""
    driver.app.producer._ensure_producer()._max_request_size = max_request_size  # type: ignore[attr-defined]


async def test_a_dead_letter_keeps_a_bounded_part_of_a_huge_value_with_its_length_and_hash() -> None:
    paid, topics = orders_app()
    async with JoinTestDriver(paid, partitions=1) as d:
        now = now_ms()
        await d.send("orders", key=b"1", value=POISON, timestamp=now, raw=True)
        await send_pair(d, b"2", now)
        await d.advance(stream_time=now + 60_000)
        assert [s.key for s in d.sent(topics["out"])] == [2]
        (raw_letter,) = [row.value for _, row in d.log.topic(paid.dead_letter_topic)]
        assert len(raw_letter) < 200_000  # 6,001,140 bytes before
        letter = orjson.loads(raw_letter)
        assert letter["category"] == "undecodable" and letter["value"] == "\x01" * LETTER_KEEPS_BYTES
        assert letter["value_bytes"] == 1_000_000
        assert letter["value_sha256"] == hashlib.sha256(POISON).hexdigest()
        assert "key_bytes" not in letter and letter["key"] == "1"


async def test_a_result_too_large_for_the_producer_is_dead_lettered_and_the_rest_are_sent() -> None:
    paid, topics = orders_app(big_result=7)
    async with JoinTestDriver(paid, partitions=1) as d:
        limit_producer(d, 200_000)
        now = now_ms()
        for n, key in enumerate((b"6", b"7", b"8")):
            await send_pair(d, key, now + n)
        await d.advance(stream_time=now + 60_000)
        assert [s.key for s in d.sent(topics["out"])] == [6, 8]
        (letter,) = d.dead_letters()
        assert letter["category"] == "too_large" and letter["offset"] is None
        assert "over the producer's max_request_size (200000 bytes)" in letter["reason"]
        assert letter["value_bytes"] > 300_000 and len(letter["value"]) == LETTER_KEEPS_BYTES


async def test_a_letter_too_large_even_when_cut_is_skipped_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    paid, topics = orders_app()
    async with JoinTestDriver(paid, partitions=1) as d:
        limit_producer(d, 2_000)  # below a letter's 16 KiB of value
        now = now_ms()
        await d.send("orders", key=b"1", value=b"{" * 50_000, timestamp=now, raw=True)
        await send_pair(d, b"2", now)
        await d.advance(stream_time=now + 60_000)
        assert [s.key for s in d.sent(topics["out"])] == [2]
        assert d.dead_letters() == []
        assert d.stats.letters_skipped == 1 and d.counters()["dead_letters"] == {"undecodable": 1}
        (line,) = [r for r in caplog.records if "skips 1 dead letter" in r.getMessage()]
        assert line.levelname == "ERROR" and "max_request_size" in line.getMessage()


@pytest.mark.usefixtures("record_check")
async def test_a_record_its_changelog_could_not_carry_is_dead_lettered_not_joined() -> None:
    """A 600 KB key and a 500 KB value, each under its limit: together they would make a
    changelog record over Faust's producer_max_request_size (1,000,000), which stopped the join
    at every restart; now the record is `too_large`, and the next pair joins."""
    paid, topics = orders_app(key_type=str)
    async with JoinTestDriver(paid, partitions=1) as d:
        limit_producer(d, paid.app.conf.producer_max_request_size)
        now = now_ms()
        key = b"k" * 600_000
        value = orjson.dumps({"order_id": 1, "ts": now, "note": "x" * 500_000})
        await d.send("orders", key=key, value=value, timestamp=now, raw=True)
        await send_pair(d, b"2", now)
        await d.advance(stream_time=now + 60_000)
        assert [s.key for s in d.sent(topics["out"])] == [2]
        (letter,) = d.dead_letters()
        assert letter["category"] == "too_large" and "what the changelog can carry" in letter["reason"]
        assert letter["key_bytes"] == len(key) and len(letter["key"]) == LETTER_KEEPS_BYTES


@pytest.mark.usefixtures("record_check")
async def test_a_raw_int_key_is_written_as_faust_writes_an_int() -> None:
    """int() reads b" 7", b"+7", b"0_7" and b"07" as 7: other Kafka keys would join as one."""
    paid, topics = orders_app()
    async with JoinTestDriver(paid, partitions=1) as d:
        now = now_ms()
        for n, key in enumerate((b" 7", b"+7", b"0_7", b"07", b"-0", b"7", b"-7", b"0")):
            await send_pair(d, key, now + n)
        await d.advance(stream_time=now + 60_000)
        assert sorted(s.key for s in d.sent(topics["out"])) == [-7, 0, 7]
        letters = d.dead_letters()
        assert [letter["key"] for letter in letters[::2]] == [" 7", "+7", "0_7", "07", "-0"]
        assert {letter["category"] for letter in letters} == {"wrong_type"} and len(letters) == 10
