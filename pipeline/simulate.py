"""simulate: a sweep of churn scenarios over assignment strategies, in parallel on Spark.

Each scenario is a balanced previous generation of a stateful join (impressions,
clicks and their changelog co-partitioned, sometimes a stateless lone topic) on
a random cluster (members, hosts, racks, standby replicas), followed by one churn
event: members join, leave, restart with their state on disk, or are replaced.
Every strategy answers the same scenario (docs/scenario-format.md); the
assignor's own metrics (`assignor.comparisons.metrics`, independent of the planner) score it:
moves against the optimum, balance, warm promotions (moved tasks landing on a
member holding their state), cold restores (state rebuilt from the changelog),
co-partitioning and standby coverage.

Strategies are pluggable: `tandem` (assignor.plan), the baselines of
`assignor.comparisons.baselines` when present (faust-full, faust-core, round-robin, range),
or any `module:function` taking a scenario and returning an assignment.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

Scenario = dict[str, Any]
Strategy = Callable[[Scenario], dict[str, Any]]
JOIN_TOPICS = ["impressions", "clicks", "ad-joins-changelog"]
EVENTS = ["join", "leave", "restart", "replace"]
METRICS = [
    "tasks", "moves", "warm", "cold", "spread_group", "spread_total", "idle",
    "copart_violations", "invalid", "standby_missing", "standby_on_active", "standby_same_host",
]  # fmt: skip
RESULT_SCHEMA = (
    "scenario long, strategy string, members int, partitions int, replicas int, "
    "members_per_host int, racks int, lone_topic boolean, event string, changed int, "
    "optimum int, excess int, plan_ms double, error string, " + ", ".join(f"{m} int" for m in METRICS)
)


# -- strategies ------------------------------------------------------------------------


def available_strategies() -> dict[str, Strategy]:
    """Every strategy importable here: the planner, then the baselines (may land later)."""
    found: dict[str, Strategy] = {}
    try:
        from assignor import plan

        found["tandem"] = plan
    except ImportError:
        pass
    try:
        from assignor.comparisons.baselines import BASELINES
    except ImportError:
        BASELINES = {}  # noqa: N806 - mirrors the optional module's name
    found.update({name: strategy for name, strategy in BASELINES.items()})
    return found


def resolve(names: list[str]) -> dict[str, Strategy]:
    """Strategies by name, or `module:function` for one of your own."""
    known = available_strategies()
    chosen: dict[str, Strategy] = {}
    for name in names:
        if name in known:
            chosen[name] = known[name]
        elif ":" in name:
            module, function = name.split(":", 1)
            chosen[name] = getattr(importlib.import_module(module), function)
        else:
            raise SystemExit(f"simulate: unknown strategy {name!r}; known: {sorted(known)}")
    return chosen


# -- scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChurnSpec:
    scenario: int
    members: int
    partitions: int
    replicas: int
    members_per_host: int
    racks: int
    lone_topic: bool
    event: str
    changed: int  # members that join, leave, restart or are replaced

    @classmethod
    def draw(cls, seed: int, scenario: int) -> ChurnSpec:
        rng = np.random.default_rng([seed, scenario])
        members = int(rng.integers(2, 25))
        event = EVENTS[int(rng.integers(len(EVENTS)))]
        most = members - 1 if event in ("leave", "replace") else members
        return cls(
            scenario=scenario,
            members=members,
            partitions=int(rng.choice([4, 6, 8, 12, 16, 24, 32, 48, 64])),
            replicas=int(rng.integers(0, 3)),
            members_per_host=int(rng.integers(1, 4)),
            racks=int(rng.integers(1, 4)),
            lone_topic=bool(rng.random() < 0.3),
            event=event,
            changed=int(rng.integers(1, max(1, min(3, most)) + 1)),
        )


def _member_id(i: int) -> str:
    return f"w{i:03d}"


def _member(spec: ChurnSpec, i: int, topics: list[str], epoch: int) -> dict[str, Any]:
    host = i // spec.members_per_host
    return {"topics": topics, "host": f"h{host:03d}", "rack": f"r{host % spec.racks}",
            "capacity": 1, "epoch": epoch}  # fmt: skip


def steady_state(spec: ChurnSpec, rng: np.random.Generator) -> Scenario:
    """A balanced previous generation: tasks dealt at random, standbys off the owner's host."""
    topics = JOIN_TOPICS + (["audit"] if spec.lone_topic else [])
    members = [_member(spec, i, topics, epoch=5) for i in range(spec.members)]
    owners = np.resize(np.arange(spec.members), spec.partitions)[rng.permutation(spec.partitions)]
    for i, d in enumerate(members):
        mine = sorted(int(p) for p in np.flatnonzero(owners == i))
        d["previous_active"] = {t: mine for t in JOIN_TOPICS} if mine else {}
        d["previous_standby"] = {}
    for p, owner in enumerate(owners):
        others = [i for i in range(spec.members) if members[i]["host"] != members[owner]["host"]]
        for i in rng.permutation(others)[: spec.replicas]:
            members[i]["previous_standby"].setdefault(JOIN_TOPICS[2], []).append(p)
    if spec.lone_topic:
        for p in range(4):
            members[p % spec.members]["previous_active"].setdefault("audit", []).append(p)
    return {
        "topics": {**{t: spec.partitions for t in JOIN_TOPICS},
                   **({"audit": 4} if spec.lone_topic else {})},
        "copartition_groups": [JOIN_TOPICS],
        "changelog_topics": [JOIN_TOPICS[2]],
        "standby_replicas": spec.replicas,
        "members": {_member_id(i): d for i, d in enumerate(members)},
    }  # fmt: skip


def _restarted(member: dict[str, Any]) -> dict[str, Any]:
    """Back with no previous assignment, its state (active and standby) still on disk."""
    held = set(member["previous_active"].get(JOIN_TOPICS[2], []))
    held |= set(member["previous_standby"].get(JOIN_TOPICS[2], []))
    offsets = {JOIN_TOPICS[2]: {str(p): 1000 + p for p in sorted(held)}} if held else {}
    return {**member, "epoch": 0, "previous_active": {}, "previous_standby": {},
            "local_offsets": offsets}  # fmt: skip


def churn(spec: ChurnSpec, rng: np.random.Generator) -> Scenario:
    """The steady state followed by the spec's event: the scenario the strategies answer."""
    scenario = steady_state(spec, rng)
    members: dict[str, Any] = scenario["members"]
    picked = [_member_id(int(i)) for i in rng.choice(spec.members, spec.changed, replace=False)]
    topics = list(scenario["topics"])
    newcomers = {
        _member_id(spec.members + k): _member(spec, spec.members + k, topics, epoch=0)
        for k in range(spec.changed)
    }
    if spec.event == "join":
        members.update(newcomers)
    elif spec.event == "leave":
        for m in picked:
            del members[m]
    elif spec.event == "restart":
        members.update({m: _restarted(members[m]) for m in picked})
    else:  # replace: members leave and as many fresh ones join (hosts recycled)
        for m in picked:
            del members[m]
        members.update(newcomers)
    return scenario


# -- running ------------------------------------------------------------------------------


def run_scenario(seed: int, scenario: int, strategies: dict[str, Strategy]) -> list[dict[str, Any]]:
    from assignor.comparisons.metrics import measure, optimum_moves

    spec = ChurnSpec.draw(seed, scenario)
    problem = churn(spec, np.random.default_rng([seed, scenario, 1]))
    optimum = optimum_moves(problem)
    rows = []
    for name, strategy in strategies.items():
        row: dict[str, Any] = {**asdict(spec), "strategy": name, "optimum": optimum,
                               "error": None, "excess": None, "plan_ms": None}  # fmt: skip
        try:
            began = time.perf_counter()
            assignment = strategy(problem)
            row["plan_ms"] = (time.perf_counter() - began) * 1000
            metrics = measure(problem, assignment).as_dict()
        except Exception as exc:  # noqa: BLE001 - a failing strategy is a result, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            metrics = {}
        row.update({m: metrics.get(m) for m in METRICS})
        if metrics:
            row["excess"] = metrics["moves"] - optimum
        rows.append(row)
    return rows


def _columns() -> list[str]:
    return [c.split()[0] for c in RESULT_SCHEMA.split(", ")]


def sweep_batches(
    batches: Iterator[pd.DataFrame], seed: int, names: list[str], full_every: int
) -> Iterator[pd.DataFrame]:
    """Spark worker side: run every scenario id of the batch through the strategies."""
    strategies = resolve(names)
    sampled = {n: s for n, s in strategies.items() if n != "faust-full"}
    for batch in batches:
        rows: list[dict[str, Any]] = []
        for scenario in batch["id"]:
            # faust-full builds a Faust app per call (~90 ms): run it on every n-th scenario.
            use = strategies if int(scenario) % full_every == 0 else sampled
            rows.extend(run_scenario(seed, int(scenario), use))
        frame = pd.DataFrame(rows, columns=_columns())
        for name in ("excess", "plan_ms", *METRICS):
            frame[name] = pd.to_numeric(frame[name])
        yield frame


def simulate(
    spark: Any, seed: int, scenarios: int, names: list[str], out: Path, full_every: int = 10, slices: int = 64
) -> Any:
    """Run the sweep on Spark and write OUT/results (Parquet); returns the results frame."""
    ids = spark.range(0, scenarios, numPartitions=max(1, min(slices, scenarios)))
    results = ids.mapInPandas(lambda batches: sweep_batches(batches, seed, names, full_every), RESULT_SCHEMA)
    results.write.mode("overwrite").parquet(str(out / "results"))
    return spark.read.parquet(str(out / "results"))


def summarize(results: Any, names: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per strategy, per (strategy, event) and per (strategy, members): the aggregates.

    `excess` is moves minus the fewest moves of any balanced assignment, so an
    unbalanced strategy can go below zero; `optimal` counts exactly zero.
    """
    from pyspark.sql import functions as F

    ok = F.col("error").isNull()
    balanced = (F.col("spread_total") <= 1) & (F.col("spread_group") <= 1)
    aggs = [
        F.count("*").alias("scenarios"),
        F.sum((~ok).cast("int")).alias("errors"),
        F.avg("moves").alias("moves"),
        F.avg("excess").alias("excess"),
        F.avg((F.col("excess") == 0).cast("double")).alias("optimal"),
        F.avg(balanced.cast("double")).alias("balanced"),
        F.avg("warm").alias("warm"),
        F.avg("cold").alias("cold"),
        F.avg((F.col("copart_violations") > 0).cast("double")).alias("copart_broken"),
        F.avg((F.col("standby_missing") > 0).cast("double")).alias("standby_short"),
        F.avg("plan_ms").alias("plan_ms"),
    ]
    order = {name: i for i, name in enumerate(names)}

    def grouped(*keys: str) -> pd.DataFrame:
        frame = results.groupBy(*keys).agg(*aggs).toPandas()
        frame["_rank"] = frame["strategy"].map(order)
        return frame.sort_values(["_rank", *keys[1:]]).drop(columns="_rank")

    return grouped("strategy"), grouped("strategy", "event"), grouped("strategy", "members")


def markdown_table(frame: pd.DataFrame) -> str:
    """A Markdown table with readable numbers (shares as percentages)."""
    shares = {"optimal", "balanced", "copart_broken", "standby_short"}

    def cell(name: str, value: Any) -> str:
        if name in shares:
            return f"{100 * value:.1f}%"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([head, rule, *body])


def plot(by_event: pd.DataFrame, by_size: pd.DataFrame, by_strategy: pd.DataFrame, path: Path) -> None:
    """Four panels: excess moves by event, by cluster size; restores; balance and optimality."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    names = list(by_strategy["strategy"])
    width = 0.8 / max(1, len(names))
    events = sorted(by_event["event"].unique())
    ax = axes[0][0]
    for k, name in enumerate(names):
        rows = by_event[by_event["strategy"] == name].set_index("event").reindex(events)
        ax.bar(np.arange(len(events)) + k * width, rows["excess"], width, label=name)
    ax.set_xticks(np.arange(len(events)) + width * (len(names) - 1) / 2, events)
    ax.set_title("Moves beyond the balanced optimum, mean per scenario")
    ax.set_ylabel("tasks")
    ax.legend(loc="upper left", fontsize="small")
    ax = axes[0][1]
    for name in names:
        rows = by_size[by_size["strategy"] == name]
        ax.plot(rows["members"], rows["excess"], marker="o", label=name)
    ax.set_title("Moves beyond the balanced optimum by cluster size")
    ax.set_xlabel("members before the event")
    ax.set_ylabel("tasks")
    ax = axes[1][0]
    x = np.arange(len(names))
    ax.bar(x, by_strategy["warm"], label="warm (state already there)")
    ax.bar(x, by_strategy["cold"], bottom=by_strategy["warm"], label="cold (restore from log)")
    ax.set_xticks(x, names)
    ax.set_title("Moved stateful tasks, mean per scenario")
    ax.legend()
    ax = axes[1][1]
    ax.bar(x - 0.2, 100 * by_strategy["optimal"], 0.4, label="optimal moves")
    ax.bar(x + 0.2, 100 * by_strategy["balanced"], 0.4, label="balanced")
    ax.set_xticks(x, names)
    ax.set_ylim(0, 105)
    ax.set_title("Share of scenarios (%)")
    ax.legend()
    fig.suptitle(f"Churn sweep: {int(by_strategy['scenarios'].max()):,} scenarios")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, command: str, frames: tuple[pd.DataFrame, ...]) -> str:
    by_strategy, by_event, by_size = frames
    plot(by_event, by_size, by_strategy, out / "simulate.png")
    text = "\n\n".join([
        f"# Churn sweep\n\nCommand: `{command}`",
        "## By strategy\n\n" + markdown_table(by_strategy),
        "## By strategy and event\n\n" + markdown_table(by_event),
        "![sweep](simulate.png)",
    ])  # fmt: skip
    (out / "summary.md").write_text(text + "\n")
    return markdown_table(by_strategy)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline simulate",
        description="Sweep churn scenarios (cluster sizes, standbys, hosts and racks, joins, "
        "leaves, restarts) over assignment strategies in parallel on Spark.",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for results/ (Parquet), summary.md, simulate.png"
    )
    parser.add_argument("--scenarios", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--strategies", default=None, help="comma-separated names or module:function (default: all available)"
    )
    parser.add_argument(
        "--faust-full-every",
        type=int,
        default=10,
        help="run faust-full (~90 ms a call) on every n-th scenario (default 10)",
    )
    parser.add_argument("--slices", type=int, default=64, help="Spark tasks (default 64)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.strategies.split(",") if args.strategies else list(available_strategies())
    resolve(names)  # fail fast on an unknown name, before Spark starts
    from pipeline.spark import progress, session

    began = time.monotonic()
    print(f"simulate: {args.scenarios:,} scenarios x {names} -> {args.out}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    spark = session(args.master, "tandem-simulate")
    with progress(spark, "simulate"):
        results = simulate(
            spark, args.seed, args.scenarios, names, args.out, args.faust_full_every, args.slices
        )
        frames = summarize(results, names)
    command = "python -m pipeline simulate " + " ".join(argv or [])
    print(write_report(args.out, command, frames))
    (args.out / "summary.json").write_text(frames[0].to_json(orient="records", indent=2))
    print(
        f"simulate: done in {time.monotonic() - began:.1f} s; see {args.out}/summary.md "
        f"and {args.out}/simulate.png",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
