"""join: the reference join (the batch twin of `tables/`) as a Spark job.

Same window, grace, inner/left/outer semantics and bad-record rules as the
stream (docs/join-semantics.md), computed in bulk instead of record by record
(`pipeline.semantics` is the record-by-record statement it is tested against):

0. a record whose key belongs to another partition than the one it was read from
   (under `params.partitioner`; `tables.records.partitioners.find_misplaced`, the stream's
   check) is *misplaced*: skipped before anything else, reported on its own;
1. decode every record with `tables.records.validate`; skip the rejected ones;
2. stream time before each record = the running max of `ts` over the records
   before it in the partition's arrival order (`seq`);
3. drop late records (`close < stream time before`, close = ts + after|before +
   grace) and then repeated `event_id`s (first arrival wins);
4. every pair (l, r) of accepted records of the same key inside the window joins
   (the stream keeps a record until no accepted record could match it);
5. left/outer: a record x is emitted unmatched when the partition's final stream
   time passed ts + before + after + grace (after which no accepted partner can
   arrive) and it has no accepted partner in its window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from pipeline.generate import META_FILE
from pipeline.kafka import offsets
from pipeline.records import Rejected, validate
from pipeline.semantics import JoinParams
from tables.records.partitioners import PARTITIONERS, Partitioner, find_misplaced, misplaced_reason

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

INPUT_COLUMNS = ["partition", "seq", "side", "key", "value"]
# Optional input column: the partition count of the record's topic. Where it is given,
# records on the wrong partition for their key are found (`belongs_to`, `misplaced`).
PARTITIONS = "partitions"
DECODED_SCHEMA = (
    "partition int, seq long, side string, event_id string, auction_id string, "
    "campaign_id string, ts long, reason string, belongs_to int, key binary"
)
RESULT_COLUMNS = [
    "join_id", "auction_id", "campaign_id", "impression_id", "click_id",
    "impression_ts", "click_ts", "ts", "kind", "partition",
]  # fmt: skip


def misplaced_rows(batch: pd.DataFrame, partitioner: Partitioner) -> dict[int, int]:
    """Row position -> the partition its key belongs to, for the misplaced rows of `batch`
    (the stream's check, fetch by fetch: one call per partition of each topic)."""
    if partitioner == "none" or PARTITIONS not in batch.columns:
        return {}
    keys = batch["key"].to_numpy()
    found: dict[int, int] = {}
    groups = batch.groupby(["partition", PARTITIONS], sort=False).indices  # null counts: unchecked
    for (partition, partitions), rows in groups.items():
        for m in find_misplaced(list(keys[rows]), int(partition), int(partitions), partitioner):
            found[int(rows[m.index])] = m.expected
    return found


def decode_batches(
    batches: Iterator[pd.DataFrame], now_ms: int | None, partitioner: Partitioner = "none"
) -> Iterator[pd.DataFrame]:
    """Validate raw records with the one shared function; keep the reason for rejects.

    Misplaced records (see `misplaced_rows`) are not decoded: their reason names both
    partitions, `belongs_to` is where their key belongs, `key` is kept to report them.
    """
    for batch in batches:
        misplaced = misplaced_rows(batch, partitioner)
        rows = []
        columns = zip(batch["partition"], batch["side"], batch["key"], batch["value"], strict=True)
        for i, (partition, side, key, value) in enumerate(columns):
            if i in misplaced:
                reason = misplaced_reason(int(partition), misplaced[i], partitioner)
                rows.append((None, None, None, None, reason, misplaced[i], key))
                continue
            found = validate(side, key, value, now_ms)
            if isinstance(found, Rejected):
                rows.append((None, None, None, None, found.reason, None, None))
            else:
                rows.append(
                    (
                        found["event_id"],
                        found["auction_id"],
                        found.get("campaign_id"),
                        found["ts"],
                        None,
                        None,
                        None,
                    )
                )
        decoded = pd.DataFrame(
            rows,
            columns=["event_id", "auction_id", "campaign_id", "ts", "reason", "belongs_to", "key"],
        )
        decoded["ts"] = decoded["ts"].astype("Int64")
        decoded["belongs_to"] = decoded["belongs_to"].astype("Int32")
        yield pd.concat([batch[["partition", "seq", "side"]].reset_index(drop=True), decoded], axis=1)


def load_parquet(spark: SparkSession, path: str) -> DataFrame:
    """Generator output (or any Parquet with topic, partition, seq, key, value).

    The generator's partition count (its `_tandem.json`), when there, goes in `partitions`.
    """
    from pyspark.sql import functions as F

    df = spark.read.parquet(path)
    side = F.when(F.col("topic") == "impressions", "left").when(F.col("topic") == "clicks", "right")
    df = df.withColumn("side", side)
    meta = Path(path) / META_FILE
    if not meta.exists():
        return df.select(*INPUT_COLUMNS)
    partitions = int(json.loads(meta.read_text())["config"]["partitions"])
    return df.select(*INPUT_COLUMNS, F.lit(partitions).alias(PARTITIONS))


def load_topics(
    spark: SparkSession, bootstrap: str, impressions: str, clicks: str, split: int = 500_000
) -> DataFrame:
    """Both input topics through the `tandem-topic` source, with a merged arrival order
    and each topic's partition count (`partitions`).

    The order within a partition is the `seq` header when the producer wrote one
    (`pipeline produce`), else the record timestamp, impressions before clicks on a
    tie, then the offset.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counts = partition_counts(bootstrap, [impressions, clicks])

    raw = (
        spark.read.format("tandem-topic")
        .option("bootstrap", bootstrap)
        .option("topic", f"{impressions},{clicks}")
        .option("splitSize", str(split))
        .load()
    )
    side = F.when(F.col("topic") == impressions, "left").otherwise("right")
    order = Window.partitionBy("partition").orderBy(
        F.col("seq").asc_nulls_first(), "timestamp", "side", "offset"
    )
    partitions = F.when(F.col("topic") == impressions, counts[impressions]).otherwise(counts[clicks])
    return (
        raw.withColumn("side", side)
        .withColumn("seq", F.row_number().over(order) - 1)
        .select(*INPUT_COLUMNS, partitions.alias(PARTITIONS))
    )


def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """How many partitions each topic has (from the cluster's metadata)."""
    bounds = offsets(bootstrap, topics)
    return {t: sum(1 for name in bounds if name.rsplit(":", 1)[0] == t) for t in topics}


@dataclass
class JoinOutput:
    results: DataFrame
    accepted: DataFrame  # decoded records that are neither late nor duplicates
    decoded: DataFrame  # every valid or misplaced record, with `late`, `duplicate`, `misplaced`
    misplaced: DataFrame  # records on the wrong partition: side, partition, belongs_to, key, reason


def _close(params: JoinParams) -> Column:
    from pyspark.sql import functions as F

    window = F.when(F.col("side") == "left", params.after).otherwise(params.before)
    return F.col("ts") + window + params.grace


def classify(records: DataFrame, params: JoinParams) -> DataFrame:
    """Decode, then mark each valid record late or duplicate as the stream would.

    Misplaced records stay in (flag `misplaced`, no `ts`: they move no stream time),
    so that one pass of Python finds them and decodes the rest.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    decoded = records.mapInPandas(
        lambda batches: decode_batches(batches, params.now_ms, params.partitioner), DECODED_SCHEMA
    )
    misplaced = F.col("belongs_to").isNotNull()
    valid = decoded.filter(F.col("reason").isNull() | misplaced).withColumn("misplaced", misplaced)
    before = Window.partitionBy("partition").orderBy("seq").rowsBetween(Window.unboundedPreceding, -1)
    first = Window.partitionBy("partition", "side", "event_id").orderBy("seq")
    with_time = (
        valid.withColumn("st_before", F.max("ts").over(before))
        .withColumn("st_after", F.greatest("st_before", "ts"))
        .withColumn("close", _close(params))
        .withColumn("emit", F.col("ts") + params.before + params.after + params.grace)
        .withColumn("late", F.coalesce(F.col("close") < F.col("st_before"), F.lit(False)))
    )
    on_time = F.when(~F.col("late"), F.col("seq"))
    return with_time.withColumn(
        "duplicate",
        ~F.col("late")
        & ~F.col("misplaced")
        & (
            F.min(on_time).over(first.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
            < F.col("seq")
        ),
    )


def _pairs(accepted: DataFrame, params: JoinParams) -> DataFrame:
    from pyspark.sql import functions as F

    def side(name: str, prefix: str) -> DataFrame:
        cols = ["partition", "auction_id", "event_id", "campaign_id", "ts", "emit", "st_after"]
        chosen = accepted.filter(F.col("side") == name).select(*cols)
        return chosen.select("partition", "auction_id", *[F.col(c).alias(f"{prefix}{c}") for c in cols[2:]])

    left, right = side("left", "l_"), side("right", "r_")
    in_window = F.col("r_ts").between(F.col("l_ts") - params.before, F.col("l_ts") + params.after)
    return (
        left.join(right, ["partition", "auction_id"])
        .filter(in_window)
        # Did the partner arrive before this side's unmatched result was due? (It always
        # does: an accepted partner arrives before ts + before + after + grace.)
        .withColumn("l_in_time", F.col("r_st_after") <= F.col("l_emit"))
        .withColumn("r_in_time", F.col("l_st_after") <= F.col("r_emit"))
    )


def _unmatched(accepted: DataFrame, pairs: DataFrame, final_time: DataFrame, side: str) -> DataFrame:
    from pyspark.sql import functions as F

    prefix = "l_" if side == "left" else "r_"
    matched = (
        pairs.filter(F.col(f"{prefix}in_time"))
        .select("partition", F.col(f"{prefix}event_id").alias("event_id"))
        .distinct()
    )
    mine = accepted.filter(F.col("side") == side)
    return (
        mine.join(matched, ["partition", "event_id"], "left_anti")
        .join(F.broadcast(final_time), "partition")
        .filter(F.col("final_time") > F.col("emit"))
    )


def _as_results(df: DataFrame, kind: str) -> DataFrame:
    from pyspark.sql import functions as F

    null = F.lit(None)
    if kind == "inner":
        cols = {
            "auction_id": F.col("auction_id"), "campaign_id": F.col("l_campaign_id"),
            "impression_id": F.col("l_event_id"), "click_id": F.col("r_event_id"),
            "impression_ts": F.col("l_ts"), "click_ts": F.col("r_ts"),
            "ts": F.greatest("l_ts", "r_ts"),
        }  # fmt: skip
    else:
        is_left = kind == "left"
        cols = {
            "auction_id": F.col("auction_id"),
            "campaign_id": F.col("campaign_id") if is_left else null,
            "impression_id": F.col("event_id") if is_left else null,
            "click_id": null if is_left else F.col("event_id"),
            "impression_ts": F.col("ts") if is_left else null,
            "click_ts": null if is_left else F.col("ts"),
            "ts": F.col("ts"),
        }
    join_id = F.concat(
        F.coalesce(cols["impression_id"].cast("string"), F.lit("")),
        F.lit("|"),
        F.coalesce(cols["click_id"].cast("string"), F.lit("")),
    )
    typed = {
        "campaign_id": "string", "impression_id": "string", "click_id": "string",
        "impression_ts": "long", "click_ts": "long", "ts": "long",
    }  # fmt: skip
    selected = [join_id.alias("join_id")] + [
        c.cast(typed[name]).alias(name) if name in typed else c.alias(name) for name, c in cols.items()
    ]
    return df.select(*selected, F.lit(kind).alias("kind"), F.col("partition").cast("int"))


def reference_join(records: DataFrame, params: JoinParams) -> JoinOutput:
    """The join's results over (partition, seq, side, key, value) records."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Decoding runs Python over every record: do it once, not once per branch below.
    decoded = classify(records, params).persist(StorageLevel.MEMORY_AND_DISK)
    accepted = decoded.filter(~F.col("late") & ~F.col("duplicate") & ~F.col("misplaced"))
    misplaced = decoded.filter(F.col("misplaced")).select(
        "side", "partition", "seq", "belongs_to", "key", "reason"
    )
    pairs = _pairs(accepted, params)
    results = _as_results(pairs, "inner")
    if params.kind in ("left", "outer"):
        final_time = accepted.groupBy("partition").agg(F.max("ts").alias("final_time"))
        sides = ["left"] if params.kind == "left" else ["left", "right"]
        for side in sides:
            unmatched = _unmatched(accepted, pairs, final_time, side)
            results = results.unionByName(_as_results(unmatched, side))
    return JoinOutput(results.select(*RESULT_COLUMNS), accepted, decoded, misplaced)


def input_frame(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    if args.input:
        return load_parquet(spark, str(args.input))
    return load_topics(spark, args.bootstrap, args.impressions_topic, args.clicks_topic)


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """Join parameters and the Spark master, shared with `reconcile`."""
    parser.add_argument("--kind", choices=["inner", "left", "outer"], default="inner")
    parser.add_argument("--before", type=int, default=0, help="ms (default 0)")
    parser.add_argument("--after", type=int, default=600_000, help="ms (default 600000)")
    parser.add_argument("--grace", type=int, default=60_000, help="ms (default 60000)")
    parser.add_argument(
        "--now-ms",
        type=int,
        default=None,
        help="wall clock for the timestamp checks (default: none, a backfill)",
    )
    parser.add_argument(
        "--partitioner",
        choices=PARTITIONERS,
        default="murmur2",
        help="how the inputs' producers partition keys (default murmur2, Kafka's; "
        "crc32: librdkafka's consistent); records on another partition are "
        "misplaced, never joined; none: no check",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="spark.sql.shuffle.partitions (default: Spark's, 200); a few "
        "per core is faster for small inputs",
    )


def params_of(args: argparse.Namespace) -> JoinParams:
    return JoinParams(args.before, args.after, args.grace, args.kind, args.now_ms, args.partitioner)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline join",
        description="The reference (batch) join over Parquet or topics, same semantics as "
        "tables/ (docs/join-semantics.md).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", type=Path, help="Parquet directory from `generate`")
    source.add_argument("--bootstrap", help="read the input topics from this Kafka cluster")
    parser.add_argument("--impressions-topic", default="impressions")
    parser.add_argument("--clicks-topic", default="clicks")
    add_window_arguments(parser)
    parser.add_argument("--out", type=Path, help="write the results here as Parquet")
    return parser


def summarize(output: JoinOutput) -> dict[str, int]:
    """Counts of results by kind and of skipped input records, in one pass each."""
    from pyspark.sql import functions as F

    counts = {
        f"results_{r['kind']}": int(r["count"]) for r in output.results.groupBy("kind").count().collect()
    }
    skipped = output.decoded.agg(
        F.sum((~F.col("misplaced")).cast("int")).alias("valid"),
        F.sum(F.col("late").cast("int")).alias("late"),
        F.sum(F.col("duplicate").cast("int")).alias("duplicate"),
        F.sum(F.col("misplaced").cast("int")).alias("misplaced"),
    ).first()
    assert skipped is not None
    counts.update({k: int(skipped[k] or 0) for k in ("valid", "late", "duplicate", "misplaced")})
    return counts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipeline.spark import progress, session

    began = time.monotonic()
    spark = session(args.master, "tandem-join", args.shuffle_partitions)
    output = reference_join(input_frame(spark, args), params_of(args))
    print(f"join: {args.kind} join of {args.input or args.bootstrap}", flush=True)
    with progress(spark, "join"):
        if args.out:
            output.results.write.mode("overwrite").parquet(str(args.out))
            print(f"join: results written to {args.out}", flush=True)
        counts = summarize(output)
    for name, value in sorted(counts.items()):
        print(f"  {name:<16} {value:>12,}")
    print(f"join: done in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
