"""`python -m pipeline <job> --help`: the batch side's commands."""

from __future__ import annotations

import importlib
import sys

JOBS = {
    "generate": ("pipeline.generate", "synthetic impressions and clicks to Parquet"),
    "produce": ("pipeline.produce", "produce generated Parquet traffic to the topics"),
    "join": ("pipeline.join", "the reference join over Parquet or topics (batch twin)"),
    "reconcile": ("pipeline.reconcile", "compare the stream join's output with the reference"),
    "simulate": ("pipeline.simulate", "sweep churn scenarios over assignment strategies"),
}


def usage() -> str:
    lines = ["usage: python -m pipeline <job> [--help] [options]", "", "jobs:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in JOBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in JOBS:
        print(usage())
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(JOBS[args[0]][0])
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
