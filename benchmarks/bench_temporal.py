"""The enrichment join's operator alone (tables/operators/temporal.py), on real RocksDB behind
the runtime's overlay, as a worker runs it: batches of table updates and stream records, each
batch's changes written with its checkpoint (no Kafka). CPU per record, operator and write.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_temporal [--keys 200000] [--trades 60000] [--rounds 3]

Input as bench_enrich.py's: a table of `--keys` quotes (one version per key), then `--trades`
stream records of random keys, then a tick that flushes them. With `--updates N`, each key
gets N more versions afterwards, 1 s apart in event time (history 1 h: old versions pruned).
Prints the median of the rounds (a fresh store each).
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tables.operators.temporal import TemporalEvent, TemporalKind
from tables.state.partition import StatePartition
from tables.state.store import PartitionStore

BATCH = 10_000
_OFFSET = struct.Struct(">Q")


def events(keys: int, trades: int, updates: int, seed: int = 3) -> Iterator[TemporalEvent]:
    rng = random.Random(seed)
    offset = 0
    ts = 1_000_000

    def quote(i: int) -> TemporalEvent:
        nonlocal offset, ts
        offset += 1
        ts += 1
        value = b'{"symbol":"S%09d","bid_cents":%d,"ask_cents":%d,"ts":%d}' % (i, i % 9000, i % 9000 + 2, ts)
        return ("right", b"S%09d" % i, ts, _OFFSET.pack(offset), value)

    for i in range(keys):
        yield quote(i)
    for n in range(trades):
        ts += 2
        key = b"S%09d" % rng.randrange(keys)
        yield ("left", key, ts, b"t%d" % n, b'{"trade_id":"t%d","qty":1,"price_cents":100,"ts":%d}' % (n, ts))
    for _ in range(updates):
        ts += 1_000 - 1
        for i in range(keys):
            yield quote(i)
    offset += 1
    yield ("right", b"tick", ts + 3_600_000, _OFFSET.pack(offset), b"{}")


def run(path: Path, data: list[TemporalEvent]) -> tuple[float, float, int]:
    """CPU seconds in the operator and in the writes, and results, over the whole input."""
    kind = TemporalKind("left", 5_000, 3_600_000)
    state = StatePartition(PartitionStore(path), kind, "active", ids=True)
    operator_s = write_s = 0.0
    results = 0
    checkpoint = 0
    try:
        for start in range(0, len(data), BATCH):
            began = time.process_time()
            results += len(state.operator.process_many(data[start : start + BATCH]))
            state.operator.take_changes()
            middle = time.process_time()
            checkpoint += 1
            state.write(checkpoint)
            operator_s += middle - began
            write_s += time.process_time() - middle
    finally:
        state.store.close()
    return operator_s, write_s, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--trades", type=int, default=60_000)
    parser.add_argument("--updates", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = list(events(args.keys, args.trades, args.updates))
    rows = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-temporal-") as tmp:
            rows.append(run(Path(tmp) / "p", data))
    operator_s = statistics.median(r[0] for r in rows)
    write_s = statistics.median(r[1] for r in rows)
    print(
        f"{len(data):,} records ({args.keys:,} keys, {args.trades:,} trades, {args.updates} more versions "
        f"per key), {rows[0][2]:,} results; median of {args.rounds} rounds: operator "
        f"{operator_s / len(data) * 1e6:.2f} µs per record, write {write_s / len(data) * 1e6:.2f}, "
        f"in all {(operator_s + write_s) / len(data) * 1e6:.2f}"
    )


if __name__ == "__main__":
    main()
