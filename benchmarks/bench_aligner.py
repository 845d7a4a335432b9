"""CPU per input record of the event-time aligner (tables/records/alignment.py, issue 15); prints a
Markdown table.

    .venv/bin/python -m benchmarks.bench_aligner [--impressions 200000] [--batch 4000] [--rounds 3]

The ad events of app/traffic.py (impressions 10 ms apart, 60 % clicked up to 5 min later,
up to 2 s out of order), one partition, two ways the join worker sees them:

- `caught up`: both inputs at their end after every fetch (live traffic, or a worker that
  keeps up): batches of `--batch` events in arrival order, each split by topic into one
  `add_many` per topic, then one `release`: every held record is released;
- `backlog`: both topics' records already on the broker: fetches of `--batch` records of
  one topic at a time, alternating, the topic named by `ahead()` skipped while the other
  has more (as the runtime pauses it), a `release` after each fetch with both ends far
  ahead: records are released up to the input behind, the rest stays held.

Three aligners, alternated round by round so a busy machine slows all alike:

- `heap (old)`: tests/heap_aligner.py, add_many and release as they were: one `heappop`
  and one `gone` count per released record;
- `sorted release, old add_many`: the new release with add_many as it was (entries built
  by a list comprehension, heapified or pushed one by one; plus one max() per batch for
  the highest held timestamp the new release needs): what the add_many change adds;
- `sorted (new)`: tables.records.alignment.Aligner: entries built by zip, a large batch merged by
  a sort; held records kept sorted where that pays, the due prefix cut; popped as before
  when a few are due from an unsorted heap.

Reports the median over rounds of the CPU time (process_time) per record for add_many +
release, and each against the old one. All must release the same records in the same
order, with the same `forced` (checked). The runtime's fetches of one topic partition are
often smaller than 4,000 records (a batch spans partitions): try `--batch 100` too.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from app.traffic import ad_events
from tables.records.alignment import Aligner
from tests.heap_aligner import HeapAligner

IMP, CLK = "impressions", "clicks"
TOPICS = (IMP, CLK)
FAR = 1 << 40  # an end far past anything read: more on the broker
Event = tuple[str, int, int]  # topic, offset, ts
Item = tuple[str, int]
Fetch = tuple[str, list[int], list[int], list[Item]]  # topic, offsets, timestamps, items
Factory = Callable[[], Aligner[Item]]


@dataclass
class Run:
    seconds: float
    released: list[Item]
    forced: int


def load(impressions: int) -> list[Event]:
    """The ad events in arrival order, each with its offset in its topic."""
    offsets = {IMP: 0, CLK: 0}
    events: list[Event] = []
    for side, event in ad_events(impressions):
        topic = IMP if side == "left" else CLK
        events.append((topic, offsets[topic], event["ts"]))
        offsets[topic] += 1
    return events


def fetch(topic: str, events: list[Event]) -> Fetch:
    """One fetch of one topic partition, as the runtime hands it to add_many (built before
    the clock starts: the runtime builds these lists while validating)."""
    offsets = [offset for _, offset, _ in events]
    return topic, offsets, [ts for _, _, ts in events], [(topic, offset) for offset in offsets]


def add(aligner: Aligner[Item], batch: Fetch) -> None:
    topic, offsets, timestamps, items = batch
    aligner.add_many(0, topic, offsets, timestamps, items, offsets[-1])


def caught_up(factory: Factory, events: list[Event], size: int) -> Run:
    """Batches of events in arrival order, both inputs at their end after each."""
    batches: list[list[Fetch]] = []
    for at in range(0, len(events), size):
        mine = {topic: [event for event in events[at : at + size] if event[0] == topic] for topic in TOPICS}
        batches.append([fetch(topic, records) for topic, records in mine.items() if records])
    aligner, released = factory(), []
    ends = {IMP: 0, CLK: 0}
    start = time.process_time()
    for batch in batches:
        for one in batch:
            add(aligner, one)
            ends[one[0]] = one[1][-1] + 1
        released += aligner.release(0, ends)
    seconds = time.process_time() - start
    assert aligner.held() == 0 and len(released) == len(events)
    return Run(seconds, released, aligner.forced)


def backlog(factory: Factory, events: list[Event], size: int) -> Run:
    """Fetches of one topic at a time from a backlog, the one ahead paused."""
    fetches: dict[str, list[Fetch]] = {}
    for topic in TOPICS:
        mine = [event for event in events if event[0] == topic]
        fetches[topic] = [fetch(topic, mine[at : at + size]) for at in range(0, len(mine), size)]
    aligner, released = factory(), []
    done = {IMP: 0, CLK: 0}  # fetches read
    turn = 0
    start = time.process_time()
    while any(done[t] < len(fetches[t]) for t in TOPICS):
        topic, other = TOPICS[turn % 2], TOPICS[(turn + 1) % 2]
        turn += 1
        paused = topic in aligner.ahead().get(0, ()) and done[other] < len(fetches[other])
        if paused or done[topic] == len(fetches[topic]):
            continue
        add(aligner, fetches[topic][done[topic]])
        done[topic] += 1
        ends = {t: fetches[t][-1][1][-1] + 1 if done[t] == len(fetches[t]) else FAR for t in TOPICS}
        released += aligner.release(0, ends)
    seconds = time.process_time() - start
    assert aligner.held() == 0 and len(released) == len(events)
    return Run(seconds, released, aligner.forced)


class OldAddMany(Aligner[Item]):
    """The new release, add_many as it was (tests/heap_aligner.py)."""

    def __init__(self, topics: Sequence[str], clock: Callable[[], float]) -> None:
        super().__init__(topics, clock=clock)
        self._arrivals = itertools.count()  # as HeapAligner.add_many counts arrivals

    def add_many(
        self,
        partition: int,
        topic: str,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        items: Iterable[Item],
        last_offset: int,
    ) -> None:
        HeapAligner.add_many(self, partition, topic, offsets, timestamps, items, last_offset)  # type: ignore[arg-type]
        state = self._partitions[partition]
        if offsets:
            state.highest = max(state.highest, max(timestamps))
            state.in_order = False  # heapified or pushed: not known sorted


ALIGNERS: dict[str, Factory] = {
    "heap (old)": lambda: HeapAligner(TOPICS, clock=lambda: 0.0),
    "sorted release, old add_many": lambda: OldAddMany(TOPICS, clock=lambda: 0.0),
    "sorted (new)": lambda: Aligner(TOPICS, clock=lambda: 0.0),
}
SCENARIOS = {"caught up": caught_up, "backlog": backlog}


def measure(events: list[Event], size: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Scenario, aligner -> seconds per record of each round; outputs checked equal."""
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for scenario, drive in SCENARIOS.items():
            runs = {name: drive(factory, events, size) for name, factory in ALIGNERS.items()}
            first, *others = runs.values()
            for run in others:
                assert run.released == first.released and run.forced == first.forced, scenario
            for name, run in runs.items():
                times.setdefault((scenario, name), []).append(run.seconds / len(events))
    return times


def table(times: dict[tuple[str, str], list[float]]) -> str:
    """Markdown: us per record by scenario and aligner, and the ratio to the old one."""
    old = next(iter(ALIGNERS))
    lines = ["| scenario | aligner | us/record (median) | rounds | vs old |", "|---|---|---:|---|---:|"]
    for scenario in SCENARIOS:
        before = statistics.median(times[(scenario, old)])
        for name in ALIGNERS:
            each = times[(scenario, name)]
            rounds = " ".join(f"{t * 1e6:.3f}" for t in each)
            median = statistics.median(each)
            lines.append(f"| {scenario} | {name} | {median * 1e6:.3f} | {rounds} | {median / before:.2f} |")
    return "\n".join(lines)


def main() -> None:
    """Parse the options, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--impressions", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    events = load(args.impressions)
    times = measure(events, args.batch, args.rounds)
    clicks = sum(1 for topic, _, _ in events if topic == CLK)
    print(f"{len(events):,} records ({args.impressions:,} impressions, {clicks:,} clicks), batches of "
          f"{args.batch:,}, median of {args.rounds} rounds (CPU time of add_many + release)\n")  # fmt: skip
    print(table(times))


if __name__ == "__main__":
    main()
