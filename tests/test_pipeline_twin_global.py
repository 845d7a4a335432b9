"""The global-table join's batch twin (pipeline/twins/global_lookup.py) on Spark: each stream
record joined with the table's value at the end of the input, by the stream's own lookup key
code, the stream's checks and dead letters (a key function that raises), the table read whole
whatever its partition count; and what reconcile accepts as a global lookup (every value the
key ever had)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from pipeline.reconcile import compare_results
from pipeline.twin import run_twin
from pipeline.twins.global_lookup import global_alternatives
from tables.operators.base import fingerprint
from tables.records.partitioners import partition_for
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, frame_of

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
APP = "tests.apps.global_table"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def rows() -> tuple[list[Row], list[Row], list[Row]]:
    """Campaigns (3 partitions: one renamed, one deleted), then clicks (4 partitions)."""
    offsets: dict[tuple[str, int], int] = {}

    def row(topic: str, count: int, key: str, value: dict[str, object] | None, ts: int) -> Row:
        raw = key.encode()
        partition = partition_for(raw, count, "murmur2")
        offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
        payload = None if value is None else json.dumps(value).encode()
        return Row(topic, partition, offset, ts, raw, payload, None)

    table = [row("campaigns", 3, f"camp-{i}", {"title": f"Campaign {i}"}, 1) for i in range(5)]
    table += [
        row("campaigns", 3, "camp-1", {"title": "Renamed"}, 2),
        row("campaigns", 3, "camp-4", None, 3),
    ]
    names = ["camp-0", "camp-1", "camp-4", "camp-9", "boom"]
    clicks = [
        row("clicks", 4, f"k{n}", {"click_id": f"k{n}", "campaign": names[n % 5], "ts": 100 + n}, 100 + n)
        for n in range(20)
    ]
    return table, clicks, table + clicks


def test_the_twin_joins_each_record_with_the_tables_value_at_the_end(spark: SparkSession) -> None:
    table, clicks, everything = rows()
    final = {b"camp-0": b'{"title": "Campaign 0"}', b"camp-1": b'{"title": "Renamed"}',
             b"camp-2": b'{"title": "Campaign 2"}', b"camp-3": b'{"title": "Campaign 3"}'}  # fmt: skip
    for join, inner in (("enriched-clicks", True), ("all-clicks", False)):
        output = run_twin(spark, JoinRef(APP, join), frame_of(spark, everything), 4)
        try:
            found = sorted(
                (r["partition"], r["fingerprint"], r["ts"])
                for r in output.results.select("partition", "fingerprint", "ts").collect()
            )
            letters = [(r["offset"], r["category"], r["reason"]) for r in output.dead_letters.collect()]
        finally:
            output.unpersist()
        expected = []
        for click in clicks:
            assert click.value is not None and click.key is not None and click.timestamp is not None
            campaign = json.loads(click.value)["campaign"]
            if inner and campaign == "boom":
                continue  # dead-lettered: the key function raised
            value = final.get(campaign.encode())
            if value is None and inner:
                continue
            expected.append(
                (
                    click.partition,
                    fingerprint(click.key, click.value, value, click.timestamp).hex(),
                    click.timestamp,
                )
            )
        assert found == sorted(expected), join
        booms = [c for c in clicks if c.value is not None and b'"boom"' in c.value]
        if inner:
            assert sorted(o for o, _, _ in letters) == sorted(c.offset for c in booms)
            assert all(
                cat == "rejected" and "lookup key function raised ValueError" in why
                for _, cat, why in letters
            )
        else:
            assert letters == []
    del table


def test_reconcile_knows_every_value_a_lookup_key_ever_had(spark: SparkSession) -> None:
    _, clicks, everything = rows()
    ref = JoinRef(APP, "all-clicks")
    output = run_twin(spark, ref, frame_of(spark, everything), 4)
    try:
        alternatives = {r["fingerprint"] for r in global_alternatives(ref, output.checked).collect()}
    finally:
        output.unpersist()
    camp1 = next(c for c in clicks if c.value is not None and b'"camp-1"' in c.value)
    assert camp1.key is not None and camp1.value is not None and camp1.timestamp is not None
    for title in (b'{"title": "Campaign 1"}', b'{"title": "Renamed"}', None):  # before, after, none
        assert fingerprint(camp1.key, camp1.value, title, camp1.timestamp).hex() in alternatives
    assert (
        fingerprint(camp1.key, camp1.value, b'{"title": "Campaign 2"}', camp1.timestamp).hex()
        not in alternatives
    )


def test_reconcile_tolerates_a_lookup_made_before_the_table_changed_and_nothing_else(
    spark: SparkSession,
) -> None:
    """The stream joined the camp-1 click before the rename (the twin: after), and handed over
    one result no value of the table could give: the first is `global_table_changed` (not
    missing, not spurious), the second spurious; every other result matched."""
    _, clicks, everything = rows()
    ref = JoinRef(APP, "all-clicks")
    output = run_twin(spark, ref, frame_of(spark, everything), 4)
    try:
        twin_results = output.results.select("partition", "fingerprint", "ts", "left_offset").collect()
        camp1 = next(c for c in clicks if c.value is not None and b'"camp-1"' in c.value)
        assert camp1.key is not None and camp1.value is not None and camp1.timestamp is not None
        before = fingerprint(camp1.key, camp1.value, b'{"title": "Campaign 1"}', camp1.timestamp).hex()
        invented = fingerprint(camp1.key, camp1.value, b'{"title": "Invented"}', camp1.timestamp).hex()
        audit_rows = [
            (b"k", r["partition"], r["ts"], r["fingerprint"], "w1")
            for r in twin_results
            if not (r["partition"] == camp1.partition and r["left_offset"] == camp1.offset)
        ]
        audit_rows += [(b"k", camp1.partition, camp1.timestamp, before, "w1")]
        audit_rows += [(b"k", camp1.partition, camp1.timestamp, invented, "w1")]
        audit = spark.createDataFrame(
            audit_rows, "key binary, partition int, ts long, fingerprint string, writer string"
        )
        others = global_alternatives(ref, output.checked)
        totals, _, _ = compare_results(output, audit, None, 5, others)
        plain, _, _ = compare_results(output, audit, None, 5)  # without the alternatives
    finally:
        output.unpersist()
    assert totals == {**dict.fromkeys(totals, 0), "matched": len(twin_results) - 1, "spurious": 1,
                      "global_table_changed": 1}  # fmt: skip
    assert plain["missing"] == 1 and plain["spurious"] == 2 and "global_table_changed" not in plain
