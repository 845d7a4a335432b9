"""The whole leader path, not just `plan()`: what a group leader pays per rebalance.

`TandemAssignor.assign(cluster, member_metadata)` decodes every member's wire
subscription, builds the scenario, plans, and encodes every member's assignment
(and the routing table). This times it beside `plan()` alone on the scenario the
adapter built, splits it into phases, and (with --faust) times Faust's own
`PartitionAssignor.assign` on the same event in the same run.

Members are the planner benchmark's (benchmarks/scenarios.py: contiguous ranges,
R standbys on other hosts, two members per host, three racks); each reports, as a
real worker does, the changelog offsets of every partition it holds (active or
standby) in hundreds of millions.

    flock /tmp/lead/bench.lock .venv/bin/python -m benchmarks.bench_leader_path \
        --size 1000x10000 --replicas 1 --repeats 5 --faust
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faust
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import plan, wire
from assignor.comparisons.baselines import FAUST_FULL, StaticCluster
from assignor.faust_adapter import partition_assignor as faust_adapter
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join, tandem
from benchmarks.scenarios import EVENTS, Scenario, parse_size, steady

PHASES = {  # module, function: what the leader path spends its time on
    "decode": (faust_adapter.wire, "read_subscription"),
    "scenario": (faust_adapter, "build_scenario"),
    "plan": (faust_adapter, "plan_with_stats"),
    "routing": (faust_adapter, "routing_table"),
    "split": (faust_adapter, "member_assignments"),
    "encode": (faust_adapter.wire, "encode_assignment"),
}


def subscription(member: str, data: dict[str, Any], changelogs: list[str]) -> wire.Subscription:
    """What the member sends: its previous generation and the offsets of its local state."""
    offsets = {}
    for topic in changelogs:
        held = set(data["previous_active"].get(topic, [])) | set(data["previous_standby"].get(topic, []))
        held |= {int(p) for p in data.get("local_offsets", {}).get(topic, {})}
        if held:
            offsets[topic] = {p: 300_000_000 + 7919 * p for p in sorted(held)}
    return wire.Subscription(
        epoch=data["epoch"],
        url=f"http://{member}.tandem.internal:6066",
        host=data["host"],
        rack=data["rack"],
        capacity=float(data["capacity"]),
        previous_active=data["previous_active"],
        previous_standby=data["previous_standby"],
        local_offsets=offsets,
    )


def leader(scenario: Scenario) -> tuple[TandemAssignor, StaticCluster, dict[str, Any]]:
    """A leader's assignor (a real faust.App, never started) and the JoinGroup it received."""
    app = faust.App("bench-leader", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)
    for group in scenario["copartition_groups"]:
        logs = [t for t in group if t in scenario["changelog_topics"]]
        declare_join(app, [t for t in group if t not in logs], logs[0] if logs else None)
    assignor = tandem(app)
    assignor.settings = type(assignor.settings)(standby_replicas=scenario["standby_replicas"])
    changelogs = scenario["changelog_topics"]
    metadata = {
        m: ConsumerProtocolMemberMetadata(
            wire.VERSION, sorted(d["topics"]), wire.encode_subscription(subscription(m, d, changelogs))
        )
        for m, d in scenario["members"].items()
    }
    return assignor, StaticCluster(scenario["topics"]), metadata


@contextmanager
def phase_clock(spent: dict[str, float], built: list[Any]) -> Iterator[None]:
    """Wrap each phase's function to add its CPU time to `spent` (and keep the scenario built)."""
    originals = {name: getattr(module, attr) for name, (module, attr) in PHASES.items()}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - started
                if name == "plan":
                    built.append(args[0])

        return run

    for name, (module, attr) in PHASES.items():
        setattr(module, attr, timed(name, originals[name]))
    try:
        yield
    finally:
        for name, (module, attr) in PHASES.items():
            setattr(module, attr, originals[name])


def cpu(fn: Callable[[], Any]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call, after a full collection."""
    gc.collect()
    started, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - started, time.perf_counter() - wall


def bench_event(event: str, base: Scenario, repeats: int, with_faust: bool) -> dict[str, Any]:
    scenario = EVENTS[event](base)
    assignor, cluster, metadata = leader(scenario)
    full = [cpu(lambda: assignor.assign(cluster, metadata)) for _ in range(repeats)]
    spent: dict[str, float] = {}
    built: list[Any] = []
    with phase_clock(spent, built):
        spent["total"] = cpu(lambda: assignor.assign(cluster, metadata))[0]
    alone = [cpu(lambda: plan(built[0])) for _ in range(repeats)]
    row = {"event": event, "full": full, "plan": alone, "phases": spent, "faust": None}
    if with_faust:
        native = FAUST_FULL.prepare(scenario)
        row["faust"] = cpu(lambda: FAUST_FULL.run(native))
    return row


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:,.0f}"


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        f"{args.size}, R = {args.replicas}, {args.repeats} runs per event; CPU ms (median, min-max)",
        "",
        "| event | assign (whole path) | plan() alone | path / plan | Faust assign | Faust / path |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        full = [c for c, _ in r["full"]]
        alone = [c for c, _ in r["plan"]]
        faust_cell = ratio = "-"
        if r["faust"]:
            faust_cell = f"{r['faust'][0] * 1000:,.0f}"
            ratio = f"{r['faust'][0] / statistics.median(full):.0f}x"
        lines.append(
            f"| {r['event']} | {ms(full)} ({min(full) * 1000:,.0f}-{max(full) * 1000:,.0f}) "
            f"| {ms(alone)} ({min(alone) * 1000:,.0f}-{max(alone) * 1000:,.0f}) "
            f"| {statistics.median(full) / statistics.median(alone):.2f} | {faust_cell} | {ratio} |"
        )
    lines += ["", "Phases of one whole-path run (CPU ms):", ""]
    names = list(PHASES)
    lines += ["| event | " + " | ".join(names) + " | other |", "|---" * (len(names) + 2) + "|"]
    for r in rows:
        total = r["phases"]["total"]
        parts = [r["phases"].get(n, 0.0) for n in names]
        cells = " | ".join(f"{p * 1000:,.0f}" for p in parts)
        lines.append(f"| {r['event']} | {cells} | {(total - sum(parts)) * 1000:,.0f} |")
    return lines


def header(argv: list[str], module: str = "benchmarks.bench_leader_path") -> list[str]:
    """When, where, on which commit, and under what load the run was made (`python -m module argv`)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "assignor"], capture_output=True, text=True, check=False
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.platform()}, Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average {load} at the end.",
        f"Code: commit {commit}{' (with uncommitted changes)' if dirty.stdout.strip() else ''}.",
        "",
        "```",
        f"python -m {module} " + " ".join(argv),
        "```",
        "",
    ]


def leader_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options both leader-path benchmarks take: the group, the events, the runs, --out."""
    parser.add_argument("--size", default="1000x10000", help="MxP (join layout of bench_planner)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--events", default="leave-1,join-1,leave-2,restart")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the table(s), with a header, to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = leader_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--faust", action="store_true", help="also time Faust's assign (~13 s each)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    base = steady(parse_size(args.size), args.replicas)
    rows = []
    for event in args.events.split(","):
        rows.append(bench_event(event, base, args.repeats, args.faust))
        print(f"  {event} done", file=sys.stderr)
    lines = report(rows, args)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(header(argv) + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
