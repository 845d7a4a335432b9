"""reconcile catches a dropped, an added, a changed and a duplicated output record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline import join, reconcile
from pipeline.join import load_topics, reference_join
from pipeline.produce import produce
from pipeline.reconcile import MisplacedInputs, Report
from pipeline.semantics import JoinParams
from tables.testing import EmbeddedBroker, create_topics
from tests.spark_fixtures import busy_traffic, produce_values, spark_session

WINDOW = ["--kind", "left", "--after", "30000", "--grace", "5000"]


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    return spark_session()


@pytest.fixture(scope="session")
def expected(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference results, written by the `join` command itself."""
    out = tmp_path_factory.mktemp("expected") / "results"
    assert join.main(["--input", str(busy_traffic()), "--out", str(out), *WINDOW]) == 0
    return out


def load(path: Path) -> list[dict[str, Any]]:
    rows = pq.read_table(str(path)).to_pylist()
    return sorted(rows, key=lambda r: r["join_id"])


def publish(broker: EmbeddedBroker, topic: str, rows: list[dict[str, Any]], extra: list[bytes]) -> None:
    """What a stream join would write: JSON values keyed by auction id, on 3 partitions."""
    asyncio.run(create_topics(broker.bootstrap, [topic], 3))
    payload = [
        (r["auction_id"].encode(), json.dumps({k: v for k, v in r.items() if k != "partition"}).encode())
        for r in rows
    ] + [(b"junk", value) for value in extra]
    asyncio.run(produce_values(broker.bootstrap, topic, payload))


def run(args: list[str], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    status = reconcile.main([*args, "--json", str(report)])
    return status, json.loads(report.read_text())


@pytest.mark.spark
def test_a_faithful_stream_output_reconciles(
    expected: Path, broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    rows = load(expected)
    topic = f"joins-ok-{unique}"
    publish(broker, topic, rows, [])
    status, report = run(
        ["--output-topic", topic, "--bootstrap", broker.bootstrap, "--expected", str(expected)],
        tmp_path,
    )
    assert status == 0 and report["ok"]
    assert report["totals"]["matched"] == len(rows) > 100
    assert sum(p["matched"] for p in report["by_partition"]) == len(rows)


@pytest.mark.spark
def test_dropped_added_changed_and_duplicated_records_are_caught(
    expected: Path, broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    rows = load(expected)
    dropped, changed, doubled = rows[3], rows[10], rows[20]
    added = {**rows[30], "join_id": "imp-bogus|", "impression_id": "imp-bogus"}
    actual = [r for r in rows if r is not dropped and r is not changed]
    actual += [{**changed, "ts": changed["ts"] + 1}, doubled, added]
    topic = f"joins-bad-{unique}"
    publish(broker, topic, actual, [b"{not json"])
    # The reference computed from the input this time, not read from Parquet.
    status, report = run(
        ["--output-topic", topic, "--bootstrap", broker.bootstrap,
         "--input", str(busy_traffic()), *WINDOW],
        tmp_path,
    )  # fmt: skip
    assert status == 1 and not report["ok"]
    totals = report["totals"]
    assert totals == {
        "matched": len(rows) - 2, "different": 1, "missing": 1, "extra": 1, "duplicates": 1,
    }  # fmt: skip
    assert report["unreadable"] == 1
    flagged = {(e["status"], e["join_id"]) for e in report["examples"]}
    assert flagged == {
        ("missing", dropped["join_id"]), ("different", changed["join_id"]),
        ("extra", "imp-bogus|"), ("duplicate", doubled["join_id"]),
    }  # fmt: skip
    by_partition = {p["partition"]: p for p in report["by_partition"]}
    assert by_partition[dropped["partition"]]["missing"] == 1
    assert by_partition[doubled["partition"]]["duplicates"] == 1


def test_duplicates_fail_unless_allowed() -> None:
    totals = {"matched": 5, "different": 0, "missing": 0, "extra": 0, "duplicates": 2}
    assert not Report(totals, [], []).ok
    assert Report(totals, [], [], allow_duplicates=True).ok
    assert not Report({**totals, "missing": 1}, [], [], allow_duplicates=True).ok


@pytest.mark.spark
def test_misplaced_inputs_are_their_own_category(
    spark: SparkSession, broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """Clicks placed by CRC32 (librdkafka's default): the stream, faithful to the contract,
    writes exactly the reference's results, yet reconcile fails and names the lost input."""
    inputs = {"impressions": f"imp-{unique}", "clicks": f"clk-{unique}"}
    asyncio.run(produce(broker.bootstrap, busy_traffic(), inputs, partitioners={"clicks": "crc32"}))
    reference = reference_join(
        load_topics(spark, broker.bootstrap, inputs["impressions"], inputs["clicks"]),
        JoinParams(after=30_000, grace=5_000, kind="left"),
    )
    rows = [r.asDict() for r in reference.results.collect()]
    moved = reference.misplaced.count()
    output = f"joins-misplaced-{unique}"
    publish(broker, output, rows, [])
    status, report = run(
        ["--output-topic", output, "--bootstrap", broker.bootstrap, *WINDOW,
         "--impressions-topic", inputs["impressions"], "--clicks-topic", inputs["clicks"]],
        tmp_path,
    )  # fmt: skip
    assert status == 1 and not report["ok"]
    assert report["totals"]["matched"] == len(rows) and report["totals"]["missing"] == 0
    found = report["misplaced"]
    assert found["by_topic"] == {inputs["impressions"]: 0, inputs["clicks"]: moved} and moved > 200
    assert sum(r["records"] for r in found["by_partition"]) == moved
    assert all(r["partition"] != r["belongs_to"] for r in found["by_partition"])
    assert found["examples"] and found["partitioner"] == "murmur2"


def test_misplaced_inputs_fail_unless_allowed() -> None:
    totals = {"matched": 5, "different": 0, "missing": 0, "extra": 0, "duplicates": 0}
    lost = MisplacedInputs("murmur2", {"imp": 0, "clk": 3}, [], [])
    none = MisplacedInputs("murmur2", {"imp": 0, "clk": 0}, [], [])
    assert not Report(totals, [], [], misplaced=lost).ok
    assert Report(totals, [], [], misplaced=lost, allow_misplaced=True).ok
    assert Report(totals, [], [], misplaced=none).ok
    assert "clk=3" in Report(totals, [], [], misplaced=lost).render()
    assert "not checked" in Report(totals, [], []).render()
