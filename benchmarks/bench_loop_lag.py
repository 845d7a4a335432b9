"""The event loop's longest stall in a busy worker: one worker of the reference app (the
embedded broker, 6 partitions, no standby) started on a backlog of impressions and clicks, with
`--hogs` CPU-bound processes beside it (a loaded machine), its `/tandem/` view read every
`--every` seconds until every record is read and joined. Reported: the worker's longest stall
since it started (`loop.worst_stall_s`: start-up, assignment and restore included), and the
gauge's samples while it worked through the backlog (`loop.stall_s`: the longest stall in the
last 10 s), from 10 s after its first read on, as their maximum and 95th percentile, with the
machine's load average.

    .venv/bin/python -m benchmarks.bench_loop_lag [--impressions 100000] [--hogs 2] [--asyncio-debug]

`--asyncio-debug` runs the worker with PYTHONASYNCIODEBUG=1: asyncio then logs each callback
or task step that held the loop over 0.1 s ("Executing <Task ...> took 0.4 seconds"), and the
longest of those lines are printed: where the stalls come from (debug mode slows the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from app.cluster import WorkerProcess
from app.settings import create_topics, from_env
from app.traffic import ad_events, produce_events
from tables.testing import EmbeddedBroker, wait_for

PARTITIONS = 6


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes that only burn CPU (stopped by pid)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:8]
    run_dir = args.run_dir or Path("/tmp") / f"tandem-looplag-{uid}"
    run_dir.mkdir(parents=True, exist_ok=True)
    s = dataclasses.replace(from_env(), app_id=f"lag-{uid}", topic_prefix=f"l{uid}-", partitions=PARTITIONS)
    burners: list[subprocess.Popen[bytes]] = []
    with EmbeddedBroker(log_dir=run_dir) as broker:
        s = dataclasses.replace(s, broker=f"kafka://{broker.bootstrap}")
        asyncio.run(create_topics(broker.bootstrap, s))
        base_ts = int(time.time() * 1000) - args.impressions * 10
        produced = asyncio.run(produce_events(s, ad_events(args.impressions, base_ts=base_ts), PARTITIONS))
        say(f"{produced:,} records produced; {args.hogs} CPU hogs; load {os.getloadavg()[0]:.1f}")
        extra = {"PYTHONASYNCIODEBUG": "1"} if args.asyncio_debug else {}
        worker = WorkerProcess("w1", "host-a", "rack-1", broker.bootstrap, s.app_id, run_dir,
                               standby_replicas=0, partitions=PARTITIONS, topic_prefix=s.topic_prefix,
                               extra_env=extra)  # fmt: skip
        try:
            burners = hogs(args.hogs)
            worker.start()
            return watch(worker, produced, args, run_dir)
        finally:
            worker.kill()
            for burner in burners:
                burner.kill()
                burner.wait(10)


def watch(worker: WorkerProcess, produced: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    began = time.monotonic()
    samples: list[tuple[float, float, int]] = []  # (seconds, stall gauge, records read)
    loads: list[float] = []
    final: dict[str, Any] = {}

    def done() -> bool:
        worker.check()
        view = worker.view(timeout=30.0)
        if view is None:
            return False
        join = view["joins"]["ad-join"]
        read = sum(join["read"].values())
        samples.append((time.monotonic() - began, float(view["loop"]["stall_s"]), read))
        loads.append(os.getloadavg()[0])
        final.update(view)
        return read >= produced and not join["held"]

    finished = wait_for(done, args.timeout, args.every)
    # The gauge is the longest stall of the last 10 s: samples from 10 s after the first read on
    # see the backlog's batches alone, not the start-up and first assignment before them.
    first_read = next((t for t, _, read in samples if read > 0), None)
    busy = [
        s for t, s, read in samples if first_read is not None and t >= first_read + 10 and read < produced
    ]
    result = {
        "impressions": args.impressions,
        "records": produced,
        "hogs": args.hogs,
        "finished": finished,
        "seconds": round(time.monotonic() - began, 1),
        "worst_stall_s": final.get("loop", {}).get("worst_stall_s"),  # since the start
        "stall_samples": [(round(t, 1), s, read) for t, s, read in samples],
        "busy_samples": len(busy),
        "busy_max_stall_s": max(busy, default=None),
        "busy_p95_stall_s": round(statistics.quantiles(busy, n=20)[-1], 3) if len(busy) >= 20 else None,
        "load_min": round(min(loads, default=0), 1),
        "load_max": round(max(loads, default=0), 1),
        "asyncio_debug": args.asyncio_debug,
    }
    if args.asyncio_debug:
        result["slowest_steps"] = slowest_steps(worker.log_path, 12)
    return result


_TOOK = re.compile(r"(Executing .*?) took (\d+\.\d+) seconds")


def slowest_steps(log_path: Path, count: int) -> list[str]:
    """asyncio debug mode's "Executing <...> took N seconds" lines, longest first."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        match = _TOOK.search(line)
        if match:
            found.append((float(match.group(2)), line.split("] ", 3)[-1][:400]))
    return [f"{seconds:.3f} s: {text}" for seconds, text in sorted(found, reverse=True)[:count]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_loop_lag", description=__doc__.split("\n")[0]
    )
    p.add_argument("--impressions", type=int, default=100_000)
    p.add_argument("--hogs", type=int, default=2, help="CPU-bound processes beside the worker")
    p.add_argument("--every", type=float, default=0.5, help="seconds between reads of the view")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--asyncio-debug", action="store_true")
    p.add_argument("--run-dir", type=Path, default=None)
    args = p.parse_args(argv)
    result = run(args)
    for key, value in result.items():
        if key not in ("slowest_steps", "stall_samples"):
            print(f"{key}: {value}")
    for line in result.get("slowest_steps", []):
        print(line)
    return 0 if result["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
