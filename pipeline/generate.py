"""generate: the reference app's synthetic traffic (impressions and clicks) written to Parquet,
in the twin's input layout (pipeline/inputs.py): `python -m pipeline join --app app --input
OUT` joins it on Spark, `python -m pipeline produce --app app --input OUT` sends it to the
app's topics with its seq headers.

Each auction has one impression; a share `ctr` also gets a click, some seconds
later. Records arrive in an order of their own: a little jitter for all, more
for an out-of-order share, far more for a late share (past the join's grace),
plus duplicate deliveries and malformed records. The output is what the two
topics would hold: per record its Kafka `partition` (murmur2 of the key, as the
Java client and aiokafka choose it: `tables.records.partitioners`), the raw `key` and
`value` bytes, and `seq`, the record's place in the merged arrival order of both
topics on that partition.
`seq` lets the batch twin reproduce stream time and lateness exactly.

Layout: OUT/topic=impressions/*.parquet, OUT/topic=clicks/*.parquet (the reference app's
topic names without a prefix), OUT/_tandem.json (the partition count, the configuration and
the counts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.inputs import META_FILE
from tables.records.partitioners import partitions_for

CHUNK_SCHEMA = "topic string, partition int, arrival_ms long, tiebreak double, key binary, value binary"
MALFORMED = (
    b"not json",
    b'{"event_id": "broken", "auction_id": ',
    b'{"event_id": "no-ts", "auction_id": "x", "campaign_id": "c"}',
    b'{"event_id": "str-ts", "auction_id": "x", "campaign_id": "c", "ts": "soon"}',
    b"[1, 2, 3]",
)


def _now_hour_ms() -> int:
    return int(time.time() // 3600 * 3600 * 1000)


@dataclass(frozen=True)
class TrafficConfig:
    impressions: int = 100_000
    partitions: int = 4
    ctr: float = 0.1
    click_delay_ms: float = 60_000.0  # mean of an exponential delay
    rate_per_s: float = 1000.0  # auctions per second of event time
    jitter_ms: int = 200  # every record arrives up to this late
    out_of_order: float = 0.02  # share arriving up to `disorder_ms` late (within grace)
    disorder_ms: int = 30_000
    late: float = 0.005  # share arriving `late_ms` or more late (past window + grace)
    late_ms: int = 900_000
    duplicates: float = 0.01  # share delivered twice
    malformed: float = 0.002  # extra records that fail validation
    start_ms: int = field(default_factory=_now_hour_ms)
    seed: int = 7
    chunk_size: int = 250_000

    def chunks(self) -> int:
        return max(1, -(-self.impressions // self.chunk_size))


def _arrival(cfg: TrafficConfig, rng: np.random.Generator, ts: np.ndarray) -> np.ndarray:
    n = len(ts)
    delay = rng.integers(0, cfg.jitter_ms + 1, n)
    kind = rng.random(n)
    disordered = kind < cfg.out_of_order
    late = (kind >= cfg.out_of_order) & (kind < cfg.out_of_order + cfg.late)
    delay[disordered] += rng.integers(0, cfg.disorder_ms + 1, int(disordered.sum()))
    delay[late] += cfg.late_ms + rng.integers(0, 60_001, int(late.sum()))
    return ts + delay


def _side_frame(
    topic: str, keys: list[bytes], values: list[bytes], arrival: np.ndarray, rng: np.random.Generator
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "topic": topic,
            "key": keys,
            "value": values,
            "arrival_ms": arrival.astype(np.int64),
            "tiebreak": rng.random(len(keys)),
        }
    )


def _with_duplicates(cfg: TrafficConfig, frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    copies = frame[rng.random(len(frame)) < cfg.duplicates].copy()
    copies["arrival_ms"] += rng.integers(1, 5_001, len(copies))
    copies["tiebreak"] = rng.random(len(copies))
    return pd.concat([frame, copies], ignore_index=True)


def _malformed(
    cfg: TrafficConfig, keys: list[bytes], ts: np.ndarray, rng: np.random.Generator
) -> pd.DataFrame:
    picked = np.flatnonzero(rng.random(len(keys)) < cfg.malformed)
    topics = rng.choice(["impressions", "clicks"], len(picked))
    values = [MALFORMED[i % len(MALFORMED)] for i in range(len(picked))]
    frame = _side_frame("", [keys[i] for i in picked], values, ts[picked], rng)
    frame["topic"] = topics
    return frame


def generate_chunk(cfg: TrafficConfig, chunk: int) -> pd.DataFrame:
    """The records of auctions [chunk * chunk_size, ...), deterministic in (seed, chunk)."""
    rng = np.random.default_rng([cfg.seed, chunk])
    lo = chunk * cfg.chunk_size
    ids = np.arange(lo, min(cfg.impressions, lo + cfg.chunk_size))
    ts = cfg.start_ms + (ids * (1000.0 / cfg.rate_per_s)).astype(np.int64)
    auctions = [f"auc-{i:012d}" for i in ids]
    keys = [a.encode() for a in auctions]
    campaigns = rng.integers(0, 1000, len(ids))
    imp_values = [
        f'{{"event_id":"imp-{i:012d}","auction_id":"{a}","campaign_id":"camp-{c}","ts":{t}}}'.encode()
        for i, a, c, t in zip(ids, auctions, campaigns, ts, strict=True)
    ]
    impressions = _side_frame("impressions", keys, imp_values, _arrival(cfg, rng, ts), rng)
    clicked = np.flatnonzero(rng.random(len(ids)) < cfg.ctr)
    click_ts = ts[clicked] + rng.exponential(cfg.click_delay_ms, len(clicked)).astype(np.int64)
    click_values = [
        f'{{"event_id":"clk-{ids[j]:012d}","auction_id":"{auctions[j]}","ts":{t}}}'.encode()
        for j, t in zip(clicked, click_ts, strict=True)
    ]
    clicks = _side_frame(
        "clicks", [keys[j] for j in clicked], click_values, _arrival(cfg, rng, click_ts), rng
    )
    frame = pd.concat(
        [
            _with_duplicates(cfg, impressions, rng),
            _with_duplicates(cfg, clicks, rng),
            _malformed(cfg, keys, ts, rng),
        ],
        ignore_index=True,
    )
    frame["partition"] = partitions_for(frame["key"].tolist(), cfg.partitions, "murmur2")
    return frame[["topic", "partition", "arrival_ms", "tiebreak", "key", "value"]]


def generate(spark: object, cfg: TrafficConfig, out: Path) -> dict[str, int]:
    """Write the traffic to `out` as Parquet with per-partition `seq`; counts by topic."""
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)

    def chunks(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            for chunk in batch["id"]:
                yield generate_chunk(cfg, int(chunk))

    n = cfg.chunks()
    raw = spark.range(0, n, numPartitions=min(n, spark.sparkContext.defaultParallelism * 4))
    records = raw.mapInPandas(chunks, CHUNK_SCHEMA)
    arrival = Window.partitionBy("partition").orderBy("arrival_ms", "tiebreak")
    ordered = records.withColumn("seq", F.row_number().over(arrival) - 1).drop("tiebreak")
    (
        ordered.repartition("topic", "partition")
        .sortWithinPartitions("partition", "seq")
        .write.mode("overwrite")
        .partitionBy("topic")
        .parquet(str(out))
    )
    counts = {
        r["topic"]: int(r["count"]) for r in spark.read.parquet(str(out)).groupBy("topic").count().collect()
    }
    meta = {"partitions": cfg.partitions, "config": asdict(cfg), "counts": counts}
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline generate",
        description="The reference app's synthetic impressions and clicks (with disorder, late records, "
        "duplicates and malformed records) written to Parquet, with a per-partition arrival sequence.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    defaults = TrafficConfig()
    for name, value in asdict(defaults).items():
        if name == "start_ms":
            parser.add_argument(
                "--start-ms",
                type=int,
                default=None,
                help="event time of the first auction (default: this hour)",
            )
            continue
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=type(value), default=value, help=f"(default {value})"
        )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    values = {k: getattr(args, k) for k in asdict(TrafficConfig()) if k != "start_ms"}
    cfg = TrafficConfig(**values, **({"start_ms": args.start_ms} if args.start_ms else {}))
    from pipeline.spark import progress, session

    began = time.monotonic()
    print(f"generate: {cfg.impressions:,} auctions in {cfg.chunks()} chunks -> {args.out}", flush=True)
    spark = session(args.master, "tandem-generate")
    with progress(spark, "generate"):
        counts = generate(spark, cfg, args.out)
    print(f"generate: wrote {counts} in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
