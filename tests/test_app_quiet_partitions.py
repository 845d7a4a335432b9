"""Real workers on the embedded broker (tests/apps/quiet_parcels.py: a left enrichment with
5 s of grace, `idle=2 s`, `audit=True`):

- a lone scan, with no other traffic, comes out un-enriched (docs/join-semantics.md, "Idle
  partitions"), its audit record marked idle;
- a scan with no Kafka key comes out at once with no depot (KIP-962); a depot with no key is
  dead-lettered (`null_key`);
- a scan produced just before a SIGKILL comes out after the restart; nothing comes out that
  was not produced, and what was handed over before the kill is not handed over again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, read_records, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 2


def test_a_quiet_partition_and_null_keys_through_a_sigkill(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    prefix = f"qp{unique}-"
    app_id = f"quiet-{unique}"
    topics = {f"{prefix}{t}": PARTITIONS for t in ("scans", "depots", "located")}
    asyncio.run(create_topics(broker.bootstrap, topics))
    env = {**embedded_env(), "QUIET_BROKER": f"kafka://{broker.bootstrap}", "QUIET_APP_ID": app_id,
           "QUIET_PREFIX": prefix}  # fmt: skip
    worker = WorkerProcess("w1", "tests.apps.quiet_parcels", tmp_path, dict(env), cwd=REPO)
    worker.extra_env |= {"QUIET_WEB_PORT": str(worker.port), "QUIET_DATA_DIR": str(tmp_path / "w1")}
    worker.start()
    try:
        assert wait_for(lambda: _ready(worker), 90), worker.log_path.read_text(errors="replace")[-3000:]
        now = int(time.time() * 1000)
        # One scan, no depot, no other traffic: only the idle clock can release it.
        _send(broker, [(f"{prefix}scans", b"p1", {"scan": 1, "ts": now})])
        assert wait_for(lambda: _scans(broker, prefix)[1] >= 1, 90), _scans(broker, prefix)
        first = _located(broker, prefix)
        assert [(r["parcel"], r["depot"]) for r in first] == [("p1", None)]
        audit = _audit(broker, app_id)
        assert [a.get("idle") for a in audit] == [True]
        # No key: a result at once (grace and idle do not concern it); a keyless depot: a dead letter.
        _send(broker, [(f"{prefix}scans", None, {"scan": 2, "ts": now + 1_000}),
                       (f"{prefix}depots", None, {"depot": "nowhere", "ts": now})])  # fmt: skip
        assert wait_for(lambda: _scans(broker, prefix)[2] >= 1, 60), _scans(broker, prefix)
        assert wait_for(lambda: _letters(broker, app_id) == ["null_key"], 30), _letters(broker, app_id)
        # A scan produced, then the worker SIGKILLed before its grace can pass; restarted.
        _send(broker, [(f"{prefix}scans", b"p2", {"scan": 3, "ts": now + 2_000})])
        worker.kill()
        worker.start()
        assert wait_for(lambda: _scans(broker, prefix)[3] >= 1, 120), (
            _scans(broker, prefix),
            worker.log_path.read_text(errors="replace")[-3000:],
        )
        worker.check()
    finally:
        worker.stop(15)
    found = _scans(broker, prefix)
    # Every scan came out; the two handed over before the kill exactly once (they were
    # committed long before it), the third at least once; nothing else.
    assert set(found) == {1, 2, 3} and found[1] == found[2] == 1 and found[3] >= 1, found
    results = {r["scan"]: r for r in _located(broker, prefix)}
    assert results[2]["parcel"] is None and results[2]["depot"] is None
    assert results[3]["parcel"] == "p2" and results[3]["depot"] is None


def _ready(worker: WorkerProcess) -> bool:
    worker.check()
    join = ((worker.view() or {}).get("joins") or {}).get("locate")
    return bool(join) and not join["restoring"] and sorted(join["actives"]) == list(range(PARTITIONS))


def _send(broker: EmbeddedBroker, records: list[tuple[str, bytes | None, dict[str, Any]]]) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for topic, key, value in records:
                # A keyless record goes to partition 0 (any partition would do).
                await producer.send_and_wait(topic, json.dumps(value).encode(), key=key,
                                             partition=None if key is not None else 0)  # fmt: skip
        finally:
            await producer.stop()

    asyncio.run(send())


def _located(broker: EmbeddedBroker, prefix: str) -> list[dict[str, Any]]:
    records = asyncio.run(read_records(broker.bootstrap, f"{prefix}located", PARTITIONS))
    return [json.loads(r.value) for r in records]


def _scans(broker: EmbeddedBroker, prefix: str) -> Counter[int]:
    return Counter(r["scan"] for r in _located(broker, prefix))


def _audit(broker: EmbeddedBroker, app_id: str) -> list[dict[str, Any]]:
    records = asyncio.run(read_records(broker.bootstrap, f"{app_id}-locate-audit", PARTITIONS))
    return [json.loads(r.value) for r in records]


def _letters(broker: EmbeddedBroker, app_id: str) -> list[str]:
    records = asyncio.run(read_records(broker.bootstrap, f"{app_id}-locate-dead-letters", PARTITIONS))
    return [json.loads(r.value)["category"] for r in records]
