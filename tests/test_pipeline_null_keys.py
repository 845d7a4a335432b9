"""The batch twin on null-keyed records (KIP-962), case by case against the stream's code
(tests/twin_reference.py): a side whose lone records are results gives its keyless record as
a result at once; it moves no stream time (a keyless record timed far ahead releases nothing
and makes nothing late); other sides dead-letter it. The generated differential tests
(tests/test_pipeline_twin.py, tests/test_pipeline_twin_temporal.py) draw null keys too."""

from __future__ import annotations

import orjson
import pytest
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from tables.operators.base import fingerprint
from tables.records.partitioners import partition_for
from tests.apps.twin_joins import PARTITIONS as JOIN_PARTITIONS
from tests.apps.twin_tables import PARTITIONS as TABLE_PARTITIONS
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, stream, twin

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]
JOINS = "tests.apps.twin_joins"
TABLES = "tests.apps.twin_tables"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def _event(n: int, ts: int) -> bytes:
    return orjson.dumps({"id": f"e{n}", "ts": ts})


def windowed_rows(join: str) -> list[Row]:
    """Keyed records of key 1 on both sides, then a keyless one on each side timed far ahead."""
    spec = JoinRef(JOINS, join).spec()
    left, right = spec.input_topics
    p = partition_for(b"1", JOIN_PARTITIONS, "murmur2")
    return [
        Row(left, p, 0, 0, b"1", _event(1, 10), 0),
        Row(right, p, 0, 0, b"1", _event(2, 11), 1),
        Row(left, p, 1, 0, b"1", _event(3, 20), 2),  # unmatched: its window closes at 20 + 1 + 1 + 1
        Row(left, p, 2, 0, None, _event(4, 1_000), 3),
        Row(right, p, 1, 0, None, _event(5, 2_000), 4),
    ]


@pytest.mark.parametrize(
    ("join", "lone"), [("outer-int", 2), ("left-int", 1), ("right-int", 1), ("inner-int", 0)]
)
def test_windowed_twin_gives_null_keyed_records_as_the_stream_does(
    spark: SparkSession, join: str, lone: int
) -> None:
    ref = JoinRef(JOINS, join)
    rows = windowed_rows(join)
    for close_inputs in (False, True):
        expected = stream(ref, rows, JOIN_PARTITIONS, close_inputs)
        got = twin(spark, ref, rows, JOIN_PARTITIONS, close_inputs)
        assert got.results == expected.results
        assert sorted(got.letters) == sorted(expected.letters)
        keyless = {
            fingerprint(None, rows[3].value, None, 1_000).hex(),
            fingerprint(None, None, rows[4].value, 2_000).hex(),
        }
        assert sum(n for (_, f, _), n in got.results.items() if f in keyless) == lone
        assert len(got.letters) == 2 - lone  # the others: null_key


def test_enrichment_twin_gives_a_null_keyed_trade_as_the_stream_does(spark: SparkSession) -> None:
    ref = JoinRef(TABLES, "left-int")
    spec = ref.spec()
    trades, quotes = spec.input_topics
    p = partition_for(b"1", TABLE_PARTITIONS, "murmur2")

    def trade(n: int, ts: int) -> bytes:
        return orjson.dumps({"id": f"t{n}", "ts": ts})

    def quote(ts: int) -> bytes:
        return orjson.dumps({"ts": ts, "v": 1})

    rows = [
        Row(quotes, p, 0, 0, b"1", quote(5), 0),
        Row(trades, p, 0, 0, b"1", trade(1, 10), 1),  # pending for its grace
        Row(trades, p, 1, 0, None, trade(2, 100_000), 2),  # a result at once; moves no stream time
        Row(quotes, p, 1, 0, None, quote(6), 3),  # dead-lettered
    ]
    for close_inputs in (False, True):
        expected = stream(ref, rows, TABLE_PARTITIONS, close_inputs)
        got = twin(spark, ref, rows, TABLE_PARTITIONS, close_inputs)
        assert got.results == expected.results
        assert sorted(got.letters) == sorted(expected.letters)
        assert [letter[3] for letter in got.letters] == ["null_key"]
        assert sum(got.results.values()) == (2 if close_inputs else 1)
