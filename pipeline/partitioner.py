"""Kafka's default partitioner (murmur2 of the key), vectorised with numpy.

Identical to aiokafka's `DefaultPartitioner` for non-null keys (tested against it),
so a partition computed here is the partition a producer would pick.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)


def _murmur2_same_length(keys: Sequence[bytes], length: int) -> np.ndarray:
    n = len(keys)
    data = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, length).astype(np.uint32)
    h = np.full(n, _SEED ^ np.uint32(length), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for i in range(length // 4):
            b = data[:, i * 4 : i * 4 + 4]
            k = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
            k = k * _M
            k ^= k >> 24
            k = k * _M
            h = (h * _M) ^ k
        tail = length & ~3
        extra = length % 4
        if extra >= 3:
            h ^= data[:, tail + 2] << 16
        if extra >= 2:
            h ^= data[:, tail + 1] << 8
        if extra >= 1:
            h ^= data[:, tail]
            h = h * _M
        h ^= h >> 13
        h = h * _M
        h ^= h >> 15
    return h


def murmur2(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key, as uint32."""
    out = np.zeros(len(keys), dtype=np.uint32)
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    for length in np.unique(lengths):
        where = np.flatnonzero(lengths == length)
        out[where] = _murmur2_same_length([keys[i] for i in where], int(length))
    return out


def partitions_for(keys: Sequence[bytes], num_partitions: int) -> np.ndarray:
    """The partition aiokafka's default partitioner picks for each (non-null) key."""
    return ((murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)).astype(np.int32)
