"""What the pipeline's end-to-end tests share (tests/test_pipeline_*_e2e.py): an input as
`pipeline.produce` takes it, with seq headers counting on over several waves, and how far a
join's workers have taken their inputs."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.produce import _encoder
from tables.spec import JoinSpec
from tables.testing import WorkerProcess, uncommitted


def encoded(spec: JoinSpec, rows: list[dict[str, Any]], first_seq: int) -> list[dict[str, Any]]:
    """Rows (`side`, `key` or `key_raw`, `value` or `value_raw`, `timestamp`) as `produce` takes
    them, with a seq counting on from `first_seq` (seq orders the records of a partition: one
    count over every wave keeps the waves in order)."""
    encoders = {side: _encoder(spec, side) for side in ("left", "right")}
    topics = {"left": spec.left.name, "right": spec.right.name}
    out = []
    for n, row in enumerate(rows):
        key, value = encoders[row["side"]]
        raw_key = row["key_raw"].encode() if row.get("key_raw") else None
        out.append({
            "topic": topics[row["side"]],
            "key": raw_key if "key_raw" in row else key(row["key"]),
            "value": row["value_raw"].encode() if "value_raw" in row else value(row["value"]),
            "timestamp": row["timestamp"],
            "seq": first_seq + n,
        })  # fmt: skip
    return out


def drained(
    bootstrap: str, group: str, workers: list[WorkerProcess], topics: list[str], partitions: int
) -> bool:
    """Every worker alive (or stopped by the test), and the group's offsets at the inputs' ends."""
    for worker in workers:
        worker.check()
    return asyncio.run(uncommitted(bootstrap, group, topics, partitions)) == 0


def covered(workers: list[WorkerProcess], join: str, partitions: int) -> bool:
    """The workers own every partition of `join`, none restoring, each past its first rebalance."""
    actives: list[int] = []
    for worker in workers:
        worker.check()
        view = worker.view()
        if view is None:
            return False
        found = view["joins"][join]
        if found["restoring"] or found["last_rebalance"]["seconds"] is None:
            return False
        actives += found["actives"]
    return sorted(actives) == list(range(partitions))
