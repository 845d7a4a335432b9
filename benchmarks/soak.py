"""Soak: two workers of the reference app on the embedded broker for a long run (30 minutes by
default) at a steady input rate, a rebalance every few minutes (one worker leaves with a clean
stop and comes back on its data dir, the two in turn), and windows short enough that the
state levels off. Every 30 s, per worker: RSS, open file descriptors, threads, asyncio tasks,
RocksDB on disk, live records in the window index, input lag and the event loop's longest stall.
At the end the chaos run's judge (app/chaos.py): every expected join id written, none spurious.

    .venv/bin/python -m benchmarks.soak [--minutes 30] [--rate 200] \
        [--plot docs/bench/soak.png] [--write docs/bench/soak.md] [--json soak.json]

Not a test (it runs for half an hour); the machine's load average is recorded with each sample,
since other jobs may share it. What "flat" means here: the slope of a least-squares line through
each process's samples after its first `--settle-s` seconds (RSS, fds, tasks: per process
lifetime, since a restart starts them again; RocksDB on disk and live records: per worker,
over the run after the first window).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import json
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from app.chaos import backlog, judge_output, read_all
from app.cluster import WorkerProcess, covered, wait_for
from app.settings import JOIN_NAME, Settings, create_topics, from_env
from assignor import clients
from tables.testing import EmbeddedBroker
from tables.web.metrics import directory_bytes

SERIES = {  # key -> (title, unit)
    "rss_mb": ("RSS", "MB"),
    "fds": ("open file descriptors", ""),
    "fds_not_sst": ("open file descriptors but RocksDB table files", ""),
    "threads": ("threads", ""),
    "asyncio_tasks": ("asyncio tasks", ""),
    "rocksdb_mb": ("RocksDB on disk (join + Faust table)", "MB"),
    "live_records": ("live records in the window index", ""),
    "input_lag": ("input lag", "records"),
    "loop_stall_s": ("longest event-loop stall in the last 10 s", "s"),
    "block_cache_mb": ("RocksDB block cache (join stores)", "MB"),
    "memtables_mb": ("RocksDB memtables (join stores)", "MB"),
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- traffic: event time is the wall clock ------------------------------------------------------


@dataclasses.dataclass
class SteadyTraffic:
    """Impressions at the wall clock's time, half of them clicked 1-5 s later (sent when due)."""

    impressions: str
    clicks: str
    run: str
    ctr: float = 0.5
    seed: int = 5
    expected: set[str] = dataclasses.field(default_factory=set)
    sent: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._pending: list[tuple[int, str, bytes]] = []

    def step(self, i: int, now_ms: int) -> list[tuple[str, bytes, bytes]]:
        out = self.due(now_ms)
        auction = f"{self.run}-a{i}"
        impression = {"event_id": f"{self.run}-i{i}", "auction_id": auction,
                      "campaign_id": f"campaign-{i % 5}", "ts": now_ms}  # fmt: skip
        out.append((self.impressions, auction.encode(), json.dumps(impression).encode()))
        if self._random.random() < self.ctr:
            ts = now_ms + self._random.randint(1000, 5000)
            click = {"event_id": f"{self.run}-c{i}", "auction_id": auction, "ts": ts}
            heapq.heappush(self._pending, (ts, auction, json.dumps(click).encode()))
            self.expected.add(f"{self.run}-i{i}|{self.run}-c{i}")
        return out

    def due(self, now_ms: int) -> list[tuple[str, bytes, bytes]]:
        out = []
        while self._pending and self._pending[0][0] <= now_ms:
            _, key, value = heapq.heappop(self._pending)
            out.append((self.clicks, key.encode(), value))
        return out


async def produce(bootstrap: str, traffic: SteadyTraffic, rate: float, stop: threading.Event) -> None:
    """`rate` impressions a second (and their clicks) until `stop`, then the clicks still due."""
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=10, request_timeout_ms=60000)
    await producer.start()
    began, i = time.monotonic(), 0
    try:
        while not stop.is_set():
            for topic, key, value in traffic.step(i, int(time.time() * 1000)):
                await producer.send(topic, value, key=key)
                traffic.sent += 1
            i += 1
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        while traffic._pending:
            await asyncio.sleep(0.2)
            for topic, key, value in traffic.due(int(time.time() * 1000)):
                await producer.send(topic, value, key=key)
                traffic.sent += 1
        await producer.flush()
    finally:
        await producer.stop()


# -- samples ------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS (kB) and Threads of a process, from /proc."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "Threads"):
                found[name] = int(value.split()[0])
    return found


def fd_kinds(pid: int) -> dict[str, int]:
    """What a process's open file descriptors are: RocksDB table files, its write-ahead logs,
    its LOCK files (one per open database), sockets, and the rest."""
    kinds = {"sst": 0, "wal": 0, "lock": 0, "socket": 0, "other": 0}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".sst"):
            kinds["sst"] += 1
        elif target.endswith(".log"):
            kinds["wal"] += 1
        elif target.endswith("/LOCK"):
            kinds["lock"] += 1
        elif target.startswith("socket:"):
            kinds["socket"] += 1
        else:
            kinds["other"] += 1
    return kinds


def sample(worker: WorkerProcess, began: float) -> dict[str, Any] | None:
    """One sample of a live worker (None when it is down or does not answer)."""
    if not worker.alive or worker.process is None:
        return None
    pid = worker.process.pid
    try:
        status = proc_status(pid)
        kinds = fd_kinds(pid)
    except OSError:
        return None
    view = worker.view(timeout=10.0)
    if view is None:  # starting (or stopping): nothing to say yet
        return None
    join = view["joins"].get(JOIN_NAME)
    loop = view.get("loop") or {}
    memory = view.get("memory") or {}
    lag = join.get("lag") if join else None
    return {
        "t_s": round(time.monotonic() - began, 1),
        "worker": worker.name,
        "pid": pid,
        "rss_mb": round(status.get("VmRSS", 0) / 1024, 1),
        "fds": sum(kinds.values()),
        "fds_not_sst": sum(kinds.values()) - kinds["sst"],
        "fd_kinds": kinds,
        "threads": status.get("Threads"),
        "asyncio_tasks": loop.get("asyncio_tasks"),
        "rocksdb_mb": round(directory_bytes(worker.data_dir) / 2**20, 2),
        "live_records": join.get("live_records") if join else None,
        "input_lag": sum(n for n in lag.values() if n is not None) if lag else None,
        "loop_stall_s": loop.get("stall_s"),
        "block_cache_mb": round(memory["rocksdb_block_cache_bytes"] / 2**20, 1) if memory else None,
        "memtables_mb": round(memory["rocksdb_memtables_bytes"] / 2**20, 1) if memory else None,
        "python_blocks": memory.get("python_blocks") if memory else None,
        "actives": len(join["actives"]) if join else None,
        "load_1m": round(os.getloadavg()[0], 2),
    }


# -- the run ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long the input runs (default 30)")
    p.add_argument("--rate", type=float, default=200.0, help="impressions a second (half get a click)")
    p.add_argument("--rebalance-every-s", type=float, default=300.0, help="a worker leaves this often")
    p.add_argument("--down-s", type=float, default=45.0, help="how long a worker that left stays away")
    p.add_argument("--sample-every-s", type=float, default=30.0)
    p.add_argument("--after-ms", type=int, default=20_000, help="the join window (after)")
    p.add_argument("--grace-ms", type=int, default=5_000, help="the join's grace")
    p.add_argument("--settle-s", type=float, default=180.0, help="samples of a process left out of slopes")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="every sample and the figures")
    p.add_argument("--plot", type=Path, default=None, help="the plot (PNG)")
    p.add_argument("--write", type=Path, default=None, help="the Markdown report")
    return p


def workers_of(
    args: argparse.Namespace, broker: EmbeddedBroker, s: Settings, run_dir: Path
) -> list[WorkerProcess]:
    window = {"TANDEM_JOIN_AFTER_MS": str(args.after_ms), "TANDEM_JOIN_GRACE_MS": str(args.grace_ms)}
    return [
        WorkerProcess(
            name,
            f"host-{name}",
            "rack-1",
            broker.bootstrap,
            s.app_id,
            run_dir,
            standby_replicas=1,
            partitions=s.partitions,
            topic_prefix=s.topic_prefix,
            extra_env=window,
        )  # fmt: skip
        for name in ("w1", "w2")
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:8]
    run_dir = args.run_dir or Path("/tmp") / f"tandem-soak-{uid}"
    run_dir.mkdir(parents=True, exist_ok=True)
    s = dataclasses.replace(
        from_env(), app_id=f"soak-{uid}", topic_prefix=f"s{uid}-", partitions=args.partitions
    )
    with EmbeddedBroker(log_dir=run_dir) as broker:
        asyncio.run(create_topics(broker.bootstrap, s))
        workers = workers_of(args, broker, s, run_dir)
        try:
            return soak(args, broker, s, workers, run_dir)
        finally:
            for worker in workers:
                worker.kill()


def soak(args: argparse.Namespace, broker: EmbeddedBroker, s: Settings, workers: list[WorkerProcess],
         run_dir: Path) -> dict[str, Any]:  # fmt: skip
    say(f"broker {broker.bootstrap}; run dir {run_dir}; load {os.getloadavg()}")
    for worker in workers:
        worker.start()
    if not wait_for(lambda: covered(workers, s.partitions), 180):
        raise TimeoutError(f"the group did not form; logs in {run_dir}")
    began = time.monotonic()
    traffic = SteadyTraffic(s.impressions, s.clicks, s.app_id)
    stop = threading.Event()
    producer = threading.Thread(
        target=lambda: asyncio.run(produce(broker.bootstrap, traffic, args.rate, stop))
    )
    producer.start()
    samples: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    end = began + args.minutes * 60
    next_sample, next_move, leaver, rounds = began, began + args.rebalance_every_s, 0, 0
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_sample:
            found = [x for x in (sample(w, began) for w in workers) if x is not None]
            for x in found:
                x["round"] = rounds
            rounds += 1
            samples += found
            say(" | ".join(f"{x['worker']} rss {x['rss_mb']} MB fds {x['fds']} tasks {x['asyncio_tasks']} "
                           f"live {x['live_records']} lag {x['input_lag']} stall {x['loop_stall_s']}"
                           for x in found) + f" | load {os.getloadavg()[0]:.1f}")  # fmt: skip
            next_sample += args.sample_every_s
        if now >= next_move and now + args.down_s < end:
            worker = workers[leaver % 2]
            leaver += 1
            say(f"{worker.name} leaves (clean stop)")
            events.append({"t_s": round(now - began, 1), "worker": worker.name, "event": "leaves"})
            worker.stop(30)
            time.sleep(args.down_s)
            worker.start()
            events.append({"t_s": round(time.monotonic() - began, 1), "worker": worker.name, "event": "back"})
            say(f"{worker.name} is back")
            next_move += args.rebalance_every_s
            continue
        for worker in workers:
            worker.check()
        time.sleep(1.0)
    stop.set()
    producer.join(timeout=120)
    say(f"input stopped: {traffic.sent:,} records sent; draining")
    drained = wait_for(
        lambda: asyncio.run(backlog(broker.bootstrap, s)) == 0 and covered(workers, s.partitions),
        600,
        interval=5.0,
    )
    samples += [{**x, "round": rounds} for x in (sample(w, began) for w in workers) if x is not None]
    output = asyncio.run(read_all(broker.bootstrap, s.joins, s.partitions))
    judged = judge_output(output, traffic.expected)
    say(f"judge: {json.dumps(judged)}")
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "sent": traffic.sent,
        "drained": drained,
        "judge": judged,
        "ok": drained and judged["lost"] == judged["spurious"] == judged["copies_that_disagree"] == 0,
        "events": events,
        "samples": samples,
        "slopes": slopes(samples, args.settle_s, args.after_ms + args.grace_ms),
        "load": {"min": min(x["load_1m"] for x in samples), "max": max(x["load_1m"] for x in samples)},
    }


# -- what the samples say -----------------------------------------------------------------------

PER_PROCESS = (
    "rss_mb",
    "fds",
    "threads",
    "asyncio_tasks",
    "block_cache_mb",
    "memtables_mb",
)  # start again with each process
SUMMED = ("rocksdb_mb", "live_records")  # the group's state: both workers' samples of a round added


def totals(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per sampling round where both workers answered: their state added up ("both")."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for x in samples:
        by_round.setdefault(x["round"], []).append(x)
    found = []
    for xs in by_round.values():
        if len(xs) == 2 and all(x.get(k) is not None for x in xs for k in SUMMED):
            found.append({"worker": "both", "pid": 0, "t_s": max(x["t_s"] for x in xs),
                          **{k: round(sum(x[k] for x in xs), 2) for k in SUMMED}})  # fmt: skip
    return found


def _slope_per_10_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 4:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 600


def slopes(samples: list[dict[str, Any]], settle_s: float, window_ms: int) -> dict[str, dict[str, Any]]:
    """Per worker and series: first and last value after settling, min, max, and the slope of a
    least-squares line per 10 minutes (per-process series: of the longest process lifetime)."""
    figures: dict[str, dict[str, Any]] = {}
    samples = [*samples, *totals(samples)]
    for name in ["w1", "w2", "both"]:
        mine = [x for x in samples if x["worker"] == name]
        lifetimes: dict[int, list[dict[str, Any]]] = {}
        for x in mine:
            lifetimes.setdefault(x["pid"], []).append(x)
        figures[name] = {}
        for key in SERIES if name != "both" else SUMMED:
            if key in PER_PROCESS:
                longest = max(lifetimes.values(), key=lambda xs: xs[-1]["t_s"] - xs[0]["t_s"])
                settled = [x for x in longest if x["t_s"] - longest[0]["t_s"] >= settle_s]
            else:
                settled = [x for x in mine if x["t_s"] >= max(settle_s, window_ms / 1000)]
            points = [(x["t_s"], float(x[key])) for x in settled if x.get(key) is not None]
            values = [v for _, v in points]
            slope = _slope_per_10_min(points)
            figures[name][key] = {
                "first": values[0] if values else None, "last": values[-1] if values else None,
                "min": min(values, default=None), "max": max(values, default=None),
                "slope_per_10_min": None if slope is None else round(slope, 3), "points": len(points),
            }  # fmt: skip
    return figures


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib  # the pipeline's dependency; only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(6, 2, figsize=(13, 19), sharex=True)
    axes.flat[-1].axis("off")
    for ax, (key, (title, unit)) in zip(axes.flat, SERIES.items(), strict=False):
        for name, colour in (("w1", "tab:blue"), ("w2", "tab:orange")):
            mine = [x for x in result["samples"] if x["worker"] == name and x.get(key) is not None]
            by_pid: dict[int, list[dict[str, Any]]] = {}
            for x in mine:
                by_pid.setdefault(x["pid"], []).append(x)
            for n, xs in enumerate(by_pid.values()):
                ax.plot([x["t_s"] / 60 for x in xs], [x[key] for x in xs], "-o", ms=2.5, color=colour,
                        label=name if n == 0 else None)  # fmt: skip
        if key in SUMMED:
            both = totals(result["samples"])
            ax.plot([x["t_s"] / 60 for x in both], [x[key] for x in both], "-", color="black", lw=1,
                    label="both")  # fmt: skip
        for event in result["events"]:
            ax.axvline(
                event["t_s"] / 60, color="grey", lw=0.6, ls="--" if event["event"] == "leaves" else ":"
            )
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    axes.flat[0].legend(loc="lower right")
    axes.flat[6].legend(loc="lower right")
    a = result["args"]
    fig.suptitle(f"Soak: 2 workers, {a['rate']:.0f} impressions/s, window {a['after_ms'] / 1000:.0f} s + "
                 f"{a['grace_ms'] / 1000:.0f} s grace, a worker leaves every {a['rebalance_every_s']:.0f} s "
                 "(dashed: leaves, dotted: back)", fontsize=11)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def report(result: dict[str, Any], command: str) -> str:
    judge, a = result["judge"], result["args"]
    lines = [
        "# Soak: two workers for a long run",
        "",
        f"Command: `{command}`",
        "",
        f"{a['minutes']:g} minutes of input at {a['rate']:g} impressions/s (half clicked 1-5 s later),",
        f"2 workers of the reference app (standby replicas 1) on the embedded broker, {a['partitions']}",
        "partitions, join window",
        f"{a['after_ms'] / 1000:g} s + {a['grace_ms'] / 1000:g} s grace; a worker leaves (clean stop) every "
        f"{a['rebalance_every_s']:g} s and comes back {a['down_s']:g} s later, the two in turn. Load average",
        f"during the run (shared machine, 2 cores): {result['load']['min']}-{result['load']['max']}.",
        "",
        f"Judge (app/chaos.py `judge_output`): {judge['expected']:,} expected join ids, "
        f"{judge['lost']} lost, "
        f"{judge['spurious']} spurious, {judge['raw_duplicates']} raw duplicates, "
        f"{judge['copies_that_disagree']} copies that disagree; drained: {result['drained']}.",
        "",
        "| worker | series | first | last | min | max | slope per 10 min |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, series in result["slopes"].items():
        for key, f in series.items():
            title, unit = SERIES[key]
            label = f"{title} ({unit})" if unit else title
            lines.append(f"| {name} | {label} | {f['first']} | {f['last']} | {f['min']} | {f['max']} | "
                         f"{f['slope_per_10_min']} |")  # fmt: skip
    for name in ("w1", "w2"):
        last = [x for x in result["samples"] if x["worker"] == name and x.get("fd_kinds")]
        if last:
            lines.append(f"\n{name}'s open file descriptors at the end: {last[-1]['fd_kinds']}.")
    lines += ["", "![soak](soak.png)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)
    command = "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(result, command)
    print(text)
    if args.write:
        args.write.write_text(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
