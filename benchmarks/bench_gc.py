"""What garbage collection costs one worker joining a backlog, with and without a batch
deferring it (TANDEM_GC_BATCH_THRESHOLD, tables/runtime/gcpacing.py); prints a Markdown table.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_gc [--impressions 300000] [--rounds 2]

The reference worker (`faust -A app worker`) joins the same preloaded backlog on the
embedded broker, `TANDEM_GC_BATCH_THRESHOLD=0` and the default alternated round by round.
Each worker process loads a `sitecustomize` probe (from a temporary directory put first on
its PYTHONPATH) that times every collection with `gc.callbacks` (the thread CPU time of the
thread that collects) and writes the totals per generation, with the process's CPU time,
to a file every half second. CPU per record is bench_worker's window (the join's run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from app.settings import create_topics, from_env
from benchmarks.bench_worker import PARTITIONS, load_inputs, run_pipeline
from tables.testing import EmbeddedBroker

SETTINGS = {"collect mid-batch (0)": "0", "deferred to the batch's end (default)": ""}
ENV_KEYS = ("PYTHONPATH", "TANDEM_GC_BATCH_THRESHOLD", "TANDEM_BENCH_GC_FILE")

PROBE = """
import gc, json, os, threading, time
_out = os.environ.get("TANDEM_BENCH_GC_FILE")
if _out:
    _seconds, _counts, _started = [0.0, 0.0, 0.0], [0, 0, 0], [0.0]
    def _time(phase, info):
        if phase == "start":
            _started[0] = time.thread_time()
        else:
            _seconds[info["generation"]] += time.thread_time() - _started[0]
            _counts[info["generation"]] += 1
    gc.callbacks.append(_time)
    def _write():
        while True:
            time.sleep(0.5)
            with open(_out, "w") as f:
                json.dump({"seconds": _seconds, "counts": _counts, "cpu": time.process_time()}, f)
    threading.Thread(target=_write, daemon=True).start()
"""


async def bench(impressions: int, rounds: int, timeout: float) -> list[str]:
    rows: dict[str, list[tuple[float, dict[str, list[float]]]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        with EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker:
            base = dataclasses.replace(
                from_env(), broker=f"kafka://{broker.bootstrap}", topic_prefix="gc-", partitions=PARTITIONS
            )
            await create_topics(broker.bootstrap, base)
            total = await load_inputs(base, impressions)
            for n in range(rounds):
                for name, value in SETTINGS.items():
                    out = Path(tmp) / f"gc-{n}-{value or 'default'}.json"
                    with worker_env(probe, out, value):
                        run = await run_pipeline(
                            "tandem", base, total, total - impressions, Path(tmp) / f"r{n}", timeout
                        )
                    rows[name].append((run["cpu"] / run["records"] * 1e6, json.loads(out.read_text())))
    return report(rows, total, rounds)


@contextlib.contextmanager
def worker_env(probe: Path, out: Path, threshold: str) -> Iterator[None]:
    """The environment the next worker starts with: the probe first on its path, writing to
    `out`; TANDEM_GC_BATCH_THRESHOLD set to `threshold` (empty: the default)."""
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(probe), os.getcwd(), saved["PYTHONPATH"] or ""])
    os.environ["TANDEM_BENCH_GC_FILE"] = str(out)
    os.environ.pop("TANDEM_GC_BATCH_THRESHOLD", None)
    if threshold:
        os.environ["TANDEM_GC_BATCH_THRESHOLD"] = threshold
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def report(rows: dict[str, list[tuple[float, dict[str, list[float]]]]], total: int, rounds: int) -> list[str]:
    lines = [
        f"One worker joining {total:,} records (4 partitions, embedded broker), {rounds} alternated rounds. "
        "Collections: over the worker's whole life (start-up included), thread CPU seconds.",
        "",
        "| garbage collection (one row a round) | µs CPU per record | young / middle / full collections, s | "
        "their count | share of the process's CPU |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for name, runs in rows.items():
        for cpu_us, gc in runs:
            seconds, counts = gc["seconds"], gc["counts"]
            share = sum(seconds) / gc["cpu"] if gc["cpu"] else 0.0
            lines.append(
                f"| {name} | {cpu_us:.1f} | {' / '.join(f'{s:.2f}' for s in seconds)} | "
                f"{' / '.join(str(int(c)) for c in counts)} | {share:.0%} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impressions", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    args = parser.parse_args()
    print("\n".join(asyncio.run(bench(args.impressions, args.rounds, args.timeout))))


if __name__ == "__main__":
    main()
