"""The reference app through the generic twin, with no pipeline code of its own: its traffic
generator's Parquet (disorder, late records, duplicates by event id, malformed records), read
by `python -m pipeline join --app app --input DIR` as any export, gives what the app's own
checks (`validate=check_event`, wall clock included) and operator give record for record."""

from __future__ import annotations

import functools
import json
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline import join as join_job
from pipeline.apps import JoinRef
from pipeline.generate import TrafficConfig, generate
from pipeline.inputs import Parquet
from pipeline.twin import join_frame, run_twin
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, outcome_of, stream

pytestmark = pytest.mark.spark
PARTITIONS = 3


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


@functools.cache
def traffic() -> Path:
    """Busy small traffic of this hour (the app rejects times a week away from its clock)."""
    config = TrafficConfig(
        impressions=1500, partitions=PARTITIONS, ctr=0.5, click_delay_ms=20_000, rate_per_s=5,
        out_of_order=0.2, disorder_ms=20_000, late=0.05, late_ms=60_000, duplicates=0.05,
        malformed=0.02, start_ms=int(time.time() // 3600 * 3600 * 1000), seed=11,
    )  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="tandem-ad-traffic-"))
    generate(spark_session(), config, out)
    return out


def rows_of(path: Path) -> list[Row]:
    """The generator's records as the topics would hold them: offsets in seq order."""
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pylist()
    rows, offsets = [], {}
    for r in sorted(table, key=lambda r: (r["topic"], r["partition"], r["seq"])):
        place = (r["topic"], r["partition"])
        offsets[place] = offsets.get(place, -1) + 1
        rows.append(Row(r["topic"], r["partition"], offsets[place], None, r["key"], r["value"], r["seq"]))
    return rows


def test_the_ad_join_from_its_generator_equals_the_stream(spark: SparkSession) -> None:
    ref = JoinRef.of("app", "ad-join")
    assert ref.spec().audit
    path = traffic()
    expected = stream(ref, rows_of(path), PARTITIONS)
    got = outcome_of(run_twin(spark, ref, Parquet(str(path))))
    assert got.results == expected.results and sum(got.results.values()) > 300
    assert sorted(got.letters) == sorted(expected.letters) and len(got.letters) > 20
    assert got.counters == expected.counters and sum(c["late"] for c in got.counters.values()) > 10


def test_join_frame_is_the_results_as_a_dataframe(spark: SparkSession) -> None:
    """The documented entry point for a backfill in Spark (docs/pipeline.md)."""
    results = join_frame(spark, "app", "ad-join", Parquet(str(traffic())))
    columns = ["key", "left", "right", "ts", "partition", "left_topic", "left_offset", "left_id",
               "right_topic", "right_offset", "right_id", "fingerprint"]  # fmt: skip
    assert results.columns == columns
    per_campaign = results.groupBy("left.campaign_id").count().collect()
    assert sum(r["count"] for r in per_campaign) == results.count() > 300


def test_the_join_command_writes_typed_results(spark: SparkSession, tmp_path: Path) -> None:
    out, counts = tmp_path / "results", tmp_path / "counts.json"
    args = ["--app", "app", "--input", str(traffic()), "--out", str(out), "--json", str(counts)]
    assert join_job.main([*args, "--master", "local[2]"]) == 0
    table = pq.read_table(str(out))
    assert table.schema.field("left").type.names == ["event_id", "auction_id", "campaign_id", "ts"]
    assert str(table.schema.field("key").type) == "string"
    row = table.slice(0, 1).to_pylist()[0]
    assert row["left"]["auction_id"] == row["right"]["auction_id"] == row["key"]
    assert row["left_id"] == row["left"]["event_id"] and row["right_id"] == row["right"]["event_id"]
    assert row["ts"] == max(row["left"]["ts"], row["right"]["ts"])
    found = json.loads(counts.read_text())
    assert found["results"]["matched"] == table.num_rows
    assert found["dead_letters"]["undecodable"] > 0 and found["dead_letters"]["wrong_type"] > 0
