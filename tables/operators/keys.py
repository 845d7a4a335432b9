"""Layout of one join partition's state in one ordered key space.

Times are big-endian and offset by 2**63, so byte order is time order: the
records of one side and join key lie in time order under their prefix. Join
keys are the Kafka key's bytes, whatever serializer made them; record ids are
bytes too (the input offset, or the join's `id` function's value).

| key | value | in changelog |
| --- | --- | --- |
| `r` side len(key) key ts id | flag byte + the record's serialized value | yes |
| `m:` name | big-endian int | counters; stream time only the temporal join's (`take_changes`) |

Which records are live, by join key and by due time, is not stored by default: the
operator indexes the `r` keys in memory (tables/operators/window_index.py). With
TANDEM_WINDOW_INDEX=rocksdb it is (tables/operators/stored_window.py): `x` expire_at
record-key, and `i` side len(key) key id with ids, derived from the records (not in the
changelog), and `w:window_index` marks a state that holds them. State format 1 stored them
too: the store drops those keys when it opens a format-1 store (tables/state/store.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tables.operators.base import Side

RECORD = b"r"
META = b"m:"
# The index of live records kept in the state (TANDEM_WINDOW_INDEX=rocksdb,
# tables/operators/stored_window.py): due times, ids, and the mark of a state that keeps them.
EXPIRY_INDEX = b"x"
ID_INDEX = b"i"
INDEX_MARK = b"w:window_index"  # not a counter (`m:`): derived, never in the changelog

SIDE_BYTE: dict[Side, bytes] = {"left": b"L", "right": b"R"}
BYTE_SIDE: dict[int, Side] = {ord("L"): "left", ord("R"): "right"}

TIME = struct.Struct(">Q")
LEN = struct.Struct(">I")
TIME_BIAS = 1 << 63
KEY_AT = 1 + 1 + LEN.size  # where the join key starts in a record key


def encode_time(ms: int) -> bytes:
    return TIME.pack(ms + TIME_BIAS)


def decode_time(raw: bytes) -> int:
    return int(TIME.unpack(raw)[0]) - TIME_BIAS


def encode_int(value: int) -> bytes:
    return encode_time(value)


def decode_int(raw: bytes) -> int:
    return decode_time(raw)


def key_prefix(side: Side, key: bytes) -> bytes:
    """Prefix of every record of one side and one join key."""
    return RECORD + SIDE_BYTE[side] + LEN.pack(len(key)) + key


def record_key(side: Side, key: bytes, ts: int, record_id: bytes) -> bytes:
    return key_prefix(side, key) + encode_time(ts) + record_id


@dataclass(frozen=True, slots=True)
class RecordKey:
    side: Side
    key: bytes
    ts: int
    record_id: bytes


def parse_record_key(raw: bytes) -> RecordKey:
    (length,) = LEN.unpack_from(raw, 2)
    key_end = KEY_AT + length
    return RecordKey(
        side=BYTE_SIDE[raw[1]],
        key=raw[KEY_AT:key_end],
        ts=decode_time(raw[key_end : key_end + 8]),
        record_id=raw[key_end + 8 :],
    )


def prefix_bounds(prefix: bytes) -> tuple[bytes, bytes]:
    """(lo, hi): every key that starts with `prefix` lies in lo <= key < hi."""
    return prefix, prefix[:-1] + bytes([prefix[-1] + 1])


def meta_key(name: str) -> bytes:
    return META + name.encode()
