"""A user's app as the README writes it, with no web settings of its own:
`faust -A tests.apps.user_app worker`. Faust's own environment variables configure it
(BROKER_URL, WEB_PORT, APP_DATADIR, WEB_BIND ...); USER_APP_ID and USER_APP_PREFIX name its
group and topics; with USER_APP_PASSWORD set it connects with SASL (USER_APP_MECHANISM,
USER_APP_USERNAME) over plaintext, as `faust.SASLCredentials` says.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

from tables import JoinResults, TandemAssignor, join

PREFIX = os.environ.get("USER_APP_PREFIX", "")


def _credentials() -> dict[str, Any]:
    password = os.environ.get("USER_APP_PASSWORD")
    if not password:
        return {}
    credentials = faust.SASLCredentials(
        username=os.environ["USER_APP_USERNAME"],
        password=password,
        mechanism=os.environ.get("USER_APP_MECHANISM", "PLAIN"),
    )
    return {"broker_credentials": credentials}


app = faust.App(
    os.environ.get("USER_APP_ID", "paid"),
    broker="kafka://localhost:9092",
    PartitionAssignor=TandemAssignor,
    **_credentials(),
)
orders = app.topic(f"{PREFIX}orders", key_type=str, value_type=str)
payments = app.topic(f"{PREFIX}payments", key_type=str, value_type=str)
paid_orders = app.topic(f"{PREFIX}paid-orders", key_type=str, value_type=str)


@join(app, orders, payments, after=timedelta(minutes=10), grace=timedelta(minutes=1), how="left")
async def paid(results: JoinResults[str, str, str]) -> None:
    async for order_id, order, payment, _ts in results:
        await paid_orders.send(key=order_id, value=f"{order}+{payment}")
