"""The temporal (enrichment) join's batch twin against the stream, record for record:
hypothesis-generated stream and table records for both `how`s (tests/apps/twin_tables.py: int
keys with Record values, the stream's ids and a time field; str keys with JSON values, offsets
and the Kafka timestamp), with deletes (a table's null value), null keys, a stream's null
values, bad records of every category, records on the wrong partition, equal timestamps,
records out of order within grace and beyond it, stream records older than history, late
table updates (within history and beyond it), duplicates by id with other times and values,
in the arrival order of docs/pipeline.md (with `seq`, and without), and the end of the input
as it is or closed (`advance` to the end of time, as the test driver's `close_inputs()`), read
in one Arrow batch or in batches of five (the twin's state committed to RocksDB between them,
as a worker commits a batch).

The stream's side is the stream's own code (tests/twin_reference.py): the partitioner check,
the side codecs (`side_codec(spec, side)`, the table's with `deletes`) and
`tables.operators.temporal.TemporalJoin` over a MemoryKV, fed in that order. Results (with
their fingerprints), dead letters (with categories and reasons), null values and the
operator's counters (`late`, `duplicates`, `late_updates`) must be equal; each of the twin's
results must also name the input records it was made of (its stream record and the table
version that answered).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from pipeline.twin import run_twin
from tables.records.partitioners import partition_for
from tests.apps.twin_tables import INT_PARAMETERS, PARTITIONS
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, frame_of, mostly, outcome_of, stream

# A failing example is shrunk through Spark, a second or more per run: give it the time, rather
# than let the default timeout interrupt a py4j call half-way (the session is then unusable).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]
APP = "tests.apps.twin_tables"
JOINS = [f"{how}-{form}" for form in ("int", "str") for how in INT_PARAMETERS]
COVERED: Counter[str] = Counter()  # what the drawn inputs held, over every example
ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


# -- inputs -------------------------------------------------------------------------------


@st.composite
def records(draw: st.DrawFn, join: str) -> list[Row]:
    """Stream and table records in the order they were produced (offsets count per topic
    partition); each may carry its place in that order as `seq`."""
    spec = JoinRef(APP, join).spec()
    form = join.rsplit("-", 1)[1]
    with_seq = draw(st.booleans())
    count = draw(st.integers(0, 60))
    rows: list[Row] = []
    offsets: Counter[tuple[str, int]] = Counter()
    for n in range(count):
        side = draw(st.sampled_from(["left", "right", "right"]))  # tables: several versions a key
        topic = getattr(spec, side).name
        if form == "int":
            key, value = draw(_int_record(side))
        else:
            key, value = draw(_str_record(side))
        # The Kafka timestamp: the int form's arrival order only (its time is a field), with
        # many ties between the inputs; the str form's event time.
        latest = 7 if form == "int" else 15
        stamp = draw(mostly(st.integers(0, latest), st.none()))
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


def _int_record(side: str) -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    key = mostly(st.integers(0, 3).map(lambda k: str(k).encode()), st.just(None), st.just(b"x"))
    if side == "left":
        good = st.fixed_dictionaries(
            {"id": st.sampled_from(["a", "b"]), "ts": st.integers(0, 15)},  # few ids: duplicates
            optional={"n": st.integers(0, 20)},
        ).map(orjson.dumps)
        bad = st.sampled_from([
            b"{not json", b'{"id": 1, "ts": 3}', b'{"id": "a"}', b'{"id": "a", "ts": -1}', b"[1]",
            b'{"id": "a", "ts": 5, "n": 13}', b'{"id": "a-long-id-past-the-size-limit", "ts": 4}',
        ])  # fmt: skip
    else:
        good = st.fixed_dictionaries({"ts": st.integers(0, 15), "v": st.integers(0, 9)}).map(orjson.dumps)
        bad = st.sampled_from(
            [b"{not json", b'{"ts": "x", "v": 1}', b'{"v": 1}', b'{"ts": 999999999999999999, "v": 1}']
        )
    return st.tuples(key, mostly(good, bad, st.just(None)))


def _str_record(side: str) -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    key = mostly(st.sampled_from([b"a", b"b", b"c", b""]), st.just(None), st.just(b"\xff"))
    good = st.fixed_dictionaries({"v": st.integers(0, 5)}).map(orjson.dumps)
    return st.tuples(key, mostly(good, st.just(b"{bad"), st.just(b"7"), st.just(None)))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
@pytest.mark.parametrize("join", JOINS)
def test_the_temporal_twin_equals_the_stream_record_for_record(
    spark: SparkSession, join: str, data: st.DataObject
) -> None:
    rows = data.draw(records(join))
    close_inputs = data.draw(st.booleans(), label="close_inputs")
    # Small Arrow batches: the pass commits its state to RocksDB after each batch, mid-partition.
    batch = data.draw(st.sampled_from([10_000, 5]), label="arrow batch")
    ref = JoinRef(APP, join)
    expected = stream(ref, rows, PARTITIONS, close_inputs)
    spark.conf.set(ARROW_BATCH, str(batch))
    try:
        output = run_twin(spark, ref, frame_of(spark, rows), PARTITIONS, close_inputs=close_inputs)
        made_of = output.raw_results.collect()
        got = outcome_of(output)
    finally:
        spark.conf.unset(ARROW_BATCH)
    assert got.results == expected.results
    assert sorted(got.letters) == sorted(expected.letters)
    assert got.null_values == expected.null_values
    assert got.counters == expected.counters
    _assert_made_of_their_inputs(ref, rows, made_of)
    COVERED.update(category for *_, category, _ in expected.letters)
    counted = [c for p in expected.counters.values() for c in p.items()]
    COVERED.update({
        "table value": sum(expected.results.values()) - expected.unmatched,
        "no table value": expected.unmatched,
        "null_value": sum(expected.null_values.values()), "delete": expected.deletes,
        **{name: sum(n for c, n in counted if c == name) for name in ("late", "duplicates", "late_updates")},
        "seq" if any(r.seq is not None for r in rows) else "no seq": 1,
        "closed" if close_inputs else "as is": 1,
        "small batches" if batch < len(rows) else "one batch": 1,
    })  # fmt: skip


def _assert_made_of_their_inputs(ref: JoinRef, rows: list[Row], results: list[Any]) -> None:
    """Each result's identities name its inputs: the stream record's value and key, and the
    table version's value at that offset (none when it has no table value)."""
    spec = ref.spec()
    raw = {(r.topic, r.partition, r.offset): r for r in rows}
    for result in results:
        left = raw[(spec.left.name, result["partition"], result["left_offset"])]
        assert (left.key, left.value) == (result["key"], result["left"])
        if result["right"] is None:
            assert result["right_topic"] is None and result["right_offset"] is None
            continue
        right = raw[(result["right_topic"], result["partition"], result["right_offset"])]
        assert right.topic == spec.right.name
        assert (right.key, right.value) == (result["key"], result["right"])
        assert result["right_rid"] == right.offset.to_bytes(8, "big")


def test_the_inputs_reached_every_case() -> None:
    """The examples drawn above (run first) held each case the twin must get right."""
    if not COVERED:
        pytest.skip("the differential test did not run in this session")
    cases = {"table value", "no table value", "null_value", "delete", "late", "duplicates", "late_updates",
             "seq", "no seq", "closed", "as is", "wrong_partition", "null_key", "undecodable", "wrong_type",
             "timestamp", "rejected", "too_large", "small batches", "one batch"}  # fmt: skip
    assert cases <= {case for case, n in COVERED.items() if n > 0}, COVERED
