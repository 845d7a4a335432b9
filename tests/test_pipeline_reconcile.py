"""reconcile against an audit written as a faithful stream would write it, then with one result
dropped, one added, one repeated by its writer, one redelivered by another writer, one on
another partition, one lost to a record the stream could have read late, a dead letter
dropped and another of another category: each lands in its own category, and the run fails
for exactly the ones that mean loss or a wrong result.

The input goes through `pipeline.produce` for the records it places (seq headers) and a bare
producer for the rest (no seq, Kafka timestamps out of offset order), on a broker of its own.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from pipeline.inputs import Topics
from pipeline.kafka import Connection
from pipeline.reconcile import Report, reconcile
from pipeline.twin import TwinOutput, run_twin
from tables.operators.keys import encode_int, meta_key
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, create_topics
from tests.apps.twin_joins import PARTITIONS
from tests.spark_fixtures import spark_session

pytestmark = [pytest.mark.spark, pytest.mark.broker]
JOIN = JoinRef("tests.apps.twin_joins", "left-int")  # before 0, after 3, grace 0 (ms); ids; time field


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def event(i: str, ts: int) -> bytes:
    return orjson.dumps({"id": i, "ts": ts})


def placed_rows() -> list[dict[str, Any]]:
    """Orders of keys 1-40 with partners, some not, a few bad and misplaced records."""
    rng = random.Random(4)
    spec = JOIN.spec()
    rows = []
    for n in range(400):
        side = rng.choice(["left", "right"])
        key = str(rng.randint(1, 40)).encode()
        value = event(f"{side[0]}{n}", 1000 + n // 2 + rng.randint(0, 2))
        rows.append({"topic": getattr(spec, side).name, "key": key, "value": value, "seq": n})
    rows.append({"topic": spec.left.name, "key": b"7", "value": b"{not json", "seq": 400})
    rows.append({"topic": spec.right.name, "key": b"8", "value": event("x", 1100), "seq": 401,
                 "partition": (partition_for(b"8", PARTITIONS, "murmur2") + 1) % PARTITIONS})  # fmt: skip
    return rows


async def prone_rows(bootstrap: str) -> None:
    """Key 99, produced a, b, c but sequenced b, c, a: the twin (in seq order) joins b (time
    2000) with c, but b lies after a (time 5000) in its input partition: a worker reading a
    backlog may have joined a first and dropped b as late."""
    spec, partition = JOIN.spec(), partition_for(b"99", PARTITIONS, "murmur2")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        sent = [(spec.left.name, event("a", 5000), 405), (spec.left.name, event("b", 2000), 403),
                (spec.right.name, event("c", 2001), 404)]  # fmt: skip
        for topic, value, seq in sent:
            headers = [("seq", str(seq).encode())]
            await producer.send_and_wait(topic, value, key=b"99", partition=partition, headers=headers)
    finally:
        await producer.stop()


def audit_of(twin: TwinOutput) -> list[tuple[bytes, int, dict[str, Any]]]:
    """(key, partition, value) of the audit records a faithful stream writes."""
    from pyspark.sql import functions as F

    typed = twin.results.select(
        "fingerprint", *[F.col(c).alias(f"t_{c}") for c in ("partition", "left_offset", "right_offset")]
    )
    same = [F.col(c).eqNullSafe(F.col(f"t_{c}")) for c in ("partition", "left_offset", "right_offset")]
    rows = twin.raw_results.join(typed, same[0] & same[1] & same[2]).collect()
    return [
        (bytes(r["key"]), r["partition"],
         {"partition": r["partition"], "ts": r["ts"], "fingerprint": r["fingerprint"], "writer": "w.1"})
        for r in rows
    ]  # fmt: skip


async def write(bootstrap: str, topic: str, records: list[tuple[bytes | None, int, bytes]]) -> None:
    await create_topics(bootstrap, [topic], PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, partition, value in records:
            await producer.send(topic, value, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def letters_of(twin: TwinOutput) -> list[dict[str, Any]]:
    return [
        {"join": "left-int", "topic": r["topic"], "partition": r["partition"], "offset": r["offset"],
         "reason": r["reason"], "category": r["category"], "key": None, "value": None}
        for r in twin.dead_letters.collect()
    ]  # fmt: skip


def test_reconcile_sorts_every_difference_into_its_category(spark: SparkSession, tmp_path: Path) -> None:
    from pipeline.produce import produce

    spec = JOIN.spec()
    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        connection = Connection(broker.bootstrap)
        asyncio.run(create_topics(broker.bootstrap, list(spec.input_topics), PARTITIONS))
        asyncio.run(produce(connection, spec, placed_rows(), PARTITIONS))
        asyncio.run(prone_rows(broker.bootstrap))
        twin = run_twin(spark, JOIN, Topics(broker.bootstrap))
        audit = audit_of(twin)
        letters = letters_of(twin)
        assert len(audit) > 100 and {d["category"] for d in letters} == {"undecodable", "wrong_partition"}
        late = twin.counts()["operator"]["late"]
        counters = {"late": late + 2, "duplicates": 0}
        asyncio.run(write(broker.bootstrap, spec.changelog_topic, [
            (meta_key(name), 0, encode_int(n)) for name, n in counters.items()
        ]))  # fmt: skip
        asyncio.run(write(broker.bootstrap, spec.dead_letter_topic,
                          [(None, d["partition"], orjson.dumps(d)) for d in letters]))  # fmt: skip

        def judge(topic: str, records: list[tuple[bytes, int, dict[str, Any]]]) -> Report:
            asyncio.run(write(broker.bootstrap, topic, [(k, p, orjson.dumps(v)) for k, p, v in records]))
            return reconcile(spark, JOIN, twin, connection, topic, examples=20)

        faithful = judge("audit-faithful", audit)
        normal = [a for a in audit if a[0] != b"99"]
        assert len(normal) == len(audit) - 1  # the one result of key 99: b with c
        mutated = normal[1:]  # one lost; and the late-prone one
        k, p, v = normal[1]
        mutated.append((k, p, v))  # repeated by its writer
        k, p, v = normal[2]
        mutated.append((k, p, {**v, "writer": "w.2"}))  # redelivered after a rebalance
        k, p, v = normal[3]
        mutated[2] = (k, (p + 1) % PARTITIONS, {**v, "partition": (p + 1) % PARTITIONS})  # normal[3], moved
        mutated.append((b"nope", 0, {"partition": 0, "ts": 1, "fingerprint": "00" * 16, "writer": "w.1"}))
        # Released by an idle partition's clock: one the twin has (matched), one it has not.
        k, p, v = mutated[4]
        mutated[4] = (k, p, {**v, "idle": True})
        mutated.append((b"quiet", 0, {"partition": 0, "ts": 2, "fingerprint": "11" * 16, "writer": "w.1",
                                      "idle": True}))  # fmt: skip
        different = judge("audit-mutated", mutated)
    twin.unpersist()

    assert faithful.results == {"matched": len(audit), "missing": 0, "late_by_stream_only": 0, "spurious": 0,
                                "idle_only": 0, "redelivered": 0, "repeated": 0, "misplaced": 0}  # fmt: skip
    assert faithful.idle_results == 0
    assert faithful.letters["matched"] == len(letters) and faithful.handler_errors == 0
    assert faithful.counters == {"twin": {"late": late, "duplicates": 0}, "stream": counters}
    # The misplaced input record (a right record read from another partition) fails the run alone.
    assert faithful.misplaced_inputs == {spec.left.name: 0, spec.right.name: 1}
    assert faithful.failures == ["misplaced input records"]
    faithful.allow_misplaced = True
    assert faithful.ok, faithful.render()

    assert different.results == {"matched": len(audit) - 2, "missing": 1, "late_by_stream_only": 1,
                                 "spurious": 1, "idle_only": 1, "redelivered": 1, "repeated": 1,
                                 "misplaced": 1}  # fmt: skip
    assert different.idle_results == 2  # the idle one the twin expects is matched, the other not a failure
    different.allow_misplaced = True
    assert different.failures == ["missing", "spurious", "repeated", "misplaced"]
    different.strict_duplicates = True
    assert "redelivered" in different.failures
    shown = {(e["category"], e["key"]) for e in different.examples}
    assert ("late_by_stream_only", "99") in shown and ("spurious", "nope") in shown
    assert ("idle_only", "quiet") in shown
    assert "released by an idle partition's clock (the `idle` option): 2" in different.render()
    assert "verdict: MISMATCH" in different.render()


def test_dead_letters_missing_or_of_another_category_fail() -> None:
    results = dict.fromkeys(["matched", "missing", "late_by_stream_only", "spurious", "redelivered",
                             "repeated", "misplaced"], 0)  # fmt: skip
    base = dict(join="j", results=results, by_partition=[], examples=[], letter_examples=[],
                handler_errors=0, counters={}, misplaced_inputs={})  # fmt: skip
    letters = {"matched": 5, "missing": 0, "spurious": 0, "other_category": 0, "redelivered": 2}
    assert Report(**base, letters=letters).ok  # type: ignore[arg-type]
    assert Report(**base, letters={**letters, "missing": 1}).failures == ["dead letters missing"]  # type: ignore[arg-type]
    assert Report(**base, letters={**letters, "other_category": 1}).failures == [
        "dead letters other_category"
    ]  # type: ignore[arg-type]
    assert Report(**{**base, "results": {**results, "late_by_stream_only": 4}}, letters=letters).ok  # type: ignore[arg-type]


def test_operator_counters_that_differ_fail_only_when_strict() -> None:
    """The stream's counters (from its changelog) against the twin's: shown either way, a
    failure with `--strict-counters`; without a changelog there is nothing to compare."""
    results = dict.fromkeys(["matched", "missing", "late_by_stream_only", "spurious", "redelivered",
                             "repeated", "misplaced"], 0)  # fmt: skip
    letters = dict.fromkeys(["matched", "missing", "spurious", "other_category", "redelivered"], 0)
    twin = {"late": 3, "duplicates": 7, "late_updates": 1}

    def report(stream: dict[str, int], strict: bool) -> Report:
        return Report(join="j", results=results, by_partition=[], examples=[], letters=letters,
                      letter_examples=[], handler_errors=0, counters={"twin": twin, "stream": stream},
                      misplaced_inputs={}, strict_counters=strict)  # fmt: skip

    equal = report(dict(twin), strict=True)
    assert equal.ok and equal.counters_differ == {}
    assert "    equal" in equal.render()
    more = {**twin, "duplicates": 9, "late_updates": 0}
    assert report(more, strict=False).ok
    differ = report(more, strict=True)
    assert differ.counters_differ == {"duplicates": 2, "late_updates": -1}
    assert differ.failures == ["operator counters"]
    assert "differ: duplicates +2 in the stream, late_updates -1 in the stream" in differ.render()
    no_changelog = report({}, strict=True)
    assert no_changelog.ok and "(no changelog)" in no_changelog.render()
