"""Planner benchmark: Tandem's `plan` against Faust's assignors, round-robin and range.

    .venv/bin/python -m benchmarks.bench_planner            # full run, writes docs/bench/
    .venv/bin/python -m benchmarks.bench_planner --quick    # smoke run, small sizes, no files

Every churn event is derived from one balanced steady state, so all strategies see the same
input and one optimum (assignor.comparisons.metrics.optimum_moves) per event. Only the assignor call is
timed; building its input (the members' metadata) and reading its output back are not.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from assignor.comparisons.baselines import BASELINES, Strategy
from assignor.comparisons.metrics import Metrics, measure, optimum_moves
from benchmarks.scenarios import EVENTS, Scenario, Size, parse_size, steady

DEFAULT_SIZES = "3x12,100x1000,300x3000,1000x10000,1M"
QUICK_SIZES = "3x12,100x1000"
OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "bench"


class Timeout(BaseException):
    """BaseException: `plan` catches Exception (it never raises), this must get through."""


@dataclass
class Row:
    size: Size
    replicas: int
    event: str
    strategy: str
    optimum: int
    times: list[float] = field(default_factory=list)  # CPU seconds of the assignor call
    walls: list[float] = field(default_factory=list)  # wall seconds, inflated by other load
    status: str = "ok"
    metrics: Metrics | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.metrics is not None


def _tandem() -> Strategy:
    def run(scenario: Any) -> Any:
        from assignor import plan  # late: the planner may not be importable yet

        return plan(scenario)

    return Strategy("tandem", lambda s: s, run, lambda _s, _n, out: out, "yes (by contract)")


def strategies() -> list[Strategy]:
    return [_tandem(), *BASELINES.values()]


def _timed(fn: Callable[[Any], Any], arg: Any, timeout: float) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result): CPU time because the machine is shared."""

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise Timeout

    # A wall-clock alarm: an armed ITIMER_PROF coarsens process_time to 4 ms ticks here.
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        out = fn(arg)
        return time.process_time() - cpu, time.perf_counter() - wall, out
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_one(strategy: Strategy, scenario: Scenario, row: Row, repeats: int, args: argparse.Namespace) -> None:
    """Median over `repeats` runs; one run only when the first exceeds --slow seconds."""
    result: Any = None
    native: Any = None
    for _ in range(repeats):
        native = strategy.prepare(scenario)
        gc.collect()
        try:
            elapsed, wall, result = _timed(strategy.run, native, args.timeout)
        except Timeout:
            row.status = f"timeout > {args.timeout:g} s"
            return
        except Exception as exc:  # a baseline failing is a result, not a crash
            row.status = f"error: {type(exc).__name__}: {exc}"[:120]
            return
        row.times.append(elapsed)
        row.walls.append(wall)
        if elapsed > args.slow:
            break
    out = strategy.convert(scenario, native, result)
    if strategy.name == "tandem" and any("internal planner error" in w for w in out["warnings"]):
        row.status = "error: " + next(w for w in out["warnings"] if "internal" in w)[:110]
    row.metrics = measure(scenario, out)


def _skip_reason(strategy: Strategy, size: Size, args: argparse.Namespace) -> str | None:
    if strategy.name == "faust-full" and size.members >= args.skip_faust_at:
        return f"skipped (--skip-faust-at {args.skip_faust_at})"
    return None


def bench(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for size in args.sizes:
        for r in args.replicas if size.join else [0]:  # the 1M layout has no state
            base = steady(size, r)
            # At 1M a cold first run (fresh heap pages) and warm ones differ: keep a few.
            repeats = args.repeats if size.tasks < 100_000 else min(args.repeats, 3)
            for event in args.events:
                scenario = EVENTS[event](base)
                opt = optimum_moves(scenario)
                for strategy in strategies():
                    if args.strategies and strategy.name not in args.strategies:
                        continue
                    row = Row(size, r, event, strategy.name, opt)
                    skip = _skip_reason(strategy, size, args)
                    if skip:
                        row.status = skip
                    else:
                        run_one(strategy, scenario, row, repeats, args)
                    rows.append(row)
                    _progress(row)
                    if args.save_rows:  # as it goes: a long run stopped early keeps its rows
                        save_rows(args.save_rows, rows, args.command, args.version, args.started)
    return rows


def _progress(row: Row) -> None:
    t = f"{1000 * statistics.median(row.times):.1f} ms" if row.times else "-"
    m = row.metrics
    moves = f"moves {m.moves}/{row.optimum}" if m else ""
    print(
        f"# {row.size.label} R={row.replicas} {row.event:8s} {row.strategy:12s} {t:>12s} "
        f"{moves} {row.status if row.status != 'ok' else ''}",
        file=sys.stderr,
        flush=True,
    )


# --- tables -------------------------------------------------------------------------------


def _ms(seconds: Iterable[float]) -> str:
    values = list(seconds)
    if not values:
        return "-"
    v = 1000 * max(values)
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def _size_cell(size: Size) -> str:
    if size.join:
        return f"{size.members:,} x {size.partitions:,} x 3"
    return f"{size.members:,} x {size.topics} topics x {size.partitions:,}"


def summary_table(rows: list[Row]) -> list[str]:
    out = [
        "| size (members x partitions x topics) | R | strategy | median ms | max ms | runs "
        "| moves / optimum (sum of events) | events at optimum | warm / cold moves "
        "| spread group / total (max) | idle | co-part. violations | standby same host "
        "| standby missing | co-partitions? |",
        "|" + "---|" * 15,
    ]
    names = {s.name: s for s in strategies()}
    for (size, r, name), group in _grouped(rows).items():
        out.append(_summary_line(size, r, names[name], group))
    return out


def _grouped(rows: list[Row]) -> dict[tuple[Size, int, str], list[Row]]:
    grouped: dict[tuple[Size, int, str], list[Row]] = {}
    for row in rows:
        grouped.setdefault((row.size, row.replicas, row.strategy), []).append(row)
    return grouped


def _summary_line(size: Size, r: int, strategy: Strategy, group: list[Row]) -> str:
    done = [g for g in group if g.ok]
    head = f"| {_size_cell(size)} | {r} | {strategy.name} |"
    if not done:
        return head + f" {group[0].status} |" + " |" * 10 + f" {strategy.copartitions} |"
    ms = [g.metrics for g in done if g.metrics]
    medians = [statistics.median(g.times) for g in done]
    at_opt = sum(1 for g in done if g.metrics and g.metrics.moves == g.optimum)
    note = "" if len(done) == len(group) else f" ({len(group) - len(done)} not run)"
    return (
        head + f" {_ms([statistics.median(medians)])} | {_ms(t for g in done for t in g.times)} "
        f"| {min(len(g.times) for g in done)} "
        f"| {sum(m.moves for m in ms):,} / {sum(g.optimum for g in done):,} "
        f"| {at_opt}/{len(done)}{note} "
        f"| {sum(m.warm for m in ms):,} / {sum(m.cold for m in ms):,} "
        f"| {max(m.spread_group for m in ms)} / {max(m.spread_total for m in ms)} "
        f"| {max(m.idle for m in ms)} | {max(m.copart_violations for m in ms):,} "
        f"| {max(m.standby_same_host for m in ms):,} | {max(m.standby_missing for m in ms):,} "
        f"| {strategy.copartitions} |"
    )


def detail_table(rows: list[Row]) -> list[str]:
    out = [
        "| size | R | event | strategy | median ms | max ms | wall median ms | moves | optimum "
        "| warm | cold | spread g/t | idle | co-part. viol. | invalid | sb same host "
        "| sb missing | status |",
        "|" + "---|" * 18,
    ]
    for row in rows:
        m = row.metrics
        cells = (
            [
                f"{m.moves:,}",
                f"{row.optimum:,}",
                f"{m.warm:,}",
                f"{m.cold:,}",
                f"{m.spread_group}/{m.spread_total}",
                str(m.idle),
                f"{m.copart_violations:,}",
                f"{m.invalid:,}",
                f"{m.standby_same_host:,}",
                f"{m.standby_missing:,}",
            ]
            if m
            else ["-"] * 10
        )
        med = [statistics.median(row.times)] if row.times else []
        wall = [statistics.median(row.walls)] if row.walls else []
        out.append(
            f"| {row.size.label} | {row.replicas} | {row.event} | {row.strategy} "
            f"| {_ms(med)} | {_ms(row.times)} | {_ms(wall)} | " + " | ".join(cells) + f" | {row.status} |"
        )
    return out


def target_table(rows: list[Row]) -> list[str]:
    tandem = [r for r in rows if r.strategy == "tandem"]
    big = [r for r in tandem if r.size.label == "1000x10000" and r.replicas == 1]
    huge = [r for r in tandem if r.size.label == "1M"]
    done = [r for r in tandem if r.ok]
    lines = ["| target | result | figures |", "|---|---|---|"]
    lines.append(_time_target("1000 x 10,000 x 2 (+changelog), R = 1: under 0.5 s", big, 0.5))
    lines.append(_time_target("1M topic-partitions: median at most 1.0 s (issue 31)", huge, 1.0, median=True))
    off = [r for r in done if r.metrics and r.metrics.moves != r.optimum]
    lines.append(
        f"| moves equal the optimum in every event | {_verdict(done, not off)} "
        f"| {len(done) - len(off)}/{len(tandem)} events at optimum"
        + "".join(
            f"; {r.size.label} R={r.replicas} {r.event}: {r.metrics.moves:,} vs {r.optimum:,}"
            for r in off[:6]
            if r.metrics
        )
        + " |"
    )
    worst = max((max(r.metrics.spread_group, r.metrics.spread_total) for r in done if r.metrics), default=-1)
    lines.append(
        f"| spread at most 1 | {_verdict(done, 0 <= worst <= 1)} "
        f"| worst spread {worst} over {len(done)} events |"
    )
    return lines


def _verdict(rows: list[Row], good: bool) -> str:
    return "not run" if not rows else "met" if good else "**missed**"


def _time_target(label: str, rows: list[Row], limit: float, median: bool = False) -> str:
    """Met when every run (or, with `median`, the median of all runs) is within `limit` s."""
    runs = [t for r in rows if r.ok for t in r.times]
    if not runs:
        status = rows[0].status if rows else "not run"
        return f"| {label} | not run | {status} |"
    worst = max(runs)
    within = statistics.median(runs) <= limit if median else worst < limit
    return (
        f"| {label} | {_verdict(rows, within and all(r.ok for r in rows))} "
        f"| max {worst:.3f} s, median {statistics.median(runs):.3f} s over {len(runs)} runs "
        f"of {len(rows)} events |"
    )


# --- outputs ------------------------------------------------------------------------------


def write_markdown(rows: list[Row], command: str, path: Path, started: datetime, version: str) -> str:
    text = "\n".join(
        [
            "# Planner benchmark",
            "",
            f"Run on {started:%Y-%m-%d %H:%M} UTC, {platform.platform()}, Python "
            f"{platform.python_version()}, {_cpus()} CPUs (a noisy shared machine: compare ratios).",
            "",
            "```",
            command,
            "```",
            "",
            f"Planner: {version}.",
            "",
            *METHOD,
            "",
            "## Targets (Tandem)",
            "",
            *target_table(rows),
            "",
            "## Summary (per size, R and strategy, over the churn events)",
            "",
            *summary_table(rows),
            "",
            "![time and moves](planner.png)",
            "",
            "## Every event",
            "",
            *detail_table(rows),
            "",
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def _planner_version() -> str:
    """The commit, and whether the planner's files differed from it during the run."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a], capture_output=True, text=True, cwd=OUT_DIR.parent.parent
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--", "assignor/__init__.py", "assignor/core")
    return f"commit {git('rev-parse', '--short', 'HEAD')}" + (
        " with uncommitted changes in assignor/core (work in progress)" if dirty else ""
    )


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


METHOD = [
    "How: one balanced, co-partitioned steady state per size and R (contiguous ranges, R",
    "standbys per task on other hosts, two members per host, epoch 7), then four events derived",
    "from it, each one input to every strategy: `leave-1` (a member leaves), `join-1` (a new",
    "member joins), `leave-2` (two leave), `restart` (a member comes back with empty",
    "`previous_*` and `local_offsets` for the changelog partitions it held). Join sizes: topics",
    "`in-a`, `in-b` and `state-changelog` in one co-partition group (the changelog is stateful).",
    "`1M`: 2,000 members, 500 topics x 2,000 partitions, each topic its own group, no state",
    "(R does not apply; up to 3 runs per strategy and event, the first of them on a cold",
    "heap, so `max` is the cold run and the median a warm one, as on a long-lived leader).",
    "",
    "- Time: CPU time (`time.process_time`) of the assignor call only (`plan`,",
    "  `PartitionAssignor.assign`, `CopartitionedAssignor.get_assignment` per group,",
    "  `RoundRobinPartitionAssignor.assign`, range). CPU, not wall time, because the machine",
    "  is shared (see the load noted with each run); all strategies are single",
    "  threaded, so on an idle core wall time is about the CPU time. The per-event table also",
    "  gives the wall median. Median over the runs (`runs`, fewer when one run exceeds",
    "  `--slow`); `max ms` is the slowest single run over all events. Building the members'",
    "  metadata is not timed. Each call runs under a wall-clock alarm (`--timeout`), which",
    "  leaves `process_time` exact.",
    "- Faust's full path gets each member's previous assignment in Faust's own user data, with",
    "  the group's changelog and topic distributions every Faust member echoes back",
    "  (`assignor.comparisons.baselines`). It is skipped from `--skip-faust-at` members (2,000):",
    "  at 1M each member's user data would carry 18.5 MB of them, 34.5 GiB for the group.",
    "- `moves` = tasks not kept by their (fenced) previous owner, as the spec counts them (a",
    "  restarted member's tasks have no previous owner, so all count). `optimum` = the fewest",
    "  moves among balanced assignments, computed independently of the planner",
    "  (`assignor.comparisons.metrics.optimum_moves`, a min-cost flow). A strategy may beat it only by",
    "  being unbalanced.",
    "- `warm` = moved stateful tasks landing on a member with a previous standby or local",
    "  offsets for them; `cold` the others (stateless moves are in neither).",
    "- `spread` = max - min active tasks among members of equal subscription and capacity, per",
    "  group / in total. Standby columns count (task, standby) pairs on the active's host and",
    "  tasks with fewer than min(R, members - 1) standbys (round-robin and range place none).",
]


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    names = [s.name for s in strategies()]
    for name in names:
        pts = _time_points(rows, name)
        if pts:
            left.plot(*zip(*pts, strict=True), marker="o", label=name)
    left.set(
        xscale="log",
        yscale="log",
        xlabel="topic-partitions (R = 1; 1M at R = 0)",
        ylabel="CPU s (slowest per-event median)",
        title="Assignor time vs size",
    )
    left.axhline(0.5, ls=":", c="grey")
    left.axhline(2.0, ls="--", c="grey")
    left.legend()
    _moves_bars(right, rows, names)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _time_points(rows: list[Row], name: str) -> list[tuple[int, float]]:
    pts = []
    for (size, r, strat), group in _grouped(rows).items():
        done = [g for g in group if g.ok]
        if strat == name and done and r == (1 if size.join else 0):
            pts.append((size.topic_partitions, max(statistics.median(g.times) for g in done)))
    return sorted(pts)


def _moves_bars(ax: Any, rows: list[Row], names: list[str]) -> None:
    """Sum of moves over sum of optima per size (all events and R): 1 is exact stickiness."""
    labels = sorted({r.size.label for r in rows}, key=lambda s: parse_size(s).topic_partitions)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ratios = []
        for label in labels:
            done = [r for r in rows if r.ok and r.strategy == name and r.size.label == label]
            moves = sum(r.metrics.moves for r in done if r.metrics)
            opt = sum(r.optimum for r in done)
            ratios.append(moves / opt if done and opt else float("nan"))
        ax.bar([x + i * width for x in range(len(labels))], ratios, width, label=name)
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    ax.set(
        ylabel="moves / optimum (sums over events and R; log)",
        title="Moves against the optimum (< 1 only by being unbalanced)",
    )
    ax.axhline(1, c="black", lw=0.8)
    ax.legend()


# --- command line -------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None, help=f"comma list of MxP or 1M ({DEFAULT_SIZES})")
    p.add_argument("--replicas", default="0,1,2", help="standby replicas R, comma list")
    p.add_argument("--events", default=",".join(EVENTS), help="comma list of churn events")
    p.add_argument("--strategies", default=None, help="comma list (default: all)")
    p.add_argument("--repeats", type=int, default=5, help="runs per event (at most 3 at 1M)")
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats, no files")
    p.add_argument(
        "--skip-faust-at", type=int, default=2000, help="skip Faust's full path from this many members up"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="wall seconds per assignor call")
    p.add_argument("--slow", type=float, default=5.0, help="no repeats after a run this slow")
    p.add_argument("--out", type=Path, default=None, help="Markdown path (default docs/bench)")
    p.add_argument("--no-out", action="store_true", help="write no Markdown or plot")
    p.add_argument("--save-rows", type=Path, default=None, help="also save raw rows as JSON")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="render saved rows of several runs instead of running",
    )
    args = p.parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.sizes = [parse_size(s) for s in sizes.split(",")]
    args.replicas = [int(r) for r in args.replicas.split(",")]
    args.events = args.events.split(",")
    args.strategies = args.strategies.split(",") if args.strategies else None
    if args.quick:
        args.repeats = min(args.repeats, 3)
    if args.out is None and not args.quick and not args.no_out:
        args.out = OUT_DIR / "planner.md"
    return args


def save_rows(path: Path, rows: list[Row], command: str, version: str, started: datetime) -> None:
    runs = [{"command": command, "version": version, "started": started.isoformat()}]
    path.write_text(json.dumps({"runs": runs, "rows": [_row_json(r) for r in rows]}))


def _row_json(row: Row) -> dict[str, Any]:
    data = asdict(row)
    data["size"] = row.size.label
    return data


def load_rows(paths: list[Path]) -> tuple[list[Row], list[dict[str, str]]]:
    rows, runs = [], []
    for path in paths:
        data = json.loads(path.read_text())
        runs.extend(data["runs"])
        for r in data["rows"]:
            met = Metrics(**r.pop("metrics")) if r.get("metrics") else None
            rows.append(Row(**{**r, "size": parse_size(r["size"]), "metrics": met}))
    names = [s.name for s in strategies()]
    events = list(EVENTS)
    rows = sorted(
        _prefer_run(rows),
        key=lambda r: (r.size.topic_partitions, r.replicas, names.index(r.strategy), events.index(r.event)),
    )
    return rows, runs


def _prefer_run(rows: list[Row]) -> list[Row]:
    """Across merged runs, a row that ran replaces one skipped for the same event."""
    ran = {(r.size, r.replicas, r.event, r.strategy) for r in rows if r.times}
    return [r for r in rows if r.times or (r.size, r.replicas, r.event, r.strategy) not in ran]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = datetime.now(UTC)
    version = _planner_version()  # at start: the planner is imported once, now
    command = " ".join([".venv/bin/python -m benchmarks.bench_planner", *argv])
    args.command, args.version, args.started = command, version, started
    if args.merge:
        rows, runs = load_rows(args.merge)
        command = "\n".join([r["command"] for r in runs] + [command])
        version = "; ".join(sorted({r["version"] for r in runs}))
        started = min(datetime.fromisoformat(r["started"]) for r in runs)
    else:
        rows = bench(args)
    if args.save_rows:
        save_rows(args.save_rows, rows, command, version, started)
    print("\n".join(["## Targets (Tandem)", *target_table(rows), "", "## Summary", *summary_table(rows)]))
    if args.out:
        write_markdown(rows, command, args.out, started, version)
        plot(rows, args.out.with_suffix(".png"))
        print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
