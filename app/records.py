"""The ad join's records (docs/join-semantics.md, "The reference app").

Impressions and clicks are JSON objects keyed by their auction id; a click joins the
impressions of its auction shown up to 10 minutes before it. An `AdJoin` is one
output record: `join_id` identifies it, so a result written twice is a duplicate,
never a second result.
"""

from __future__ import annotations

import time
from typing import Any

import faust

MAX_VALUE_BYTES = 64 * 1024
MAX_PAST_MS = 7 * 24 * 3600 * 1000
MAX_FUTURE_MS = 24 * 3600 * 1000


class Impression(faust.Record, serializer="json"):
    event_id: str
    auction_id: str
    campaign_id: str
    ts: int  # event time, ms since the epoch


class Click(faust.Record, serializer="json"):
    event_id: str
    auction_id: str
    ts: int


def check_event(key: str, event: Impression | Click, now_ms: int | None = None) -> str | None:
    """The ad contract's checks beyond the types: why the event is rejected, or None.
    `now_ms` None: the wall clock (the batch twin passes its own, or skips the check)."""
    if not event.auction_id:
        return "empty auction_id"
    if key != event.auction_id:
        return "key does not match auction_id"
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if event.ts < now - MAX_PAST_MS:
        return "timestamp more than 7 days in the past"
    if event.ts > now + MAX_FUTURE_MS:
        return "timestamp more than 1 day in the future"
    return None


def ad_join(auction_id: str, impression: Impression | None, click: Click | None, ts: int) -> dict[str, Any]:
    """One `ad-joins` record."""
    return {
        "join_id": f"{impression.event_id if impression else ''}|{click.event_id if click else ''}",
        "auction_id": auction_id,
        "campaign_id": impression.campaign_id if impression else None,
        "impression_id": impression.event_id if impression else None,
        "click_id": click.event_id if click else None,
        "impression_ts": impression.ts if impression else None,
        "click_ts": click.ts if click else None,
        "ts": ts,
        "kind": "inner" if impression and click else "left" if impression else "right",
    }
