"""reconcile: judge what the stream join wrote against the reference join.

Every output record is identified by its `join_id` (docs/join-semantics.md). A
`join_id` the reference expects is *matched* when the stream wrote it with the
same fields, *different* when the fields disagree, *missing* when the stream
never wrote it; one the reference does not expect is *extra*; each copy beyond
the first is a *duplicate*. The report breaks these down by partition and shows
example keys; the exit status is 0 only when nothing is missing, extra or
different, and (unless --allow-duplicates, for at-least-once runs) nothing is
duplicated.

When the reference is computed from the input topics, input records found on a
partition their key does not belong to (under `--partitioner`) are *misplaced*,
their own category: the stream dead-letters them and the reference skips them, so
their joins are lost without a single missing result. They fail the run too (their
producer partitions keys differently, docs/partitioners.md) unless --allow-misplaced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.join import (
    RESULT_COLUMNS,
    JoinOutput,
    add_window_arguments,
    load_parquet,
    load_topics,
    params_of,
    reference_join,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COMPARED = [c for c in RESULT_COLUMNS if c not in ("join_id", "partition")]
OUTPUT_SCHEMA = (
    "join_id string, auction_id string, campaign_id string, impression_id string, "
    "click_id string, impression_ts long, click_ts long, ts long, kind string"
)
STATUSES = ["matched", "different", "missing", "extra", "duplicates"]


@dataclass
class MisplacedInputs:
    """Input records found on a partition their key does not belong to."""

    partitioner: str
    by_topic: dict[str, int]  # input topic -> misplaced records
    by_partition: list[dict[str, Any]]  # topic, partition (read from), belongs_to, records
    examples: list[dict[str, Any]]  # topic, partition, belongs_to, key

    @property
    def total(self) -> int:
        return sum(self.by_topic.values())


@dataclass
class Report:
    totals: dict[str, int]
    by_partition: list[dict[str, int]]
    examples: list[dict[str, Any]]
    allow_duplicates: bool = False
    unreadable: int = 0
    notes: list[str] = field(default_factory=list)
    misplaced: MisplacedInputs | None = None  # None: the input was not read (--expected)
    allow_misplaced: bool = False

    @property
    def ok(self) -> bool:
        bad = ["different", "missing", "extra"] + ([] if self.allow_duplicates else ["duplicates"])
        lost = 0 if self.allow_misplaced or self.misplaced is None else self.misplaced.total
        return self.unreadable == 0 and lost == 0 and all(self.totals.get(s, 0) == 0 for s in bad)

    def render(self) -> str:
        lines = ["reconcile: stream output against the reference join", ""]
        lines.append("  " + "  ".join(f"{s}={self.totals.get(s, 0):,}" for s in STATUSES))
        if self.unreadable:
            lines.append(f"  unreadable output records: {self.unreadable:,}")
        lines += ["", f"  {'partition':>9} " + " ".join(f"{s:>10}" for s in STATUSES)]
        for row in self.by_partition:
            cells = " ".join(f"{row.get(s, 0):>10,}" for s in STATUSES)
            lines.append(f"  {row['partition']:>9} {cells}")
        if self.examples:
            lines += ["", "  examples (status, partition, auction_id, join_id, copies):"]
            lines += [
                f"    {e['status']:<10} {e['partition']!s:>3} {e['auction_id']} {e['join_id']} x{e['copies']}"
                for e in self.examples
            ]
        lines += self._render_misplaced()
        lines += ["", f"  verdict: {'OK' if self.ok else 'MISMATCH'}", *self.notes]
        return "\n".join(lines)

    def _render_misplaced(self) -> list[str]:
        found = self.misplaced
        if found is None:
            return ["", "  misplaced input records: not checked (no input read: --expected)"]
        counts = "  ".join(f"{topic}={n:,}" for topic, n in found.by_topic.items())
        lines = ["", f"  misplaced input records (key on another partition under {found.partitioner}): "
                 f"{counts}"]  # fmt: skip
        if not found.total:
            return lines
        lines += [
            "  their joins are lost: the stream dead-letters them, the reference skips them.",
            "  Likely cause: their producer partitions keys differently (docs/partitioners.md).",
            f"  {'topic':>20} {'partition':>9} {'belongs to':>10} {'records':>9}",
        ]
        lines += [
            f"  {r['topic']:>20} {r['partition']:>9} {r['belongs_to']:>10} {r['records']:>9,}"
            for r in found.by_partition
        ]
        lines += ["  examples (topic, partition, belongs to, key):"]
        lines += [f"    {e['topic']} {e['partition']} {e['belongs_to']} {e['key']!r}" for e in found.examples]
        return lines


def read_output_topic(spark: SparkSession, bootstrap: str, topic: str) -> tuple[DataFrame, int]:
    """The stream's output records (and how many values were not readable JSON)."""
    from pyspark.sql import functions as F

    raw = spark.read.format("tandem-topic").option("bootstrap", bootstrap).option("topic", topic).load()
    parsed = raw.select("partition", F.from_json(F.col("value").cast("string"), OUTPUT_SCHEMA).alias("r"))
    readable = parsed.filter(F.col("r.join_id").isNotNull())
    unreadable = parsed.filter(F.col("r.join_id").isNull()).count()
    return readable.select("r.*", "partition"), unreadable


def compare(expected: DataFrame, actual: DataFrame, examples: int = 20) -> Report:
    """Classify every join_id of either side; counts by partition and example keys."""
    from pyspark.sql import functions as F

    exp = expected.select(
        "join_id", F.col("partition").alias("e_partition"),
        *[F.col(c).alias(f"e_{c}") for c in COMPARED],
    )  # fmt: skip
    act = actual.groupBy("join_id").agg(
        F.count("*").alias("copies"), F.min("partition").alias("a_partition"),
        *[F.first(c, ignorenulls=False).alias(f"a_{c}") for c in COMPARED],
    )  # fmt: skip
    same = F.lit(True)
    for c in COMPARED:
        same = same & F.col(f"e_{c}").eqNullSafe(F.col(f"a_{c}"))
    status = (
        F.when(F.col("copies").isNull(), "missing")
        .when(F.col("e_partition").isNull() & F.col("e_kind").isNull(), "extra")
        .when(same, "matched")
        .otherwise("different")
    )
    joined = (
        exp.join(act, "join_id", "full_outer")
        .withColumn("status", status)
        .withColumn("partition", F.coalesce("e_partition", "a_partition"))
        .withColumn("auction_id", F.coalesce("e_auction_id", "a_auction_id"))
        .withColumn("dups", F.greatest(F.coalesce(F.col("copies"), F.lit(1)) - 1, F.lit(0)))
        .select("join_id", "partition", "auction_id", "status", "copies", "dups")
        .cache()
    )
    sums = [F.sum((F.col("status") == s).cast("int")).alias(s) for s in STATUSES[:4]]
    per_partition = (
        joined.groupBy("partition")
        .agg(*sums, F.sum("dups").alias("duplicates"))
        .orderBy("partition")
        .collect()
    )
    by_partition = [{k: int(v or 0) for k, v in r.asDict().items()} for r in per_partition]
    totals = {s: sum(r[s] for r in by_partition) for s in STATUSES}
    odd = joined.filter((F.col("status") != "matched") | (F.col("dups") > 0))
    found = odd.orderBy("partition", "auction_id", "join_id").limit(examples).collect()
    shown = [
        {
            **r.asDict(),
            "status": r["status"] if r["status"] != "matched" else "duplicate",
            "copies": int(r["copies"] or 0),
        }
        for r in found
    ]
    joined.unpersist()
    return Report(totals, by_partition, shown)


def misplaced_inputs(
    output: JoinOutput, topics: dict[str, str], partitioner: str, examples: int = 20
) -> MisplacedInputs:
    """The reference's misplaced input records, by topic (`topics`: side -> topic name)."""
    from pyspark.sql import functions as F

    topic = F.when(F.col("side") == "left", topics["left"]).otherwise(topics["right"])
    found = output.misplaced.withColumn("topic", topic)
    rows = (
        found.groupBy("topic", "partition", "belongs_to")
        .agg(F.count("*").alias("records"))
        .orderBy("topic", "partition", "belongs_to")
        .collect()
    )
    by_partition = [r.asDict() for r in rows]
    by_topic = dict.fromkeys(topics.values(), 0)
    for row in by_partition:
        by_topic[row["topic"]] += row["records"]
    shown = found.orderBy("topic", "partition", "seq").limit(examples).collect()
    sample = [
        {"topic": r["topic"], "partition": r["partition"], "belongs_to": r["belongs_to"],
         "key": bytes(r["key"]).decode("utf-8", errors="replace")}
        for r in shown
    ]  # fmt: skip
    return MisplacedInputs(partitioner, by_topic, by_partition, sample)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline reconcile",
        description="Compare the stream join's output topic with the reference join: matched, "
        "missing, extra, different and duplicated records by partition. Exit 0 if they agree.",
    )
    actual = parser.add_mutually_exclusive_group(required=True)
    actual.add_argument("--output-topic", help="the stream's output topic (needs --bootstrap)")
    actual.add_argument("--actual", type=Path, help="the stream's output as Parquet")
    expected = parser.add_mutually_exclusive_group()
    expected.add_argument("--expected", type=Path, help="reference results (join --out)")
    expected.add_argument("--input", type=Path, help="input Parquet from `generate`")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (topics input/output)")
    parser.add_argument("--impressions-topic", default="impressions")
    parser.add_argument("--clicks-topic", default="clicks")
    add_window_arguments(parser)
    parser.add_argument("--examples", type=int, default=20, help="example keys shown")
    parser.add_argument(
        "--allow-duplicates",
        action="store_true",
        help="duplicates do not fail the run (at-least-once delivery)",
    )
    parser.add_argument(
        "--allow-misplaced",
        action="store_true",
        help="input records on the wrong partition do not fail the run",
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    return parser


def _expected(spark: SparkSession, args: argparse.Namespace) -> tuple[DataFrame, MisplacedInputs | None]:
    """The reference results, and the misplaced input records when the input was read."""
    if args.expected:
        return spark.read.parquet(str(args.expected)), None
    if args.input:
        records = load_parquet(spark, str(args.input))
        topics = {"left": "impressions", "right": "clicks"}
    elif args.bootstrap:
        records = load_topics(spark, args.bootstrap, args.impressions_topic, args.clicks_topic)
        topics = {"left": args.impressions_topic, "right": args.clicks_topic}
    else:
        raise SystemExit("reconcile: give --expected, --input or --bootstrap for the reference")
    output = reference_join(records, params_of(args))
    return output.results, misplaced_inputs(output, topics, args.partitioner, args.examples)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.output_topic and not args.bootstrap:
        raise SystemExit("reconcile: --output-topic needs --bootstrap")
    from pipeline.spark import progress, session

    began = time.monotonic()
    spark = session(args.master, "tandem-reconcile", args.shuffle_partitions)
    with progress(spark, "reconcile"):
        unreadable = 0
        if args.output_topic:
            actual, unreadable = read_output_topic(spark, args.bootstrap, args.output_topic)
        else:
            actual = spark.read.parquet(str(args.actual))
        expected, misplaced = _expected(spark, args)
        report = compare(expected, actual, args.examples)
    report.unreadable = unreadable
    report.allow_duplicates = args.allow_duplicates
    report.misplaced = misplaced
    report.allow_misplaced = args.allow_misplaced
    print(report.render())
    print(f"reconcile: done in {time.monotonic() - began:.1f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
