"""The batch twin of self-joins (pipeline/twins/self_join.py) against the stream's own code
(the checks and `tables.operators.self_join.SelfJoin`), record for record, with the inputs of
tests/test_pipeline_twin.py: bad records, null keys and values, wrong partitions, equal
times, records out of order, late ones and duplicates, the end of the input as it is or
closed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from tests.apps.twin_joins import PARTITIONS, SELF_WINDOWS
from tests.spark_fixtures import spark_session
from tests.test_pipeline_twin import APP, records
from tests.twin_reference import stream, twin

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
@pytest.mark.parametrize("join", sorted(SELF_WINDOWS))
def test_the_self_join_twin_equals_the_stream_record_for_record(
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


def test_a_pair_comes_in_both_orders_and_a_lone_record_alone(spark: SparkSession) -> None:
    """A by-hand case: the drawn ones above could all be empty of pairs."""
    from tests.twin_reference import Row

    ref = JoinRef(APP, "self-inner-str")
    rows = [Row("self-inner-str", 0, n, ts, b"", b'{"v": %d}' % n, None) for n, ts in enumerate((5, 6, 20))]
    expected = stream(ref, rows, PARTITIONS, close_inputs=True)
    assert sum(expected.results.values()) == 2  # (0, 1) and (1, 0): 20 is alone
    assert twin(spark, ref, rows, PARTITIONS, close_inputs=True).results == expected.results
