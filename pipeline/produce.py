"""produce: write a recorded or made-up input to a join's input topics, for any declared join.

    python -m pipeline produce --app examples.orders [--join paid] --input FILE|DIR [--bootstrap HOST:PORT]

The input is Parquet in the twin's input layout (pipeline/inputs.py: `topic` or `side`, `key`
and `value` as bytes, and optionally `partition`, `timestamp`, `seq`; `export` writes it) or
JSON lines (`.jsonl`), one record a line:

    {"side": "left", "key": 42, "value": {"order_id": 42, ...}, "timestamp": 1700000000000}
    {"side": "right", "key": 42, "value_raw": "{not json", "seq": 7}
    {"topic": "payments", "key": 42, "value": null, "partition": 3}

`key` and `value` are serialized with the side's declared types and serializers (Faust's own
registry: a Record as JSON, an int key as the app declares it); `key_raw` / `value_raw` are
sent as UTF-8 bytes as they are (bad records); null is a null key or value.

Each record goes to its `partition` if given, else to its key's under the join's partitioner
(`--left-partitioner` / `--right-partitioner` override it, to try the stream's handling of
misplaced records; null keys go to partition 0). Records are sent in `seq` order (file
order without one), each with its `seq` header: its place in the merged arrival order of both
inputs on its partition (given, or numbered in file order), from which the twin rebuilds
the order the stream saw (docs/pipeline.md). Topics missing are created with the join's
partition count; existing ones must have it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
from aiokafka.admin import NewTopic

from assignor import clients
from pipeline.apps import AppNotFound, JoinRef, app_bootstrap
from pipeline.inputs import declared_partitions, read_meta
from pipeline.kafka import Connection, add_client_config_argument, connection_from, connection_of
from tables.records.partitioners import PARTITIONERS, Partitioner, partitions_for
from tables.spec import JoinSpec

Record = dict[str, Any]  # topic, key, value (bytes or None), and maybe partition, timestamp, seq


def _encoder(spec: JoinSpec, side: str) -> tuple[Any, Any]:
    """The side's key and value serializers, as the app declares them."""
    app, topic = spec.app, getattr(spec, side).topic
    key_serializer = topic.key_serializer or app.conf.key_serializer
    value_serializer = topic.value_serializer or app.conf.value_serializer

    def key(value: Any) -> bytes | None:
        return (
            None
            if value is None
            else app.serializers.dumps_key(topic.key_type, value, serializer=key_serializer)
        )

    def value(found: Any) -> bytes | None:
        if found is None:
            return None
        return app.serializers.dumps_value(topic.value_type, found, serializer=value_serializer)

    return key, value


def from_json_lines(spec: JoinSpec, path: Path) -> list[Record]:
    """Records from JSON lines (module docstring), serialized as the join's inputs declare."""
    topics = {"left": spec.left.name, "right": spec.right.name}
    encoders = {side: _encoder(spec, side) for side in topics}
    by_topic = {name: side for side, name in topics.items()}
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        found = orjson.loads(line)
        side = found.get("side") or by_topic.get(found.get("topic"))
        if side not in topics:
            raise SystemExit(
                f"{path}:{number}: name the input by side (left/right) or one of {list(by_topic)}"
            )
        key, value = encoders[side]
        records.append(
            {
                "topic": topics[side],
                "key": found["key_raw"].encode() if "key_raw" in found else key(found.get("key")),
                "value": found["value_raw"].encode() if "value_raw" in found else value(found.get("value")),
                **{k: found[k] for k in ("partition", "timestamp", "seq") if found.get(k) is not None},
            }
        )
    return records


def from_parquet(spec: JoinSpec, path: Path) -> list[Record]:
    """Records from Parquet in the input layout (file order)."""
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    topics = {"left": spec.left.name, "right": spec.right.name}
    out = []
    for row in rows:
        topic = row.get("topic") or topics.get(row.get("side") or "")
        if topic not in topics.values():
            continue
        record = {"topic": topic, "key": row.get("key"), "value": row.get("value")}
        out.append(record | {k: row[k] for k in ("partition", "timestamp", "seq") if row.get(k) is not None})
    return out


def read_input(spec: JoinSpec, path: Path) -> list[Record]:
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return from_json_lines(spec, path)
    return from_parquet(spec, path)


def place(records: Sequence[Record], partitions: int, partitioners: dict[str, Partitioner]) -> list[int]:
    """Each record's partition: its own, else its key's under its topic's partitioner."""
    placed = [r.get("partition") for r in records]
    for topic, partitioner in partitioners.items():
        mine = [i for i, r in enumerate(records) if r["topic"] == topic and placed[i] is None]
        keyed = [i for i in mine if records[i]["key"] is not None]
        for i in mine:
            if records[i]["key"] is None:
                placed[i] = 0  # a null key goes anywhere: partition 0, as the twin reads such a file
        if keyed and partitioner != "none":
            found = partitions_for([records[i]["key"] for i in keyed], partitions, partitioner)
            for i, p in zip(keyed, found.tolist(), strict=True):
                placed[i] = p
        for i in keyed:
            if placed[i] is None:  # partitioner none: Kafka's default, murmur2
                placed[i] = int(partitions_for([records[i]["key"]], partitions, "murmur2")[0])
    return [int(p) for p in placed]  # type: ignore[arg-type]


def sequenced(records: Sequence[Record], placed: list[int]) -> list[tuple[Record, int, int]]:
    """(record, partition, seq) in sending order: by seq where given, else numbered per
    partition in file order."""
    if all("seq" in r for r in records):
        order = sorted(range(len(records)), key=lambda i: (records[i]["seq"], placed[i]))
        return [(records[i], placed[i], int(records[i]["seq"])) for i in order]
    counters: dict[int, int] = {}
    out = []
    for record, partition in zip(records, placed, strict=True):
        seq = counters.get(partition, 0)
        counters[partition] = seq + 1
        out.append((record, partition, seq))
    return out


async def ensure_topics(connection: Connection, topics: Sequence[str], partitions: int) -> None:
    """Create the missing topics with `partitions`; fail if one exists with another count."""
    admin = clients.admin(connection.settings())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(t, partitions, 1) for t in topics if t not in existing]
        if missing:
            await admin.create_topics(missing)
    finally:
        await admin.close()


async def produce(
    target: str | Connection,
    spec: JoinSpec,
    records: Sequence[Record],
    partitions: int | None = None,
    partitioners: dict[str, Partitioner] | None = None,
    report_every: int = 100_000,
    rate: float | None = None,
) -> int:
    """Send `records` to the join's topics (module docstring), at `rate` records a second if
    given; returns how many."""
    connection = connection_of(target)
    count = partitions or declared_partitions(spec)
    await ensure_topics(connection, spec.topics, count)  # a self-join's topic once
    chosen = {t: spec.partitioner for t in spec.topics} | (partitioners or {})
    placed = place(records, count, chosen)
    producer = clients.producer(connection.settings(), linger_ms=5, acks="all", max_request_size=4 << 20)
    await producer.start()
    began = time.monotonic()
    try:
        for topic in spec.topics:
            found = len(await producer.partitions_for(topic))
            if found != count:
                raise SystemExit(f"topic {topic} has {found} partitions, the join's input {count}")
        pending = []
        for sent, (record, partition, seq) in enumerate(sequenced(records, placed), 1):
            pending.append(await producer.send(
                record["topic"], record["value"], key=record["key"], partition=partition,
                timestamp_ms=record.get("timestamp"), headers=[("seq", str(seq).encode())],
            ))  # fmt: skip
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending = []
            if rate and (ahead := began + sent / rate - time.monotonic()) > 0:
                await asyncio.sleep(ahead)
            if sent % report_every == 0:
                print(
                    f"produce: {sent:,}/{len(records):,} ({sent / (time.monotonic() - began):,.0f}/s)",
                    flush=True,
                )
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return len(records)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline produce",
        description="Write Parquet (the input layout) or JSON lines to a declared join's input topics, "
        "placed by the join's partitioner, in seq order with the seq header.",
    )
    parser.add_argument("--app", required=True, help="the app's module (MODULE or MODULE:ATTRIBUTE)")
    parser.add_argument("--join", help="the join's name (default: the module's only join)")
    parser.add_argument("--input", type=Path, required=True, help="Parquet directory or file, or .jsonl")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the app's broker)")
    add_client_config_argument(parser)
    parser.add_argument(
        "--partitions", type=int, help="partition count of topics to create (default: declared)"
    )
    parser.add_argument(
        "--rate", type=float, help="records a second (default: as fast as the broker takes them)"
    )
    for side in ("left", "right"):
        parser.add_argument(
            f"--{side}-partitioner", choices=PARTITIONERS, help=f"place the {side} input's keys so instead"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ref = JoinRef.of(args.app, args.join)
    except AppNotFound as exc:
        raise SystemExit(str(exc)) from None
    spec = ref.spec()
    connection = connection_from(args) if args.bootstrap else Connection(app_bootstrap(spec))
    records = read_input(spec, args.input)
    partitions = args.partitions or (
        read_meta(str(args.input)).get("partitions") if args.input.is_dir() else None
    )
    # Only the partitioners given: a self-join's two sides are one topic.
    sides = [(getattr(spec, s).name, getattr(args, f"{s}_partitioner")) for s in ("left", "right")]
    overrides = {topic: partitioner for topic, partitioner in sides if partitioner}
    began = time.monotonic()
    count = asyncio.run(produce(connection, spec, records, partitions, overrides, rate=args.rate))
    print(f"produce: {count:,} records to {', '.join(spec.topics)} in {time.monotonic() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
