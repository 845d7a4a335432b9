"""How far a state has taken an input (tables/records/positions.py) and the aligner's held
runs it is made of (Aligner.held_runs), against small reference models."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.records import alignment
from tables.records.alignment import Aligner
from tables.records.positions import InputPosition

TOPICS = ("left", "right")


@st.composite
def positions(draw: st.DrawFn) -> InputPosition:
    bounds = sorted(draw(st.sets(st.integers(0, 200), max_size=10)))
    runs = []
    for first, last in zip(bounds[::2], bounds[1::2], strict=False):
        if not runs or runs[-1][1] + 1 < first:
            runs.append((first, last))
    read_next = draw(st.integers((runs[-1][1] + 1) if runs else 0, 260))
    return InputPosition(read_next, tuple(runs))


@given(positions())
def test_a_position_is_done_below_its_read_point_outside_its_held_runs(position: InputPosition) -> None:
    held = {o for first, last in position.held for o in range(first, last + 1)}
    for offset in range(0, 270):
        assert position.done(offset) == (offset < position.read_next and offset not in held), offset
    assert InputPosition.decode(position.encode()) == position


@given(st.binary(max_size=80))
def test_any_bytes_decode_to_a_position_or_none(raw: bytes) -> None:
    found = InputPosition.decode(raw)  # never raises: a bad value means no record is done
    if found is not None:
        assert found.encode() == raw


# One step of a reference run: read some records of a topic (held, or dead-lettered), or release.
records = st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=1, max_size=8)  # (ts, good)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.sampled_from(TOPICS), records),
        st.tuples(st.just("release"), st.sampled_from(TOPICS), st.booleans()),
    ),
    max_size=30,
)


def run(steps_: list[tuple], max_held: int = 50_000) -> tuple[Aligner[int], dict[str, set[int]]]:
    """The steps on an aligner of partition 0; each topic's offsets read, dead letters included."""
    aligner: Aligner[int] = Aligner(list(TOPICS), max_held=max_held)
    next_offset = dict.fromkeys(TOPICS, 0)
    read: dict[str, set[int]] = {t: set() for t in TOPICS}
    for step in steps_:
        if step[0] == "read":
            _, topic, records = step
            offsets, stamps = [], []
            for ts, good in records:
                offset = next_offset[topic]
                next_offset[topic] += 1
                read[topic].add(offset)
                if good:
                    offsets.append(offset)
                    stamps.append(ts)
            aligner.add_many(0, topic, offsets, stamps, offsets, next_offset[topic] - 1)
        else:
            _, topic, caught_up = step
            ends = {t: next_offset[t] + (0 if caught_up or t != topic else 100) for t in TOPICS}
            aligner.release(0, ends, dict.fromkeys(TOPICS, 0))
    return aligner, read


def held_now(aligner: Aligner[int], topic: str) -> set[int]:
    state = aligner._partitions.get(0)
    return {offset for _, _, t, offset, _ in state.held if t == topic} if state else set()


def covered(runs: list[tuple[int, int]]) -> set[int]:
    return {o for first, last in runs for o in range(first, last + 1)}


@settings(max_examples=300)
@given(steps, st.sampled_from([3, 50_000]))
def test_held_runs_are_exactly_the_offsets_still_held(steps_: list[tuple], max_held: int) -> None:
    aligner, read = run(steps_, max_held)
    for topic in TOPICS:
        runs = aligner.held_runs(0, topic)
        assert runs == sorted(runs) and all(a[1] + 1 < b[0] for a, b in zip(runs, runs[1:], strict=False))
        assert covered(runs) & read[topic] == held_now(aligner, topic), (topic, runs)


@settings(max_examples=100)
@given(steps)
def test_past_their_bounds_held_runs_still_cover_every_offset_held(steps_: list[tuple]) -> None:
    saved = alignment.MAX_RUNS, alignment.MAX_RUN_SCAN
    alignment.MAX_RUNS, alignment.MAX_RUN_SCAN = 1, 2
    try:
        aligner, _ = run(steps_)
        for topic in TOPICS:
            runs = aligner.held_runs(0, topic)
            assert len(runs) <= 1 and covered(runs) >= held_now(aligner, topic)  # never done while held
    finally:
        alignment.MAX_RUNS, alignment.MAX_RUN_SCAN = saved
