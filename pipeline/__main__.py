"""`python -m pipeline <job> --help`: the batch side's commands."""

from __future__ import annotations

import importlib
import sys

JOBS = {
    "join": (
        "pipeline.join",
        "the batch twin of a declared join (--app MODULE), over its topics or an export",
    ),
    "reconcile": ("pipeline.reconcile", "what the stream produced for a join (its audit) against the twin"),
    "export": ("pipeline.export", "a join's input topics to Parquet"),
    "produce": ("pipeline.produce", "Parquet or JSON lines to a join's input topics (partitioner, seq)"),
    "generate": ("pipeline.generate", "the reference app's synthetic impressions and clicks to Parquet"),
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
