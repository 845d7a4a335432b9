"""A join's input records as the batch twin reads them: from the join's topics (the
`tandem-topic` source) or from Parquet (written by `python -m pipeline export`, or by anyone
in the same layout).

The layout (`RAW_SCHEMA`), one row per input record as Kafka holds it: `topic`, `partition`,
`offset`, `timestamp` (the Kafka timestamp, ms), `key` and `value` (the raw bytes; null for a
null key or value) and `seq` (the producer's `seq` header: the record's place in the merged
arrival order of both inputs on its partition, docs/pipeline.md; null without one).

Parquet may leave out `partition` (placed by the join's partitioner, as `produce` would),
`offset` (numbered per topic partition in `seq`, else file, order), `timestamp` and `seq`; it
may name the input by `side` ("left"/"right") instead of `topic`. `_tandem.json` next to the
files gives the topics' partition count (`export` writes it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from pipeline.kafka import Connection, offsets, source_options
from tables.records.partitioners import partitions_for
from tables.spec import JoinSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RAW_SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary, seq long"
RAW_COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "value", "seq"]
META_FILE = "_tandem.json"


@dataclass(frozen=True)
class Topics:
    """Read the join's input topics from a Kafka cluster (the app's own broker by default)."""

    bootstrap: str | None = None
    client_config: str | None = None  # a client properties file (secured clusters)
    split: int = 500_000  # offsets per Spark input partition


@dataclass(frozen=True)
class Parquet:
    """Read Parquet in the input layout (`export`'s output, or any with the same columns)."""

    path: str
    partitions: int | None = None  # the topics' partition count, if not in _tandem.json


Source = Topics | Parquet


def source_of(text: str, partitions: int | None = None) -> Source:
    """A source from the command line: a directory of Parquet, else bootstrap servers."""
    if Path(text).exists():
        return Parquet(text, partitions)
    return Topics(text)


def read_names(spec: JoinSpec) -> tuple[str, ...]:
    """The topics the twin reads: a rekeyed input's source topic (rekeyed by pipeline/rekey.py
    as the stream does), else the input itself (a global-table join's table too, which the
    stream reads apart from its group's inputs)."""
    sources = {r.side: r.source.name for r in spec.repartitions}
    left, right = sources.get("left", spec.left.name), sources.get("right", spec.right.name)
    return (left,) if left == right else (left, right)  # a self-join's topic is read once


def join_partitions(connection: Connection, spec: JoinSpec) -> int:
    """The join's partition count on the cluster: its inputs' (co-partitioned), a rekeyed one's
    repartition topic left out (it may not exist yet); both rekeyed, the larger source's, as
    the stream makes them (tables/runtime/startup.py)."""
    rekeyed = {r.name for r in spec.repartitions}
    kept = [t for t in spec.input_topics if t not in rekeyed]
    if kept:
        return topic_partitions(connection, kept)
    bounds = offsets(connection, list(read_names(spec)))
    return max(sum(1 for tp in bounds if tp.rsplit(":", 1)[0] == t) for t in read_names(spec))


def declared_partitions(spec: JoinSpec) -> int:
    """The inputs' partition count as declared (the topics' own, else the app's default)."""
    declared = [t.partitions for t in (spec.left.topic, spec.right.topic) if t.partitions]
    return int(declared[0] if declared else spec.app.conf.topic_partitions)


def topic_partitions(connection: Connection, topics: list[str]) -> int:
    """The inputs' partition count on the cluster; they must be co-partitioned."""
    bounds = offsets(connection, topics)
    counts = {t: sum(1 for tp in bounds if tp.rsplit(":", 1)[0] == t) for t in topics}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the join's inputs are not co-partitioned: {counts}")
    return next(iter(counts.values()))


def read_topics(spark: SparkSession, spec: JoinSpec, connection: Connection, split: int) -> DataFrame:
    """Both inputs through the `tandem-topic` source, in the input layout."""
    return (
        spark.read.format("tandem-topic")
        .options(**source_options(connection))
        .option("topic", ",".join(read_names(spec)))
        .option("splitSize", str(split))
        .load()
        .select(*RAW_COLUMNS)
    )


def read_meta(path: str) -> dict[str, Any]:
    meta = Path(path) / META_FILE
    return json.loads(meta.read_text()) if meta.exists() else {}


def read_parquet(spark: SparkSession, spec: JoinSpec, path: str, partitions: int) -> DataFrame:
    """Parquet in the input layout; missing optional columns filled in (module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(path)
    names = read_names(spec)
    left, right = names[0], names[-1]  # a self-join's one topic is both
    if "topic" not in df.columns:
        if "side" not in df.columns:
            raise SystemExit(f"{path}: no `topic` or `side` column")
        df = df.withColumn(
            "topic", F.when(F.col("side") == "left", left).when(F.col("side") == "right", right)
        )
    found = {r["topic"] for r in df.select("topic").distinct().collect()}
    if not found & {left, right}:
        raise SystemExit(
            f"{path} holds topics {sorted(found, key=str)}, none of the join's ({left}, {right})"
        )
    df = df.filter(F.col("topic").isin(left, right))
    for name, kind in (("timestamp", "long"), ("seq", "long")):
        if name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast(kind))
    if "partition" not in df.columns:
        df = df.withColumn("partition", _placed(spec, partitions)(F.col("key")))
    if "offset" not in df.columns:
        order = Window.partitionBy("topic", "partition").orderBy(F.col("seq").asc_nulls_last(), F.col("_row"))
        df = (
            df.withColumn("_row", F.monotonically_increasing_id())
            .withColumn("offset", F.row_number().over(order) - 1)
            .drop("_row")
        )
    return df.select(
        "topic",
        F.col("partition").cast("int"),
        F.col("offset").cast("long"),
        F.col("timestamp").cast("long"),
        F.col("key").cast("binary"),
        F.col("value").cast("binary"),
        F.col("seq").cast("long"),
    )


def _placed(spec: JoinSpec, partitions: int) -> Any:
    """A pandas UDF: each key's partition under the join's partitioner (murmur2 for "none"),
    as `produce` places records without a partition."""
    from pyspark.sql.functions import pandas_udf

    partitioner = "murmur2" if spec.partitioner == "none" else spec.partitioner

    @pandas_udf("int")  # type: ignore[call-overload]
    def placed(keys: pd.Series) -> pd.Series:
        found = [0] * len(keys)  # a null key goes anywhere: partition 0
        given = [(i, key) for i, key in enumerate(keys.tolist()) if key is not None]
        if given:
            where = partitions_for([bytes(key) for _, key in given], partitions, partitioner).tolist()
            for (i, _), partition in zip(given, where, strict=True):
                found[i] = partition
        return pd.Series(found, dtype="int32")

    return placed


def export(spark: SparkSession, spec: JoinSpec, connection: Connection, out: str, split: int) -> int:
    """Write the join's input topics to Parquet (input layout, `_tandem.json`); the count."""
    partitions = join_partitions(connection, spec)
    raw = read_topics(spark, spec, connection, split)
    raw.write.mode("overwrite").partitionBy("topic").parquet(out)
    counts = {r["topic"]: int(r["count"]) for r in spark.read.parquet(out).groupBy("topic").count().collect()}
    meta = {"join": spec.name, "topics": list(read_names(spec)), "partitions": partitions, "counts": counts}
    (Path(out) / META_FILE).write_text(json.dumps(meta, indent=2))
    return sum(counts.values())
