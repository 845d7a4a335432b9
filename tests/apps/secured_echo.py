"""A plain Faust app on a secured broker: `faust -A tests.apps.secured_echo worker`.

It sends SECURED_COUNT records to its topic when it starts and an agent appends each value
it reads to SECURED_OUT: both the producer and the group consumer (and Faust's own topic
creation) must get through the broker's TLS and SASL. How it connects is SECURED_MODE:

- `ssl_context`: the `ssl_context` setting alone (TLS);
- `ssl_credentials`: `broker_credentials=faust.SSLCredentials(context)` (TLS);
- `ssl_context_credentials`: `broker_credentials=<ssl.SSLContext>` (TLS; Faust wraps it);
- `sasl`: `broker_credentials=faust.SASLCredentials(username, password, mechanism, ssl_context)`
  (SASL_SSL with SECURED_CA set, SASL_PLAINTEXT without);
- `client_config`: a librdkafka/Java properties file, SECURED_CLIENT_CONFIG, through
  `assignor.clients.faust_credentials`.

SECURED_BROKER, SECURED_APP_ID, SECURED_TOPIC, SECURED_WEB_PORT, SECURED_CA (the test CA),
SECURED_MECHANISM, SECURED_USERNAME, SECURED_PASSWORD.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import faust

MODE = os.environ.get("SECURED_MODE", "ssl_context")
CA = os.environ.get("SECURED_CA", "")
OUT = Path(os.environ.get("SECURED_OUT", "secured-echo.out"))
COUNT = int(os.environ.get("SECURED_COUNT", "20"))


def _connection() -> dict[str, Any]:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=CA) if CA else None
    if MODE == "ssl_context":
        return {"ssl_context": context}
    if MODE == "ssl_credentials":
        return {"broker_credentials": faust.SSLCredentials(context)}
    if MODE == "ssl_context_credentials":
        return {"broker_credentials": context}
    if MODE == "sasl":
        credentials = faust.SASLCredentials(
            username=os.environ["SECURED_USERNAME"],
            password=os.environ["SECURED_PASSWORD"],
            mechanism=os.environ.get("SECURED_MECHANISM", "PLAIN"),
            ssl_context=context,
        )
        return {"broker_credentials": credentials}
    if MODE == "client_config":
        from assignor.clients import faust_credentials, parse_client_config

        config = parse_client_config(Path(os.environ["SECURED_CLIENT_CONFIG"]).read_text())
        return {"broker_credentials": faust_credentials(config)}
    raise ValueError(f"unknown SECURED_MODE {MODE!r}")


app = faust.App(
    os.environ.get("SECURED_APP_ID", "secured-echo"),
    broker=os.environ.get("SECURED_BROKER", "kafka://localhost:9092"),
    web_port=int(os.environ.get("SECURED_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    datadir=os.environ.get("SECURED_DATA_DIR", "secured-echo-data"),
    topic_partitions=2,
    **_connection(),
)
topic = app.topic(os.environ.get("SECURED_TOPIC", "secured-echo"), value_type=str, partitions=2)


@app.agent(topic)
async def echo(values: Any) -> None:
    async for value in values:
        with OUT.open("a") as out:
            out.write(f"{value}\n")


@app.task
async def send_records() -> None:
    for i in range(COUNT):
        await topic.send(key=str(i), value=f"record-{i}")
