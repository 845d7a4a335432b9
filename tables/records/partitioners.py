"""Which partition a record's key belongs to, as Kafka producers choose it (pure, no I/O).

A stream-stream join is only correct when both inputs put a key on the same
partition. Clients disagree on how (docs/partitioners.md):

- `murmur2`: the Java client (`Utils.toPositive(Utils.murmur2(key)) % n`), aiokafka's
  `DefaultPartitioner`, kafka-python, and librdkafka's `murmur2` / `murmur2_random`;
- `crc32`: librdkafka's `consistent` (`rd_crc32(key) % n`, zlib's CRC-32) and its
  default `consistent_random`, which is the same for non-empty keys and puts empty and
  null keys anywhere; librdkafka is under confluent-kafka (Python, Go, .NET), node-rdkafka
  and kcat;
- `none`: no partitioner is assumed (custom partitioners); nothing is checked.

`find_misplaced` is the check a join runs per fetch: the records of one topic
partition whose key belongs to another partition can never meet their partner.
It is vectorised with numpy (murmur2) or runs zlib's C CRC-32 per key:
benchmarks/bench_partitioners.py measures it, docs/partitioners.md quotes it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Literal, NamedTuple, get_args

import numpy as np

__all__ = [
    "PARTITIONERS",
    "Misplaced",
    "Partitioner",
    "crc32",
    "find_misplaced",
    "misplaced_reason",
    "murmur2",
    "murmur2_many",
    "parse_partitioner",
    "partition_for",
    "partitions_for",
]

Partitioner = Literal["murmur2", "crc32", "none"]
PARTITIONERS: tuple[Partitioner, ...] = get_args(Partitioner)

# librdkafka's names, so that an error can say which setting the user meant.
_LIBRDKAFKA_NAMES = {
    "murmur2_random": "murmur2",
    "consistent": "crc32",
    "consistent_random": "crc32",
}

_SEED = 0x9747B28C  # Kafka's murmur2 seed
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF
_POSITIVE = 0x7FFFFFFF  # Java's Utils.toPositive: clear the sign bit (not abs())
_NP_M = np.uint32(_M)
_FEW_KEYS = 8  # below this, hash key by key in Python (benchmarks/bench_partitioners.py)


class Misplaced(NamedTuple):
    """A record read from the wrong partition: its index in the batch and where its key belongs."""

    index: int  # type: ignore[assignment]
    expected: int


def parse_partitioner(value: object) -> Partitioner:
    """`value` as a Partitioner, or a ValueError naming the allowed values."""
    if isinstance(value, str) and value in PARTITIONERS:
        return value
    allowed = ", ".join(PARTITIONERS)
    hint = ""
    if isinstance(value, str) and value in _LIBRDKAFKA_NAMES:
        hint = f" (librdkafka's {value!r} is {_LIBRDKAFKA_NAMES[value]!r} here)"
    raise ValueError(f"unknown partitioner {value!r}: expected one of {allowed}{hint}")


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 of `key` (Java's `Utils.murmur2`), as an unsigned 32-bit int.

    Java returns the same bits as a signed int; `h - 2**32 if h >= 2**31` converts.
    """
    length = len(key)
    h = _SEED ^ length
    body = length & ~3
    for (k,) in struct.iter_unpack("<I", key[:body]):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    if length != body:  # the last 1-3 bytes, little-endian, as Java's switch folds them
        h ^= int.from_bytes(key[body:], "little")
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    return h ^ (h >> 15)


def crc32(key: bytes) -> int:
    """librdkafka's `rd_crc32` of `key`: the standard (zlib) CRC-32, unsigned."""
    return zlib.crc32(key)


def _check_count(partitions: int) -> None:
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")


def partition_for(key: bytes, partitions: int, partitioner: Partitioner) -> int:
    """The partition a producer using `partitioner` picks for the non-null `key`.

    For `crc32` this is librdkafka's `consistent`; its default `consistent_random` picks
    the same partition for every non-empty key (an empty key goes anywhere there).
    """
    _check_count(partitions)
    if partitioner == "murmur2":
        return (murmur2(key) & _POSITIVE) % partitions
    if partitioner == "crc32":
        return zlib.crc32(key) % partitions
    raise ValueError(f"partitioner {partitioner!r} implies no partition for a key")


def _murmur2_same_length(joined: bytes, count: int, length: int) -> np.ndarray:
    """murmur2 of `count` keys of `length` bytes each, concatenated in `joined`."""
    data = np.frombuffer(joined, dtype=np.uint8).reshape(count, length)
    h = np.full(count, _SEED ^ length, dtype=np.uint32)
    body = length & ~3
    if body:
        words = data if body == length else np.ascontiguousarray(data[:, :body])
        # One row per 4-byte block, so each step of the chain below reads a contiguous row.
        k = words.view("<u4").T.copy()  # a C-ordered copy, writable (the input is not)
        k *= _NP_M
        k ^= k >> 24
        k *= _NP_M
        for row in k:  # h depends on the previous block: this loop is inherently sequential
            h *= _NP_M
            h ^= row
    if length != body:
        tail = np.zeros(count, dtype=np.uint32)
        for i in range(length - body):
            tail |= data[:, body + i].astype(np.uint32) << np.uint32(8 * i)
        h ^= tail
        h *= _NP_M
    h ^= h >> 13
    h *= _NP_M
    h ^= h >> 15
    return h


def _murmur2_mixed_lengths(keys: Sequence[bytes], lengths: np.ndarray) -> np.ndarray:
    """murmur2 of keys of different lengths in one pass: each key zero-padded to a whole
    number of 4-byte words, and a step applied only to the keys that have that word."""
    width = (int(lengths.max()) + 3) & ~3
    padded = b"".join([key.ljust(width, b"\0") for key in keys])
    raw = np.frombuffer(padded, dtype=np.uint8).reshape(len(keys), width).view("<u4").T.copy()
    k = raw * _NP_M
    k ^= k >> 24
    k *= _NP_M
    blocks = lengths >> 2  # whole words of each key; a zero-padded tail word may follow
    has_tail = (lengths & 3) != 0
    fewest, most = int(blocks.min()), int(blocks.max())
    h = (lengths ^ _SEED).astype(np.uint32)
    for row in k[:fewest]:  # words every key has
        h *= _NP_M
        h ^= row
    for j in range(fewest, len(raw)):
        if j < most:
            step = h * _NP_M
            step ^= k[j]
            np.copyto(h, step, where=blocks > j)
        # Java folds the last 1-3 bytes in little-endian: the zero-padded word equals them.
        tail = h ^ raw[j]
        tail *= _NP_M
        np.copyto(h, tail, where=has_tail & (blocks == j))
    h ^= h >> 13
    h *= _NP_M
    h ^= h >> 15
    return h


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key (uint32), vectorised over the keys with numpy."""
    count = len(keys)
    if count < _FEW_KEYS:  # numpy's fixed cost per call is more than a few keys in Python
        return np.array([murmur2(key) for key in keys], dtype=np.uint32)
    lengths = np.fromiter(map(len, keys), dtype=np.intp, count=count)
    first = int(lengths[0])
    if (lengths == first).all():  # the usual case: ids of one format
        return _murmur2_same_length(b"".join(keys), count, first)
    return _murmur2_mixed_lengths(keys, lengths)


def partitions_for(keys: Sequence[bytes], partitions: int, partitioner: Partitioner) -> np.ndarray:
    """`partition_for` of every (non-null) key, as an int32 array."""
    _check_count(partitions)
    if partitioner == "murmur2":
        hashes = murmur2_many(keys) & np.uint32(_POSITIVE)
    elif partitioner == "crc32":
        hashes = np.fromiter(map(zlib.crc32, keys), dtype=np.uint32, count=len(keys))
    else:
        raise ValueError(f"partitioner {partitioner!r} implies no partition for a key")
    return (hashes % np.uint32(partitions)).astype(np.int32)


def _judged(key: bytes | None, partitioner: Partitioner) -> bool:
    """Whether the key's partition is determined: null keys go anywhere with every client,
    and empty keys do with librdkafka's default `consistent_random`."""
    return key is not None and (len(key) > 0 or partitioner == "murmur2")


def find_misplaced(
    keys: Sequence[bytes | None], partition: int, partitions: int, partitioner: Partitioner
) -> list[Misplaced]:
    """The records of a batch read from `partition` (of a topic with `partitions`) whose key
    belongs to another partition under `partitioner`, in batch order.

    Null keys are never flagged (every client places them anywhere), nor empty keys
    under `crc32`; `none` flags nothing. Cost: docs/partitioners.md.
    """
    if partitioner == "none" or not keys:
        return []
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not one of the topic's {partitions}")
    if len(keys) < _FEW_KEYS:  # numpy's fixed cost is more than a few keys in Python
        return [
            Misplaced(i, belongs)
            for i, key in enumerate(keys)
            if _judged(key, partitioner)
            and (belongs := partition_for(key, partitions, partitioner)) != partition  # type: ignore[arg-type]
        ]
    try:
        expected = partitions_for(keys, partitions, partitioner)  # type: ignore[arg-type]
    except TypeError:
        if all(key is not None for key in keys):
            raise
        # Null keys cost this detour only in batches that hold one.
        judged = [i for i, key in enumerate(keys) if _judged(key, partitioner)]
        among_judged = find_misplaced([keys[i] for i in judged], partition, partitions, partitioner)
        return [Misplaced(judged[m.index], m.expected) for m in among_judged]
    where = np.flatnonzero(expected != partition)
    found = map(Misplaced, where.tolist(), expected[where].tolist())
    if partitioner == "crc32":  # empty keys go anywhere with consistent_random
        return [m for m in found if keys[m.index]]
    return list(found)


def misplaced_reason(partition: int, expected: int, partitioner: Partitioner) -> str:
    """The dead-letter reason for a record read from `partition` whose key belongs to `expected`."""
    if partitioner == "murmur2":
        likely = (
            "its producer likely uses another partitioner: librdkafka-based clients "
            "(confluent-kafka, kcat, Go, .NET) default to CRC32 (consistent_random); "
            "set partitioner=murmur2_random there"
        )
    else:
        likely = (
            "its producer likely uses another partitioner: the Java client and aiokafka use "
            "murmur2; give the librdkafka producer partitioner=consistent_random, or use "
            "murmur2 on both sides"
        )
    return (
        f"key belongs to partition {expected} under {partitioner} but was read from partition "
        f"{partition}, so it can never meet its partner: {likely} (or the topic's partition "
        "count changed after it was produced)"
    )
