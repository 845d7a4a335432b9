"""Two joins in one app, with different partition counts: `faust -A tests.apps.two_joins worker`.

TWO_JOINS_BROKER, TWO_JOINS_APP_ID, TWO_JOINS_PREFIX, TWO_JOINS_DATA_DIR, TWO_JOINS_WEB_PORT.
"""

from __future__ import annotations

import os

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinResults, join

PREFIX = os.environ.get("TWO_JOINS_PREFIX", "")
app = faust.App(
    os.environ.get("TWO_JOINS_APP_ID", "two-joins"),
    broker=os.environ.get("TWO_JOINS_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    datadir=os.environ.get("TWO_JOINS_DATA_DIR", "two-joins-data"),
    web_port=int(os.environ.get("TWO_JOINS_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
)
out = app.topic(f"{PREFIX}out", key_type=str, value_type=str)


def _joined(name: str, inputs: tuple[str, str], partitions: int) -> None:
    left, right = (
        app.topic(f"{PREFIX}{t}", key_type=str, value_type=str, partitions=partitions) for t in inputs
    )

    async def handler(results: JoinResults[str, str, str]) -> None:
        async for key, a, b, _ts in results:
            results.send_soon(out, key=key, value=f"{name}:{a}+{b}")

    join(app, left, right, within=60, name=name)(handler)


_joined("narrow", ("a1", "a2"), 2)
_joined("wide", ("b1", "b2"), 4)
