"""A join of orders with payments, and an `@app.agent` counting the same orders:
`faust -A tests.apps.agent_beside_join worker`.

AGENT_APP_BROKER, AGENT_APP_ID, AGENT_APP_PREFIX (topic names), AGENT_APP_GATE (a file: the
agent waits for it to exist before it takes an order whose value is "gate"),
AGENT_APP_PAUSE_S (how long the agent takes per order), APP_DATADIR, WEB_PORT.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import faust

from tables import JoinResults, TandemAssignor, join

PREFIX = os.environ.get("AGENT_APP_PREFIX", "")
GATE = Path(os.environ.get("AGENT_APP_GATE", "agent-gate"))
PAUSE_S = float(os.environ.get("AGENT_APP_PAUSE_S", "0"))

app = faust.App(
    os.environ.get("AGENT_APP_ID", "agent-beside-join"),
    broker=os.environ.get("AGENT_APP_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    web_bind="127.0.0.1",
)
orders = app.topic(f"{PREFIX}orders", key_type=str, value_type=str)
payments = app.topic(f"{PREFIX}payments", key_type=str, value_type=str)
paid = app.topic(f"{PREFIX}paid", key_type=str, value_type=str)
counted = app.topic(f"{PREFIX}counted", key_type=str, value_type=str)


@join(app, orders, payments, within=600, name="paid")
async def paid_orders(results: JoinResults[str, str, str]) -> None:
    async for order_id, order, payment, _ts in results:
        results.send_soon(paid, key=order_id, value=f"{order}+{payment}")


@app.agent(orders)
async def count_orders(stream: faust.StreamT[str]) -> None:
    async for order_id, order in stream.items():
        while order == "gate" and not GATE.exists():
            await asyncio.sleep(0.1)
        if PAUSE_S:
            await asyncio.sleep(PAUSE_S)
        await counted.send(key=order_id, value=order)
