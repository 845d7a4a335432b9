"""The batch twin of a global-table join (`join_global`): each stream record joined with the
table's value **at the end of the input**.

The stream joins a record with the value its worker's copy of the table holds when it joins
it (docs/join-semantics.md, "Global tables"): a moment the input does not record. The twin
takes the one moment it knows, the end: for each table key, its last record (the highest
offset in its partition; a key found on several partitions, the latest Kafka timestamp, then
the higher partition); a null value deletes the key. The twin gives the stream's results
exactly when the table did not change after the stream joined the records that look it up;
`reconcile` knows a result whose table value the table held at some other time as a global
lookup (`global_alternatives`: every value each lookup key ever had), not as a loss.

1. The stream's own checks (pipeline/checks.py): the stream's records as a worker checks
   them; the table's taken as they are (a worker's reader stores them unchecked).
2. Each accepted stream record's lookup key: `GlobalKind.key_of` of its value, the stream's
   own code (None: no key).
3. A left join of the stream records with the table's last values on that key; an inner join
   keeps the matched ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from pipeline.apps import JoinRef
from pipeline.checks import ACCEPTED
from pipeline.twins import KindTwin
from tables.operators.global_lookup import GlobalKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def kind_of(ref: JoinRef) -> GlobalKind:
    kind = ref.spec().kind
    assert isinstance(kind, GlobalKind), kind
    return kind


def lookup_keys(ref: JoinRef) -> Any:
    """A pandas UDF: each stream value's lookup key, computed by the stream's own code."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("binary")  # type: ignore[call-overload]
    def lookup(values: pd.Series) -> pd.Series:
        kind = kind_of(ref)  # in the Python worker: the app's module imported there
        return pd.Series(
            [None if v is None else kind.key_of(bytes(v)) for v in values.tolist()], dtype=object
        )

    return lookup


def table_at_end(checked: DataFrame) -> DataFrame:
    """The table's value of each key at the end of the input (deleted keys left out):
    `table_key`, `table_value`, `table_offset`, `table_partition`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    table = checked.filter((F.col("side") == "right") & F.col("key").isNotNull())
    last = Window.partitionBy("key").orderBy(
        F.col("timestamp").desc_nulls_last(), F.col("partition").desc(), F.col("offset").desc()
    )
    in_partition = Window.partitionBy("key", "partition")
    return (
        table.withColumn("_last_here", F.max("offset").over(in_partition))
        .filter(F.col("offset") == F.col("_last_here"))  # each partition's last record of the key
        .withColumn("_rank", F.row_number().over(last))
        .filter((F.col("_rank") == 1) & F.col("value").isNotNull())
        .select(
            F.col("key").alias("table_key"),
            F.col("value").alias("table_value"),
            F.col("offset").alias("table_offset"),
            F.col("partition").alias("table_partition"),
        )
    )


def stream_records(ref: JoinRef, checked: DataFrame) -> DataFrame:
    """The accepted stream records with their lookup key (`lookup`)."""
    from pyspark.sql import functions as F

    accepted = checked.filter((F.col("side") == "left") & (F.col("status") == ACCEPTED))
    return accepted.withColumn("lookup", lookup_keys(ref)(F.col("value")))


def twin(
    spark: SparkSession, ref: JoinRef, checked: DataFrame, partitions: int | None, close_inputs: bool = False
) -> KindTwin:
    """The twin of a global-table join over its checked input records (`close_inputs` changes
    nothing: no record is ever pending)."""
    from pyspark.sql import functions as F

    spec = ref.spec()
    kind = kind_of(ref)
    joined = stream_records(ref, checked).join(
        F.broadcast(table_at_end(checked)), F.col("lookup") == F.col("table_key"), "left"
    )
    if kind.how == "inner":
        joined = joined.filter(F.col("table_value").isNotNull())
    found = F.col("table_offset").isNotNull()
    results = joined.select(
        "partition", "key", F.col("value").alias("left"), F.col("table_value").alias("right"), "ts",
        F.col("topic").alias("left_topic"), F.col("offset").alias("left_offset"),
        F.col("rid").alias("left_rid"), F.when(found, F.lit(spec.right.name)).alias("right_topic"),
        F.col("table_offset").alias("right_offset"), F.lit(None).cast("binary").alias("right_rid"),
    )  # fmt: skip
    return KindTwin(checked, results, counters=())


def global_alternatives(ref: JoinRef, checked: DataFrame) -> DataFrame:
    """Every result the stream may have handed over for each accepted stream record, whatever
    moment it joined it at: with each value its lookup key ever had (and, for a left join, none):
    `partition`, `offset` (the stream record's), `ts`, `fingerprint` (hex). What reconcile
    accepts as a global lookup."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    from tables.operators.base import fingerprint

    kind = kind_of(ref)
    table = checked.filter((F.col("side") == "right") & F.col("key").isNotNull() & F.col("value").isNotNull())
    versions = table.select(F.col("key").alias("table_key"), F.col("value").alias("table_value")).distinct()
    stream = stream_records(ref, checked)
    joined = stream.join(versions, F.col("lookup") == F.col("table_key"), "inner")
    if kind.how == "left":
        joined = joined.unionByName(
            stream.withColumn("table_key", F.lit(None).cast("binary")).withColumn(
                "table_value", F.lit(None).cast("binary")
            )
        )

    @pandas_udf("string")  # type: ignore[call-overload]
    def prints(keys: pd.Series, lefts: pd.Series, rights: pd.Series, stamps: pd.Series) -> pd.Series:
        return pd.Series(
            [
                fingerprint(bytes(k), bytes(lv), None if r is None else bytes(r), int(t)).hex()
                for k, lv, r, t in zip(
                    keys.tolist(), lefts.tolist(), rights.tolist(), stamps.tolist(), strict=True
                )
            ],
            dtype=object,
        )

    return joined.select(
        "partition",
        "offset",
        "ts",
        prints(F.col("key"), F.col("value"), F.col("table_value"), F.col("ts")).alias("fingerprint"),
    )
