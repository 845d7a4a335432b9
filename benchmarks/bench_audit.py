"""CPU per result of the audit records (a join's `audit` option, `Collector.audit`): compiled
(tables/operators/_fastjoin.pyx `audit_many`, one call per batch) and the Python loop it mirrors
(`Collector.python_audit`: `audit_value` per result), alternated round by round; prints a
Markdown table.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_audit [--results 2000] [--rounds 7]

Each result is the reference app's: an auction id key, an impression and a click as the inputs
carry them (JSON, app/traffic.py), an event time; a batch of `--results` of them per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import orjson

from app.traffic import ad_events
from tables.operators.base import Match
from tables.runtime.output import AUDIT, Collector


def feed(results: int) -> list[tuple[int, Match]]:
    events = list(ad_events(results * 2, base_ts=1_700_000_000_000))
    impressions = {e["auction_id"]: e for side, e in events if side == "left"}
    found = []
    for side, event in events:
        if side == "right" and event["auction_id"] in impressions:
            impression = impressions[event["auction_id"]]
            found.append(
                Match(
                    event["auction_id"].encode(), orjson.dumps(impression), orjson.dumps(event), event["ts"]
                )
            )
    return [(i % 4, m) for i, m in enumerate(found[:results])]


def timed(batch: list[tuple[int, Match]], compiled: bool) -> tuple[float, dict[int, list[Any]]]:
    made = Collector.__new__(Collector)
    made.audited, made.writer = {}, "host-1:4242:5f1c"
    AUDIT.use(compiled)
    start = time.process_time()
    made.audit(batch)
    return time.process_time() - start, made.audited


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if AUDIT.bound is None:
        raise SystemExit(
            "tables.operators._fastjoin is not built (setup.py build_ext --inplace), or TANDEM_PURE_PYTHON=1"
        )
    batch = feed(args.results)
    if timed(batch, True)[1] != timed(batch, False)[1]:
        raise SystemExit("the compiled and the Python audit records differ")
    spent: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for compiled in (True, False):
            spent[compiled].append(min(timed(batch, compiled)[0] for _ in range(20)) / len(batch) * 1e6)
    fast, slow = statistics.median(spent[True]), statistics.median(spent[False])
    print(
        f"{len(batch):,} results per batch, median of {args.rounds} rounds (each the least of 20 batches)\n"
    )
    print("| audit | compiled, µs CPU / result | Python, µs CPU / result | compiled / Python |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| `Collector.audit` | {fast:.2f} | {slow:.2f} | {fast / slow:.2f} |")


if __name__ == "__main__":
    main()
