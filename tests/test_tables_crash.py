"""Kill a join worker mid-stream (real process, real RocksDB files, real broker), restart it:
state and output are as if nothing happened."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tables.operators.keys import meta_key
from tables.operators.kv import MemoryKV
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.operators.windowed_kind import WindowedKind
from tables.state.manager import JoinState
from tables.testing import EmbeddedBroker, create_topics
from tests.tables_helpers import (
    ad_data,
    as_event,
    as_output,
    comparable,
    dump,
    partition_of,
    produce,
    read_all,
)

pytestmark = pytest.mark.broker

PARTITIONS = 2
AFTER, GRACE = 1000, 10**7
ROOT = Path(__file__).resolve().parent.parent


def expected_run(impressions: list[Any], clicks: list[Any]) -> tuple[dict[str, Any], dict[int, Any]]:
    """Results and final state of an uninterrupted run (order-free for this data)."""
    results: dict[str, Any] = {}
    states: dict[int, Any] = {}
    for partition in range(PARTITIONS):
        state = MemoryKV()
        join = WindowedJoin(state, JoinWindow(0, AFTER, GRACE), JoinType.OUTER)
        for side, values in (("left", impressions), ("right", clicks)):
            for value in values:
                if partition_of(value["auction_id"], PARTITIONS) == partition:
                    found = [as_output(m) for m in join.process(*as_event(side, value))]
                    results.update((r["join_id"], r) for r in found)
        join.take_changes()  # as a commit does: the stream time goes into the state
        states[partition] = dict(state.scan(b"", b"\xff"))
    return results, states


async def restore_all(bootstrap: str, changelog: str, data_dir: Path) -> None:
    state = JoinState(
        bootstrap, changelog, data_dir, kind=WindowedKind(JoinWindow(0, AFTER, GRACE), JoinType.OUTER)
    )
    try:
        moves = await state.assign(set(range(PARTITIONS)), set())
        await state.restore(moves.to_restore, lambda p: None)
        assert all(r.restored for r in state.recovery.progress.values())
    finally:
        await state.close()


def start_worker(
    broker: EmbeddedBroker, names: dict[str, str], data_dir: Path, *extra: str
) -> subprocess.Popen[str]:
    args = [f"--{k}={v}" for k, v in names.items()]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.tables_helpers",
            f"--bootstrap={broker.bootstrap}",
            f"--data-dir={data_dir}",
            f"--after={AFTER}",
            f"--grace={GRACE}",
            *args,
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_for_results(worker: subprocess.Popen[str], count: int, timeout: float = 30.0) -> None:
    """Read the worker's progress lines until it has committed `count` results."""
    deadline = time.monotonic() + timeout
    produced = 0
    assert worker.stdout is not None
    while produced < count and time.monotonic() < deadline:
        line = worker.stdout.readline()
        if not line:
            break
        if line.startswith("committed"):
            produced = int(line.rsplit("=", 1)[1])
    assert produced >= count, f"worker committed {produced} results"


CRASHES = ["kill -9 from outside", "before_changelog", "before_state_write", "after_state_write"]


@pytest.mark.parametrize("crash", CRASHES)
def test_killed_worker_restarts_as_if_nothing_happened(
    broker: EmbeddedBroker, unique: str, tmp_path: Path, crash: str
) -> None:
    """The input resumes at Kafka's committed offsets, committed after the state, so input
    is replayed and must be absorbed by the duplicate check."""
    names = {k: f"{k}-{unique}" for k in ("left", "right", "output", "changelog")}
    impressions, clicks = ad_data(auctions=300, after=AFTER)
    asyncio.run(create_topics(broker.bootstrap, names.values(), PARTITIONS))
    asyncio.run(produce(broker.bootstrap, names["left"], impressions, PARTITIONS))
    asyncio.run(produce(broker.bootstrap, names["right"], clicks, PARTITIONS))
    expected_results, expected_states = expected_run(impressions, clicks)

    if crash == "kill -9 from outside":
        first = start_worker(broker, names, tmp_path, "--pause=0.05")
        wait_for_results(first, 20)
        os.kill(first.pid, signal.SIGKILL)
    else:
        first = start_worker(broker, names, tmp_path, f"--crash-point={crash}")
    assert first.wait(timeout=30) == -signal.SIGKILL
    partial = asyncio.run(read_all(broker.bootstrap, names["output"], PARTITIONS))
    assert 0 < len({r["join_id"] for r in partial}) < len(expected_results), "killed mid-stream"

    second = start_worker(broker, names, tmp_path, "--exit-when-done")
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    assert "done" in out

    output = asyncio.run(read_all(broker.bootstrap, names["output"], PARTITIONS))
    by_id: dict[str, Any] = {}
    for record in output:
        assert by_id.setdefault(record["join_id"], record) == record, "a join_id with two contents"
    assert by_id == expected_results

    # The worker's files, and a worker that rebuilds from the changelog alone, agree.
    rebuilt = tmp_path / "rebuilt"
    asyncio.run(restore_all(broker.bootstrap, names["changelog"], rebuilt))
    for partition, data_dir in itertools.product(range(PARTITIONS), (tmp_path, rebuilt)):
        state = comparable(dump(data_dir / names["changelog"] / str(partition)))
        expected = comparable(expected_states[partition])
        # This minimal worker (tests/tables_helpers.py) keeps no input positions, so what it
        # reads again counts as duplicates and late once more (the runtime skips re-reads).
        for counter in (meta_key("duplicates"), meta_key("late")):
            assert state.pop(counter, b"") >= expected.pop(counter, b"")
        assert state == expected
