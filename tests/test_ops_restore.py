"""Restore progress as an operator sees it: in the worker's view and its /metrics while a
partition restores a real changelog, and in the progress line the restore logs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from app.cluster import WorkerProcess
from app.settings import create_topics, from_env
from tables.kafka.batches import send_records
from tables.kafka.topics import changelog_configs
from tables.kafka.topics import create_topics as create_with_configs
from tables.operators.kv import MemoryKV
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.state.recovery import RestoreProgress
from tables.testing import EmbeddedBroker, wait_for
from tests.ops_checks import exposition

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]
IMPRESSIONS = 100_000


async def _fill_changelog(bootstrap: str, topic: str, base_ts: int) -> int:
    """The changelog a worker would have written for IMPRESSIONS impressions of partition 0;
    how many records it holds."""
    join = WindowedJoin(MemoryKV(), JoinWindow(0, 600_000, 60_000), JoinType.INNER, ids=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=512 * 1024)
    await producer.start()
    written = 0
    try:
        for start in range(0, IMPRESSIONS, 20_000):
            for n in range(start, start + 20_000):
                ts = base_ts + n // 1000
                value = {"event_id": f"i{n}", "auction_id": f"a{n}", "campaign_id": "c", "ts": ts}
                join.process("left", f"a{n}".encode(), ts, f"i{n}".encode(), orjson.dumps(value))
            changes = join.take_changes()
            await send_records(producer, topic, 0, changes)
            written += len(changes)
    finally:
        await producer.stop()
    return written


def test_a_restore_shows_its_progress_in_the_view_and_the_metrics(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        from_env(), app_id=f"restore-{unique}", topic_prefix=f"r{unique}-", partitions=1
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    configs = {settings.changelog: changelog_configs(None)}
    asyncio.run(create_with_configs(broker.bootstrap, {settings.changelog: 1}, configs))
    base_ts = int(time.time() * 1000) - 3_600_000
    records = asyncio.run(_fill_changelog(broker.bootstrap, settings.changelog, base_ts))
    worker = WorkerProcess(
        "w1", "host-a", "r", broker.bootstrap, settings.app_id, tmp_path,
        standby_replicas=0, partitions=1, topic_prefix=settings.topic_prefix,
    ).start()  # fmt: skip
    try:
        seen: list[dict] = []
        metrics: list[float] = []

        def restoring() -> bool:
            worker.check()
            found = (worker.join() or {}).get("restoring", {}).get("0")
            if found and found["to_go"]:
                seen.append(found)
                metrics.extend(_restore_to_go(worker))
            return len(seen) >= 2

        assert wait_for(restoring, 60, 0.02), f"no restore seen in progress; {seen}"
        first, later = seen[0], seen[-1]
        assert 0 < first["to_go"] <= records and first["restored"] + first["to_go"] <= records
        assert later["restored"] >= first["restored"] and later["rate_per_s"] > 0
        assert later["eta_s"] is not None and later["eta_s"] >= 0
        assert metrics and all(0 <= m <= records for m in metrics), metrics
        # Done: nothing to go, and every record of the changelog counted as restored.
        assert wait_for(lambda: not (worker.join() or {}).get("restoring"), 60)
        page = exposition(_metrics(worker))["samples"]
        assert [s.value for s in page["tandem_restore_records_to_go"]] == [0]
        assert [s.value for s in page["tandem_restore_records_restored"]] == [records]
        assert worker.join()["last_rebalance"]["replayed"] == records  # type: ignore[index]
    finally:
        worker.stop(15)


def _metrics(worker: WorkerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _restore_to_go(worker: WorkerProcess) -> list[float]:
    try:
        page = exposition(_metrics(worker))["samples"]
    except OSError:
        return []
    return [s.value for s in page.get("tandem_restore_records_to_go", [])]


def test_the_progress_line_says_done_to_go_rate_and_eta() -> None:
    """The line the restore logs every few seconds (tables/state/recovery.py)."""
    started = time.monotonic() - 10.0
    progress = RestoreProgress(0, started=started, restored=40_000, position=40_000, end=100_000)
    line = progress.describe()
    assert line.startswith("40,000 records restored, 60,000 to go, ")
    rate = float(line.split(", ")[2].removesuffix("/s").replace(",", ""))
    assert 3_900 <= rate <= 4_000  # 40,000 in a bit over 10 s
    assert line.endswith("about 15 s to go")
