"""A user's clicks joined with the user's own earlier clicks: `faust -A examples.sessions worker`.

A self-join of the `clicks` topic (keyed by user) with itself (docs/join-semantics.md,
"Self-joins"): each click is joined with every other click of its user up to 30 minutes
(event time) before it, and written to `click-steps` as a step from that earlier click. A
left self-join: a click with no earlier click of its user within 30 minutes starts a session,
and is written there with `previous_click=None` once no earlier click can still arrive. The
number of sessions started per user is kept in a Faust table on the join's partitions (at
least once, as every output: a result handed over again after a crash counts again).

The batch side needs nothing more: `python -m pipeline join --app examples.sessions` computes
the same self-join on Spark from the topic, and `python -m pipeline reconcile --app
examples.sessions` checks what the workers produced against it (through the join's audit topic).

Settings from the environment: SESSIONS_BROKER (kafka://localhost:9092), SESSIONS_APP_ID
(sessions), SESSIONS_DATA_DIR (sessions-data), SESSIONS_WEB_PORT (6066), SESSIONS_PARTITIONS (4).
"""

from __future__ import annotations

import os
from datetime import timedelta

import faust
from faust.web import Request, Response, View

from tables import JoinInput, JoinResults, TandemAssignor, join

PARTITIONS = int(os.environ.get("SESSIONS_PARTITIONS", "4"))
SESSION_GAP = timedelta(minutes=30)

app = faust.App(
    os.environ.get("SESSIONS_APP_ID", "sessions"),
    broker=os.environ.get("SESSIONS_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,  # co-partitioned placement of the join, with standbys
    store="rocksdb://",
    datadir=os.environ.get("SESSIONS_DATA_DIR", "sessions-data"),
    web_port=int(os.environ.get("SESSIONS_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
)


class Click(faust.Record, serializer="json"):
    click_id: str
    user: str
    page: str


class Step(faust.Record, serializer="json"):
    click_id: str
    page: str
    previous_click: str | None = None  # None: this click starts a session
    previous_page: str | None = None


# Users as JSON strings, like the table's keys: a user's clicks, steps and session count are on
# the same partition.
clicks = app.topic("clicks", key_type=str, key_serializer="json", value_type=Click, partitions=PARTITIONS)
click_steps = app.topic(
    "click-steps", key_type=str, key_serializer="json", value_type=Step, partitions=PARTITIONS
)
sessions_started = app.Table("sessions-started", key_type=str, default=int, partitions=PARTITIONS)

# One reading of the topic, both roles: a click sent twice is joined once.
click_input = JoinInput(clicks, id="click_id")


@join(
    app,
    click_input,
    click_input,  # the same topic: a self-join, a click never joined with itself
    before=SESSION_GAP,  # each click with the user's clicks up to 30 minutes before it
    after=0,  # and none after it: each pair of clicks comes out once, from the later click
    grace=timedelta(minutes=1),  # how late (in event time) a click may still arrive
    how="left",  # a click with no earlier click in the gap comes out too: a session's first
    tables=[sessions_started],  # keyed by user, the join key: it lives on the join's partitions
    audit=True,  # an audit record per result: `python -m pipeline reconcile --app examples.sessions`
)
async def steps(results: JoinResults[str, Click, Click]) -> None:
    async for user, click, previous, _ts in results:
        assert click is not None  # a left join: every result has its click
        await click_steps.send(
            key=user,
            value=Step(
                click_id=click.click_id,
                page=click.page,
                previous_click=previous.click_id if previous else None,
                previous_page=previous.page if previous else None,
            ),
        )
        if previous is None:
            sessions_started[user] += 1


@app.page("/sessions/{user}/")
@app.table_route(table=sessions_started, match_info="user")
async def started(web: View, request: Request, user: str) -> Response:
    """A user's sessions started, answered by the worker that owns it (Faust routes the request)."""
    return web.json({"user": user, "sessions": sessions_started[user]})
