"""The batch twin of a windowed stream-stream join (`tables.operators.windowed.WindowedJoin`).

In the arrival order of docs/pipeline.md (per partition: `seq` when the records carry it,
else the Kafka timestamp, left before right, then the offset), one pass per partition, in
order, decides each record's fate as the stream's worker and operator do:

1. the stream's own checks (pipeline/checks.py): wrong partition, then the side's codec;
   dead letters and null values go no further and move no stream time;
2. a **duplicate** is a record whose identity is held: (side, key, id) with the join's `id`
   option, else (side, key, time, offset); a record is held until stream time passes
   `ts + before + after + grace` (then it is expired, and its identity with it);
   A null-keyed record (accepted only on a side `how` emits unmatched: KIP-962) is none of
   these: it is a result with no partner at once, and moves no stream time;
3. else a record is **late** when its window closed before it: `ts + after + grace` (left)
   or `ts + before + grace` (right) below the stream time before it;
4. else it is **accepted**: held, and stream time moves to its time if later.

The joins themselves are then Spark SQL over the accepted records (distributed by partition
and key): every left and right record of one partition and key with
`left.ts - before <= right.ts <= left.ts + after` make a result at the later time (the
second of the pair always arrives while the first is held); a record of a side `how` emits
unmatched, with no partner at all, makes a result once the partition's final stream time
passed `ts + before + after + grace` (after that no partner can be accepted), never before:
what the stream has emitted by the end of the input (with `close_inputs`, every one: what
the stream emits once `advance` moves its stream time to the end of time).

tests/test_pipeline_twin.py holds this to the stream's operator, record for record.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.checks import ACCEPTED, CHECKED_SCHEMA
from pipeline.twins import END_OF_TIME, KindTwin, in_arrival_order
from tables.operators.windowed import JoinType, JoinWindow
from tables.operators.windowed_kind import WindowedKind
from tables.spec import JoinSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# The checked records (pipeline/checks.py) with each one's fate in the join (`status`: late,
# duplicate) and the stream time before it.
RECORDS_SCHEMA = CHECKED_SCHEMA + ", st_before long"


def window_of(spec: JoinSpec) -> tuple[JoinWindow, JoinType]:
    kind = spec.kind
    assert isinstance(kind, WindowedKind), kind
    return kind.window, kind.join_type


class Sequencer:
    """One pass over the records of each partition in arrival order (module docstring, 1-4)."""

    def __init__(self, ref: JoinRef) -> None:
        spec = ref.spec()
        window, _ = window_of(spec)
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
        partitions = batch.column("partition").to_pylist()
        keys = batch.column("key").to_pylist()
        sides = batch.column("side").to_pylist()
        status = batch.column("status").to_pylist()
        ts = batch.column("ts").to_pylist()
        rid = batch.column("rid").to_pylist()
        st_before: list[int | None] = [None] * len(keys)
        close, retention, ids, held, due = self.close, self.retention, self.ids, self.held, self.due
        for i, partition in enumerate(partitions):
            if partition != self.partition:  # records come partition by partition
                self.partition, self.stream_time = partition, None
                held.clear()
                due.clear()
            if status[i] != ACCEPTED:
                continue
            side, when = sides[i], ts[i]
            st_before[i] = self.stream_time
            if keys[i] is None:
                continue  # a lone result at once (KIP-962): neither held nor moving stream time
            identity = (side, keys[i], rid[i]) if ids else (side, keys[i], when, rid[i])
            now = self.stream_time
            if identity in held:
                status[i] = "duplicate"
            elif now is not None and when + close[side] < now:
                status[i] = "late"
            else:
                held[identity] = when
                heapq.heappush(due, (when + retention, identity))
                if now is None or when > now:
                    self.stream_time = now = when
                    while due and due[0][0] < now:
                        expiry, gone = heapq.heappop(due)
                        if held.get(gone, expiry) + retention == expiry:  # not held again since
                            held.pop(gone, None)
        names = batch.schema.names
        arrays = [pa.array(status, type=pa.string()) if n == "status" else batch.column(n) for n in names]
        arrays.append(pa.array(st_before, type=pa.int64()))
        return pa.RecordBatch.from_arrays(arrays, names=[*names, "st_before"])


def sequencer(ref: JoinRef) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The pass as mapInArrow takes it (its state is made in the Python worker)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from Sequencer(ref)(batches)

    return run


def classify(spark: SparkSession, ref: JoinRef, checked: DataFrame, partitions: int | None) -> DataFrame:
    """Every input record with its fate (RECORDS_SCHEMA): each partition's checked records on
    one Spark partition (by range: one partition each where they are few), sorted in arrival
    order, then one pass."""
    ordered = in_arrival_order(spark, ref.spec(), checked, partitions)
    return ordered.mapInArrow(sequencer(ref), RECORDS_SCHEMA)


def _side(accepted: DataFrame, side: str) -> DataFrame:
    from pyspark.sql import functions as F

    mine = accepted.filter(F.col("side") == side)
    return mine.select(
        F.col("partition").alias(f"{side}_partition"), F.col("key").alias(f"{side}_key"),
        F.col("ts").alias(f"{side}_ts"), F.col("value").alias(side), F.col("topic").alias(f"{side}_topic"),
        F.col("offset").alias(f"{side}_offset"), F.col("rid").alias(f"{side}_rid"),
    )  # fmt: skip


# The outer join that gives, in one pass, the pairs and the records of the sides `how` emits
# unmatched that have no partner in their window (the other side's columns null).
_OUTER = {frozenset(): "inner", frozenset({"left"}): "left_outer", frozenset({"right"}): "right_outer",
          frozenset({"left", "right"}): "full_outer"}  # fmt: skip


def results_of(records: DataFrame, spec: JoinSpec, close_inputs: bool = False) -> DataFrame:
    """The join's results from the records' fates (module docstring), as RAW_RESULTS: one join
    of the accepted left and right records by partition, key and window (outer on the sides
    `how` emits unmatched); an unmatched record is kept once the partition's final stream time
    (END_OF_TIME with `close_inputs`) has passed its `ts + before + after + grace`."""
    from pyspark.sql import functions as F

    window, join_type = window_of(spec)
    accepted = records.filter(F.col("status") == ACCEPTED)
    left, right = _side(accepted, "left"), _side(accepted, "right")
    on = (
        (F.col("left_partition") == F.col("right_partition"))
        & (F.col("left_key") == F.col("right_key"))
        & F.col("right_ts").between(F.col("left_ts") - window.before, F.col("left_ts") + window.after)
    )
    joined = left.join(right, on, _OUTER[join_type.unmatched_sides])
    partition = F.coalesce("left_partition", "right_partition")
    columns: list[Column | str] = [
        partition.alias("partition"), F.coalesce("left_key", "right_key").alias("key"), "left", "right",
        F.coalesce(F.greatest("left_ts", "right_ts"), "left_ts", "right_ts").alias("ts"),
        "left_topic", "left_offset", "left_rid", "right_topic", "right_offset", "right_rid",
    ]  # fmt: skip
    results = joined.select(*columns)
    if not join_type.unmatched_sides:
        return results
    final_time = F.lit(END_OF_TIME) if close_inputs else F.max("ts")
    # A null-keyed record moves no stream time: the final stream time is over the keyed ones.
    keyed = accepted.filter(F.col("key").isNotNull())
    final = keyed.groupBy(F.col("partition").alias("p")).agg(final_time.alias("final_time"))
    retention = window.before + window.after + window.grace
    lone = F.col("left").isNull() | F.col("right").isNull()
    null_key = F.col("key").isNull()  # given at once (KIP-962), not when its window closes
    return (
        # "left": a partition with null-keyed records only has no final stream time.
        results.join(F.broadcast(final), F.col("partition") == F.col("p"), "left")
        .filter(~lone | null_key | (F.col("final_time") > F.col("ts") + retention))
        .drop("p", "final_time")
    )


def twin(
    spark: SparkSession, ref: JoinRef, checked: DataFrame, partitions: int | None, close_inputs: bool = False
) -> KindTwin:
    """The twin of a windowed join over its checked input records (pipeline/checks.py)."""
    from pyspark import StorageLevel

    # The pass runs Python over every record: once, not once per use below.
    records = classify(spark, ref, checked, partitions).persist(StorageLevel.MEMORY_AND_DISK)
    return KindTwin(records, results_of(records, ref.spec(), close_inputs))


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
    # (A null-keyed record is a result at once, moving no stream time: never late, no cause.)
    valid = records.filter(F.col("status").isin(ACCEPTED, "late", "duplicate") & F.col("key").isNotNull())
    earlier = (
        Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    )
    return (
        valid.withColumn("read_before", F.max("ts").over(earlier))
        .filter((F.col("status") == ACCEPTED) & (F.col("ts") + close < F.col("read_before")))
        .select("topic", "partition", "offset")
    )
