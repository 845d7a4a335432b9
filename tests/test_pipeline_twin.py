"""The batch twin against the stream, record for record: hypothesis-generated inputs for every
`how` of the windowed join (tests/apps/twin_joins.py: int keys with Record values, ids and a
time field; str keys with JSON values, offsets and the Kafka timestamp), with null keys and
values, bad records of every category, records on the wrong partition, equal timestamps,
records out of order, late ones and duplicates, in the arrival order of docs/pipeline.md
(with `seq`, and without: Kafka timestamp, left first, offset), and the end of the input as it
is or closed (`advance` to the end of time, as the test driver's `close_inputs()`).

The stream's side is the stream's own code: the partitioner check
(`tables.records.partitioners.find_misplaced`), the side codecs (`side_codec(spec, side)`)
and the operator (`tables.operators.windowed.WindowedJoin` over a MemoryKV), fed in that
order. Results (with their fingerprints), dead letters (with categories and reasons), null
values and the operator's counters must be equal.
"""

from __future__ import annotations

from collections import Counter

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from tables.records.partitioners import partition_for
from tests.apps.twin_joins import PARTITIONS, STR_WINDOWS
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, mostly, stream, twin

pytestmark = pytest.mark.spark
APP = "tests.apps.twin_joins"
JOINS = [f"{how}-{form}" for form in ("int", "str") for how in STR_WINDOWS]
COVERED: Counter[str] = Counter()  # what the drawn inputs held, over every example


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


# -- inputs -------------------------------------------------------------------------------


@st.composite
def records(draw: st.DrawFn, join: str) -> list[Row]:
    """Records of both inputs in the order they were produced (offsets count per topic
    partition); each may carry its place in that order as `seq`."""
    spec = JoinRef(APP, join).spec()
    form = join.rsplit("-", 1)[1]
    with_seq = draw(st.booleans())
    count = draw(st.integers(0, 60))
    rows: list[Row] = []
    offsets: Counter[tuple[str, int]] = Counter()
    for n in range(count):
        side = draw(st.sampled_from(["left", "right"]))
        topic = getattr(spec, side).name
        key, value = draw(_int_record() if form == "int" else _str_record())
        stamp = draw(mostly(st.integers(0, 15), st.none()) if form == "str" else st.integers(0, 15))
        if key is not None and draw(st.integers(0, 9)) == 0:  # placed by another client's partitioner
            partition = draw(st.integers(0, PARTITIONS - 1))
        elif key is not None:
            partitioner = spec.partitioner if spec.partitioner != "none" else "murmur2"
            partition = partition_for(key, PARTITIONS, partitioner) if key or partitioner == "murmur2" else 0
        else:
            partition = draw(st.integers(0, PARTITIONS - 1))
        offset = offsets[(topic, partition)]
        offsets[(topic, partition)] += 1
        rows.append(Row(topic, partition, offset, stamp, key, value, n if with_seq else None))
    return rows


def _int_record() -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    key = mostly(st.integers(0, 4).map(lambda k: str(k).encode()), st.just(None), st.just(b"x"))
    good = st.fixed_dictionaries(
        {"id": st.sampled_from(["a", "b", "c", "d"]), "ts": st.integers(0, 15)},
        optional={"n": mostly(st.integers(0, 20), st.just(13))},  # 13: the inner join's validate rejects it
    ).map(orjson.dumps)
    bad = st.sampled_from([
        b"{not json", b'{"id": 1, "ts": 3}', b'{"id": "a"}', b'{"id": "a", "ts": -1}', b"[1]",
        b'{"id": "a", "ts": 5, "n": 13}', b'{"id": "a-long-id-past-the-size-limit-of-one-join", "ts": 4}',
    ])  # fmt: skip
    return st.tuples(key, mostly(good, bad, st.just(None)))


def _str_record() -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    key = mostly(st.sampled_from([b"a", b"b", b"c", b""]), st.just(None), st.just(b"\xff"))
    good = st.fixed_dictionaries({"v": st.integers(0, 5)}).map(orjson.dumps)
    return st.tuples(key, mostly(good, st.just(b"{bad"), st.just(b"7"), st.just(None)))


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
@pytest.mark.parametrize("join", JOINS)
def test_the_twin_equals_the_stream_record_for_record(
    spark: SparkSession, join: str, data: st.DataObject
) -> None:
    rows = data.draw(records(join))
    close_inputs = data.draw(st.booleans(), label="close_inputs")
    ref = JoinRef(APP, join)
    expected = stream(ref, rows, PARTITIONS, close_inputs)
    got = twin(spark, ref, rows, PARTITIONS, close_inputs)
    assert got.results == expected.results
    assert sorted(got.letters) == sorted(expected.letters)
    assert got.null_values == expected.null_values
    assert got.counters == expected.counters
    COVERED.update(category for *_, category, _ in expected.letters)
    COVERED.update({
        "matched": sum(expected.results.values()) - expected.unmatched, "unmatched": expected.unmatched,
        "null_value": sum(expected.null_values.values()),
        "late": sum(c["late"] for c in expected.counters.values()),
        "duplicates": sum(c["duplicates"] for c in expected.counters.values()),
        "seq" if any(r.seq is not None for r in rows) else "no seq": 1,
        "closed" if close_inputs else "as is": 1,
    })  # fmt: skip


def test_the_inputs_reached_every_case() -> None:
    """The examples drawn above (run first) held each case the twin must get right."""
    if not COVERED:
        pytest.skip("the differential test did not run in this session")
    cases = {"matched", "unmatched", "null_value", "late", "duplicates", "seq", "no seq", "closed", "as is",
             "wrong_partition", "null_key", "undecodable", "wrong_type", "timestamp", "rejected",
             "too_large"}  # fmt: skip
    assert cases <= {case for case, n in COVERED.items() if n > 0}, COVERED
