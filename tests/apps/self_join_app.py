"""A self-join: each click joined with the other clicks of its user within 10 s
(`faust -A tests.apps.self_join_app worker`).

SELF_APP_BROKER, SELF_APP_ID, SELF_APP_PREFIX (topic names), APP_DATADIR, WEB_PORT.
"""

from __future__ import annotations

import os

import faust

from tables import JoinResults, TandemAssignor, join

PREFIX = os.environ.get("SELF_APP_PREFIX", "")
app = faust.App(
    os.environ.get("SELF_APP_ID", "self-join"),
    broker=os.environ.get("SELF_APP_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    web_bind="127.0.0.1",
)
clicks = app.topic(f"{PREFIX}clicks", key_type=str, value_type=str)
pairs = app.topic(f"{PREFIX}pairs", key_type=str, value_type=str)


@join(app, clicks, clicks, within=10, name="sessions")
async def sessions(results: JoinResults[str, str, str]) -> None:
    async for user, click, other, _ts in results:
        results.send_soon(pairs, key=user, value=f"{click}+{other}")
