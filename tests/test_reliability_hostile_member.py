"""A member that sends hostile subscription user data cannot hurt its group (issue 36,
finding 3), live: two real workers of the reference app on the embedded broker, and a
hostile member (tests/hostile_member.py, its own process: a real aiokafka consumer speaking
the `tandem` protocol, no mocks) joining their group with each payload in turn.

The hostile member subscribes to the join's output topic only: it is eligible for none of
the join's tasks, so the good workers must keep exactly their partitions and standbys, in
Tandem assignments every member reads (before the fix an epoch of 2**70 - 1 left every member
with bare partitions and no standbys, and 58 KB of user data stalled the leader past the
session timeout).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.cluster import REPO, WorkerProcess, join_view, wait_for
from tables.testing import EmbeddedBroker
from tests.workers import PARTITIONS, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(420)]

# The payloads a member can send without a single valid claim (tests/hostile_payloads.py).
PAYLOADS = [
    "huge-epoch",
    "amplification-58k",
    "many-topics",
    "repeated-topic",
    "epoch-above-bound",
    "garbage",
]


def _held(workers: list[WorkerProcess]) -> dict[str, Any] | None:
    """Each worker's (epoch, protocol, join actives, join standbys) once they agree on one
    epoch twice in a row and every partition is owned once with a standby; else None."""
    looks = []
    for _ in range(2):
        found = {}
        for worker in workers:
            view = worker.view()
            join = join_view(view)
            if view is None or join is None or join.get("warmups") or join.get("restoring"):
                return None
            found[worker.name] = (
                view["epoch"],
                (view.get("group_rebalance") or {}).get("protocol"),
                sorted(join["actives"]),
                sorted(join["standbys"]),
            )
        looks.append(found)
        time.sleep(0.3)
    first, second = looks
    if first != second or len({epoch for epoch, *_ in first.values()}) != 1:
        return None
    actives = sorted(p for _, _, act, _ in first.values() for p in act)
    standbys = sorted(p for _, _, _, sby in first.values() for p in sby)
    if actives != list(range(PARTITIONS)) or standbys != list(range(PARTITIONS)):
        return None
    return first


def _wait_held(workers: list[WorkerProcess], after_epoch: int, timeout: float) -> dict[str, Any] | None:
    found: list[dict[str, Any]] = []

    def done() -> bool:
        for worker in workers:
            worker.check()  # a crashed worker fails now, with its log
        held = _held(workers)
        if held is None or next(iter(held.values()))[0] <= after_epoch:
            return False
        found.append(held)
        return True

    return found[-1] if wait_for(done, timeout, interval=0.5) else None


class Hostile:
    def __init__(self, bootstrap: str, group: str, topic: str, payload: str, run_dir: Path) -> None:
        self.log_path = run_dir / f"hostile-{payload}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile_member", bootstrap, group, topic, payload],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # it leaves the group
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


def test_a_member_sending_hostile_user_data_leaves_the_others_their_partitions_and_standbys(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        workers = [c.worker("w1", "host-a").start(), c.worker("w2", "host-b").start()]
        c.wait_covered(120)
        before = _wait_held(workers, 0, 120)
        assert before is not None, f"the two workers never settled; logs in {tmp_path}"
        epoch = next(iter(before.values()))[0]
        group = c.settings.app_id
        for payload in PAYLOADS:
            hostile = Hostile(broker.bootstrap, group, c.settings.joins, payload, tmp_path)
            try:
                assert wait_for(lambda h=hostile: "assigned" in h.text(), 120, interval=0.3), (
                    f"{payload}: the hostile member never got an assignment; logs in {tmp_path}"
                )
                assert "led the group" not in hostile.text(), "the hostile member led: nothing tested"
                during = _wait_held(workers, epoch, 120)
                assert during is not None, f"{payload}: the group did not settle; logs in {tmp_path}"
                for name, (new_epoch, protocol, actives, standbys) in during.items():
                    assert protocol == "tandem", f"{payload}: {name} fell back to {protocol}"
                    assert (actives, standbys) == tuple(before[name][2:]), f"{payload}: {name} lost some"
                    assert new_epoch < epoch + 100, f"{payload}: epoch {new_epoch} (a member's forged one?)"
                epoch = next(iter(during.values()))[0]
            finally:
                hostile.stop()
            # Its leaving is one more rebalance: the next member joins a settled group.
            after = _wait_held(workers, epoch, 120)
            assert after is not None, f"after {payload}: the group did not settle; logs in {tmp_path}"
            epoch = next(iter(after.values()))[0]
        warned = "".join(w.log_path.read_text(errors="replace") for w in workers)
        assert "unreadable subscription user data" in warned and "ignored in part" in warned

        traffic = c.send(c.traffic(f"{unique}-after"), 60, rate=300.0)
        joined = c.joins(traffic.expected, timeout=60)
        assert traffic.expected <= joined, f"lost after the hostile members: {traffic.expected - joined}"
