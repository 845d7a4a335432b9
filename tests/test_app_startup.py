"""What a worker checks before it joins its group: a join that cannot be right refuses to start,
saying why, instead of silently losing results (a second worker on one data dir:
tests/test_app_state_faults.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from app.cluster import WorkerProcess
from app.settings import from_env
from tables.testing import EmbeddedBroker, create_topics, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


def _worker(
    broker: EmbeddedBroker, unique: str, run_dir: Path, name: str = "w1", **kw: object
) -> WorkerProcess:
    settings = dataclasses.replace(from_env(), app_id=f"start-{unique}", topic_prefix=f"st{unique}-")
    return WorkerProcess(
        name, "host-a", "r", broker.bootstrap, settings.app_id, run_dir, standby_replicas=0,
        partitions=4, topic_prefix=settings.topic_prefix, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_inputs_with_different_partition_counts_stop_the_worker(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    asyncio.run(create_topics(broker.bootstrap, {f"st{unique}-impressions": 4, f"st{unique}-clicks": 2}))
    worker = _worker(broker, unique, tmp_path).start()
    assert wait_for(lambda: not worker.alive, 60), "the worker started anyway"
    log = worker.log_path.read_text()
    assert worker.process is not None and worker.process.returncode == 1
    assert f"st{unique}-clicks=2" in log and f"st{unique}-impressions=4" in log and "co-partitioned" in log
    # One clear line, the last, and no traceback (the cause is logged at DEBUG).
    assert (
        "[CRITICAL] tandem cannot start: join 'ad-join' needs its inputs co-partitioned"
        in log.splitlines()[-1]
    )
    assert "Traceback" not in log
