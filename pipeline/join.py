"""join: the batch twin of a declared join, as a Spark job.

    python -m pipeline join --app examples.orders [--join paid] [--bootstrap HOST:PORT | --input DIR]
                            [--out DIR] [--dead-letters DIR] [--json FILE] [--close-inputs]

Everything comes from the declaration in the app's module (imported, no worker started); the
input from the join's topics (the app's broker by default, or `--bootstrap`, with
`--client-config` for a secured cluster) or from Parquet (`python -m pipeline export`).
Prints the declaration as read, the counts (input records by fate and side, dead letters by
category, results, the operator's counters), and writes the results as Parquet with `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.apps import AppNotFound, JoinRef, describe
from pipeline.inputs import Parquet, Source, Topics
from pipeline.kafka import add_client_config_argument, connection_from
from pipeline.twin import TwinOutput, run_twin
from pipeline.twins import UnknownKind


def add_join_arguments(parser: argparse.ArgumentParser) -> None:
    """The join and its input, shared with `reconcile` and `export`."""
    parser.add_argument(
        "--app", required=True, help="the app's module (MODULE or MODULE:ATTRIBUTE), as faust -A"
    )
    parser.add_argument("--join", help="the join's name (default: the module's only join)")
    parser.add_argument("--bootstrap", help="read the input topics here (default: the app's broker)")
    add_client_config_argument(parser)
    parser.add_argument("--input", type=Path, help="read the input from Parquet (`export`) instead")
    parser.add_argument(
        "--partitions", type=int, help="the topics' partition count, for --input without _tandem.json"
    )
    parser.add_argument(
        "--split", type=int, default=500_000, help="offsets per Spark input partition of a topic"
    )


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="spark.sql.shuffle.partitions (default: Spark's, 200); a few per core suit small inputs",
    )


def join_of(args: argparse.Namespace) -> JoinRef:
    try:
        return JoinRef.of(args.app, args.join)
    except AppNotFound as exc:
        raise SystemExit(f"{exc}") from None


def source_of(args: argparse.Namespace) -> Source:
    if args.input:
        return Parquet(str(args.input), args.partitions)
    connection = connection_from(args) if args.bootstrap else None
    return Topics(
        connection.bootstrap if connection else None,
        connection.client_config if connection else None,
        args.split,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline join",
        description="The batch twin of a declared join (same results, dead letters and counts as the "
        "stream: docs/pipeline.md) over its topics or an export.",
    )
    add_join_arguments(parser)
    add_spark_arguments(parser)
    parser.add_argument("--out", type=Path, help="write the results here as Parquet")
    parser.add_argument("--dead-letters", type=Path, help="write the dead letters here as Parquet")
    parser.add_argument("--json", type=Path, help="write the counts here as JSON")
    parser.add_argument(
        "--close-inputs",
        action="store_true",
        help="the input is all there is: also emit what the stream would once its stream time passed "
        "every record (the last grace or window), as the test driver's close_inputs()",
    )
    return parser


def render_counts(counts: dict[str, Any]) -> list[str]:
    lines = ["  input records by fate:          left        right"]
    for status, sides in counts["input"].items():
        lines.append(f"    {status:<24} {sides['left']:>10,} {sides['right']:>12,}")
    lines.append(
        "  dead letters by category: "
        + (", ".join(f"{c}={n:,}" for c, n in counts["dead_letters"].items()) or "none")
    )
    lines.append("  results: " + ", ".join(f"{k}={n:,}" for k, n in counts["results"].items()))
    lines.append("  operator counters: " + ", ".join(f"{k}={n:,}" for k, n in counts["operator"].items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ref = join_of(args)
    from pipeline.spark import progress, session

    began = time.monotonic()
    spark = session(args.master, "tandem-join", args.shuffle_partitions)
    print(f"join: {json.dumps(describe(ref.spec()))}", flush=True)
    try:
        output: TwinOutput = run_twin(spark, ref, source_of(args), close_inputs=args.close_inputs)
    except UnknownKind as exc:
        raise SystemExit(f"join: {exc}") from None
    with progress(spark, "join"):
        if args.out:
            output.results.write.mode("overwrite").parquet(str(args.out))
            print(f"join: results written to {args.out}", flush=True)
        if args.dead_letters:
            output.dead_letters.write.mode("overwrite").parquet(str(args.dead_letters))
            print(f"join: dead letters written to {args.dead_letters}", flush=True)
        counts = output.counts()
    print("\n".join(render_counts(counts)))
    if args.json:
        args.json.write_text(json.dumps(counts, indent=2, default=str))
    print(f"join: done in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
