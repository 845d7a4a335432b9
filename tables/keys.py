"""Layout of the join state in one ordered key space.

Times are big-endian and offset by 2**63, so byte order is time order and a
range scan over an index prefix visits exactly the entries that are due.

| key | value | in changelog |
| --- | --- | --- |
| `r` side len(key) key ts event_id | flag byte + payload | yes |
| `e` side event_id | empty (duplicate check) | derived |
| `x` expire_at record-key | empty (retention index) | derived |
| `u` emit_at record-key | empty (unmatched, not yet emitted) | derived |
| `m:` name | big-endian int | some (see join.py) |
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tables.records import Side

RECORD = b"r"
EVENT = b"e"
EXPIRY = b"x"
UNMATCHED = b"u"
META = b"m:"
# Looked up by exact key only, never range-scanned (see kv.Overlay).
POINT_ONLY = (EVENT,)

SIDE_BYTE: dict[Side, bytes] = {"left": b"L", "right": b"R"}
BYTE_SIDE: dict[int, Side] = {ord("L"): "left", ord("R"): "right"}

TIME = struct.Struct(">Q")
LEN = struct.Struct(">H")
TIME_BIAS = 1 << 63
_TIME, _LEN, _TIME_BIAS = TIME, LEN, TIME_BIAS


def encode_time(ms: int) -> bytes:
    return _TIME.pack(ms + _TIME_BIAS)


def decode_time(raw: bytes) -> int:
    return int(_TIME.unpack(raw)[0]) - _TIME_BIAS


def encode_int(value: int) -> bytes:
    return encode_time(value)


def decode_int(raw: bytes) -> int:
    return decode_time(raw)


def key_prefix(side: Side, auction_id: str) -> bytes:
    """Prefix of every record of one side and one join key."""
    raw = auction_id.encode()
    return RECORD + SIDE_BYTE[side] + _LEN.pack(len(raw)) + raw


def record_key(side: Side, auction_id: str, ts: int, event_id: str) -> bytes:
    return key_prefix(side, auction_id) + encode_time(ts) + event_id.encode()


@dataclass(frozen=True, slots=True)
class RecordKey:
    side: Side
    auction_id: str
    ts: int
    event_id: str


def parse_record_key(key: bytes) -> RecordKey:
    (length,) = _LEN.unpack_from(key, 2)
    auction_end = 4 + length
    return RecordKey(
        side=BYTE_SIDE[key[1]],
        auction_id=key[4:auction_end].decode(),
        ts=decode_time(key[auction_end : auction_end + 8]),
        event_id=key[auction_end + 8 :].decode(),
    )


def event_key(side: Side, event_id: str) -> bytes:
    return EVENT + SIDE_BYTE[side] + event_id.encode()


def index_key(index: bytes, at: int, key: bytes) -> bytes:
    return index + encode_time(at) + key


def index_bounds(index: bytes) -> tuple[bytes, bytes]:
    """The whole range of one time index."""
    return index, index[:-1] + bytes([index[-1] + 1])


def meta_key(name: str) -> bytes:
    return META + name.encode()
