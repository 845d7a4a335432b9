"""Real Faust worker processes on the embedded broker: rolling upgrade and start-up checks.

Each test has its own app id (group id) and topic; every wait is bounded and
workers are stopped by their process ids.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tables.testing import EmbeddedBroker, create_topics, free_port

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


class Probe:
    """One `python -m tests.faust_probe` worker process."""

    def __init__(self, mode: str, name: str, run_dir: Path, **env: str) -> None:
        self.mode, self.name, self.run_dir, self.env = mode, name, run_dir, env
        self.report = run_dir / f"{name}.json"
        self.log = run_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, app_id: str, bootstrap: str, topic: str) -> Probe:
        env = {**os.environ, **self.env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.faust_probe",
                    self.mode,
                    app_id,
                    bootstrap,
                    topic,
                    str(self.report),
                ],
                cwd=self.run_dir,  # Faust writes its data dir ({app id}-data) in the working directory
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.report.read_text())
        except (OSError, ValueError):
            return None

    def partitions(self) -> list[int]:
        state = self.state()
        return state["partitions"] if state else []

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (the worker leaves the group), SIGKILL if it lingers; by pid."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return predicate()


@contextmanager
def probes(*workers: Probe) -> Iterator[tuple[Probe, ...]]:
    try:
        yield workers
    finally:
        for worker in workers:
            worker.stop()


def _logs(*workers: Probe) -> str:
    return "\n".join(f"--- {w.name}\n{w.log.read_text()[-3000:]}" for w in workers if w.log.exists())


def test_stock_and_tandem_share_a_group_then_it_switches_to_tandem(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic, app_id = f"upgrade-{unique}", f"upgrade-app-{unique}"
    asyncio.run(create_topics(broker.bootstrap, {topic: PARTITIONS}))
    stock = Probe("stock", "stock", tmp_path, PROBE_WEB_PORT="6071")
    ours = Probe("tandem", "tandem", tmp_path, PROBE_WEB_PORT="6072")
    with probes(stock, ours):
        # The stock worker creates the group, as in a cluster before the upgrade.
        stock.start(app_id, broker.bootstrap, topic)
        assert wait_for(lambda: len(stock.partitions()) == PARTITIONS, 40), _logs(stock)
        ours.start(app_id, broker.bootstrap, topic)

        def shared() -> bool:
            a, b = stock.partitions(), ours.partitions()
            return bool(a) and bool(b) and sorted(a + b) == list(range(PARTITIONS))

        assert wait_for(shared, 40), _logs(stock, ours)
        assert ours.state()["planned_by"] == "faust"  # type: ignore[index]

        # The last stock worker leaves: every member speaks Tandem now.
        stock.stop()

        def switched() -> bool:
            state = ours.state() or {}
            return state.get("planned_by") == "tandem" and ours.partitions() == list(range(PARTITIONS))

        assert wait_for(switched, 30), _logs(ours)
        assert "Traceback" not in ours.log.read_text()


def test_a_join_with_different_partition_counts_stops_the_worker(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    left, right = f"left-{unique}", f"right-{unique}"
    asyncio.run(create_topics(broker.bootstrap, {left: 4, right: 3}))
    worker = Probe("tandem", "mismatch", tmp_path, PROBE_JOIN_WITH=right, PROBE_WEB_PORT="6073")
    with probes(worker):
        worker.start(f"mismatch-{unique}", broker.bootstrap, left)
        assert worker.process is not None
        try:
            worker.process.wait(timeout=45)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker kept running:\n" + _logs(worker))
        log = worker.log.read_text()
        assert worker.process.returncode != 0
        assert f"{left}=4" in log and f"{right}=3" in log, log[-3000:]
        assert not worker.partitions()


def test_a_new_group_of_tandem_workers_plans_with_tandem_and_shares_routing(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic, app_id = f"fresh-{unique}", f"fresh-app-{unique}"
    asyncio.run(create_topics(broker.bootstrap, {topic: PARTITIONS}))
    one = Probe("tandem", "one", tmp_path, PROBE_WEB="1", PROBE_WEB_PORT=str(free_port()))
    two = Probe("tandem", "two", tmp_path, PROBE_WEB="1", PROBE_WEB_PORT=str(free_port()))
    with probes(one, two):
        one.start(app_id, broker.bootstrap, topic)
        two.start(app_id, broker.bootstrap, topic)

        def settled() -> bool:
            states = [one.state() or {}, two.state() or {}]
            owned = sorted(one.partitions() + two.partitions())
            return owned == list(range(PARTITIONS)) and all(
                s.get("planned_by") == "tandem"
                and one.partitions()
                and two.partitions()
                # The follower fetched the leader's routing table for this generation.
                and s.get("routing_epoch") == s.get("epoch")
                for s in states
            )

        assert wait_for(settled, 45), _logs(one, two)
        assert "protocol tandem" in one.log.read_text() + two.log.read_text()
