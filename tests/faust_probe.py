"""A minimal Faust worker, stock or Tandem, that reports its assignment to a JSON file.

Used by the rolling-upgrade test (one stock Faust worker and one Tandem
worker in one group) and handy to try the adapter by hand::

    python -m tests.faust_probe tandem|stock APP_ID BOOTSTRAP TOPIC REPORT_FILE

Group settings come from ``tables.testing.FAST_GROUP_SETTINGS`` (the embedded
broker holds every JoinGroup for half the session timeout).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join, install
from tables.testing import FAST_GROUP_SETTINGS


def build(mode: str, app_id: str, bootstrap: str, topic: str, report: Path) -> faust.App:
    tandem = mode == "tandem"
    extra: dict[str, Any] = {"PartitionAssignor": TandemAssignor} if tandem else {}
    port = int(os.environ.get("PROBE_WEB_PORT", "6066"))
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        # PROBE_WEB=1: serve the web (and the routing table) on 127.0.0.1.
        web_enabled=os.environ.get("PROBE_WEB") == "1",
        web_port=port,
        web_bind="127.0.0.1",
        canonical_url=f"http://127.0.0.1:{port}",
        broker_session_timeout=FAST_GROUP_SETTINGS["session_timeout_ms"] / 1000,
        broker_heartbeat_interval=FAST_GROUP_SETTINGS["heartbeat_interval_ms"] / 1000,
        broker_request_timeout=FAST_GROUP_SETTINGS["request_timeout_ms"] / 1000,
        topic_disable_leader=True,
        **extra,
    )
    source = app.topic(topic, value_serializer="raw")

    @app.agent(source)
    async def consume(stream: Any) -> None:
        async for _ in stream:
            pass

    @app.timer(0.3)
    async def write_report() -> None:
        _write(report, _state(app, topic))

    if tandem:
        # PROBE_JOIN_WITH: a second input of the join, to try the start-up check.
        other = os.environ.get("PROBE_JOIN_WITH")
        declare_join(app, topics=[topic, other] if other else [topic])
        install(app)
    return app


def _state(app: faust.App, topic: str) -> dict[str, Any]:
    assignor = app.assignor
    info = getattr(assignor, "last_rebalance", None)
    routing = getattr(assignor, "routing", None)
    return {
        "pid": os.getpid(),
        "assignor": type(assignor).__name__,
        "planned_by": info.protocol if info else "faust-stock",
        "epoch": info.epoch if info else None,
        "routing_epoch": routing.epoch if routing else None,
        "partitions": sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == topic),
    }


def _write(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)  # readers never see half a file


def main(argv: list[str]) -> None:
    mode, app_id, bootstrap, topic, report = argv
    app = build(mode, app_id, bootstrap, topic, Path(report))
    worker = faust.Worker(app, loglevel="info")
    worker.execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])
