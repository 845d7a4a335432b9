"""reconcile: judge what the stream produced for a declared join against its batch twin.

    python -m pipeline reconcile --app examples.orders [--join paid] [--bootstrap HOST:PORT | --input DIR]

The stream's handler output is the app's own, so the stream tells what it produced through the
join's audit topic (`join(..., audit=True)`: one record per result handed to the handler, with
its partition, time, fingerprint and writer; tables/runtime/output.py). The twin computes the
same fingerprints from the input (pipeline/twin.py). Reconcile compares the two multisets:

- matched: a result both produced (each copy the twin expects);
- missing (fails): the twin's, never handed to the stream's handler;
- late_by_stream_only: missing, but one of its records is late-prone: the stream may have read
  it after later records of its own input partition and dropped it as late (docs/pipeline.md);
- spurious (fails): handed to the handler, not a result of the twin;
- idle_only: handed to the handler by an idle partition's clock (the join's `idle` option: its
  audit record says `"idle": true`), not a result of the twin: the stream's time moved on with
  the wall clock past where the input's event time ever got (docs/join-semantics.md, "Idle
  partitions"). Not a failure; the report also counts every result released so (`idle`);
- redelivered (fails with `--strict-duplicates`): more copies than the twin's, written by two
  or more writers (worker processes or assignments): the at-least-once window of a crash or
  a rebalance;
- repeated (fails): more copies, all by one writer: never at least once (but for a join with a
  rekeyed input, where a source record read again is repartitioned again: redelivered);
- misplaced (fails): a copy handed over on another partition than the twin's.

It also compares the dead letters (the dead-letter topic against the twin's: missing,
spurious, another category; copies by redelivery), the stream's operator counters (its
changelog's last `late`, `duplicates`, and for a temporal join `late_updates`) with the
twin's (a difference fails the run with `--strict-counters`: records read again after a crash
are skipped as re-reads, so the counts agree unless the stream's state could not tell a
re-read record was done, or it read a late-prone record in another order), and counts the
input records on a partition their key does not belong to (dead-lettered by both, so their
joins are lost with no result missing: they fail the run unless `--allow-misplaced`;
docs/partitioners.md). Exit status 0 when nothing fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.apps import JoinRef, app_bootstrap
from pipeline.join import add_join_arguments, add_spark_arguments, join_of, source_of
from pipeline.kafka import Connection, KafkaReadError, connection_from, offsets, source_options
from pipeline.twin import TwinOutput, run_twin
from pipeline.twins import COUNTER_OF, UnknownKind, kind_module
from tables.operators.keys import decode_int, meta_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RESULT_CATEGORIES = (
    "matched", "missing", "late_by_stream_only", "spurious", "idle_only", "redelivered", "repeated",
    "misplaced",
)  # fmt: skip
# A global-table join's result the twin did not expect, but made of a value the lookup key had
# at another time than the input's end (docs/join-semantics.md, "Global tables"): tolerated.
GLOBAL_CHANGED = "global_table_changed"
LETTER_CATEGORIES = ("matched", "missing", "spurious", "other_category", "redelivered")
AUDIT_SCHEMA = "partition int, ts long, fingerprint string, writer string, idle boolean"
LETTER_SCHEMA = (
    "join string, topic string, partition int, offset long, reason string, category string, key string"
)


@dataclass
class Report:
    join: str
    results: dict[str, int]
    by_partition: list[dict[str, int]]
    examples: list[dict[str, Any]]
    letters: dict[str, int]
    letter_examples: list[dict[str, Any]]
    handler_errors: int
    counters: dict[str, dict[str, int]]  # "stream"/"twin" -> counter -> count
    misplaced_inputs: dict[str, int]  # topic -> records on a partition their key does not belong to
    twin_counts: dict[str, Any] = field(default_factory=dict)
    strict_duplicates: bool = False
    allow_misplaced: bool = False
    strict_counters: bool = False
    idle_results: int = 0  # audit records of results released by an idle partition's clock

    @property
    def counters_differ(self) -> dict[str, int]:
        """Counter -> the stream's count minus the twin's, where they differ (none without a
        changelog)."""
        twin, stream = self.counters.get("twin") or {}, self.counters.get("stream") or {}
        if not stream:
            return {}
        return {name: stream.get(name, 0) - n for name, n in twin.items() if stream.get(name, 0) != n}

    @property
    def failures(self) -> list[str]:
        found = [c for c in ("missing", "spurious", "repeated", "misplaced") if self.results.get(c)]
        if self.strict_duplicates and self.results.get("redelivered"):
            found.append("redelivered")
        found += [
            f"dead letters {c}" for c in ("missing", "spurious", "other_category") if self.letters.get(c)
        ]
        if not self.allow_misplaced and any(self.misplaced_inputs.values()):
            found.append("misplaced input records")
        if self.strict_counters and self.counters_differ:
            found.append("operator counters")
        return found

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def categories(self) -> tuple[str, ...]:
        """The result categories shown: a global-table join's has `global_table_changed` too."""
        return RESULT_CATEGORIES + ((GLOBAL_CHANGED,) if GLOBAL_CHANGED in self.results else ())

    def render(self) -> str:
        categories = self.categories
        lines = [f"reconcile: join {self.join!r}: the stream's audit against the batch twin", ""]
        lines.append("  results:      " + "  ".join(f"{c}={self.results.get(c, 0):,}" for c in categories))
        lines.append(f"    released by an idle partition's clock (the `idle` option): {self.idle_results:,}")
        lines += ["", f"  {'partition':>9} " + " ".join(f"{c[:12]:>12}" for c in categories)]
        for row in self.by_partition:
            lines.append(f"  {row['partition']:>9} " + " ".join(f"{row.get(c, 0):>12,}" for c in categories))
        if self.examples:
            lines += ["", "  examples (category, partition, key, fingerprint, inputs):"]
            lines += [
                f"    {e['category']:<20} {e['partition']!s:>3} {e['key']} {e['fingerprint'][:12]} "
                f"{e['inputs']}"
                for e in self.examples
            ]
        lines += [
            "",
            "  dead letters: " + "  ".join(f"{c}={self.letters.get(c, 0):,}" for c in LETTER_CATEGORIES),
        ]
        lines += [f"    handler errors (the stream's own): {self.handler_errors:,}"]
        lines += [
            f"    {e['category']:<15} {e['topic']} {e['partition']} {e['offset']} "
            f"twin={e['twin']} stream={e['stream']}"
            for e in self.letter_examples
        ]
        names = list(self.counters.get("twin") or {})
        lines += ["", "  operator counters   " + "".join(f"{name:>14}" for name in names)]
        for who in ("twin", "stream"):
            counts = self.counters.get(who)
            cells = "".join(f"{counts.get(n, 0):>14,}" for n in names) if counts else "  (no changelog)"
            lines.append(f"    {who:<17} " + cells)
        differ = self.counters_differ
        if differ:
            found = ", ".join(f"{name} {n:+,} in the stream" for name, n in differ.items())
            lines.append(f"    differ: {found}")
        elif self.counters.get("stream"):
            lines.append("    equal")
        misplaced = "  ".join(f"{t}={n:,}" for t, n in self.misplaced_inputs.items())
        lines += ["", f"  misplaced input records (dead-lettered by both: their joins are lost): {misplaced}"]
        verdict = "OK" if self.ok else "MISMATCH: " + ", ".join(self.failures)
        lines += ["", f"  verdict: {verdict}"]
        return "\n".join(lines)


def read_topic(spark: SparkSession, connection: Connection, topic: str) -> DataFrame:
    return (
        spark.read.format("tandem-topic").options(**source_options(connection)).option("topic", topic).load()
    )


def audit_records(spark: SparkSession, connection: Connection, topic: str) -> DataFrame:
    """The stream's audit: one row per result handed to its handler."""
    from pyspark.sql import functions as F

    raw = read_topic(spark, connection, topic)
    parsed = raw.select(
        F.col("partition").alias("written_to"),
        F.col("key"),
        F.from_json(F.col("value").cast("string"), AUDIT_SCHEMA).alias("a"),
    )
    return parsed.select("key", "written_to", "a.*")


def compare_results(
    twin: TwinOutput,
    audit: DataFrame,
    late_prone: DataFrame | None,
    examples: int,
    alternatives: DataFrame | None = None,
) -> tuple[dict[str, int], list[dict[str, int]], list[dict[str, Any]]]:
    """Totals by category, per partition, and examples (module docstring). `alternatives`: a
    global-table join's other possible results (pipeline/twins/global_lookup.py): a stream
    result among them is `global_table_changed`, and the twin's result of the same stream
    record is then not missing."""
    from pyspark.sql import functions as F

    categories = RESULT_CATEGORIES + ((GLOBAL_CHANGED,) if alternatives is not None else ())
    if "idle" not in audit.columns:  # audit records written before the `idle` option
        audit = audit.withColumn("idle", F.lit(None).cast("boolean"))

    inputs = F.concat_ws(
        " ",
        F.concat_ws(":", "left_topic", "left_offset"),
        F.concat_ws(":", "right_topic", "right_offset"),
    )
    expected = twin.results.select(
        "fingerprint", "partition", F.col("key").cast("string").alias("key"), inputs.alias("inputs")
    )
    if late_prone is not None:
        prone = late_prone.select(
            F.col("topic").alias("t"), F.col("partition").alias("p"), F.col("offset").alias("o")
        )
        flagged = (
            twin.results.join(
                prone,
                (
                    (F.col("left_topic") == F.col("t"))
                    & (F.col("left_offset") == F.col("o"))
                    & (F.col("partition") == F.col("p"))
                )
                | (
                    (F.col("right_topic") == F.col("t"))
                    & (F.col("right_offset") == F.col("o"))
                    & (F.col("partition") == F.col("p"))
                ),
                "left_semi",
            )
            .select("fingerprint")
            .distinct()
            .withColumn("prone", F.lit(True))
        )
    exp = expected.groupBy("fingerprint").agg(
        F.count("*").alias("expected"), F.min("partition").alias("e_partition"),
        F.first("key").alias("e_key"), F.first("inputs").alias("e_inputs"),
    )  # fmt: skip
    if late_prone is not None:
        exp = exp.join(flagged, "fingerprint", "left").fillna(False, ["prone"])
    else:
        exp = exp.withColumn("prone", F.lit(False))
    act = audit.groupBy("fingerprint").agg(
        F.count("*").alias("copies"),
        F.countDistinct("writer").alias("writers"),
        F.min("partition").alias("a_partition"),
        F.first(F.col("key").cast("string")).alias("a_key"),
        F.max(F.coalesce("idle", F.lit(False)).cast("int")).alias("idle"),
    )
    placed = (
        audit.select("fingerprint", F.col("partition").alias("p"))
        .join(expected.select("fingerprint", F.col("partition").alias("q")).distinct(), "fingerprint")
        .filter(F.col("p") != F.col("q"))
        .groupBy("fingerprint")
        .agg(F.count("*").alias("misplaced"))
    )
    # A rekeyed input's record read again after a crash is repartitioned again: a new record for
    # the join, whose results one writer may hand over again (docs/join-semantics.md, "Rekeying").
    # Its extra copies are redelivery, not a repeat.
    one_writer = F.col("writers") <= (0 if twin.ref.spec().repartitions else 1)
    changed, covered = _global_changes(twin, audit, expected, alternatives)
    copies, wanted = F.coalesce("copies", F.lit(0)), F.coalesce("expected", F.lit(0))
    extra = F.greatest(copies - wanted, F.lit(0))
    short = F.greatest(wanted - copies, F.lit(0))
    is_changed, is_covered = F.coalesce("changed", F.lit(False)), F.coalesce("covered", F.lit(False))
    joined = (
        exp.join(act, "fingerprint", "full_outer")
        .join(placed, "fingerprint", "left")
        .join(changed, "fingerprint", "left")
        .join(covered, "fingerprint", "left")
        .select(
            "fingerprint",
            F.coalesce("e_partition", "a_partition").alias("partition"),
            F.coalesce("e_key", "a_key").alias("key"),
            F.coalesce("e_inputs", F.lit("")).alias("inputs"),
            F.least(copies, wanted).alias("matched"),
            F.when(~F.coalesce("prone", F.lit(False)) & ~is_covered, short).otherwise(0).alias("missing"),
            F.when(F.coalesce("prone", F.lit(False)) & ~is_covered, short)
            .otherwise(0)
            .alias("late_by_stream_only"),
            F.when(F.col("expected").isNull() & (F.col("idle") == 0) & ~is_changed, copies)
            .otherwise(0)
            .alias("spurious"),
            F.when(F.col("expected").isNull() & (F.col("idle") == 1), copies).otherwise(0).alias("idle_only"),
            F.when(F.col("expected").isNotNull() & ~one_writer, extra).otherwise(0).alias("redelivered"),
            F.when(F.col("expected").isNotNull() & one_writer, extra).otherwise(0).alias("repeated"),
            F.coalesce("misplaced", F.lit(0)).alias("misplaced"),
            F.when(F.col("expected").isNull() & is_changed, copies).otherwise(0).alias(GLOBAL_CHANGED),
        )
        .cache()
    )
    sums = [F.sum(c).alias(c) for c in categories]
    rows = joined.groupBy("partition").agg(*sums).orderBy("partition").collect()
    by_partition = [{k: int(v or 0) for k, v in r.asDict().items()} for r in rows]
    totals = {c: sum(r[c] for r in by_partition) for c in categories}
    odd = joined.filter(sum((F.col(c) > 0).cast("int") for c in categories[1:]) > 0)  # type: ignore[arg-type]
    shown = []
    for r in odd.orderBy("partition", "key").limit(examples).collect():
        category = next(c for c in categories[1:] if r[c] > 0)
        shown.append({"category": category, "partition": r["partition"], "key": r["key"],
                      "fingerprint": r["fingerprint"], "inputs": r["inputs"]})  # fmt: skip
    joined.unpersist()
    return totals, by_partition, shown


def _global_changes(
    twin: TwinOutput, audit: DataFrame, expected: DataFrame, alternatives: DataFrame | None
) -> tuple[DataFrame, DataFrame]:
    """(fingerprint, changed): the stream's unexpected results that are a global lookup made at
    another moment; (fingerprint, covered): the twin's results of those stream records. Both
    empty without `alternatives`."""
    from pyspark.sql import functions as F

    spark = audit.sparkSession
    if alternatives is None:
        return (
            spark.createDataFrame([], "fingerprint string, changed boolean"),
            spark.createDataFrame([], "fingerprint string, covered boolean"),
        )
    unexpected = (
        audit.select("fingerprint")
        .distinct()
        .join(expected.select("fingerprint"), "fingerprint", "left_anti")
    )
    found = alternatives.select("fingerprint", F.col("partition").alias("g_p"), F.col("offset").alias("g_o"))
    made = found.join(unexpected, "fingerprint").cache()
    changed = made.select("fingerprint").distinct().withColumn("changed", F.lit(True))
    records = made.select("g_p", "g_o").distinct()
    covered = (
        twin.results.join(
            records,
            (F.col("partition") == F.col("g_p")) & (F.col("left_offset") == F.col("g_o")),
            "left_semi",
        )
        .select("fingerprint")
        .distinct()
        .withColumn("covered", F.lit(True))
    )
    return changed, covered


def compare_letters(
    twin: TwinOutput, stream: DataFrame, examples: int
) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    """Dead letters by where they were read (topic, partition, offset) and category."""
    from pyspark.sql import functions as F

    place = ["topic", "partition", "offset"]
    parsed = stream.select(F.from_json(F.col("value").cast("string"), LETTER_SCHEMA).alias("d")).select("d.*")
    handler_errors = parsed.filter(F.col("category") == "handler_error").count()
    theirs = (
        parsed.filter(F.col("category") != "handler_error")
        .groupBy(*place)
        .agg(F.count("*").alias("copies"), F.first("category").alias("stream"))
    )
    ours = twin.dead_letters.select(*place, F.col("category").alias("twin"))
    joined = ours.join(theirs, place, "full_outer").cache()
    status = (
        F.when(F.col("stream").isNull(), "missing")
        .when(F.col("twin").isNull(), "spurious")
        .when(F.col("twin") != F.col("stream"), "other_category")
        .otherwise("matched")
    )
    labelled = joined.withColumn("status", status)
    totals = {r["status"]: int(r["count"]) for r in labelled.groupBy("status").count().collect()}
    extra = labelled.agg(F.sum(F.greatest(F.coalesce("copies", F.lit(0)) - 1, F.lit(0))).alias("n")).first()
    totals["redelivered"] = int((extra or {"n": 0})["n"] or 0)
    odd = labelled.filter(F.col("status") != "matched").orderBy(*place).limit(examples).collect()
    fields = ("topic", "partition", "offset", "twin", "stream")
    shown = [{"category": r["status"], **{f: r[f] for f in fields}} for r in odd]
    joined.unpersist()
    return {c: totals.get(c, 0) for c in LETTER_CATEGORIES}, shown, handler_errors


def counter_names(twin: TwinOutput) -> list[str]:
    """The operator's counters of the twin's join kind (`late`, `duplicates`, ...)."""
    return [COUNTER_OF[status] for status in twin.counters]


def stream_counters(
    spark: SparkSession, connection: Connection, changelog: str, counters: list[str]
) -> dict[str, int]:
    """The operator's `counters` as the stream last wrote them to its changelog, summed over
    partitions (the last value of `m:<counter>` on each); empty if there is no changelog."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    try:
        offsets(connection, [changelog])
    except KafkaReadError:
        return {}
    names = {meta_key(name).decode(): name for name in counters}
    raw = read_topic(spark, connection, changelog).withColumn("name", F.col("key").cast("string"))
    last = Window.partitionBy("partition", "name").orderBy(F.col("offset").desc())
    rows = (
        raw.filter(F.col("name").isin(*names))
        .withColumn("n", F.row_number().over(last))
        .filter(F.col("n") == 1)
        .select("name", "value")
        .collect()
    )
    totals = dict.fromkeys(counters, 0)
    for row in rows:
        if row["value"]:
            totals[names[row["name"]]] += decode_int(bytes(row["value"]))
    return totals


def twin_counters(twin: TwinOutput) -> dict[str, int]:
    """The twin's records counted as the operator counts them (COUNTER_OF its statuses)."""
    found = {r["status"]: int(r["count"]) for r in twin.records.groupBy("status").count().collect()}
    return {COUNTER_OF[status]: found.get(status, 0) for status in twin.counters}


def misplaced_inputs(twin: TwinOutput) -> dict[str, int]:
    from pyspark.sql import functions as F

    spec = twin.ref.spec()
    rows = twin.dead_letters.filter(F.col("category") == "wrong_partition").groupBy("topic").count().collect()
    found = dict.fromkeys(spec.input_topics, 0)  # (a global table's records are never checked)
    found.update({r["topic"]: int(r["count"]) for r in rows})
    return found


def reconcile(
    spark: SparkSession,
    ref: JoinRef,
    twin: TwinOutput,
    connection: Connection,
    audit_topic: str | None = None,
    examples: int = 20,
) -> Report:
    """The report of the stream's output (audit, dead letters, changelog) against `twin`."""
    from pyspark.sql import functions as F

    spec = ref.spec()
    audit = audit_records(spark, connection, audit_topic or spec.audit_topic)
    module = kind_module(spec.kind.name)
    prone = module.late_prone(twin.records, spec) if hasattr(module, "late_prone") else None
    others = module.global_alternatives(ref, twin.checked) if spec.is_global else None
    results, by_partition, shown = compare_results(twin, audit, prone, examples, others)
    letters, letter_examples, handler_errors = compare_letters(
        twin, read_topic(spark, connection, spec.dead_letter_topic), examples
    )
    counters = {
        "twin": twin_counters(twin),
        "stream": stream_counters(spark, connection, spec.changelog_topic, counter_names(twin)),
    }
    report = Report(spec.name, results, by_partition, shown, letters, letter_examples, handler_errors,
                    counters, misplaced_inputs(twin))  # fmt: skip
    report.idle_results = audit.filter(F.coalesce("idle", F.lit(False))).count()
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline reconcile",
        description="Compare what the stream produced for a declared join (its audit topic, dead letters "
        "and counters) with the batch twin. Exit 0 if nothing is missing or spurious.",
    )
    add_join_arguments(parser)
    add_spark_arguments(parser)
    parser.add_argument("--audit-topic", help="the audit records to judge (default: the join's audit topic)")
    parser.add_argument("--examples", type=int, default=20, help="examples shown per table")
    parser.add_argument(
        "--strict-duplicates",
        action="store_true",
        help="fail on redelivered duplicates too (a run with no crash and no rebalance)",
    )
    parser.add_argument(
        "--allow-misplaced",
        action="store_true",
        help="input records on the wrong partition do not fail the run",
    )
    parser.add_argument(
        "--strict-counters",
        action="store_true",
        help="fail when the stream's operator counters (late, duplicates, ...) differ from the twin's",
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ref = join_of(args)
    spec = ref.spec()
    if not spec.audit and not args.audit_topic:
        raise SystemExit(
            f"reconcile: join {spec.name!r} writes no audit: declare it with audit=True (docs/pipeline.md)"
        )
    from pipeline.spark import progress, session

    began = time.monotonic()
    connection = connection_from(args) if args.bootstrap else Connection(app_bootstrap(spec))
    spark = session(args.master, "tandem-reconcile", args.shuffle_partitions)
    with progress(spark, "reconcile"):
        try:
            twin = run_twin(spark, ref, source_of(args))
        except UnknownKind as exc:
            raise SystemExit(f"reconcile: {exc}") from None
        report = reconcile(spark, ref, twin, connection, args.audit_topic, args.examples)
        report.twin_counts = twin.counts()
    report.strict_duplicates = args.strict_duplicates
    report.allow_misplaced = args.allow_misplaced
    report.strict_counters = args.strict_counters
    print(report.render())
    print(f"reconcile: done in {time.monotonic() - began:.1f} s", file=sys.stderr)
    if args.json:
        found = {**asdict(report), "ok": report.ok, "failures": report.failures,
                 "counters_differ": report.counters_differ}  # fmt: skip
        args.json.write_text(json.dumps(found, indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
