"""The ad join's contract in plain Python, without Faust or Tandem: which input records are
good (`validate`) and what a result is (`result`), docs/join-semantics.md.

The app itself (app/records.py) states the same rules with Faust records and the join's
checks, which the batch twin runs as they are (pipeline/). This plain statement serves what
runs without them: the Faust-table baseline of the benchmarks (benchmarks/faust_table_app.py)
and the tests' own models of the ad join; tests/test_app_units.py holds it to the app's
decisions.

JSON is decoded by orjson (strict RFC 8259, UTF-8 only, ~6x faster than the
standard library): NaN, Infinity, numbers out of double range, lone UTF-16
surrogates, a byte order mark and non-UTF-8 encodings are malformed JSON, and an
integer beyond 64 bits decodes as a float (so a wrong type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

Side = Literal["left", "right"]

MAX_VALUE_BYTES = 64 * 1024
MAX_PAST_MS = 7 * 24 * 3600 * 1000
MAX_FUTURE_MS = 24 * 3600 * 1000
# Kafka timestamps are milliseconds since the epoch, never negative; past year 9999 a
# value is corrupt, and near 2**63 it would overflow the state's time keys.
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

# Required fields and their types, per side (left = impressions, right = clicks).
FIELDS: dict[str, dict[str, type]] = {
    "left": {"event_id": str, "auction_id": str, "campaign_id": str, "ts": int},
    "right": {"event_id": str, "auction_id": str, "ts": int},
}


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that cannot be joined, and why."""

    reason: str


def validate(
    side: Side, key: bytes | None, value: bytes | None, now_ms: int | None
) -> dict[str, Any] | Rejected:
    """The decoded record, or why it is rejected.

    `now_ms` is the wall clock used to reject timestamps far in the past or
    future; None skips that check (a backfill over old data).
    """
    if key is None:
        # A keyless record lands on an arbitrary partition, away from its partner:
        # it would silently never join. Rejecting it makes the loss visible.
        return Rejected("null Kafka key")
    if value is None:
        return Rejected("null value")
    if len(value) > MAX_VALUE_BYTES:
        return Rejected(f"value of {len(value)} bytes exceeds {MAX_VALUE_BYTES}")
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Rejected(f"malformed JSON: {exc.__class__.__name__}")
    if type(record) is dict:
        # Fast path: every field present with its exact type (orjson makes no subclasses,
        # and bool is not `int` by type()), the key equal to the auction id.
        event_id, auction_id, ts = record.get("event_id"), record.get("auction_id"), record.get("ts")
        if (
            type(event_id) is str
            and type(auction_id) is str
            and type(ts) is int
            and auction_id
            and key == auction_id.encode()
            and 0 <= ts <= MAX_TS_MS
            and (now_ms is None or now_ms - MAX_PAST_MS <= ts <= now_ms + MAX_FUTURE_MS)
        ):
            if side == "right":
                return {"event_id": event_id, "auction_id": auction_id, "ts": ts}
            campaign_id = record.get("campaign_id")
            if type(campaign_id) is str:
                return {
                    "event_id": event_id,
                    "auction_id": auction_id,
                    "campaign_id": campaign_id,
                    "ts": ts,
                }
    return _checked(side, key, record, now_ms)


def result(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """One output record in the `ad-joins` format, from validated records (app/records.py's
    `ad_join` makes the same from Faust records)."""
    anchor = left or right
    assert anchor is not None
    ts = max(r["ts"] for r in (left, right) if r is not None)
    impression_id = left["event_id"] if left else None
    click_id = right["event_id"] if right else None
    return {
        "join_id": f"{impression_id or ''}|{click_id or ''}",
        "auction_id": anchor["auction_id"],
        "campaign_id": left["campaign_id"] if left else None,
        "impression_id": impression_id,
        "click_id": click_id,
        "impression_ts": left["ts"] if left else None,
        "click_ts": right["ts"] if right else None,
        "ts": ts,
        "kind": "inner" if left and right else ("left" if left else "right"),
    }


def _checked(side: Side, key: bytes, record: Any, now_ms: int | None) -> dict[str, Any] | Rejected:
    """The full checks, in order, each with its reason."""
    if not isinstance(record, dict):
        return Rejected(f"value is a JSON {type(record).__name__}, not an object")
    for field, kind in FIELDS[side].items():
        if field not in record or record[field] is None:
            return Rejected(f"missing or null field {field!r}")
        found = record[field]
        # bool is an int in Python; a boolean timestamp is still a wrong type.
        if not isinstance(found, kind) or isinstance(found, bool):
            return Rejected(f"field {field!r} is {type(found).__name__}, expected {kind.__name__}")
    if not record["auction_id"]:
        return Rejected("empty auction_id")
    if key.decode("utf-8", "replace") != record["auction_id"]:
        return Rejected("key does not match auction_id")
    if not 0 <= record["ts"] <= MAX_TS_MS:
        return Rejected("timestamp out of range (0 to year 9999 in ms since the epoch)")
    if now_ms is not None:
        if record["ts"] < now_ms - MAX_PAST_MS:
            return Rejected("timestamp more than 7 days in the past")
        if record["ts"] > now_ms + MAX_FUTURE_MS:
            return Rejected("timestamp more than 1 day in the future")
    return {field: record[field] for field in FIELDS[side]}
