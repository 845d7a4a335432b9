"""CPU per input record of the join runtime's ingest and result path, without Kafka and
without the join's state: the reference app's input checks, the event-time aligner, and
the results handed to the handler (issue 15). Two ways over the same records in the
same run, printed as a Markdown table with their ratio:

- per record: `SideCodec.check` (an `Accepted` each), `Aligner.add` / `skip` one record
  at a time, the first held offsets by a scan of every held record, each result built
  by `JoinResults._result` (a decode and build of both stored values);
- batched: what the runtime runs: the reference app's own `Intake.check` per fetch
  (`SideCodec.accept`, `Aligner.add_many` per topic partition), `Aligner.first_held`
  kept incrementally, `JoinResults._results`.

    .venv/bin/python -m benchmarks.bench_ingest --impressions 100000 --fetch 500 --rounds 3

The records are delivered as a backlog is: fetches of one topic partition at a time,
clicks and impressions alternating, released in event-time order across both (both
inputs have more on the broker). Each result pairs a click with its impression.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
from faust.types import TP

from app.join import build
from app.settings import JOIN_NAME, from_env
from benchmarks.bench_tables import recent_events
from tables import runtime_of
from tables.operators.windowed import Match
from tables.records.alignment import Aligner
from tables.records.codecs import Accepted, SideCodec
from tables.runtime.results import JoinResults
from tables.runtime.task import JoinTask

PARTITION = 0


class Record(NamedTuple):
    """What the runtime reads of an aiokafka ConsumerRecord."""

    key: bytes | None
    value: bytes | None
    offset: int
    timestamp: int | None


Fetch = tuple[str, str, list[Record]]  # side, topic, records


def fetches(impressions: int, size: int, topics: dict[str, str]) -> tuple[list[Fetch], list[Match]]:
    """The reference traffic as fetches of `size` records per topic, alternating, and the
    matches the join would give (each click with its auction's impression)."""
    by_side: dict[str, list[Record]] = {"left": [], "right": []}
    first_impression: dict[bytes, bytes] = {}
    matches: list[Match] = []
    for side, key, value in recent_events(impressions):
        records = by_side[side]
        records.append(Record(key, value, len(records), None))
        if side == "left":
            first_impression.setdefault(key, value)
        elif key in first_impression:
            matches.append(Match(key, first_impression[key], value, 0))
    out: list[Fetch] = []
    for start in range(0, max(map(len, by_side.values())), size):
        for side in ("left", "right"):
            chunk = by_side[side][start : start + size]
            if chunk:
                out.append((side, topics[side], chunk))
    return out, matches


def per_record(codecs: dict[str, SideCodec], batches: list[Fetch], ends: dict[str, int]) -> int:
    aligner: Aligner[Any] = Aligner(list(ends))
    released = 0
    for side, topic, records in batches:
        codec = codecs[side]
        for record in records:
            checked = codec.check(record.key, record.value, record.offset, record.timestamp)
            if type(checked) is Accepted:
                item = (side, record.key, checked.ts, checked.record_id, record.value)
                aligner.add(PARTITION, topic, record.offset, checked.ts, item)
            else:
                aligner.skip(PARTITION, topic, record.offset)
        released += len(aligner.release(PARTITION, ends))
        _scan_first_held(aligner)
    return released


def _scan_first_held(aligner: Aligner[Any]) -> dict[str, int]:
    """The first held offsets as the aligner found them before: a scan of every held record."""
    firsts: dict[str, int] = {}
    state = aligner._partitions.get(PARTITION)
    for _, _, topic, offset, _ in state.held if state else ():
        if offset < firsts.get(topic, offset + 1):
            firsts[topic] = offset
    return firsts


def reference_runner() -> JoinTask:
    """The reference app's own join runner, without a broker: its check and aligner are
    what `batched` runs (no partitioner check: its partition count is not known here)."""
    return runtime_of(build(from_env())).tasks[JOIN_NAME]


def batched(join: JoinTask, batches: list[Fetch], ends: dict[str, int]) -> int:
    """The runtime's own way: `Intake.check` per fetch, then the aligner's release."""
    join.intake.aligner = Aligner(list(ends))
    letters: list[Any] = []
    released = 0
    for _, topic, records in batches:
        join.intake.check(TP(topic, PARTITION), records, letters)  # type: ignore[arg-type]
        released += len(join.intake.aligner.release(PARTITION, ends))
        join.intake.aligner.first_held(PARTITION)
    return released


def results_of(
    codecs: dict[str, SideCodec], value_of: Callable[[SideCodec], Callable[[bytes], Any]]
) -> JoinResults[Any, Any, Any]:
    return JoinResults(
        None,  # type: ignore[arg-type]  # neither way below touches the app
        None,  # type: ignore[arg-type]
        "impressions",  # neither way sets the partition
        codecs["left"].key,
        value_of(codecs["left"]),
        value_of(codecs["right"]),
        [],
        None,  # type: ignore[arg-type]
    )


def value_as_before(codec: SideCodec) -> Callable[[bytes], Any]:
    """A stored value as it was decoded before: a call through the codec and the form's
    generic `build` (RecordForm.build -> its compiled make) of orjson's decoding."""
    form = codec.form

    def stored(raw: bytes) -> Any:
        return form.build(orjson.loads(raw))

    def value(raw: bytes) -> Any:
        return stored(raw)

    return value


def cpu_us(
    old: Callable[[], object], new: Callable[[], object], count: int, rounds: int
) -> tuple[float, float]:
    """Least CPU per item of each way over `rounds` runs, taken in turns (the others are
    disturbed by the machine, and whichever runs first pays for the collector's start)."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, run in enumerate((old, new)):
            gc.collect()
            start = time.process_time()
            run()
            best[i] = min(best[i], time.process_time() - start)
    return best[0] / count * 1e6, best[1] / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impressions", type=int, default=100_000)
    parser.add_argument("--fetch", type=int, default=500, help="records per fetch of a topic partition")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    join = reference_runner()
    codecs = join.intake.codecs
    topics = {"left": join.spec.left.name, "right": join.spec.right.name}
    batches, matches = fetches(args.impressions, args.fetch, topics)
    records = sum(len(r) for _, _, r in batches)
    ends = {topic: 1 << 62 for topic in topics.values()}  # both inputs have more on the broker
    assert per_record(codecs, batches, ends) == batched(join, batches, ends)
    before, now = results_of(codecs, value_as_before), results_of(codecs, lambda codec: codec.value)
    assert [before._result(m) for m in matches] == now._results(matches)
    rows = []
    for name, old, new, count in [
        ("check + align", lambda: per_record(codecs, batches, ends), lambda: batched(join, batches, ends),
         records),
        ("results", lambda: [before._result(m) for m in matches], lambda: now._results(matches),
         len(matches)),
    ]:  # fmt: skip
        old_us, new_us = cpu_us(old, new, count, args.rounds)
        rows.append((name, old_us, new_us, count))
    print(
        f"join {JOIN_NAME!r}: {records:,} input records in fetches of {args.fetch}; {len(matches):,} results"
    )
    print("| path | per record, us CPU | batched, us CPU | batched / per record | records |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, old_us, new_us, count in rows:
        print(f"| {name} | {old_us:.2f} | {new_us:.2f} | {new_us / old_us:.2f} | {count:,} |")


if __name__ == "__main__":
    main()
