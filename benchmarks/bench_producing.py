"""The cost per record of filling the record batches `start_sending` hands to the producer.

    flock /tmp/lead/bench.lock .venv/bin/python -m benchmarks.bench_producing

Prints a Markdown table: microseconds per record of building the batches for `--records`
records (the join's shape: 40-byte keys, 120-byte values) with `producer.create_batch()`
batches of the producer's `max_batch_size`, for

- `BatchBuilder.append` per record: start_sending's loop before `fill_batch` (reproduced here);
- `fill_batch`: tables.kafka.batches, what start_sending runs now (the record-batch
  builder's append per record, without BatchBuilder.append's Python wrapper);
- `create_batch` only: the batches alone, empty (their part of both figures).

for the join's changelog records (key, value) with `headers=[]`, and results carrying their
own headers (none, as the handler's sends mostly do, or one). Nothing is sent: the batches
are built and dropped. Each figure is the best of `--rounds` rounds, each repeating the
build for at least `--seconds`; the last columns put the saving next to the join's ~25 us of
CPU per input record (docs/bench/tables.md, "stages"), at ~1.4 records appended per input
record (a changelog record for each, a result for some).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder

from tables.kafka.batches import fill_batch

JOIN_US_PER_RECORD = 25.0
APPENDS_PER_INPUT_RECORD = 1.4
Build = Callable[[AIOKafkaProducer, Sequence[Any], list[Any]], list[tuple[BatchBuilder, int]]]


def by_append(producer: AIOKafkaProducer, records: Sequence[Any], headers: list[Any]) -> list[Any]:
    """start_sending's batches before fill_batch: BatchBuilder.append per record."""
    batches = []
    batch = producer.create_batch()
    append = batch.append
    for record in records:
        key, value = record[0], record[1]
        own = list(record[2]) if len(record) > 2 else headers
        if append(key=key, value=value, timestamp=None, headers=own) is None:
            batches.append((batch, batch.record_count()))
            batch = producer.create_batch()
            append = batch.append
            append(key=key, value=value, timestamp=None, headers=own)
    batches.append((batch, batch.record_count()))
    return batches


def by_fill(producer: AIOKafkaProducer, records: Sequence[Any], headers: list[Any]) -> list[Any]:
    """start_sending's batches now: fill_batch per batch."""
    batches = []
    done = 0
    while done < len(records):
        batch = producer.create_batch()
        count = fill_batch(batch, records, headers, start=done)
        batches.append((batch, count))
        done += count
    return batches


def shapes(count: int) -> dict[str, tuple[list[Any], list[Any]]]:
    """Records and the headers on each, by kind."""
    pairs = [(os.urandom(40), os.urandom(120)) for _ in range(count)]
    return {
        "changelog: (key, value), headers=[]": (pairs, []),
        "results: own headers, none": ([(k, v, ()) for k, v in pairs], []),
        "results: own headers, one": ([(k, v, [("trace", b"0123456789")]) for k, v in pairs], []),
    }


def per_record_us(build: Callable[[], object], records: int, rounds: int, seconds: float) -> float:
    """Best of `rounds`, each repeating `build` for at least `seconds`."""
    best = float("inf")
    for _ in range(rounds):
        repeats, started = 0, time.perf_counter()
        while True:
            build()
            repeats += 1
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        best = min(best, elapsed / repeats / records * 1e6)
    return best


def _row(producer: AIOKafkaProducer, name: str, shape: tuple[list[Any], list[Any]], args: Any) -> str:
    records, headers = shape

    def timed(build: Callable[[], object]) -> float:
        return per_record_us(build, len(records), args.rounds, args.seconds)

    before = timed(lambda: by_append(producer, records, headers))
    now = timed(lambda: by_fill(producer, records, headers))
    count = len(by_fill(producer, records, headers))
    empty = timed(lambda: [producer.create_batch() for _ in range(count)])
    saved = (before - now) * APPENDS_PER_INPUT_RECORD
    return (
        f"| {name} | {count} | {before:.3f} | {now:.3f} | {now / before:.2f} | {empty:.3f} "
        f"| {saved:.2f} | {saved / JOIN_US_PER_RECORD:.1%} |"
    )


async def run(args: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", max_batch_size=args.batch_size)
    try:
        print(f"{args.records} records, max_batch_size {args.batch_size}, best of {args.rounds} rounds")
        print()
        print(
            "| records | batches | append us/record | fill_batch us/record | ratio | create_batch us/record "
            "| saved us per input record | of the join's 25 us |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, shape in shapes(args.records).items():
            print(_row(producer, name, shape, args))
    finally:
        await producer.stop()  # never started: nothing to close but the object


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=16384, help="the producer's max_batch_size")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
