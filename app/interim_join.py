"""Interim in-memory windowed inner join, used until `tables/` lands its operator.

Semantics from docs/join-semantics.md (inner results, duplicate inputs ignored,
late records dropped, stream time per partition). It keeps its buffers in
memory; durability comes from the changelog replayed by app/state.py.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

Record = dict[str, Any]


def join_result(left: Record, right: Record) -> Record:
    return {
        "join_id": f"{left['event_id']}|{right['event_id']}",
        "auction_id": left["auction_id"],
        "campaign_id": left["campaign_id"],
        "impression_id": left["event_id"],
        "click_id": right["event_id"],
        "impression_ts": left["ts"],
        "click_ts": right["ts"],
        "ts": max(left["ts"], right["ts"]),
        "kind": "inner",
    }


class WindowedJoin:
    """One partition's join: impressions (left) with clicks (right) by auction id."""

    def __init__(self, before: int = 0, after: int = 600_000, grace: int = 60_000) -> None:
        self.before, self.after, self.grace = before, after, grace
        self.stream_time = -1
        self.late = 0
        self._buffers: dict[str, dict[str, list[Record]]] = {"left": {}, "right": {}}
        self._seen: dict[str, set[str]] = {"left": set(), "right": set()}

    def _is_late(self, side: str, ts: int) -> bool:
        closes = ts + (self.after if side == "left" else self.before) + self.grace
        return closes < self.stream_time

    def _matches(self, left: Record, right: Record) -> bool:
        return left["ts"] - self.before <= right["ts"] <= left["ts"] + self.after

    def seen(self, side: str, event_id: str) -> bool:
        return event_id in self._seen[side]

    def process(self, side: str, record: Record) -> list[Record]:
        """The results the record makes (empty for duplicates and late records)."""
        if record["event_id"] in self._seen[side]:
            return []
        self._seen[side].add(record["event_id"])
        if self._is_late(side, record["ts"]):
            self.late += 1
            return []
        self.stream_time = max(self.stream_time, record["ts"])
        other = "right" if side == "left" else "left"
        self._buffers[side].setdefault(record["auction_id"], []).append(record)
        results = []
        for candidate in self._buffers[other].get(record["auction_id"], []):
            left, right = (record, candidate) if side == "left" else (candidate, record)
            if self._matches(left, right):
                results.append(join_result(left, right))
        return results


class CampaignStats:
    """Per-campaign impressions and joined clicks (the click-through table)."""

    def __init__(self) -> None:
        self.impressions: dict[str, int] = defaultdict(int)
        self.clicks: dict[str, int] = defaultdict(int)

    def count(self, side: str, record: Record, results: list[Record]) -> None:
        if side == "left":
            self.impressions[record["campaign_id"]] += 1
        for result in results:
            self.clicks[result["campaign_id"]] += 1
