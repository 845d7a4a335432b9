"""The cost of the misplaced-record check per record, against the alternatives.

    flock /tmp/lead/bench.lock .venv/bin/python -m benchmarks.bench_partitioners

Prints a Markdown table (results: docs/partitioners.md): nanoseconds per record of
finding the records of one fetch (one topic partition) whose key belongs to another
partition, by batch size and key shape, for

- `find_misplaced` murmur2: tables.records.partitioners, numpy-vectorised over the batch;
- `find_misplaced` crc32: tables.records.partitioners, zlib's C CRC-32 per key;
- per key, pure Python: tables.records.partitioners.murmur2 in a loop (the single-key function);
- per key, aiokafka: aiokafka.partitioner.murmur2 (pure Python) in a loop;
- per key, compiled: the `murmurhash2` wheel (Rust) in a loop, when it is installed
  (`pip install murmurhash2`; it is not a dependency).

The keys of a fetch belong to the partition it was read from (the usual case: nothing
to flag), except in the last rows, where 3 in 4 do not (a librdkafka producer with its
default partitioner on 4 partitions: each flagged record becomes a `Misplaced`).
Each figure is the best of `--rounds` rounds, each round repeating the check on the
same batch for at least `--seconds`; the last column puts the check next to the
join's ~25 us of CPU per record (docs/bench/tables.md, "stages").
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence

from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from tables.records.partitioners import Partitioner, find_misplaced, murmur2, partition_for

JOIN_NS_PER_RECORD = 25_000
PARTITIONS = 4
PARTITION = 1
Check = Callable[[Sequence[bytes]], object]


def _per_key(hash_of: Callable[[bytes], int]) -> Check:
    def check(keys: Sequence[bytes]) -> list[int]:
        return [i for i, key in enumerate(keys) if (hash_of(key) & 0x7FFFFFFF) % PARTITIONS != PARTITION]

    return check


def _compiled() -> Check | None:
    try:
        from murmurhash2 import murmurhash2 as compiled
    except ImportError:
        return None

    def check(keys: Sequence[bytes]) -> list[int]:
        return [
            i
            for i, key in enumerate(keys)
            if (compiled(key, 0x9747B28C) & 0x7FFFFFFF) % PARTITIONS != PARTITION
        ]

    return check


def checks() -> dict[str, Check | None]:
    """The alternatives; None for one that cannot run here."""
    return {
        "find_misplaced murmur2 (numpy)": lambda keys: find_misplaced(keys, PARTITION, PARTITIONS, "murmur2"),
        "find_misplaced crc32 (zlib)": lambda keys: find_misplaced(keys, PARTITION, PARTITIONS, "crc32"),
        "per key, tables murmur2 (Python)": _per_key(murmur2),
        "per key, aiokafka murmur2 (Python)": _per_key(aiokafka_murmur2),
        "per key, murmurhash2 wheel (compiled)": _compiled(),
    }


def _uuid(rng: random.Random) -> bytes:
    return str(uuid.UUID(int=rng.getrandbits(128))).encode()


def _auction(rng: random.Random) -> bytes:
    return f"auction-{rng.randrange(10 ** rng.randint(1, 6))}".encode()


SHAPES = {"uuid, 36 bytes": _uuid, "auction-<n>, 9-14 bytes": _auction}


def fetch_keys(
    size: int,
    shape: Callable[[random.Random], bytes],
    partitioner: Partitioner,
    rng: random.Random,
    misplaced: float = 0.0,
) -> list[bytes]:
    """`size` keys of partition PARTITION under `partitioner`, a share `misplaced` of others."""
    keys: list[bytes] = []
    while len(keys) < size:
        key = shape(rng)
        wanted = rng.random() >= misplaced
        if (partition_for(key, PARTITIONS, partitioner) == PARTITION) == wanted:
            keys.append(key)
    return keys


def ns_per_record(check: Check, keys: Sequence[bytes], rounds: int, seconds: float) -> float:
    """Best over `rounds` of the mean time of one check, per record."""
    reps = 1
    while True:  # calibrate: enough repetitions to fill `seconds` (at most ~20 doublings)
        began = time.perf_counter()
        for _ in range(reps):
            check(keys)
        if time.perf_counter() - began >= seconds or reps >= 1 << 20:
            break
        reps *= 2
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(reps):
            check(keys)
        best = min(best, (time.perf_counter() - began) / reps)
    return best / len(keys) * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,10,100,500,2000", help="records per fetch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.2, help="minimum time per round")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| keys | records per fetch | check | ns per record | share of the join's ~25 us |")
    print("| --- | ---: | --- | ---: | ---: |")
    rows = [(size, shape, 0.0) for size in sizes for shape in SHAPES]
    rows += [(max(sizes), shape, 0.75) for shape in SHAPES]
    for size, shape, misplaced in rows:
        label = shape + (f", {misplaced:.0%} misplaced" if misplaced else "")
        for name, check in checks().items():
            if check is None:
                print(f"| {label} | {size:,} | {name} | not installed | |")
                continue
            partitioner: Partitioner = "crc32" if "crc32" in name else "murmur2"
            keys = fetch_keys(size, SHAPES[shape], partitioner, rng, misplaced)
            ns = ns_per_record(check, keys, args.rounds, args.seconds)
            share = ns / JOIN_NS_PER_RECORD
            print(f"| {label} | {size:,} | {name} | {ns:,.0f} | {share:.2%} |", flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
