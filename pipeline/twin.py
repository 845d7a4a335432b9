"""The batch twin of any declared join: what the stream computes, on Spark.

    from pipeline import join_frame, Topics
    results = join_frame(spark, "examples.orders", "paid", Topics("127.0.0.1:9092"))

The twin reads the join's declaration from the app's module (pipeline/apps.py) and its input
from the topics or from Parquet (pipeline/inputs.py); the join kind's own twin
(pipeline/twins/, by `spec.kind.name`) decides each record's fate and the results; this module
makes what every kind shares: the typed results, the dead letters and the counts.

Results (`TwinOutput.results`), one row per result, as the handler would get it:

- `key`, `left`, `right`: the join key and both values, decoded with their declared types
  (pipeline/types.py; a `faust.Record` is a struct); null where there is no partner;
- `ts`, `partition`: the result's time (ms) and partition;
- `left_topic`, `left_offset`, `left_id`: the left input record's identity: its topic and
  offset (its partition is the result's) and its declared `id` (null when the id is the offset);
- `right_topic`, `right_offset`, `right_id`: the same for the right record;
- `fingerprint`: the result's audit fingerprint (hex; `tables.operators.base.fingerprint` of
  the raw bytes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.apps import JoinRef, app_bootstrap
from pipeline.checks import checked
from pipeline.inputs import (
    Parquet,
    Source,
    Topics,
    declared_partitions,
    join_partitions,
    read_meta,
    read_parquet,
    read_topics,
)
from pipeline.kafka import Connection
from pipeline.rekey import rekeyed
from pipeline.twins import COUNTER_OF, STATUSES, KindTwin, kind_module
from pipeline.types import key_typed, value_typed
from tables.operators.base import fingerprint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

DEAD_LETTER_COLUMNS = ["topic", "partition", "offset", "key", "value", "category", "reason"]


@dataclass
class TwinOutput:
    """The twin of one join over one input."""

    ref: JoinRef
    partitions: int | None  # the inputs' partition count (the partition check), None if unknown
    checked: DataFrame  # every input record as the stream's checks left it (pipeline/checks.py)
    records: DataFrame  # every input record with its fate (`status`), the kind's columns
    raw_results: DataFrame  # pipeline.twins.RAW_RESULTS
    results: DataFrame  # typed (module docstring)
    counters: tuple[str, ...]  # statuses the stream's operator counts
    cached: tuple[DataFrame, ...] = ()  # what the kind's twin persisted besides

    def unpersist(self) -> None:
        """Free what the twin keeps for its several uses (its records and raw results)."""
        self.checked.unpersist()
        self.records.unpersist()
        self.raw_results.unpersist()
        for frame in self.cached:
            frame.unpersist()

    @property
    def dead_letters(self) -> DataFrame:
        """The records the stream sends to the dead-letter topic: where they were read, the
        raw key and value, the category and the reason."""
        from pyspark.sql import functions as F

        return self.records.filter(F.col("status") == "dead_letter").select(*DEAD_LETTER_COLUMNS)

    def counts(self) -> dict[str, Any]:
        """Input records by fate and side, dead letters by category, results by shape, and the
        operator's counters (by their names in `Operator.counters()`), in all and by partition
        (one Spark job each)."""
        from pyspark.sql import functions as F

        fates = self.records.groupBy("status", "side", "category", "partition").count().collect()
        by_fate: dict[str, dict[str, int]] = {s: {"left": 0, "right": 0} for s in STATUSES}
        categories: dict[str, int] = {}
        per_partition: dict[int, dict[str, int]] = {}
        for row in fates:
            by_fate[row["status"]][row["side"]] += row["count"]
            if row["category"]:
                categories[row["category"]] = categories.get(row["category"], 0) + row["count"]
            if row["status"] in self.counters:
                names = [COUNTER_OF[status] for status in self.counters]
                mine = per_partition.setdefault(row["partition"], dict.fromkeys(names, 0))
                mine[COUNTER_OF[row["status"]]] += row["count"]
        shape = (
            F.when(F.col("left").isNull(), "right_only")
            .when(F.col("right").isNull(), "left_only")
            .otherwise("matched")
        )
        shapes = {
            r["shape"]: r["count"] for r in self.raw_results.groupBy(shape.alias("shape")).count().collect()
        }
        return {
            "input": {s: sides for s, sides in by_fate.items()},
            "dead_letters": dict(sorted(categories.items())),
            "results": {k: shapes.get(k, 0) for k in ("matched", "left_only", "right_only")},
            "operator": {
                c: sum(p[c] for p in per_partition.values()) for c in (COUNTER_OF[s] for s in self.counters)
            },
            "operator_by_partition": dict(sorted(per_partition.items())),
        }


def raw_input(spark: SparkSession, ref: JoinRef, source: Source) -> tuple[DataFrame, int | None]:
    """The input records (pipeline/inputs.py's layout) and the inputs' partition count."""
    spec = ref.spec()
    if isinstance(source, Topics):
        connection = Connection(source.bootstrap or app_bootstrap(spec), source.client_config)
        partitions = join_partitions(connection, spec)
        return read_topics(spark, spec, connection, source.split), partitions
    if isinstance(source, Parquet):
        partitions = (
            source.partitions or read_meta(source.path).get("partitions") or declared_partitions(spec)
        )
        return read_parquet(spark, spec, source.path, int(partitions)), int(partitions)
    raise TypeError(f"a source is pipeline.Topics(...) or pipeline.Parquet(...), not {source!r}")


def run_twin(
    spark: SparkSession,
    ref: JoinRef,
    source: Source | DataFrame,
    partitions: int | None = None,
    close_inputs: bool = False,
) -> TwinOutput:
    """The twin of the join `ref` over `source` (topics, Parquet, or a DataFrame already in
    the input layout, with `partitions` the topics' partition count): what the stream has
    emitted by each partition's final stream time, or with `close_inputs` what it emits once
    stream time moves past every record (the test driver's `close_inputs()`: a backfill of a
    bounded input that wants every result, the last grace or window too)."""
    if isinstance(source, Topics | Parquet):
        raw, partitions = raw_input(spark, ref, source)
    else:
        raw = source
    from pyspark import StorageLevel

    spec = ref.spec()
    module = kind_module(spec.kind.name)  # before any work: an unknown kind says so at once
    if spec.repartitions:  # a rekeyed input: its source records as its repartition topic holds them
        raw = rekeyed(raw, ref, partitions or declared_partitions(spec))
    # The checks run Python over every record: once (the kind's ordering samples them too).
    checks = checked(raw, ref, partitions).persist(StorageLevel.MEMORY_AND_DISK)
    kind: KindTwin = module.twin(spark, ref, checks, partitions, close_inputs=close_inputs)
    raw_results = kind.results.persist(StorageLevel.MEMORY_AND_DISK)  # typed results and counts read it
    results = raw_results.mapInArrow(Finisher.run(ref), result_schema(ref))
    return TwinOutput(ref, partitions, checks, kind.records, raw_results, results, kind.counters, kind.cached)


def join_frame(
    spark: SparkSession, app: str, join: str | None, source: Source | DataFrame, close_inputs: bool = False
) -> DataFrame:
    """The results of the join `join` declared in the module `app` (its only join if None),
    over `source`, as a DataFrame (columns: the module docstring): what the stream's handler
    would be handed, for a backfill written in Spark (`close_inputs`: run_twin).

        results = join_frame(spark, "examples.orders", "paid", Topics("127.0.0.1:9092"))
        results = join_frame(spark, "examples.orders", None, Parquet("orders-export/"))
    """
    return run_twin(spark, JoinRef.of(app, join), source, close_inputs=close_inputs).results


# -- the typed results ------------------------------------------------------------------------


def result_schema(ref: JoinRef) -> StructType:
    from pyspark.sql import types as T

    spec, codecs = ref.spec(), ref.codecs()
    key = key_typed(codecs["left"], spec.left.topic.key_type)
    left = value_typed(codecs["left"], spec.left.topic.value_type)
    right = value_typed(codecs["right"], spec.right.topic.value_type)
    fields = [
        T.StructField("key", key.spark_type),
        T.StructField("left", left.spark_type),
        T.StructField("right", right.spark_type),
        T.StructField("ts", T.LongType()),
        T.StructField("partition", T.IntegerType()),
    ]
    for side in ("left", "right"):
        fields += [
            T.StructField(f"{side}_topic", T.StringType()),
            T.StructField(f"{side}_offset", T.LongType()),
            T.StructField(f"{side}_id", T.StringType()),
        ]
    return T.StructType([*fields, T.StructField("fingerprint", T.StringType())])


class Finisher:
    """Raw results to typed ones, with their fingerprints (in a Spark Python worker)."""

    def __init__(self, ref: JoinRef) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        spec, codecs = ref.spec(), ref.codecs()
        self.key = key_typed(codecs["left"], spec.left.topic.key_type).convert
        self.values = {
            "left": value_typed(codecs["left"], spec.left.topic.value_type).convert,
            "right": value_typed(codecs["right"], spec.right.topic.value_type).convert,
        }
        self.declared_id = {"left": spec.left.id is not None, "right": spec.right.id is not None}
        self.schema = to_arrow_schema(result_schema(ref))

    @staticmethod
    def run(ref: JoinRef) -> Any:
        def finish(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            finisher = Finisher(ref)
            for batch in batches:
                yield finisher.batch(batch)

        return finish

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        raw = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        keys, lefts, rights, stamps = raw["key"], raw["left"], raw["right"], raw["ts"]
        columns: dict[str, list[Any]] = {
            "key": [None if k is None else self.key(k) for k in keys],
            "left": [None if v is None else self.values["left"](v) for v in lefts],
            "right": [None if v is None else self.values["right"](v) for v in rights],
            "ts": stamps,
            "partition": raw["partition"],
        }
        for side in ("left", "right"):
            columns[f"{side}_topic"] = raw[f"{side}_topic"]
            columns[f"{side}_offset"] = raw[f"{side}_offset"]
            declared = self.declared_id[side]
            columns[f"{side}_id"] = [
                None if rid is None or not declared else rid.decode("utf-8", "replace")
                for rid in raw[f"{side}_rid"]
            ]
        columns["fingerprint"] = [
            fingerprint(k, left, right, ts).hex()
            for k, left, right, ts in zip(keys, lefts, rights, stamps, strict=True)
        ]
        arrays = [pa.array(columns[f.name], type=f.type) for f in self.schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
