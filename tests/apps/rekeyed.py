"""A windowed join with both inputs rekeyed, for the batch twin's test of rekeyed inputs
(tests/test_pipeline_rekey.py): clicks keyed by user (2 partitions) and impressions keyed by
ad (3 partitions), joined by auction within 10 s, left. Importing this module declares it (no
worker is started); Spark's workers import it too."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinInput, JoinResults, join

app = faust.App("twin-rekeyed", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)


class Click(faust.Record, serializer="json"):
    user: str
    auction: str
    ts: int


class Impression(faust.Record, serializer="json"):
    auction: str
    ad: str
    ts: int


clicks = app.topic("rk-clicks", key_type=str, value_type=Click, partitions=2)
impressions = app.topic("rk-impressions", key_type=str, value_type=Impression, partitions=3)


def auction_of(impression: Impression) -> str:
    if impression.ad == "boom":
        raise ValueError("no auction")
    return impression.auction


@join(
    app,
    JoinInput(clicks, key="auction"),
    JoinInput(impressions, key=auction_of),
    within=timedelta(seconds=10),
    how="left",
    timestamp="ts",
    audit=True,
)
async def attributed(results: JoinResults[Any, Click, Impression]) -> None:
    async for _ in results:
        pass
