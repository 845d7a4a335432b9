"""What Faust's consumer thread spends handing out one fetched record of a join input:
aiokafka's ConsumerRecord per record, against the fetched record itself
(`RawRecords`); prints a Markdown table.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_fetched_records [--records 10000] [--rounds 9]

A record batch of the reference app's impressions is built once with aiokafka's own
builder; each round reads it through aiokafka's PartitionRecords, as the fetcher does
(the best of the rounds, per record). The two ways alternate round by round.
"""

from __future__ import annotations

import argparse
import time

import orjson
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from tables.kafka.consumer import RawRecords, install_raw_records

TOPIC = "impressions"


def fetch(records: int) -> bytes:
    """One record batch of `records` impressions, as a fetch response carries it."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    for n in range(records):
        value = {"event_id": f"i{n}", "auction_id": f"auction-{n}", "campaign_id": f"c{n % 50}", "ts": n}
        builder.append(
            n, timestamp=1_700_000_000_000 + n, key=b"auction-%d" % n, value=orjson.dumps(value), headers=[]
        )
    return bytes(builder.build())


def read(data: bytes, keys: RawRecords | None) -> float:
    """Seconds to hand out every record of `data`, as the fetcher's getall does."""
    started = time.perf_counter()
    handed = list(
        PartitionRecords(TopicPartition(TOPIC, 0), MemoryRecords(data), [], 0, keys, None, False, 0)
    )
    elapsed = time.perf_counter() - started
    assert handed and handed[-1].offset == len(handed) - 1
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    install_raw_records()
    data = fetch(args.records)
    ways = {
        "a ConsumerRecord each (aiokafka)": None,
        "the fetched records (RawRecords)": RawRecords(lambda t: True),
    }
    best = {name: float("inf") for name in ways}
    for _ in range(args.rounds):
        for name, keys in ways.items():
            best[name] = min(best[name], read(data, keys))
    stock = best["a ConsumerRecord each (aiokafka)"]
    print(f"{args.records:,} records in one batch, best of {args.rounds} rounds.\n")
    print("| records handed out as | µs per record | vs ConsumerRecord |\n| --- | ---: | ---: |")
    for name, seconds in best.items():
        print(f"| {name} | {seconds / args.records * 1e6:.2f} | {seconds / stock:.2f} |")


if __name__ == "__main__":
    main()
