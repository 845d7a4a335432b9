"""CPU per input record of the join's per-record check, compiled and in Python; prints a
Markdown table.

    .venv/bin/python -m benchmarks.bench_check [--impressions 20000] [--rounds 5] [--gc-threshold N]

The ad events of app/traffic.py (impressions and clicks, keyed by auction id, stamped from
now on so the app's own check passes them) through `SideCodec.accept` with the reference
app's options (app/join.py: str keys, `Impression`/`Click` records in JSON, `validate=
check_event`, `timestamp="ts"`, `id="event_id"`, `max_value_bytes`), one call per record
as `Intake.check` makes them, results kept per batch of 2,000 as the runtime keeps
them. Rows:

- `accept`: the join's check as the app declares it;
- `accept, no validate`: the same without `validate` (the check's own part: decode, field
  checks, the record built only for validate, so here not at all);
- `stored`: `SideCodec.value`, the record read back from the state for a result's partner
  (decode and build);
- `fetch loop`: `check_records` (tables/records/sides.py) over aiokafka `ConsumerRecord`s,
  2,000 per call as `Intake.check` hands them, the events built: compiled, one call per
  fetched partition (`_fastcheck.check_many`), against the Python loop calling the compiled
  accept per record (`python_check_records`); both with `validate`. Its Python column is
  the worker's path before the loop was compiled, so the ratio is the loop's alone.

Each row is run compiled (tables/records/_fastcheck.pyx) and in Python (the closure the compiled
one hands odd records to: what runs where it is not built, or with TANDEM_PURE_PYTHON=1),
alternated round by round so a busy machine slows both alike. Reports the median CPU time
(process_time) per record and the ratio. Python's garbage collector runs at its default
thresholds unless `--gc-threshold` sets the youngest generation's (a worker runs with
50,000, and 1,000,000 during a batch: tables/runtime/gcpacing.py). Before timing, both must give
the same answer for every record.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka.structs import ConsumerRecord
from faust.types import TP

from app.records import MAX_VALUE_BYTES, Click, Impression, check_event
from app.traffic import ad_events
from tables.records import codecs, sides
from tables.records.codecs import SideCodec, key_check, value_form

BATCH = 2000
Record = tuple[bytes, bytes, int, int]  # key, value, offset, Kafka timestamp


def side_codecs(validate: bool) -> dict[str, SideCodec]:
    """The two sides' codecs as the runtime makes them for the reference app (app/join.py)."""
    made = {}
    for side, model in (("left", Impression), ("right", Click)):
        made[side] = SideCodec(
            side,
            key_check(str, "raw", lambda raw: raw),
            value_form(model, "json", lambda raw: raw),
            timestamp="ts",
            record_id="event_id",
            validate=check_event if validate else None,
            max_value_bytes=MAX_VALUE_BYTES,
        )
    return made


def records(impressions: int) -> dict[str, list[Record]]:
    """Each side's records, from now on (check_event refuses events a week old)."""
    now = int(time.time() * 1000)
    by_side: dict[str, list[Record]] = {"left": [], "right": []}
    for offset, (side, event) in enumerate(ad_events(impressions, base_ts=now)):
        by_side[side].append((event["auction_id"].encode(), orjson.dumps(event), offset, event["ts"]))
    return by_side


def timed_batches(
    calls: dict[str, Callable[..., Any]],
    by_side: dict[str, list[Record]],
    batch: Callable[[Callable[..., Any], list[Record]], list[Any]],
) -> float:
    """CPU seconds for `batch(calls[side], rows)` over every side's records, a batch at a
    time; what a batch returns is kept until it ends (as the runtime keeps a batch's)."""
    clock = time.process_time
    spent = 0.0
    for side, rows in by_side.items():
        call = calls[side]
        for at in range(0, len(rows), BATCH):
            start = clock()
            kept = batch(call, rows[at : at + BATCH])
            spent += clock() - start
            del kept
    return spent


def run_accept(accepts: dict[str, Callable[..., Any]], by_side: dict[str, list[Record]]) -> float:
    """CPU seconds to check every record."""
    return timed_batches(accepts, by_side, lambda accept, rows: [accept(*row) for row in rows])


def run_stored(values: dict[str, Callable[[bytes], Any]], by_side: dict[str, list[Record]]) -> float:
    """CPU seconds to build every record's value from its stored bytes."""
    return timed_batches(values, by_side, lambda value_of, rows: [value_of(row[1]) for row in rows])


def run_fetch_loop(
    loop: Callable[..., sides.Checked], made: dict[str, SideCodec], fetched: dict[str, list[Any]]
) -> float:
    """CPU seconds for `loop` (`check_records` or its Python reference) over every side's
    fetched records, a batch per call, every record accepted."""
    clock = time.process_time
    spent = 0.0
    for side, rows in fetched.items():
        tp = TP(side, 0)
        for at in range(0, len(rows), BATCH):
            letters: list[Any] = []
            built: dict[int, Any] = {}
            start = clock()
            checked = loop(made[side], side, tp, rows[at : at + BATCH], letters, built)
            spent += clock() - start
            if letters or len(checked.events) != len(rows[at : at + BATCH]):
                raise SystemExit(f"fetch loop: {len(letters)} records rejected")
    return spent


def same(a: Any, b: Any) -> bool:
    """Equal answers: the same (ts, id) and a record of the same type and fields, or equal."""
    if type(a) is tuple and type(b) is tuple:
        return a[:2] == b[:2] and same(a[2], b[2])
    if hasattr(a, "__dict__") and type(a) is type(b):
        return list(vars(a).items()) == list(vars(b).items())
    return bool(a == b)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impressions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gc-threshold", type=int, help="the youngest generation's GC threshold")
    args = parser.parse_args()
    if not codecs.CHECK.active:
        raise SystemExit(
            "tables.records._fastcheck is not built (setup.py build_ext --inplace), or TANDEM_PURE_PYTHON=1"
        )
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    by_side = records(args.impressions)
    count = sum(len(rows) for rows in by_side.values())
    with_validate, without = side_codecs(True), side_codecs(False)
    assert all(c.compiled for c in (*with_validate.values(), *without.values()))
    codecs.CHECK.use(False)
    try:
        python_values = {side: c.value for side, c in side_codecs(False).items()}
    finally:
        codecs.CHECK.use(True)
    # name: (compiled run, Python run)
    rows: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {}
    for name, made in (("accept", with_validate), ("accept, no validate", without)):
        compiled = {side: c.accept for side, c in made.items()}
        python = {side: c.python_accept for side, c in made.items()}
        for side, rows_of_side in by_side.items():
            for key, value, offset, ts in rows_of_side:
                got, expected = compiled[side](key, value, offset, ts), python[side](key, value, offset, ts)
                if not same(got, expected) or type(got) is not tuple:
                    raise SystemExit(f"{name}: {got!r} != {expected!r} (or not accepted)")
        rows[name] = (
            lambda compiled=compiled: run_accept(compiled, by_side),  # type: ignore[misc]
            lambda python=python: run_accept(python, by_side),  # type: ignore[misc]
        )
    values = {side: c.value for side, c in without.items()}
    for side, rows_of_side in by_side.items():
        for row in rows_of_side:
            if not same(values[side](row[1]), python_values[side](row[1])):
                raise SystemExit("stored: the compiled and the Python record differ")
    rows["stored"] = (lambda: run_stored(values, by_side), lambda: run_stored(python_values, by_side))
    fetched = {
        side: [ConsumerRecord(side, 0, o, ts, 0, k, v, None, 0, 0, []) for k, v, o, ts in rows_of_side]
        for side, rows_of_side in by_side.items()
    }
    rows["fetch loop"] = (
        lambda: run_fetch_loop(sides.check_records, with_validate, fetched),
        lambda: run_fetch_loop(sides.python_check_records, with_validate, fetched),
    )
    spent: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, runs in rows.items():
            for how, run in zip(("compiled", "python"), runs, strict=True):
                spent.setdefault((name, how), []).append(run() / count * 1e6)
    print(
        f"{count:,} records ({len(by_side['left']):,} impressions, {len(by_side['right']):,} clicks), "
        f"median of {args.rounds} rounds, GC threshold {gc.get_threshold()[0]:,}\n"
    )
    print("| path | compiled, us CPU / record | runs | Python, us CPU / record | runs | compiled / Python |")
    print("| --- | ---: | --- | ---: | --- | ---: |")
    for name in rows:
        fast, slow = spent[(name, "compiled")], spent[(name, "python")]
        print(
            f"| {name} | {statistics.median(fast):.3f} | {' '.join(f'{r:.2f}' for r in fast)} "
            f"| {statistics.median(slow):.3f} | {' '.join(f'{r:.2f}' for r in slow)} "
            f"| {statistics.median(fast) / statistics.median(slow):.2f} |"
        )


if __name__ == "__main__":
    main()
