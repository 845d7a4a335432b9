"""A stream enriched from a global table (`faust -A tests.apps.global_table worker`): clicks
keyed by click id, each looked up in the campaigns table by its value's `campaign` field. The
table has 3 partitions, the stream 4: no co-partitioning; every worker holds every campaign."""

from __future__ import annotations

import faust

from tables import JoinInput, JoinResults, TandemAssignor, join_global

app = faust.App("global-table", PartitionAssignor=TandemAssignor, topic_partitions=4)


class Campaign(faust.Record, serializer="json"):
    title: str


class Click(faust.Record, serializer="json"):
    click_id: str
    campaign: str
    ts: int


def campaign_of(click: Click) -> str:
    if click.campaign == "boom":
        raise ValueError("no campaign 'boom'")
    return click.campaign


campaigns = app.topic("campaigns", key_type=str, value_type=Campaign, partitions=3)
clicks = app.topic("clicks", key_type=str, value_type=Click, partitions=4)
out = app.topic("clicks-enriched", key_type=str, partitions=4)


@join_global(app, JoinInput(clicks, timestamp="ts"), campaigns, key=campaign_of, how="inner", audit=True)
async def enriched_clicks(results: JoinResults[str, Click, Campaign]) -> None:
    async for key, click, campaign, _ts in results:
        await out.send(key=key, value={"click": click.click_id, "title": campaign.title, "how": "inner"})


@join_global(app, JoinInput(clicks, timestamp="ts"), campaigns, key="campaign", how="left", audit=True)
async def all_clicks(results: JoinResults[str, Click, Campaign]) -> None:
    async for key, click, campaign, _ts in results:
        title = campaign.title if campaign is not None else None
        await out.send(key=key, value={"click": click.click_id, "title": title, "how": "left"})
