"""The batch twin of a windowed stream-stream join (`tables.operators.windowed.WindowedJoin`).

In the arrival order of docs/pipeline.md (per partition: `seq` when the records carry it,
else the Kafka timestamp, left before right, then the offset), one pass per partition, in
order, decides each record's fate as the stream's worker and operator do:

1. the stream's own checks (pipeline/checks.py): wrong partition, then the side's codec;
   dead letters and null values go no further and move no stream time;
2. a **duplicate** is a record whose identity is held: (side, key, id) with the join's `id`
   option, else (side, key, time, offset); a record is held until stream time passes
   `ts + before + after + grace` (then it is expired, and its identity with it);
3. else a record is **late** when its window closed before it: `ts + after + grace` (left)
   or `ts + before + grace` (right) below the stream time before it;
4. else it is **accepted**: held, and stream time moves to its time if later.

The joins themselves are then Spark SQL over the accepted records (distributed by partition
and key): every left and right record of one partition and key with
`left.ts - before <= right.ts <= left.ts + after` make a result at the later time (the
second of the pair always arrives while the first is held); a record of a side `how` emits
unmatched, with no partner at all, makes a result once the partition's final stream time
passed `ts + before + after + grace` (after that no partner can be accepted), never before:
what the stream has emitted by the end of the input.

tests/test_pipeline_twin.py holds this to the stream's operator, record for record.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.checks import ACCEPTED, Checker
from pipeline.inputs import RAW_COLUMNS
from pipeline.twins import KindTwin
from tables.operators.windowed import JoinType, JoinWindow, WindowedKind
from tables.spec import JoinSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

RECORDS_SCHEMA = (
    "topic string, partition int, offset long, timestamp long, key binary, value binary, seq long, "
    "side string, status string, category string, reason string, ts long, rid binary, st_before long"
)
_OUT_TYPES = {
    "side": pa.string(),
    "status": pa.string(),
    "category": pa.string(),
    "reason": pa.string(),
    "ts": pa.int64(),
    "rid": pa.binary(),
    "st_before": pa.int64(),
}


def window_of(spec: JoinSpec) -> tuple[JoinWindow, JoinType]:
    kind = spec.kind
    assert isinstance(kind, WindowedKind), kind
    return kind.window, kind.join_type


def arrival_order(raw: DataFrame, spec: JoinSpec) -> list[Column]:
    """The sort of a partition's records in arrival order (docs/pipeline.md): `seq` first (a
    partition whose records carry none falls to the rest), then the Kafka timestamp, left
    before right, then the offset."""
    from pyspark.sql import functions as F

    side_rank = F.when(F.col("topic") == spec.left.name, 0).otherwise(1)
    return [
        F.col("partition"),
        F.col("seq").asc_nulls_last(),
        F.col("timestamp").asc_nulls_first(),
        side_rank,
        F.col("offset"),
    ]


class Sequencer:
    """One pass over the records of each partition in arrival order (module docstring, 1-4)."""

    def __init__(self, ref: JoinRef, partitions: int | None) -> None:
        spec = ref.spec()
        window, _ = window_of(spec)
        self.checker = Checker(ref, partitions)
        self.sides = {spec.left.name: "left", spec.right.name: "right"}
        self.close = {"left": window.after + window.grace, "right": window.before + window.grace}
        self.retention = window.before + window.after + window.grace
        self.ids = spec.ids
        self.partition: int | None = None
        self.stream_time: int | None = None
        self.held: dict[tuple[Any, ...], int] = {}  # identity -> time of the record holding it
        self.due: list[tuple[int, tuple[Any, ...]]] = []  # (expiry, identity)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.batch(batch)

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        checked = self.checker.check(batch)
        topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist()
        keys = batch.column("key").to_pylist()
        sides = [self.sides[t] for t in topics]
        st_before: list[int | None] = [None] * len(keys)
        status, ts, rid = checked.status, checked.ts, checked.rid
        close, retention, ids, held, due = self.close, self.retention, self.ids, self.held, self.due
        for i, partition in enumerate(partitions):
            if partition != self.partition:  # records come partition by partition
                self.partition, self.stream_time = partition, None
                held.clear()
                due.clear()
            if status[i] != ACCEPTED:
                continue
            side, when = sides[i], ts[i]
            identity = (side, keys[i], rid[i]) if ids else (side, keys[i], when, rid[i])
            now = self.stream_time
            st_before[i] = now
            if identity in held:
                status[i] = "duplicate"
            elif now is not None and when + close[side] < now:  # type: ignore[operator]
                status[i] = "late"
            else:
                held[identity] = when  # type: ignore[assignment]
                heapq.heappush(due, (when + retention, identity))  # type: ignore[operator]
                if now is None or when > now:  # type: ignore[operator]
                    self.stream_time = now = when
                    while due and due[0][0] < now:  # type: ignore[operator]
                        expiry, gone = heapq.heappop(due)
                        if held.get(gone, expiry) + retention == expiry:  # not held again since
                            held.pop(gone, None)
        columns = {
            "side": sides,
            "status": status,
            "category": checked.category,
            "reason": checked.reason,
            "ts": ts,
            "rid": rid,
            "st_before": st_before,
        }
        arrays = [batch.column(name) for name in RAW_COLUMNS]
        arrays += [pa.array(values, type=_OUT_TYPES[name]) for name, values in columns.items()]
        return pa.RecordBatch.from_arrays(arrays, names=[*RAW_COLUMNS, *columns])


def sequencer(
    ref: JoinRef, partitions: int | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The pass as mapInArrow takes it (its state is made in the Python worker)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from Sequencer(ref, partitions)(batches)

    return run


def classify(spark: SparkSession, ref: JoinRef, raw: DataFrame, partitions: int | None) -> DataFrame:
    """Every input record with its fate (RECORDS_SCHEMA): each partition's records on one
    Spark partition, sorted in arrival order, then one pass."""
    spec = ref.spec()
    count = max(1, min(partitions or spark.sparkContext.defaultParallelism, 1024))
    ordered = raw.repartitionByRange(count, "partition").sortWithinPartitions(*arrival_order(raw, spec))
    return ordered.mapInArrow(sequencer(ref, partitions), RECORDS_SCHEMA)


def _side(accepted: DataFrame, side: str) -> DataFrame:
    from pyspark.sql import functions as F

    mine = accepted.filter(F.col("side") == side)
    return mine.select(
        "partition", "key",
        F.col("ts").alias(f"{side}_ts"), F.col("value").alias(side), F.col("topic").alias(f"{side}_topic"),
        F.col("offset").alias(f"{side}_offset"), F.col("rid").alias(f"{side}_rid"),
    )  # fmt: skip


def results_of(records: DataFrame, spec: JoinSpec) -> DataFrame:
    """The join's results from the records' fates (module docstring), as RAW_RESULTS."""
    from pyspark.sql import functions as F

    window, join_type = window_of(spec)
    accepted = records.filter(F.col("status") == ACCEPTED)
    left, right = _side(accepted, "left"), _side(accepted, "right")
    in_window = F.col("right_ts").between(F.col("left_ts") - window.before, F.col("left_ts") + window.after)
    pairs = left.join(right, ["partition", "key"]).filter(in_window)
    columns = [
        "partition", "key", "left", "right", "ts", "left_topic", "left_offset", "left_rid",
        "right_topic", "right_offset", "right_rid",
    ]  # fmt: skip
    results = pairs.withColumn("ts", F.greatest("left_ts", "right_ts")).select(*columns)
    unmatched = join_type.unmatched_sides
    if unmatched:
        final = accepted.groupBy("partition").agg(F.max("ts").alias("final_time"))
        retention = window.before + window.after + window.grace
        for side in ("left", "right"):
            if side not in unmatched:
                continue
            other = "right" if side == "left" else "left"
            matched = pairs.select("partition", f"{side}_topic", f"{side}_offset").distinct()
            lone = (
                _side(accepted, side)
                .join(F.broadcast(final), "partition")
                .filter(F.col("final_time") > F.col(f"{side}_ts") + retention)
                .join(matched, ["partition", f"{side}_topic", f"{side}_offset"], "left_anti")
                .withColumn("ts", F.col(f"{side}_ts"))
            )
            for name, kind in ((other, "binary"), (f"{other}_topic", "string"), (f"{other}_offset", "long"),
                               (f"{other}_rid", "binary")):  # fmt: skip
                lone = lone.withColumn(name, F.lit(None).cast(kind))
            results = results.unionByName(lone.select(*columns))
    return results


def twin(spark: SparkSession, ref: JoinRef, raw: DataFrame, partitions: int | None) -> KindTwin:
    """The twin of a windowed join over `raw` (the input layout)."""
    from pyspark import StorageLevel

    # The pass runs Python over every record: once, not once per use below.
    records = classify(spark, ref, raw, partitions).persist(StorageLevel.MEMORY_AND_DISK)
    return KindTwin(records, results_of(records, ref.spec()))


def late_prone(records: DataFrame, spec: JoinSpec) -> DataFrame:
    """(topic, partition, offset) of the accepted records the stream may have dropped as late:
    the worker reads each input partition in offset order, and when it reads a backlog it may
    join every earlier record of the same input partition before it reads this one, so its
    stream time may reach the latest time among them (the twin's may not: docs/pipeline.md).
    A record whose window closes before that time is late-prone."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window, _ = window_of(spec)
    close = F.when(F.col("side") == "left", window.after + window.grace).otherwise(
        window.before + window.grace
    )
    valid = records.filter(F.col("status").isin(ACCEPTED, "late", "duplicate"))
    earlier = (
        Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    )
    return (
        valid.withColumn("read_before", F.max("ts").over(earlier))
        .filter((F.col("status") == ACCEPTED) & (F.col("ts") + close < F.col("read_before")))
        .select("topic", "partition", "offset")
    )
