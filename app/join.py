"""The reference app: impressions joined with clicks by auction id (`faust -A app worker`).

Everything here is the app's own: its records, the join declaration, the handler
that writes each result to `ad-joins` and counts click-throughs per campaign in a
Faust table. Tandem (`tables`, `assignor`) does the rest: co-partitioned placement
with standbys, dead letters, event-time alignment, RocksDB state and its changelog,
restores, and commits only once results are handled.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import faust
from faust.web import Request, Response, View

from app.records import MAX_VALUE_BYTES, Click, Impression, ad_join, check_event
from app.settings import JOIN_NAME, Settings
from assignor.clients import faust_credentials, parse_client_config
from tables import JoinInput, JoinResults, TandemAssignor, join


def build(settings: Settings) -> faust.App:
    """The Faust app configured from `settings` (see app/settings.py)."""
    app = faust.App(settings.app_id, PartitionAssignor=TandemAssignor, **faust_settings(settings))
    impressions = app.topic(settings.impressions, key_type=str, value_type=Impression)
    clicks = app.topic(settings.clicks, key_type=str, value_type=Click)
    output = app.topic(settings.joins, key_type=str)
    # Joined clicks per campaign. The table lives on the join's partitions, so each
    # partition counts its own: the key names both (docs/join-semantics.md, "Tables").
    click_throughs = app.Table("click-throughs", default=int, partitions=settings.partitions)

    @join(
        app,
        JoinInput(impressions, validate=check_event),
        JoinInput(clicks, validate=check_event),
        before=0,
        # A click within 10 minutes after its impression, a minute late at most (the defaults).
        after=timedelta(milliseconds=settings.join_after_ms),
        grace=timedelta(milliseconds=settings.join_grace_ms),
        how="inner",
        name=JOIN_NAME,
        timestamp="ts",
        id="event_id",
        tables=[click_throughs],
        max_value_bytes=MAX_VALUE_BYTES,
        audit=True,  # what `python -m pipeline reconcile --app app` judges (app/chaos.py runs it)
    )
    async def ad_joins(results: JoinResults[str, Impression, Click]) -> None:
        async for batch in results.batches():
            clicked: Counter[str] = Counter()
            for auction, impression, click, ts in batch.results:
                results.send_soon(output, key=auction, value=ad_join(auction, impression, click, ts))
                clicked[impression.campaign_id] += 1  # type: ignore[union-attr]
            for campaign, n in clicked.items():
                click_throughs[f"{campaign}@{batch.partition}"] += n

    @app.page("/ad/click-throughs")
    async def per_campaign(web: View, request: Request) -> Response:
        """Joined clicks per campaign over this worker's partitions of the join."""
        actives = {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == settings.impressions}
        totals: Counter[str] = Counter()
        for key, n in click_throughs.items():
            campaign, partition = key.rsplit("@", 1)
            if int(partition) in actives:
                totals[campaign] += n
        return web.json(dict(sorted(totals.items())))

    return app


def credentials(client_config: str | None) -> Any:
    """Faust's `broker_credentials` for a client properties file (None: plaintext)."""
    if client_config is None:
        return None
    return faust_credentials(parse_client_config(Path(client_config).read_text()))


def faust_settings(settings: Settings) -> dict[str, Any]:
    return {
        "broker": settings.broker,
        # TANDEM_CLIENT_CONFIG: the cluster's TLS and SASL settings, from a properties file.
        "broker_credentials": credentials(settings.client_config),
        "datadir": str(settings.data_dir),
        "store": "rocksdb://",
        "web_port": settings.web_port,
        "web_bind": settings.web_bind,
        "canonical_url": settings.url,
        "table_standby_replicas": settings.standby_replicas,
        "topic_partitions": settings.partitions,
        "topic_replication_factor": settings.replication_factor,
        "broker_session_timeout": settings.session_timeout_ms / 1000,
        "broker_heartbeat_interval": settings.heartbeat_ms / 1000,
        "broker_request_timeout": settings.request_timeout_ms / 1000,
        "consumer_auto_offset_reset": "earliest",
        # No transactions on the embedded broker (docs/embedded-broker.md).
        "processing_guarantee": "at_least_once",
        "broker_commit_interval": 1.0,
        "web_in_thread": False,
    }
