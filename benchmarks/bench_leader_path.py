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

It also reports the messages' sizes: each member's subscription and assignment, their
sums over the group, and the record Kafka's group coordinator writes to
`__consumer_offsets` on SyncGroup (every member's id, subscription and assignment in one
record, which must fit that topic's `max.message.bytes`, by default the broker's
`message.max.bytes`, 1,048,588 bytes), raw and gzip-compressed
(`offsets.topic.compression.codec=1`).

Faust's assign runs in a forked child limited to --faust-cpu CPU seconds (600 by default,
the "10 minutes" of issue 31); past that the table says it did not finish.

    flock /tmp/lead/bench.lock .venv/bin/python -m benchmarks.bench_leader_path \
        --size 1000x10000 --replicas 1 --repeats 5 --faust
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import platform
import resource
import signal
import statistics
import struct
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faust
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import plan, wire
from assignor.comparisons import baselines
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
            # Spread over 300-400 million like a real changelog's (a regular series would
            # compress unrealistically well in the coordinator's record); one value per partition.
            offsets[topic] = {p: 300_000_000 + p * 2_654_435_761 % 100_000_000 for p in sorted(held)}
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
    metadata = {  # the protocol version a member announces: it reads warm-up assignments
        m: ConsumerProtocolMemberMetadata(
            wire.VERSION_WARMUPS,
            sorted(d["topics"]),
            wire.encode_subscription(subscription(m, d, changelogs)),
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


def bench_event(event: str, base: Scenario, repeats: int, faust: tuple[float, int] | None) -> dict[str, Any]:
    """Tandem's whole path (`repeats` runs), its phases, plan() alone, message sizes, and, with
    `faust` = (CPU seconds, bytes) allowed, Faust's assign on the same event."""
    scenario = EVENTS[event](base)
    assignor, cluster, metadata = leader(scenario)
    full = [cpu(lambda: assignor.assign(cluster, metadata)) for _ in range(repeats)]
    spent: dict[str, float] = {}
    built: list[Any] = []
    with phase_clock(spent, built):
        spent["total"] = cpu(lambda: assignor.assign(cluster, metadata))[0]
    alone = [cpu(lambda: plan(built[0])) for _ in range(repeats)]
    sizes = message_sizes(metadata, assignor.assign(cluster, metadata))
    row = {"event": event, "full": full, "plan": alone, "phases": spent, "faust": None, "sizes": sizes}
    s = assignor.settings
    row["warmups"] = (
        f"warm-ups on (acceptable_recovery_lag {s.acceptable_recovery_lag:,}, max_warmup_replicas "
        f"{s.max_warmup_replicas})"
        if s.warmups
        else "warm-ups off"
    )
    if faust is not None:
        row["faust"] = faust_in_child(scenario, *faust)
    return row


def faust_in_child(scenario: Scenario, cpu_limit: float, memory_limit: int = 8 << 30) -> dict[str, Any]:
    """Faust's assign in a forked child allowed `cpu_limit` CPU seconds (RLIMIT_CPU) and
    `memory_limit` bytes more address space: its CPU seconds and message sizes, or
    {"unfinished": reason}."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_faust_child, args=(scenario, cpu_limit, memory_limit, send), daemon=True)
    child.start()
    send.close()
    wall_limit = 3 * cpu_limit + 120  # the machine is shared: CPU time, not wall time, is the limit
    result: dict[str, Any] | None = None
    if receive.poll(wall_limit):
        try:
            result = receive.recv()
        except EOFError:  # the child died before it could answer
            result = None
    if child.is_alive():
        child.kill()  # our own child, by its pid
    child.join()
    if result is not None:
        return result
    if child.exitcode == -signal.SIGXCPU:
        return {"unfinished": f"did not finish within {cpu_limit:.0f} CPU s"}
    if child.exitcode == -signal.SIGKILL:
        return {"unfinished": f"no result within {wall_limit:.0f} s of wall time"}
    return {"unfinished": f"failed (exit code {child.exitcode})"}


def _faust_child(scenario: Scenario, cpu_limit: float, memory_limit: int, send: Any) -> None:
    """In the child: at most `memory_limit` more bytes of address space (Faust's members each
    echo the cluster's whole distribution, so its input grows with members x partitions), and
    `cpu_limit` CPU seconds for the assign call."""
    echoed = len(baselines._faust_shared_state(scenario))  # what every member's user data repeats
    if echoed * len(scenario["members"]) > memory_limit:
        send.send(
            {
                "unfinished": f"not run: its {len(scenario['members']):,} subscriptions would hold "
                f"{echoed * len(scenario['members']) / 2**30:,.1f} GiB (each echoes the group's "
                f"distribution, {echoed / 2**20:,.1f} MiB; limit {memory_limit / 2**30:.3g} GiB)"
            }
        )
        return
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + memory_limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        assignor, cluster, metadata = FAUST_FULL.prepare(scenario)
    except MemoryError:
        send.send({"unfinished": f"its input alone needs over {memory_limit / 2**30:.3g} GiB"})
        return
    subs = [len(md.encode()) for md in metadata.values()]
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + cpu_limit) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 10))
    gc.collect()
    started = time.process_time()
    try:
        out = assignor.assign(cluster, metadata)
    except Exception as exc:  # out of memory shows as MemoryError, or as the JSON parser's own error
        reason = f"{type(exc).__name__}: {exc}"[:100]
        send.send({"unfinished": f"failed within {memory_limit / 2**30:.3g} GiB ({reason})"})
        return
    seconds = time.process_time() - started
    given = [len(a.encode()) for a in out.values()]
    send.send(
        {
            "cpu": seconds,
            "subscription_max": max(subs),
            "subscriptions": sum(subs),
            "assignment_max": max(given),
            "assignments": sum(given),
        }
    )


def message_sizes(metadata: dict[str, Any], assignments: dict[str, Any]) -> dict[str, Any]:
    """Bytes of each member's subscription (protocol metadata) and assignment, their sums, and
    the group coordinator's `__consumer_offsets` record for the group (see the module doc)."""
    subs = {m: md.encode() for m, md in metadata.items()}
    given = {m: a.encode() for m, a in assignments.items()}
    record = group_record(subs, given)
    # Kafka's own share: the same record with every user data empty (what any assignor pays).
    bare_subs = {m: type(md)(md.version, md.subscription, b"").encode() for m, md in metadata.items()}
    bare_given = {m: type(a)(a.version, a.assignment, b"").encode() for m, a in assignments.items()}
    return {
        "members": len(subs),
        "subscription_max": max(map(len, subs.values())),
        "subscription_user_max": max(len(md.user_data) for md in metadata.values()),
        "subscriptions": sum(map(len, subs.values())),
        "assignment_max": max(map(len, given.values())),
        "assignment_user_max": max(len(a.user_data) for a in assignments.values()),
        "assignments": sum(map(len, given.values())),
        "record": len(record),
        "record_gzip": len(zlib.compress(record, 6)) + 18,  # Java's GZIPOutputStream: level 6, 18-byte frame
        "record_bare": len(group_record(bare_subs, bare_given)),
    }


def group_record(subscriptions: dict[str, bytes], assignments: dict[str, bytes]) -> bytes:
    """The GroupMetadataValue (version 3) the coordinator appends on SyncGroup, with ids as Kafka
    makes them: member id = client id + "-" + a UUID, Faust's client id, one host per member."""

    def text(value: str | None) -> bytes:
        if value is None:
            return struct.pack(">h", -1)
        raw = value.encode()
        return struct.pack(">h", len(raw)) + raw

    def blob(value: bytes) -> bytes:
        return struct.pack(">i", len(value)) + value

    client = "faust-0.15.3"
    ids = {m: f"{client}-{uuid.UUID(int=i + 1)}" for i, m in enumerate(sorted(subscriptions))}
    parts = [struct.pack(">h", 3), text("consumer"), struct.pack(">i", 8), text("tandem")]
    parts += [text(ids[min(ids)]), struct.pack(">q", 0), struct.pack(">i", len(ids))]
    for i, member in enumerate(sorted(subscriptions)):
        parts += [
            text(ids[member]),
            text(None),
            text(client),
            text(f"/10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"),
        ]
        parts += [struct.pack(">ii", 300_000, 10_000), blob(subscriptions[member]), blob(assignments[member])]
    return b"".join(parts)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:,.0f}"


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        f"{args.size}, R = {args.replicas}, {rows[0]['warmups'] if rows else ''}, {args.repeats} runs "
        "per event; CPU ms (median, min-max)",
        "",
        "| event | assign (whole path) | plan() alone | path / plan | Faust assign | Faust / path |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        full = [c for c, _ in r["full"]]
        alone = [c for c, _ in r["plan"]]
        faust_cell = ratio = "-"
        if r["faust"] and "cpu" in r["faust"]:
            faust_cell = f"{r['faust']['cpu'] * 1000:,.0f}"
            ratio = f"{r['faust']['cpu'] / statistics.median(full):.0f}x"
        elif r["faust"]:
            faust_cell = r["faust"]["unfinished"]
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
    return lines + ["", *size_report(rows)]


def size_report(rows: list[dict[str, Any]]) -> list[str]:
    """Bytes per member (largest) and over the group, Tandem's and (where it finished) Faust's."""
    lines = [
        "Message sizes in bytes (Kafka protocol encoding: user data included; largest member, sum over "
        "the group), and the group coordinator's record of the group (estimated: see the module doc):",
        "",
        "| event | assignor | subscription, largest | subscriptions, sum | assignment, largest "
        "| assignments, sum | group record | group record, gzip | group record, no user data |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        z = r["sizes"]
        lines.append(
            f"| {r['event']} | tandem | {z['subscription_max']:,} (user data {z['subscription_user_max']:,}) "
            f"| {z['subscriptions']:,} | {z['assignment_max']:,} (user data {z['assignment_user_max']:,}) "
            f"| {z['assignments']:,} | {z['record']:,} | {z['record_gzip']:,} | {z['record_bare']:,} |"
        )
        f = r["faust"]
        if f and "cpu" in f:
            lines.append(
                f"| {r['event']} | faust | {f['subscription_max']:,} | {f['subscriptions']:,} "
                f"| {f['assignment_max']:,} | {f['assignments']:,} | - | - | - |"
            )
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
    parser.add_argument("--faust", action="store_true", help="also time Faust's assign (~15 s at 1000x10000)")
    parser.add_argument("--faust-cpu", type=float, default=600.0, help="CPU seconds Faust's assign may take")
    parser.add_argument("--faust-memory", type=float, default=8.0, help="GiB Faust's child may allocate")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    base = steady(parse_size(args.size), args.replicas)
    rows = []
    for event in args.events.split(","):
        faust = (args.faust_cpu, int(args.faust_memory * 2**30)) if args.faust else None
        rows.append(bench_event(event, base, args.repeats, faust))
        print(f"  {event} done", file=sys.stderr)
    lines = report(rows, args)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(header(argv) + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
