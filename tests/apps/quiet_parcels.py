"""Parcel scans enriched with depots on quiet partitions: `faust -A tests.apps.quiet_parcels worker`.

A left enrichment join (5 s of grace) with `idle=2 s`: a lone scan comes out un-enriched a few
seconds after it arrived, with no other traffic; a scan without a Kafka key comes out at once,
un-enriched (KIP-962). Each result is sent to `{prefix}located` as JSON, keyed like the scan.

QUIET_BROKER, QUIET_APP_ID, QUIET_PREFIX, QUIET_DATA_DIR, QUIET_WEB_PORT.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinResults, join_table

PREFIX = os.environ.get("QUIET_PREFIX", "")
PARTITIONS = 2
app = faust.App(
    os.environ.get("QUIET_APP_ID", "quiet-parcels"),
    broker=os.environ.get("QUIET_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    datadir=os.environ.get("QUIET_DATA_DIR", "quiet-parcels-data"),
    web_port=int(os.environ.get("QUIET_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
)
scans = app.topic(f"{PREFIX}scans", key_type=str, value_serializer="json", partitions=PARTITIONS)
depots = app.topic(f"{PREFIX}depots", key_type=str, value_serializer="json", partitions=PARTITIONS)
located = app.topic(f"{PREFIX}located", key_type=str, value_serializer="json", partitions=PARTITIONS)


@join_table(
    app, scans, depots, how="left", grace=timedelta(seconds=5), timestamp="ts", audit=True,
    idle=timedelta(seconds=2), name="locate",
)  # fmt: skip
async def locate(results: JoinResults[str, dict[str, Any], dict[str, Any]]) -> None:
    async for parcel, scan, depot, ts in results:
        value = {"parcel": parcel, "scan": scan["scan"], "depot": depot and depot["depot"], "ts": ts}
        results.send_soon(located, key=parcel, value=value)
