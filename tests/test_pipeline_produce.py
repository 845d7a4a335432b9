"""produce and export for any declared join: JSON lines serialized with the join's declared
types, placed by its partitioner with seq headers (and kept where a line names a partition);
an export of the topics gives the twin the same results as the topics themselves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from pipeline import export, produce
from pipeline.apps import JoinRef
from pipeline.inputs import Parquet, Topics
from pipeline.twin import run_twin
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, read_records
from tests.apps.twin_joins import PARTITIONS
from tests.spark_fixtures import spark_session

pytestmark = pytest.mark.broker
JOIN = JoinRef("tests.apps.twin_joins", "outer-int")  # int keys as JSON, Records, ids, a time field


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def lines() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(60):
        side = "left" if i % 3 else "right"
        rows.append({"side": side, "key": i % 7, "value": {"id": f"e{i}", "ts": 100 + i}, "timestamp": 5 + i})
    rows.append({"side": "left", "key": 3, "value_raw": "{not json"})
    rows.append({"side": "right", "key": None, "value": {"id": "k", "ts": 1}})
    rows.append({"topic": "outer-int-l", "key": 4, "value": None})
    rows.append({"side": "left", "key": 5, "value": {"id": "moved", "ts": 130},
                 "partition": (partition_for(b"5", PARTITIONS, "murmur2") + 1) % PARTITIONS})  # fmt: skip
    return rows


def test_json_lines_go_out_as_declared(broker: EmbeddedBroker, tmp_path: Path) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in lines()))
    assert produce.main(["--app", JOIN.app, "--join", JOIN.join, "--input", str(source),
                         "--bootstrap", broker.bootstrap]) == 0  # fmt: skip
    spec = JOIN.spec()
    left = asyncio.run(read_records(broker.bootstrap, spec.left.name, PARTITIONS))
    right = asyncio.run(read_records(broker.bootstrap, spec.right.name, PARTITIONS))
    assert len(left) == 43 and len(right) == 21
    for record in left + right:
        if record.key is not None and record.value != orjson.dumps({"id": "moved", "ts": 130}):
            assert record.partition == partition_for(record.key, PARTITIONS, "murmur2")
    seqs = {(r.partition, int(dict(r.headers)["seq"])) for r in left + right}
    assert len(seqs) == 64  # one place each in its partition's merged order
    for records in (left, right):  # sent in that order: offsets follow it
        for partition in range(PARTITIONS):
            mine = sorted(
                (r.offset, int(dict(r.headers)["seq"])) for r in records if r.partition == partition
            )
            assert [seq for _, seq in mine] == sorted(seq for _, seq in mine)
    assert {r.value for r in left if r.key == b"3"} >= {b"{not json"}
    for record in left + right:  # keys as JSON ints, Records as JSON, the lines' timestamps
        if record.value and record.value.startswith(b'{"id":"e'):
            i = int(json.loads(record.value)["id"][1:])
            assert record.key == str(i % 7).encode() and record.timestamp == 5 + i
            assert record.value == orjson.dumps({"id": f"e{i}", "ts": 100 + i})
    assert any(r.key is None for r in right) and any(r.value is None for r in left)
    moved = next(r for r in left if r.value == orjson.dumps({"id": "moved", "ts": 130}))
    assert moved.partition != partition_for(b"5", PARTITIONS, "murmur2")


@pytest.mark.spark
def test_an_export_gives_the_twin_what_the_topics_give(spark: SparkSession, tmp_path: Path) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in lines()))
    with EmbeddedBroker(log_dir=tmp_path / "broker") as own:
        args = ["--app", JOIN.app, "--join", JOIN.join, "--bootstrap", own.bootstrap]
        assert produce.main([*args, "--input", str(source)]) == 0
        assert export.main([*args, "--out", str(tmp_path / "export"), "--master", "local[2]"]) == 0
        from_topics = run_twin(spark, JOIN, Topics(own.bootstrap))
        topics = sorted(tuple(r) for r in from_topics.results.select("partition", "fingerprint").collect())
        counts = from_topics.counts()
        from_topics.unpersist()
    meta = json.loads((tmp_path / "export" / "_tandem.json").read_text())
    assert meta["partitions"] == PARTITIONS and sum(meta["counts"].values()) == 64
    from_export = run_twin(spark, JOIN, Parquet(str(tmp_path / "export")))
    exported = sorted(tuple(r) for r in from_export.results.select("partition", "fingerprint").collect())
    assert exported == topics and len(topics) > 20
    assert from_export.counts() == counts
    # (The keyless right record is a result of this outer join, with no partner: KIP-962.)
    assert counts["dead_letters"] == {"undecodable": 1, "wrong_partition": 1}
    assert sum(counts["input"]["null_value"].values()) == 1
    from_export.unpersist()


def test_a_self_joins_topic_is_created_once_and_placed_by_the_partitioner_given(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A self-join reads one topic in both roles: produce creates it once (not twice in one
    request, which Kafka refuses) and `--left-partitioner` places its records (a right
    side's default must not undo it: it is the same topic)."""
    ref = JoinRef("tests.apps.twin_joins", "self-left-int")
    source = tmp_path / "clicks.jsonl"
    rows = [{"side": "left", "key": i, "value": {"id": f"c{i}", "ts": 100 + i}} for i in range(40)]
    source.write_text("\n".join(json.dumps(r) for r in rows))
    assert produce.main(["--app", ref.app, "--join", ref.join, "--input", str(source),
                         "--bootstrap", broker.bootstrap, "--left-partitioner", "crc32"]) == 0  # fmt: skip
    found = asyncio.run(read_records(broker.bootstrap, ref.spec().left.name, PARTITIONS))
    assert len(found) == 40
    assert all(r.partition == partition_for(r.key, PARTITIONS, "crc32") for r in found)
    assert any(partition_for(r.key, PARTITIONS, "murmur2") != r.partition for r in found)  # a real test
