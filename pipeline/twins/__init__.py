"""The batch twin of each join kind: one module per `JoinKind.name`.

A kind's module has `twin(spark, ref, checked, partitions, close_inputs=False) -> KindTwin`:
from the input records as the stream's checks left them (pipeline/checks.py: dead letters,
null values, and the accepted records with their event time and id; the same for every kind,
as the worker's intake is) to every record's fate and the join's results as raw bytes with
their inputs' identities; pipeline/twin.py does the rest for every kind (typed columns,
fingerprints, dead letters, counts). `close_inputs`: the results once stream time has moved
past every record at the end of the input (`advance` to the end of time, as the test driver's
`close_inputs()`), instead of what the stream has emitted by the input's final stream time.
It may also have `late_prone(records, spec)`: the accepted records the stream may have read
late (reconcile's `late_by_stream_only`).

What every kind shares is here: the arrival order of a partition's records (`in_arrival_order`,
docs/pipeline.md), the statuses and the counters they are counted in.

A new kind's twin is a module here and a line in `KINDS`; nothing else changes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from tables.records.codecs import MAX_TS_MS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from tables.spec import JoinSpec

# `close_inputs`: stream time moves here at the end of the input (JoinTestDriver.close_inputs).
END_OF_TIME = MAX_TS_MS
# JoinKind.name -> the module of its twin.
KINDS = {
    "windowed": "pipeline.twins.windowed",
    "temporal": "pipeline.twins.temporal",
    "self": "pipeline.twins.self_join",
    "global": "pipeline.twins.global_lookup",
}

# Every record's fate (`status` of KindTwin.records): before the join (pipeline/checks.py) and in it.
STATUSES = ("accepted", "late", "duplicate", "late_update", "null_value", "dead_letter")
# A status the operator counts -> the counter it is counted in (`Operator.counters()`, the
# changelog's `m:<counter>`).
COUNTER_OF = {"late": "late", "duplicate": "duplicates", "late_update": "late_updates"}
# The raw results' columns (`KindTwin.results`): the partition, the join key and both values as
# read (null: no partner), the result's time, and each side's input identity.
RAW_RESULTS = (
    "partition int, key binary, left binary, right binary, ts long, "
    "left_topic string, left_offset long, left_rid binary, "
    "right_topic string, right_offset long, right_rid binary"
)


@dataclass
class KindTwin:
    """What a kind's twin computes."""

    records: DataFrame  # the input layout + side, status, category, reason, ts, rid (+ the kind's own)
    results: DataFrame  # RAW_RESULTS
    # Counted per partition from `records` (status values), as the stream's operator counts them
    # (each in its counter COUNTER_OF[status]).
    counters: tuple[str, ...] = field(default=("late", "duplicate"))
    # What the twin persisted beyond `records` and `results` (freed with them).
    cached: tuple[DataFrame, ...] = ()


class UnknownKind(LookupError):
    """No twin for this join kind yet."""


def kind_module(name: str) -> ModuleType:
    """The twin module of the join kind `name`."""
    try:
        return importlib.import_module(KINDS[name])
    except KeyError:
        raise UnknownKind(
            f"no batch twin for joins of kind {name!r} yet (twins exist for: {', '.join(KINDS)})"
        ) from None


def arrival_order(spec: JoinSpec) -> list[Column]:
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


def in_arrival_order(
    spark: SparkSession, spec: JoinSpec, checked: DataFrame, partitions: int | None
) -> DataFrame:
    """Each partition's checked records on one Spark partition (by range: one partition each
    where they are few), sorted in arrival order: what a kind's ordered pass reads."""
    count = max(1, min(partitions or spark.sparkContext.defaultParallelism, 1024))
    return checked.repartitionByRange(count, "partition").sortWithinPartitions(*arrival_order(spec))
