"""export: a declared join's input topics to Parquet, in the twin's input layout.

    python -m pipeline export --app examples.orders [--join paid] [--bootstrap HOST:PORT] --out DIR

Every record as Kafka holds it (topic, partition, offset, Kafka timestamp, raw key and value,
`seq` header), partitioned by topic, with `_tandem.json` (the join, its topics and their
partition count). `join --input DIR` and `reconcile --input DIR` read it as they read the
topics; `produce --input DIR` replays it, each record to the partition it was read from.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline.apps import app_bootstrap
from pipeline.inputs import export
from pipeline.join import add_spark_arguments, join_of
from pipeline.kafka import Connection, add_client_config_argument, connection_from


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline export",
        description="Write a declared join's input topics to Parquet (the twin's input layout).",
    )
    parser.add_argument(
        "--app", required=True, help="the app's module (MODULE or MODULE:ATTRIBUTE), as faust -A"
    )
    parser.add_argument("--join", help="the join's name (default: the module's only join)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the app's broker)")
    add_client_config_argument(parser)
    parser.add_argument("--out", type=Path, required=True, help="the Parquet directory to write")
    parser.add_argument(
        "--split", type=int, default=500_000, help="offsets per Spark input partition of a topic"
    )
    add_spark_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ref = join_of(args)
    spec = ref.spec()
    connection = connection_from(args) if args.bootstrap else Connection(app_bootstrap(spec))
    from pipeline.spark import progress, session

    began = time.monotonic()
    spark = session(args.master, "tandem-export", args.shuffle_partitions)
    with progress(spark, "export"):
        count = export(spark, spec, connection, str(args.out), args.split)
    print(f"export: {count:,} records of {', '.join(spec.topics)} to {args.out} in "
          f"{time.monotonic() - began:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
