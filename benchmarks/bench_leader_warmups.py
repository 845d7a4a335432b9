"""The leader path with warm-ups on beside warm-ups off, in one run (issue 12).

The same events as `bench_leader_path` (its members, its subscriptions, its phases);
"on" adds the contract's warm-up fields (`acceptable_recovery_lag`, `max_warmup_replicas`)
to the scenario the adapter builds, so `plan()` computes lags, holds moves to members not
caught up and gives out warm-up replicas. Every member reports the same offset for a
partition, so holders are caught up; a joining member is not, and its share is held.

    flock /tmp/lead/bench.lock .venv/bin/python -m benchmarks.bench_leader_warmups \
        --size 1000x10000 --replicas 1 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from assignor import plan
from assignor.faust_adapter import partition_assignor as faust_adapter
from benchmarks.bench_leader_path import bench_event, header, leader_arguments
from benchmarks.scenarios import parse_size, steady

WARMUP_FIELDS = ("acceptable_recovery_lag", "max_warmup_replicas", "changelog_end_offsets")


@contextmanager
def warmups(on: tuple[int, int] | None) -> Iterator[None]:
    """While inside, the adapter's scenarios carry the warm-up fields `(lag, budget)`, or none
    at all with None (the adapter's settings turn warm-ups on by default)."""
    original: Callable[..., dict[str, Any]] = faust_adapter.build_scenario

    def with_warmups(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built = {k: v for k, v in original(*args, **kwargs).items() if k not in WARMUP_FIELDS}
        if on is None:
            return built
        return {**built, "acceptable_recovery_lag": on[0], "max_warmup_replicas": on[1]}

    faust_adapter.build_scenario = with_warmups  # type: ignore[assignment]
    try:
        yield
    finally:
        faust_adapter.build_scenario = original  # type: ignore[assignment]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:,.0f} ({min(values) * 1000:,.0f}-{max(values) * 1000:,.0f})"


def _pending(built: dict[str, Any]) -> str:
    moves = plan(built).get("pending_moves")
    return "-" if moves is None else f"{len(moves)} ({sum(m['warmup'] for m in moves)} warm-up)"


def _run(event: str, base: Any, repeats: int, on: tuple[int, int] | None) -> tuple[Any, Any]:
    """bench_event's row, and the scenario the adapter planned (with warm-ups on if given)."""
    built: list[Any] = []
    original = faust_adapter.plan_with_stats

    def keep(scenario: dict[str, Any]) -> Any:
        built.append(scenario)
        return original(scenario)

    faust_adapter.plan_with_stats = keep  # type: ignore[assignment]
    try:
        with warmups(on):
            return bench_event(event, base, repeats, None), built[-1]
    finally:
        faust_adapter.plan_with_stats = original  # type: ignore[assignment]


def measure(event: str, base: Any, repeats: int, lag: int, budget: int) -> list[str]:
    """Table rows for one event: off, then on."""
    rows = []
    for mode, on in (("off", None), ("on", (lag, budget))):
        row, scenario = _run(event, base, repeats, on)
        full = [c for c, _ in row["full"]]
        alone = [c for c, _ in row["plan"]]
        rows.append(f"| {event} | {mode} | {_ms(full)} | {_ms(alone)} | {_pending(scenario)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = leader_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--lag", type=int, default=10_000, help="acceptable_recovery_lag when on")
    parser.add_argument("--budget", type=int, default=2, help="max_warmup_replicas when on")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    base = steady(parse_size(args.size), args.replicas)
    lines = [
        f"{args.size}, R = {args.replicas}, {args.repeats} runs per event; CPU ms (median, min-max); "
        f"on: acceptable_recovery_lag {args.lag}, max_warmup_replicas {args.budget}",
        "",
        "| event | warm-ups | assign (whole path) | plan() alone | pending moves |",
        "|---|---|---|---|---|",
    ]
    for event in args.events.split(","):
        lines += measure(event, base, args.repeats, args.lag, args.budget)
        print(f"  {event} done", file=sys.stderr)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(header(argv, "benchmarks.bench_leader_warmups") + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
