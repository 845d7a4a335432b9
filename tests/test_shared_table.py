"""Several joins reading one topic (tests/apps/shared_table.py: one table enriching two
streams), on real workers: the table is fetched once and handed to both joins; both joins'
partitions are placed together; a SIGKILL and a restart lose nothing, and every event is
enriched with the tier its customer had at its time."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from assignor import clients
from tables.testing import LocalCluster
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parent.parent
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)
CUSTOMERS = [f"c{i}" for i in range(16)]


async def produce(bootstrap: str, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    try:
        for topic, key, value in sorted(rows, key=lambda r: r[2]["ts"]):
            await producer.send(topic, json.dumps(value).encode(), key=key.encode(), timestamp_ms=value["ts"])
        await producer.flush()
    finally:
        await producer.stop()


def test_two_joins_read_one_table_through_a_kill_and_a_restart(tmp_path: Path) -> None:
    # Each customer is "basic" from T0, "gold" from T0 + 100 s.
    profiles = [("customers", c, {"tier": tier, "ts": T0 + at}) for c in CUSTOMERS for tier, at in
                (("basic", 0), ("gold", 100_000))]  # fmt: skip
    events = [
        (topic, c, {"event_id": f"{topic}-{c}-{n}", "ts": T0 + 10_000 * n + i})
        for i, c in enumerate(CUSTOMERS)
        for n in range(1, 20)
        for topic in ("orders", "payments")
    ]
    ticks = [("customers", c, {"tier": "tick", "ts": T0 + 3_000_000}) for c in CUSTOMERS]
    with LocalCluster("tests.apps.shared_table", 2, standbys=1, run_dir=tmp_path, cwd=REPO) as c:
        c.wait_ready()
        views = [w.view() for w in c.workers]
        for view in views:  # partition p of both joins on one worker
            joins = view["joins"]  # type: ignore[index]
            assert joins["order-tiers"]["actives"] == joins["payment-tiers"]["actives"], joins
        asyncio.run(produce(c.bootstrap, profiles))
        c.wait_caught_up()
        asyncio.run(produce(c.bootstrap, events[: len(events) // 2]))
        c.workers[0].kill()
        asyncio.run(produce(c.bootstrap, events[len(events) // 2 :]))
        c.wait_ready(timeout=120)
        c.add_worker(c.workers[0].name)  # the victim back, on its own files
        c.wait_ready(timeout=120)
        asyncio.run(produce(c.bootstrap, ticks))  # stream time past every grace
        wanted = {e[2]["event_id"] for e in events}
        out = asyncio.run(_read(c.bootstrap, "enriched", lambda rs: {r["event"] for r in rs} >= wanted, 120))
    tiers: dict[str, set[str | None]] = {}
    for record in out:
        tiers.setdefault(record["event"], set()).add(record["tier"])
    assert set(tiers) == wanted, f"{len(wanted - set(tiers))} events lost"
    for _, _, event in events:
        expected = "gold" if event["ts"] >= T0 + 100_000 else "basic"
        assert tiers[event["event_id"]] == {expected}, (event, tiers[event["event_id"]])
