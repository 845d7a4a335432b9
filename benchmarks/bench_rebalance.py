"""What a rebalance pauses (issue 38, item 4): eager against cooperative (KIP-429) rebalancing,
on real worker processes of the reference app and the embedded broker, in one run.

    .venv/bin/python benchmarks/bench_rebalance.py [--protocols eager,cooperative] [--quick] \
        [--write docs/bench/rebalance.md] [--plot docs/bench/rebalance.png]

Per protocol (`TANDEM_REBALANCE_PROTOCOL` passed to every worker): a fresh app id, 6
partitions, three workers w1-w3 on three hosts, standby replicas 1, steady traffic (every
impression clicked: every one makes a joined record), then, one after the other:

- **baseline**: a window with no rebalance at all;
- **join**: a fourth worker w4 starts;
- **leave**: w4 stops cleanly (SIGTERM);
- **SIGKILL**: w1 is killed (the group notices at the session timeout), then comes back
  (**rejoin**, on its data dir);
- **rolling restart**: w1, w2, w3 each stopped cleanly and started again, one at a time
  (each bounce its own window).

Each window runs from the event until the group is settled (every partition active on
exactly one live worker, restored, no move pending, one generation everywhere) plus
`--tail-s`. For each partition: the longest time in the window between two consecutive
joined records (output records' CreateTime, set by the worker that joined them). A partition
*stayed* when the worker that owned it before the window owns it after, no other worker
was seen owning it meanwhile (the views are polled), and that worker was not the one
stopped, killed or restarted; else it *moved*. The goal for partitions that stay: their
longest gap is at most the baseline's longest gap + 0.3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cluster import WorkerProcess, covered, wait_for  # noqa: E402
from app.settings import Settings, create_topics, from_env  # noqa: E402
from app.traffic import Traffic  # noqa: E402
from benchmarks.bench_scale_out import read_all  # noqa: E402
from tables.testing import EmbeddedBroker  # noqa: E402
from tests.scale_out import Background, longest_gaps  # noqa: E402

PARTITIONS = 6
LABELS = [("w1", "host-a", "rack-1"), ("w2", "host-b", "rack-2"), ("w3", "host-c", "rack-3")]
NEWCOMER = ("w4", "host-d", "rack-1")
GOAL_SLACK_S = 0.3  # kept partitions: longest gap <= the baseline's + this
EVENTS = ["baseline", "join", "leave", "SIGKILL", "rejoin", "rolling restart"]
EVENT_TEXT = {
    "baseline": "no rebalance (baseline)",
    "join": "a fourth worker joins",
    "leave": "one worker leaves cleanly",
    "SIGKILL": "one worker is SIGKILLed",
    "rejoin": "the killed worker comes back",
    "rolling restart": "rolling restart of all three",
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- who owns what ----------------------------------------------------------------------------


def owners(workers: list[WorkerProcess]) -> dict[int, str]:
    """Partition -> the worker that reports it active (a partition nobody reports: absent)."""
    found: dict[int, str] = {}
    for w in workers:
        for p in (w.join() or {}).get("actives", []):
            found[int(p)] = w.name
    return found


def settled(workers: list[WorkerProcess]) -> bool:
    """Every partition active on exactly one live worker and restored there, every worker
    holding some, no move pending and one generation everywhere."""
    views = [w.view() for w in workers]
    if any(v is None for v in views) or not covered(workers, PARTITIONS):
        return False
    joins = [v["joins"].get("ad-join") or {} for v in views if v is not None]
    if any(not j.get("actives") for j in joins):
        return False
    epochs = {v["epoch"] for v in views if v is not None}
    pending = [(v.get("group_rebalance") or {}).get("pending_moves") for v in views if v is not None]
    return len(epochs) == 1 and not any(pending)


class OwnerWatch:
    """Polls the workers' views in a thread while a window is open: every owner seen per partition."""

    def __init__(self, workers: Callable[[], list[WorkerProcess]], every_s: float = 0.3) -> None:
        self.workers, self.every_s = workers, every_s
        self.seen: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for p, name in owners(self.workers()).items():
                    self.seen[p].add(name)
            except Exception as exc:  # a worker going away mid-poll: the next poll sees the rest
                say(f"  owner watch: {type(exc).__name__}: {exc}")
            self._stop.wait(self.every_s)

    def __enter__(self) -> OwnerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Window:
    """One measured window: when, and which partitions stayed and which moved."""

    event: str
    start: float
    end: float
    kept: list[int]
    moved: list[int]
    settle_s: float | None  # from the event until settled (None: not within the timeout)
    gaps: dict[int, float] = field(default_factory=dict)  # filled once the outputs are read

    def longest(self, partitions: list[int]) -> float | None:
        return max((self.gaps[p] for p in partitions), default=None)


class Group:
    """The workers of one protocol's run and the windows measured on them."""

    def __init__(self, broker: EmbeddedBroker, settings: Settings, protocol: str, args: argparse.Namespace,
                 run_dir: Path) -> None:  # fmt: skip
        self.broker, self.settings, self.protocol, self.args = broker, settings, protocol, args
        self.run_dir = run_dir
        self.workers: dict[str, WorkerProcess] = {}
        self.windows: list[Window] = []

    def worker(self, name: str, host: str, rack: str) -> WorkerProcess:
        env = {"TANDEM_REBALANCE_PROTOCOL": self.protocol, "TANDEM_PROBING_REBALANCE_INTERVAL_S": "30"}
        s = self.settings
        found = WorkerProcess(name, host, rack, self.broker.bootstrap, s.app_id, self.run_dir,
                              standby_replicas=1, partitions=PARTITIONS, topic_prefix=s.topic_prefix,
                              extra_env=env)  # fmt: skip
        self.workers[name] = found
        return found

    def live(self) -> list[WorkerProcess]:
        return [w for w in list(self.workers.values()) if w.alive and not w.stopped]

    def wait_settled(self, what: str) -> float | None:
        started = time.time()
        if wait_for(lambda: settled(self.live()), self.args.timeout, interval=0.2):
            return time.time() - started
        say(f"  {self.protocol}: {what}: not settled within {self.args.timeout:.0f} s (logs: {self.run_dir})")
        return None

    def observe(
        self, event: str, action: Callable[[], object] | None, touched: frozenset[str] = frozenset()
    ) -> Window:
        """Run `action` and measure until the group settles (no action: the baseline's quiet
        window). `touched`: the workers stopped, killed or started by the action."""
        before = owners(self.live())
        with OwnerWatch(self.live) as watch:
            start = time.time()
            if action is None:
                time.sleep(self.args.baseline_s)
                settle_s: float | None = 0.0
            else:
                action()
                settled_s = self.wait_settled(event)
                settle_s = None if settled_s is None else time.time() - start  # from the event on
                time.sleep(self.args.tail_s)
            end = time.time()
        after = owners(self.live())
        kept: list[int] = []
        moved: list[int] = []
        for p in range(PARTITIONS):
            owner = before.get(p)
            stayed = owner is not None and owner not in touched and after.get(p) == owner
            (kept if stayed and watch.seen[p] <= {owner} else moved).append(p)
        window = Window(event, start, end, kept, moved, settle_s)
        self.windows.append(window)
        settle = "not settled" if settle_s is None else f"settled after {settle_s:.1f} s"
        say(f"  {self.protocol}: {event}: kept {kept}, moved {moved}, {settle}")
        return window

    def reported_protocol(self) -> str:
        """The protocol the workers say their group runs (the view's `rebalance_protocol`), or
        None for workers that do not report one."""
        found = {
            str(((w.view() or {}).get("rebalance_protocol") or {}).get("group_runs")) for w in self.live()
        }
        return ", ".join(sorted(found))


def run_protocol(
    broker: EmbeddedBroker, protocol: str, args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    settings = replace(from_env(), app_id=f"rebalance-{tag}", topic_prefix=f"r{tag}-", partitions=PARTITIONS)
    asyncio.run(create_topics(broker.bootstrap, settings))
    group = Group(broker, settings, protocol, args, run_dir / f"{protocol}-{tag}")
    for label in LABELS:
        group.worker(*label).start()
    try:
        if group.wait_settled("forming") is None:
            raise RuntimeError(f"{protocol}: the three workers did not settle; logs in {group.run_dir}")
        reported = group.reported_protocol()
        say(f"{protocol}: three workers settled; the workers report protocol {reported}")
        traffic = Traffic(settings.impressions, settings.clicks, run=f"r{tag}", click_ratio=1.0, bad_every=0,
                          duplicate_every=0)  # fmt: skip
        background = Background(broker.bootstrap, traffic, args.rate).start()
        began = time.time()
        time.sleep(args.warm_s)
        events(group)
        sent = background.stop()
        outputs = asyncio.run(read_all(broker.bootstrap, settings.joins))
    finally:
        for w in group.workers.values():
            w.kill()
    for window in group.windows:
        window.gaps = longest_gaps(outputs, PARTITIONS, int(window.start * 1000), int(window.end * 1000))
    lost = len(sent.expected - {j for _, _, j in outputs})
    return {"protocol": protocol, "reported": reported, "began": began, "windows": group.windows,
            "outputs": outputs, "lost": lost, "expected": len(sent.expected)}  # fmt: skip


def events(group: Group) -> None:
    """The events of the issue, one after the other, each measured until the group settles."""
    w = group.workers
    group.observe("baseline", None)
    group.observe("join", lambda: group.worker(*NEWCOMER).start(), frozenset({"w4"}))
    group.observe("leave", lambda: w["w4"].stop(30), frozenset({"w4"}))
    group.observe("SIGKILL", w["w1"].kill, frozenset({"w1"}))
    group.observe("rejoin", w["w1"].start, frozenset({"w1"}))
    for name, *_ in LABELS:

        def bounce(worker: WorkerProcess = w[name]) -> None:
            worker.stop(30)
            worker.start()

        group.observe("rolling restart", bounce, frozenset({name}))


# -- the report ---------------------------------------------------------------------------------


def summary(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per event: the kept and moved partitions' longest gap over its windows."""
    found: dict[str, dict[str, Any]] = {}
    for event in EVENTS:
        windows = [w for w in run["windows"] if w.event == event]
        kept = [g for w in windows if (g := w.longest(w.kept)) is not None]
        moved = [g for w in windows if (g := w.longest(w.moved)) is not None]
        settle = [w.settle_s for w in windows]
        found[event] = {
            "kept": max(kept) if kept else None,
            "moved": max(moved) if moved else None,
            "n_kept": sum(len(w.kept) for w in windows),
            "n_moved": sum(len(w.moved) for w in windows),
            "settle": None if None in settle else sum(s for s in settle if s is not None),
        }
    return found


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(runs: list[dict[str, Any]]) -> str:
    sums = {r["protocol"]: summary(r) for r in runs}
    names = list(sums)
    head = ["event"]
    for name in names:
        head += [f"{name}: kept max gap (s)", f"{name}: moved max gap (s)", f"{name}: goal"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for event in EVENTS:
        row = [EVENT_TEXT[event]]
        for name in names:
            s, base = sums[name][event], sums[name]["baseline"]["kept"]
            if event == "baseline":
                row += [f"{_s(s['kept'])} (all {s['n_kept']})", "—", "—"]
                continue
            goal = (
                "—"
                if s["kept"] is None or base is None
                else ("yes" if s["kept"] <= base + GOAL_SLACK_S else "no")
            )
            row += [f"{_s(s['kept'])} ({s['n_kept']})", f"{_s(s['moved'])} ({s['n_moved']})", goal]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for run in runs:
        # Workers without the setting report None and run eager (the only protocol they know).
        if run["reported"] not in (
            run["protocol"],
            "None" if run["protocol"] == "eager" else run["protocol"],
        ):
            lines.append(
                f"- WARNING: {run['protocol']} was asked for (TANDEM_REBALANCE_PROTOCOL) but the workers "
                f"report `{run['reported']}`: its columns do not measure the {run['protocol']} protocol"
            )
        settle = ", ".join(
            f"{e} {_s(s['settle'])}" for e, s in sums[run["protocol"]].items() if e != "baseline"
        )
        lines.append(
            f"- {run['protocol']}: the workers report protocol `{run['reported']}`; joins not read back "
            f"{run['lost']} of {run['expected']:,}; settled after (s): {settle}"
        )
    lines.append(
        "\n(n): partitions counted in the event's windows (the rolling restart: three windows, one per "
        f"bounce). Goal: kept max gap <= baseline + {GOAL_SLACK_S} s."
    )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Per protocol: each joined record's gap since the previous one of its partition, over
    time, with the event windows shaded."""
    import matplotlib  # the pipeline's dependency; only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 3.6 * len(runs)), sharey=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        began = run["began"]
        last: dict[int, int] = {}
        series: dict[int, tuple[list[float], list[float]]] = {p: ([], []) for p in range(PARTITIONS)}
        for partition, ts, _ in sorted(run["outputs"], key=lambda o: o[1]):
            if partition in last and ts / 1000 >= began:
                series[partition][0].append(ts / 1000 - began)
                series[partition][1].append((ts - last[partition]) / 1000)
            last[partition] = ts
        for p, (xs, ys) in series.items():
            ax.plot(xs, ys, ".", ms=3, label=f"p{p}")
        base = next((w.longest(w.kept) for w in run["windows"] if w.event == "baseline"), None)
        if base is not None:
            ax.axhline(base + GOAL_SLACK_S, color="black", lw=0.7, ls="--", label="goal for kept")
        for i, w in enumerate(run["windows"]):
            ax.axvspan(w.start - began, w.end - began, color="tab:grey" if i % 2 else "tab:olive", alpha=0.15)
            ax.text(w.start - began, 0.98, w.event, transform=ax.get_xaxis_transform(), fontsize=7, va="top")
        ax.set_title(f"{run['protocol']} (the workers report: {run['reported']})")
        ax.set_ylabel("gap since the previous result (s)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the traffic started")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--protocols", default="eager,cooperative", help="comma separated: eager, cooperative"
    )
    parser.add_argument("--quick", action="store_true", help="shorter windows and less traffic (a smoke run)")
    parser.add_argument("--rate", type=float, default=60.0, help="impressions a second (each clicked)")
    parser.add_argument("--baseline-s", type=float, default=15.0, help="the window with no rebalance")
    parser.add_argument("--tail-s", type=float, default=3.0, help="seconds measured after each settle")
    parser.add_argument("--warm-s", type=float, default=5.0, help="traffic before the first window")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for each settle")
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    parser.add_argument("--plot", type=Path, help="the gaps over time (PNG)")
    parser.add_argument("--keep", action="store_true", help="keep the workers' logs")
    args = parser.parse_args()
    if args.quick:
        args.rate, args.baseline_s, args.tail_s, args.warm_s = min(args.rate, 30.0), 6.0, 1.5, 3.0
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if not protocols or set(protocols) - {"eager", "cooperative"}:
        raise SystemExit(f"--protocols: eager and/or cooperative, not {args.protocols!r}")
    run_dir = Path(tempfile.mkdtemp(prefix="bench-rebalance-"))
    say(f"run directory (worker logs): {run_dir}")
    runs = []
    with EmbeddedBroker(log_dir=run_dir / "broker") as broker:
        for protocol in protocols:
            runs.append(run_protocol(broker, protocol, args, run_dir))
            say(json.dumps({e: s for e, s in summary(runs[-1]).items()}))
    text = table(runs)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")
    if args.plot:
        plot(runs, args.plot)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
