"""Join throughput of one worker (`faust -A app worker`) against the raw consume rate
of the same worker on the same topics, measured in the same run.

    .venv/bin/python -m benchmarks.bench_worker --impressions 100000 --rounds 3

Input: impressions and their clicks (app.traffic.ad_events, 60 % clicked,
in event time with up to 2 s of disorder), loaded once, keyed and co-partitioned by
auction id. Each pipeline is one real worker process started fresh (new app id, so a
new consumer group reading from the start and an empty state) on the embedded broker:

- consume-only: the reference worker with its join body replaced by a no-op
  (benchmarks/consume_only_app.py): same Faust agent, batching, consumer settings,
  assignor and state start-up. Its rate is what a worker can read.
- tandem: the reference worker: validation, dead letters, event-time alignment of
  the two inputs, the windowed join on RocksDB, results produced and acknowledged,
  changelog and state committed.
- faust-table: the join written the usual way on Faust's own tables
  (benchmarks/faust_table_app.py): one Table keyed by auction id, one event at a
  time, Faust's RocksDB store and changelog; no expiry, no event-time order.

The rate counts from the first poll that saw records consumed to the first that saw
none left (polls of the worker's /tandem/ view every 0.1 s), and the worker's CPU
time between the same two polls. Rounds alternate the pipelines; the best round of
each counts. Results: docs/bench/worker.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.cluster import WorkerProcess
from app.settings import Settings, create_topics, from_env
from app.traffic import ad_events, produce_events
from tables.testing import EmbeddedBroker

PARTITIONS = 4
PIPELINES = {
    "consume-only": "benchmarks.consume_only_app",
    "tandem": "app",
    "faust-table": "benchmarks.faust_table_app",
}
POLL_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def load_inputs(settings: Settings, impressions: int) -> int:
    """Produce the input once; timestamps end an hour ago (the worker rejects records
    more than 7 days old by the wall clock)."""
    base_ts = int(time.time() * 1000) - 3_600_000 - impressions * 10
    return await produce_events(settings, ad_events(impressions, base_ts=base_ts), PARTITIONS)


def consumed(view: dict[str, Any] | None, total: int) -> int | None:
    """Input records the worker has read, once it owns every partition and knows their ends."""
    if view is None or len(view["actives"]) < PARTITIONS:
        return None
    lags = view["lag"].values()
    if any(lag is None for lag in lags):
        return None
    return total - sum(lags)


async def run_pipeline(
    name: str, base: Settings, total: int, run_dir: Path, timeout: float
) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:6]
    settings = dataclasses.replace(base, app_id=f"wb-{name}-{uid}")
    await create_topics(settings.broker.removeprefix("kafka://"), settings)
    worker = WorkerProcess(
        f"{name}-{uid}",
        "host-1",
        "rack-1",
        settings.broker.removeprefix("kafka://"),
        settings.app_id,
        run_dir,
        standby_replicas=0,
        partitions=PARTITIONS,
        topic_prefix=settings.topic_prefix,
        app_module=PIPELINES[name],
    ).start()
    first: tuple[float, int, float] | None = None
    last: tuple[float, int, float] | None = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            worker.check()
            view = worker.view()
            assert worker.process is not None
            sample = (time.perf_counter(), consumed(view, total), cpu_seconds(worker.process.pid))
            if sample[1] is not None and sample[1] > 0:
                point = (sample[0], sample[1], sample[2])
                first = first or point
                last = point
                if sample[1] >= total:
                    break
            await asyncio.sleep(POLL_S)
        else:
            raise RuntimeError(f"{name}: not done in {timeout} s (last: {last})")
        outputs, late, forced = (view["outputs"], view["late"], view["forced"]) if view else (0, 0, 0)
    finally:
        worker.stop(10)
    assert first is not None and last is not None
    records, wall, cpu = last[1] - first[1], last[0] - first[0], last[2] - first[2]
    return {"records": records, "wall": wall, "cpu": cpu, "outputs": outputs, "late": late, "forced": forced}


async def bench(impressions: int, rounds: int, timeout: float) -> list[str]:
    best: dict[str, tuple[float, float]] = {}
    runs: list[str] = []
    per_round: list[dict[str, float]] = []  # wall rate of each pipeline, per round
    with (
        tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        base = dataclasses.replace(
            from_env(), broker=f"kafka://{broker.bootstrap}", topic_prefix="wb-", partitions=PARTITIONS
        )
        await create_topics(broker.bootstrap, base)
        total = await load_inputs(base, impressions)
        for n in range(rounds):
            per_round.append({})
            for name in PIPELINES:
                run = await run_pipeline(name, base, total, Path(tmp) / f"r{n}", timeout)
                wall_rate, cpu_rate = run["records"] / run["wall"], run["records"] / max(run["cpu"], 1e-9)
                runs.append(
                    f"{name} round {n + 1}: {wall_rate:,.0f}/s wall, {cpu_rate:,.0f} per CPU-s, "
                    f"{run['outputs']:,} results, {run['late']:,} late, "
                    f"{run['forced']:,} released before their turn"
                )
                per_round[-1][name] = wall_rate
                old = best.get(name, (0.0, 0.0))
                best[name] = (max(old[0], wall_rate), max(old[1], cpu_rate))
    raw, faust = best["consume-only"], best["faust-table"]
    return [
        f"Input: {total:,} records ({impressions:,} impressions and their clicks), {PARTITIONS} "
        f"partitions, one worker process, embedded tansu broker; best of {rounds} alternating rounds.",
        "",
        "| pipeline | records/s (wall) | vs consume-only | vs faust-table | records per CPU-s "
        "| vs consume-only | vs faust-table |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {wall:,.0f} | {wall / raw[0]:.2f} | {wall / faust[0]:.2f} | {cpu:,.0f} "
            f"| {cpu / raw[1]:.2f} | {cpu / faust[1]:.2f} |"
            for name, (wall, cpu) in best.items()
        ),
        "",
        "Within each round (wall), tandem / consume-only: "
        + ", ".join(f"{r['tandem'] / r['consume-only']:.2f}" for r in per_round)
        + "; tandem / faust-table: "
        + ", ".join(f"{r['tandem'] / r['faust-table']:.2f}" for r in per_round)
        + ".",
        "",
        *(f"- {line}" for line in runs),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impressions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    args = parser.parse_args()
    print("\n".join(asyncio.run(bench(args.impressions, args.rounds, args.timeout))))


if __name__ == "__main__":
    main()
