"""The batch twin of a self-join (`tables.join(app, t, t, ...)`, `tables.operators.self_join`).

The windowed twin (pipeline/twins/windowed.py) with the self-join's rules
(docs/join-semantics.md, "Self-joins"): one pass per partition in arrival order decides each
record's fate once, for both its roles,

1. the stream's own checks (pipeline/checks.py), as for every join;
2. a **duplicate** is a record whose identity (key, id; without the `id` option, key, time
   and offset) is held; a record is held until stream time passes
   `ts + 2 * max(before, after) + grace`;
3. else a record is **late** when `ts + max(before, after) + grace` is below the stream time
   before it;
4. else it is **accepted**: held, and stream time moves to its time if later.

The pairs are then Spark SQL over the accepted records: every two records `a`, `b` of one
partition and key, not the same record, with `a.ts - before <= b.ts <= a.ts + after` make
the result (a, b) at the later time; a left self-join's record with no such partner makes
(record, None) once the partition's final stream time (END_OF_TIME with `close_inputs`)
passed `ts + 2 * max(before, after) + grace`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.checks import ACCEPTED
from pipeline.twins import END_OF_TIME, KindTwin, in_arrival_order
from pipeline.twins.windowed import RECORDS_SCHEMA, Sequencer, _side, window_of
from tables.operators.windowed import JoinType, JoinWindow
from tables.spec import JoinSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def closes_after(window: JoinWindow) -> int:
    """How long after its time a record may still arrive (in both roles)."""
    return max(window.before, window.after) + window.grace


def held_for(window: JoinWindow) -> int:
    """How long after its time a record is held (tables/operators/self_join.py, held_window)."""
    return 2 * max(window.before, window.after) + window.grace


class SelfSequencer(Sequencer):
    """The windowed twin's pass, with one fate per record (its topic is the left input)."""

    def __init__(self, ref: JoinRef) -> None:
        super().__init__(ref)
        window, _ = window_of(ref.spec())
        self.close = dict.fromkeys(("left", "right"), closes_after(window))
        self.retention = held_for(window)


def sequencer(ref: JoinRef) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from SelfSequencer(ref)(batches)

    return run


def results_of(records: DataFrame, spec: JoinSpec, close_inputs: bool = False) -> DataFrame:
    """The pairs of accepted records (module docstring), as RAW_RESULTS."""
    from pyspark.sql import functions as F

    window, join_type = window_of(spec)
    accepted = records.filter(F.col("status") == ACCEPTED)
    left = _side(accepted, "left")
    right = _side(accepted.withColumn("side", F.lit("right")), "right")  # each record in both roles
    on = (
        (F.col("left_partition") == F.col("right_partition"))
        & (F.col("left_key") == F.col("right_key"))
        & (F.col("left_offset") != F.col("right_offset"))  # never a record with itself
        & F.col("right_ts").between(F.col("left_ts") - window.before, F.col("left_ts") + window.after)
    )
    joined = left.join(right, on, "left_outer" if join_type is JoinType.LEFT else "inner")
    columns: list[Column | str] = [
        F.col("left_partition").alias("partition"), F.col("left_key").alias("key"), "left", "right",
        F.coalesce(F.greatest("left_ts", "right_ts"), "left_ts").alias("ts"),
        "left_topic", "left_offset", "left_rid", "right_topic", "right_offset", "right_rid",
    ]  # fmt: skip
    results = joined.select(*columns)
    if join_type is not JoinType.LEFT:
        return results
    final_time = F.lit(END_OF_TIME) if close_inputs else F.max("ts")
    # A null-keyed record (accepted in a left self-join: KIP-962) is a result at once, with no
    # partner, and moves no stream time: the final stream time is over the keyed ones.
    keyed = accepted.filter(F.col("key").isNotNull())
    final = keyed.groupBy(F.col("partition").alias("p")).agg(final_time.alias("final_time"))
    return (
        results.join(F.broadcast(final), F.col("partition") == F.col("p"), "left")
        .filter(
            F.col("right").isNotNull()
            | F.col("key").isNull()
            | (F.col("final_time") > F.col("ts") + held_for(window))
        )
        .drop("p", "final_time")
    )


def twin(
    spark: SparkSession, ref: JoinRef, checked: DataFrame, partitions: int | None, close_inputs: bool = False
) -> KindTwin:
    """The twin of a self-join over its checked input records (pipeline/checks.py)."""
    from pyspark import StorageLevel

    ordered = in_arrival_order(spark, ref.spec(), checked, partitions)
    records = ordered.mapInArrow(sequencer(ref), RECORDS_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    return KindTwin(records, results_of(records, ref.spec(), close_inputs))


def late_prone(records: DataFrame, spec: JoinSpec) -> DataFrame:
    """As the windowed twin's `late_prone`, with the self-join's one bound for both roles."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window, _ = window_of(spec)
    valid = records.filter(F.col("status").isin(ACCEPTED, "late", "duplicate"))
    earlier = (
        Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    )
    return (
        valid.withColumn("read_before", F.max("ts").over(earlier))
        .filter((F.col("status") == ACCEPTED) & (F.col("ts") + closes_after(window) < F.col("read_before")))
        .select("topic", "partition", "offset")
    )
