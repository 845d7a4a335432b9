"""The batch twin of a join whose inputs are rekeyed (tests/apps/rekeyed.py: a windowed join,
both inputs rekeyed, the sources with other partition counts than the join's), against the
stream's own code in the test driver (the worker's rekeyer and join task): from the same
source records, the same results (partition, fingerprint, time) and the same dead letters
(where they were read, their category)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pyspark.sql import SparkSession

from pipeline.apps import JoinRef
from pipeline.twin import run_twin
from tables.operators.base import fingerprint
from tables.records.partitioners import partition_for
from tables.testing import JoinTestDriver
from tests.apps.rekeyed import Click, Impression, attributed, clicks, impressions
from tests.spark_fixtures import spark_session
from tests.twin_reference import Row, frame_of

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
PARTITIONS = 3  # both inputs rekeyed: the larger source's count
REF = JoinRef("tests.apps.rekeyed", "attributed")


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def sources(seed: int = 5) -> list[tuple[str, bytes, bytes | None, int]]:
    """(topic, key, value, timestamp) in the order produced: clicks by user and impressions by
    ad for 30 auctions, some clicks outside the window, and records with no key to find."""
    rng = random.Random(seed)
    rows: list[tuple[str, bytes, bytes | None, int]] = []
    for n in range(30):
        ts = 1_000 * n
        impression = Impression(auction=f"a{n % 12}", ad=f"ad{n}", ts=ts)
        rows.append(("rk-impressions", f"ad{n}".encode(), impression.dumps(), ts))
        if rng.random() < 0.8:
            late = rng.random() < 0.2
            click = Click(user=f"u{n % 5}", auction=f"a{n % 12}", ts=ts + (20_000 if late else 500))
            rows.append(("rk-clicks", f"u{n % 5}".encode(), click.dumps(), ts))
    rows.append(("rk-clicks", b"u9", b'{"user": "u9", "ts": 5}', 5))  # no auction: the Record's check
    rows.append(("rk-clicks", b"u9", None, 6))  # a null value
    boom = Impression(auction="a1", ad="boom", ts=7)
    rows.append(("rk-impressions", b"boom", boom.dumps(), 7))  # the key function raises
    return rows


async def stream_outcome(rows: list[tuple[str, bytes, bytes | None, int]]) -> tuple[Counter, set]:
    topics = {"rk-clicks": clicks, "rk-impressions": impressions}
    async with JoinTestDriver(attributed, partitions=PARTITIONS) as d:
        for topic, key, value, ts in rows:
            await d.send(topics[topic], key=key, value=value, timestamp=ts, raw=True)
        await d.close_inputs()
        results = Counter(
            (p, fingerprint(m.key, m.left, m.right, m.timestamp).hex(), m.timestamp) for p, m in d._handed
        )
        letters = {(x["topic"], x["partition"], x["offset"], x["category"]) for x in d.dead_letters()}
    return results, letters


async def test_the_twin_rekeys_the_sources_as_the_stream_does(spark: SparkSession) -> None:
    rows = sources()
    counts = {"rk-clicks": 2, "rk-impressions": 3}
    offsets: dict[tuple[str, int], int] = {}
    layout = []
    for seq, (topic, key, value, ts) in enumerate(rows):
        partition = partition_for(key, counts[topic], "murmur2")
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        layout.append(Row(topic, partition, offset, ts, key, value, seq))
    want_results, want_letters = await stream_outcome(rows)
    assert sum(want_results.values()) >= 20 and len(want_letters) == 3

    output = run_twin(spark, REF, frame_of(spark, layout), PARTITIONS, close_inputs=True)
    try:
        got_results = Counter(
            (r["partition"], r["fingerprint"], r["ts"])
            for r in output.results.select("partition", "fingerprint", "ts").collect()
        )
        got_letters = {
            (r["topic"], r["partition"], r["offset"], r["category"]) for r in output.dead_letters.collect()
        }
    finally:
        output.unpersist()
    assert got_results == want_results
    assert got_letters == want_letters
