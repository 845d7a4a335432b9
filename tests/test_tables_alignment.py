"""Event-time alignment of the join's two inputs (tables/records/alignment.py), without Kafka."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.records import alignment
from tables.records.alignment import Aligner
from tests.heap_aligner import HeapAligner

IMP, CLK = "impressions", "clicks"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def aligner(**kwargs: object) -> tuple[Aligner[str], Clock]:
    clock = Clock()
    return Aligner([IMP, CLK], clock=clock, **kwargs), clock  # type: ignore[arg-type]


def test_a_topic_running_ahead_is_held_until_the_other_catches_up() -> None:
    a, _ = aligner()
    for offset, ts in enumerate([10, 20, 30, 40]):
        a.add(0, IMP, offset, ts, f"i{ts}")
    a.add(0, CLK, 0, 25, "c25")
    ends = {IMP: 100, CLK: 100}  # both have more on the broker
    assert a.release(0, ends) == ["i10", "i20", "c25"]
    assert a.held(0) == 2
    a.add(0, CLK, 1, 35, "c35")
    assert a.release(0, ends) == ["i30", "c35"]
    # Clicks caught up (their end reached): they bound nothing any more.
    assert a.release(0, {IMP: 100, CLK: 2}) == ["i40"]
    assert a.forced == 0


def test_partitions_are_independent() -> None:
    a, _ = aligner()
    a.add(0, IMP, 0, 10, "p0-i10")
    a.add(1, IMP, 0, 10, "p1-i10")
    a.add(1, CLK, 0, 50, "p1-c50")
    ends = {IMP: 9, CLK: 9}
    assert a.release(1, ends) == ["p1-i10"]
    assert a.release(0, ends) == []  # partition 0 has no click yet, and clicks have data
    assert a.holding() == [0, 1]


def test_an_input_with_records_on_the_broker_but_none_received_holds_the_other_back() -> None:
    a, clock = aligner(max_wait_s=2.0, max_wait_unheard_s=60.0)
    a.add(0, IMP, 0, 10, "i10")
    assert a.release(0, {IMP: 1, CLK: 500}) == []
    clock.now = 30.0
    assert a.release(0, {IMP: 1, CLK: 500}) == []  # Faust may hand one backlog over late
    clock.now = 61.0
    assert a.release(0, {IMP: 1, CLK: 500}) == ["i10"]  # taken for empty at last


def test_an_input_whose_end_is_unknown_holds_back_for_max_wait_only() -> None:
    a, clock = aligner(max_wait_s=2.0)
    a.add(0, IMP, 0, 10, "i10")
    assert a.release(0, {IMP: 1, CLK: None}) == []
    clock.now = 1.9
    assert a.release(0, {IMP: 1, CLK: None}) == []
    clock.now = 2.0
    assert a.release(0, {IMP: 1, CLK: None}) == ["i10"]


def test_each_wait_that_runs_out_is_counted_once_per_input() -> None:
    """An input let go for its wait (TANDEM_ALIGN_MAX_WAIT_MS) is counted once per silence,
    however many releases pass it over, and again after it sent and went silent anew; an input
    caught up or with nothing to read was not waited for."""
    a, clock = aligner(max_wait_s=2.0)
    a.add(0, IMP, 0, 10, "i10")
    assert a.release(0, {IMP: 1, CLK: None}) == []
    clock.now = 1.9
    assert a.release(0, {IMP: 1, CLK: None}) == []
    assert a.let_go == {IMP: 0, CLK: 0}  # still waiting
    clock.now = 2.0
    assert a.release(0, {IMP: 1, CLK: None}) == ["i10"]
    a.add(0, IMP, 1, 20, "i20")
    assert a.release(0, {IMP: 2, CLK: None}) == ["i20"]  # the same silence
    assert a.let_go == {IMP: 0, CLK: 1}
    a.add(0, CLK, 0, 30, "c30")
    a.add(0, IMP, 2, 40, "i40")
    assert a.release(0, {IMP: 3, CLK: None}) == ["c30"]  # clicks sent: waited for again
    clock.now = 4.0
    assert a.release(0, {IMP: 3, CLK: None}) == ["i40"]
    a.add(1, IMP, 0, 10, "p1-i10")
    assert a.release(1, {IMP: 1, CLK: 0}) == ["p1-i10"]  # nothing to read: no wait
    assert a.let_go == {IMP: 0, CLK: 2}


def test_an_input_silent_mid_backlog_is_counted_when_let_go() -> None:
    a, clock = aligner(max_wait_s=2.0, max_wait_unheard_s=60.0)
    a.add(0, IMP, 0, 10, "i10")
    a.add(0, IMP, 1, 60, "i60")
    a.add(0, CLK, 0, 20, "c20")
    ends = {IMP: 2, CLK: 5}  # clicks have more on the broker
    assert a.release(0, ends) == ["i10", "c20"]
    clock.now = 59.0
    assert a.release(0, ends) == []
    assert a.let_go == {IMP: 0, CLK: 0}
    clock.now = 60.0
    assert a.release(0, ends) == ["i60"]
    assert a.let_go == {IMP: 0, CLK: 1}


def test_an_empty_or_already_committed_input_holds_nothing_back() -> None:
    a, _ = aligner()
    a.add(0, IMP, 7, 10, "i10")
    assert a.release(0, {IMP: 8, CLK: 0}) == ["i10"]  # clicks partition empty
    a.add(0, IMP, 8, 20, "i20")
    # Clicks: the group committed offset 40, the end is 40: nothing to wait for.
    assert a.release(0, {IMP: 9, CLK: 40}, {IMP: 0, CLK: 40}) == ["i20"]


def test_the_cap_releases_the_oldest_and_counts_them() -> None:
    a, _ = aligner(max_held=3)
    for offset, ts in enumerate([50, 10, 40, 20, 30]):
        a.add(0, IMP, offset, ts, f"i{ts}")
    assert a.release(0, {IMP: 100, CLK: 100}) == ["i10", "i20"]  # clicks unheard: held
    assert a.forced == 2
    assert a.held(0) == 3


def test_an_input_far_ahead_is_named_until_its_partner_catches_up() -> None:
    """With half of max_held held, the input past the one holding the release back is to be
    read no further (the runtime pauses its fetches); never the one holding it back, never
    one caught up; and no more once what is held drops below half."""
    a, _ = aligner(max_held=8)
    ends = {IMP: 100, CLK: 100}
    a.add(0, IMP, 0, 10, "i10")
    for offset, ts in enumerate([20, 30, 40]):
        a.add(0, CLK, offset, ts, f"c{ts}")
    assert a.release(0, ends) == ["i10"] and a.ahead() == {}  # 3 held: under half
    a.add(0, CLK, 3, 50, "c50")
    assert a.release(0, ends) == [] and a.ahead() == {0: frozenset({CLK})}  # 4 held: clicks ahead
    a.add(0, IMP, 1, 35, "i35")
    assert a.release(0, ends) == ["c20", "c30", "i35"] and a.ahead() == {}  # 2 held again
    for offset, ts in enumerate([60, 70, 80], 4):
        a.add(0, CLK, offset, ts, f"c{ts}")
    ends = {IMP: 100, CLK: 7}  # clicks at their end: 5 held, but never paused
    assert a.release(0, ends) == [] and a.held(0) == 5 and a.ahead() == {}
    for offset, ts in enumerate([90, 91, 92, 93], 2):
        a.add(0, IMP, offset, ts, f"i{ts}")
    assert a.release(0, ends) == ["c40", "c50", "c60", "c70", "c80", "i90", "i91", "i92", "i93"]
    assert a.ahead() == {} and a.forced == 0
    a.forget()
    assert a.ahead() == {}


def test_an_input_paused_for_running_ahead_is_not_let_go_for_its_silence() -> None:
    """The runtime fetches no more of an input named ahead: its silence is the pause's, not its
    own. It stays ahead, its records held, while its partner goes on far behind for longer than
    `max_wait_unheard_s` (a table of millions of keys read before the stream it enriches):
    let go, it was resumed and released past the cap, before the partner's records it needs.
    Once resumed, it still bounds the release: the rest of it is on the broker (or kept aside),
    and its partner's later records must wait for it."""
    a, clock = aligner(max_held=8, max_wait_unheard_s=60.0)
    ends = {IMP: 1_000, CLK: 1_000}
    for offset, ts in enumerate([100, 110, 120, 130]):
        a.add(0, CLK, offset, ts, f"c{ts}")
    a.add(0, IMP, 0, 10, "i10")
    assert a.release(0, ends) == ["i10"] and a.ahead() == {0: frozenset({CLK})}
    for n in range(1, 11):  # five minutes of impressions, all before the clicks
        clock.now += 30.0
        a.add(0, IMP, n, 10 + n, f"i{10 + n}")
        assert a.release(0, ends) == [f"i{10 + n}"]
        assert a.ahead() == {0: frozenset({CLK})}, n
    assert a.held(0) == 4 and a.forced == 0
    a.add(0, IMP, 11, 125, "i125")  # the impressions catch up: the clicks before them go
    assert a.release(0, ends) == ["c100", "c110", "c120", "i125"] and a.ahead() == {}
    clock.now += 1.0
    a.add(0, IMP, 12, 200, "i200")  # past the clicks read: held until more clicks are read
    assert a.release(0, ends) == ["c130"]
    a.add(0, CLK, 4, 140, "c140")
    assert a.release(0, ends) == ["c140"] and a.held(0) == 1 and a.forced == 0


def test_an_input_whose_records_wait_in_the_worker_is_not_silent() -> None:
    """A worker held for minutes by one batch has records of both inputs queued: an input is
    heard while its records wait (`heard`), and let go only after the silence that follows."""
    a, clock = aligner(max_wait_unheard_s=60.0)
    ends = {IMP: 1_000, CLK: 1_000}
    a.add(0, IMP, 0, 10, "i10")
    a.add(0, CLK, 0, 50, "c50")
    assert a.release(0, ends) == ["i10"]
    clock.now += 177.0  # the batch that held the worker; impressions wait in its queue
    a.heard(0, IMP)
    assert a.release(0, ends) == []  # the click waits for the impressions queued before it
    a.heard(0, "unknown")
    a.heard(7, IMP)  # nothing read of that partition: nothing to do
    clock.now += 61.0  # then a minute of real silence
    assert a.release(0, ends) == ["c50"]


def test_forget_drops_every_held_record_and_what_was_read() -> None:
    """A revocation: held records are read again later, from the committed offsets."""
    a, _ = aligner()
    for offset, ts in enumerate([30, 10, 20]):
        a.add(3, IMP, offset, ts, f"i{ts}")
    a.add(5, CLK, 0, 5, "c5")
    assert sorted(a.forget()) == ["c5", "i10", "i20", "i30"]
    assert a.held() == 0 and a.holding() == [] and a.forced == 0
    # Read again from offset 0: nothing of the first reading counts (no stale offsets:
    # offset 2 read before would make impressions look caught up, end 3).
    a.add(3, IMP, 0, 30, "i30")
    a.add(3, CLK, 0, 40, "c40")
    assert a.release(3, {IMP: 3, CLK: 1}) == ["i30"]  # c40 waits: impressions have more
    assert a.forget() == ["c40"]


@st.composite
def two_inputs(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Two topics' timestamps, each in time order, and a delivery order: which topic
    hands over its next record (any interleaving Faust might produce)."""
    left = sorted(draw(st.lists(st.integers(0, 1000), max_size=40)))
    right = sorted(draw(st.lists(st.integers(0, 1000), max_size=40)))
    order = draw(st.permutations([0] * len(left) + [1] * len(right)))
    return left, right, list(order)


@settings(max_examples=300, deadline=None)
@given(two_inputs(), st.integers(1, 7))
def test_any_delivery_order_is_released_in_time_order_exactly_once(
    inputs: tuple[list[int], list[int], list[int]], release_every: int
) -> None:
    """However the two topics' deliveries interleave, while both have more on the broker
    the join sees one timestamp-ordered stream, every record exactly once, nothing forced."""
    left, right, order = inputs
    a, _ = aligner()
    ends = {IMP: len(left), CLK: len(right)}
    next_index = [0, 0]
    items: list[str] = []
    for step, which in enumerate(order):
        topic, values = (IMP, left) if which == 0 else (CLK, right)
        i = next_index[which]
        next_index[which] += 1
        a.add(0, topic, i, values[i], f"{topic}:{i}")
        if step % release_every == 0:
            items += a.release(0, ends)
    items += a.release(0, ends)  # both caught up now
    assert sorted(items) == sorted(
        [f"{IMP}:{i}" for i in range(len(left))] + [f"{CLK}:{i}" for i in range(len(right))]
    )
    times = [(left if item.startswith(IMP) else right)[int(item.split(":")[1])] for item in items]
    assert times == sorted(times)
    assert a.forced == 0 and a.held() == 0


def test_a_dead_lettered_last_record_still_counts_as_read() -> None:
    a, _ = aligner()
    a.add(0, CLK, 0, 50, "c50")
    a.add(0, IMP, 0, 10, "i10")
    a.skip(0, IMP, 1)  # bad JSON at the end of impressions: read, never joined
    assert a.release(0, {IMP: 2, CLK: 1}) == ["i10", "c50"]


def test_an_input_short_of_its_end_is_let_go_after_a_long_silence() -> None:
    """Transaction markers take offsets: an input can stay short of its high watermark
    with every record read. Faust may also leave an input silent for seconds mid-backlog,
    so only a long silence lets the others go."""
    a, clock = aligner(max_wait_s=2.0, max_wait_unheard_s=60.0)
    a.add(0, IMP, 0, 10, "i10")
    a.add(0, IMP, 1, 60, "i60")
    a.add(0, CLK, 4, 20, "c20")
    ends = {IMP: 2, CLK: 6}  # offset 5 of clicks: a commit marker
    assert a.release(0, ends) == ["i10", "c20"]
    clock.now = 30.0
    assert a.release(0, ends) == []
    clock.now = 60.0
    assert a.release(0, ends) == ["i60"]
    assert a.forced == 0


def test_the_first_held_offset_of_each_topic_bounds_what_may_be_committed() -> None:
    a, _ = aligner()
    for offset, ts in enumerate([10, 20, 30]):
        a.add(0, IMP, offset + 5, ts, f"i{ts}")
    a.add(0, CLK, 3, 25, "c25")
    assert a.first_held(0) == {IMP: 5, CLK: 3}
    assert a.release(0, {IMP: 100, CLK: 100}) == ["i10", "i20", "c25"]  # up to the clicks' 25
    assert a.first_held(0) == {IMP: 7}
    a.drop_partition(0)
    assert a.first_held(0) == {} and a.held() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([IMP, CLK]), st.integers(0, 50)), max_size=40), st.randoms())
def test_first_held_is_the_lowest_offset_still_held(
    records: list[tuple[str, int]], rng: random.Random
) -> None:
    a, _ = aligner()
    offsets = {IMP: 0, CLK: 0}
    held: dict[str, list[int]] = {IMP: [], CLK: []}
    for topic, ts in records:
        a.add(0, topic, offsets[topic], ts, (topic, offsets[topic]))  # type: ignore[arg-type]
        held[topic].append(offsets[topic])
        offsets[topic] += 1
        if rng.random() < 0.3:
            for t, o in a.release(0, {IMP: offsets[IMP] + rng.randint(0, 1), CLK: offsets[CLK] + 1}):  # type: ignore[misc]
                held[t].remove(o)
        assert a.first_held(0) == {t: min(os) for t, os in held.items() if os}


# The sorted release against the heap-pop release it replaced (tests/heap_aligner.py): one
# step adds a batch of one topic partition (one by one or by add_many, some records
# dead-lettered, maybe read again from a little back), releases a partition, lets time
# pass, asks for the first held offsets, drops a partition or forgets everything.
# Weighted towards more held and more released: mostly one partition, few dead letters,
# ends mostly ahead of what was read (more to come: held back).
_PARTITION = st.sampled_from([0, 0, 0, 1])
_DEAD = st.sampled_from([False, False, False, True])
_END = st.sampled_from([-1, 0, 1, 1, 2, 2])  # end: next offset + this; -1 unknown
_batch = st.tuples(
    st.just("read"),
    _PARTITION,
    st.sampled_from([IMP, CLK]),
    st.lists(st.tuples(st.integers(0, 40), _DEAD), min_size=1, max_size=10),  # ts, dead letter
    st.booleans(),  # add/skip one by one instead of add_many
    st.integers(-3, 0),  # first offset: the next one to read, or a little before (a seek back)
)
_release = st.tuples(
    st.just("release"),
    _PARTITION,
    st.tuples(_END, _END),
    st.tuples(st.integers(-1, 2), st.integers(-1, 2)),  # start; -1 unknown
)
_STEPS = {
    "read": _batch,
    "release": _release,
    "tick": st.tuples(st.just("tick"), st.sampled_from([0.0, 1.0, 2.0, 61.0])),
    "first_held": st.tuples(st.just("first_held"), st.integers(0, 1)),
    "drop": st.tuples(st.just("drop"), st.integers(0, 1)),
    "forget": st.tuples(st.just("forget")),
}
# Mostly reads and releases (one_of would draw each kind alike: drops and forgets would
# empty the aligners before much is held).
_KINDS = ["read"] * 4 + ["release"] * 3 + ["tick", "first_held", "drop", "forget"]
_steps = st.lists(st.sampled_from(_KINDS).flatmap(_STEPS.__getitem__), min_size=5, max_size=60)


_CAPS = st.sampled_from([0, 1, 3, 6, 10, 50_000, 50_000])  # max_held: the cap forces records out, or not


# Thresholds of tables/records/alignment.py: defaults, and extremes that force each way (rebuild
# the held offsets at once or late; merge batches by a sort or push them; release by a
# sort or by pops).
_TUNINGS = st.fixed_dictionaries({
    "COMPACT_AT": st.sampled_from([1, 3, 1024]),
    "SORT_BATCH_AT": st.sampled_from([0, alignment.SORT_BATCH_AT, 10**9]),
    "SORT_DUE_AT": st.sampled_from([10**9, alignment.SORT_DUE_AT, 0]),
})  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(_steps, _CAPS, st.booleans(), _TUNINGS)
def test_the_sorted_release_does_what_the_heap_release_did(
    steps: list[tuple[Any, ...]], max_held: int, eager: bool, tunings: dict[str, int]
) -> None:
    """Same records released in the same order, same `forced`, `ahead()` and first held
    offsets (also against the held records themselves: committing past one loses it).
    `eager`: first held offsets asked after every step, else only now and then, so that
    released offsets pile up behind a held one (as between two commits)."""
    defaults = {name: getattr(alignment, name) for name in tunings}
    try:
        for name, value in tunings.items():
            setattr(alignment, name, value)
        run_against_heap_aligner(steps, max_held, eager)
    finally:
        for name, value in defaults.items():
            setattr(alignment, name, value)


Record = tuple[int, str, int, int]  # partition, topic, offset, serial (an offset may be read twice)


def run_against_heap_aligner(steps: list[tuple[Any, ...]], max_held: int, eager: bool) -> None:
    clock = Clock()
    new: Aligner[Record] = Aligner([IMP, CLK], 2.0, max_held, clock, 60.0)
    old: HeapAligner[Record] = HeapAligner([IMP, CLK], max_wait_s=2.0, max_held=max_held, clock=clock,
                                           max_wait_unheard_s=60.0)  # fmt: skip
    held: list[Record] = []  # what should be held, whatever the order
    next_offset: dict[tuple[int, str], int] = {}
    for serial, step in enumerate(steps):
        kind = step[0]
        if kind == "read":
            read_batch((new, old), held, next_offset, serial, step)
        elif kind == "release":
            _, partition, end_deltas, start_values = step
            ends = {t: None if d < 0 else next_offset.get((partition, t), 0) + d
                    for t, d in zip((IMP, CLK), end_deltas, strict=True)}  # fmt: skip
            starts = {t: None if s < 0 else s for t, s in zip((IMP, CLK), start_values, strict=True)}
            released = new.release(partition, ends, starts)
            assert released == old.release(partition, ends, starts)
            for record in released:
                held.remove(record)
        elif kind == "tick":
            clock.now += step[1]
        elif kind == "drop":
            new.drop_partition(step[1])
            old.drop_partition(step[1])
            held[:] = [record for record in held if record[0] != step[1]]
        elif kind == "forget":
            assert sorted(new.forget()) == sorted(old.forget()) == sorted(held)
            held.clear()
        assert new.forced == old.forced and new.ahead() == old.ahead()
        assert new.held() == old.held() == len(held) and new.holding() == old.holding()
        if eager or kind == "first_held":
            assert_first_held(new, old, held)
    assert_first_held(new, old, held)


def read_batch(
    aligners: tuple[Aligner[Record], ...],
    held: list[Record],
    next_offset: dict[tuple[int, str], int],
    serial: int,
    step: tuple[Any, ...],
) -> None:
    """One fetch of a topic partition into each aligner (and `held`)."""
    _, partition, topic, records, singly, back = step
    first = max(0, next_offset.get((partition, topic), 0) + back)
    offsets = list(range(first, first + len(records)))
    next_offset[(partition, topic)] = max(next_offset.get((partition, topic), 0), offsets[-1] + 1)
    kept = [(o, ts, (partition, topic, o, serial)) for o, (ts, dead) in zip(offsets, records, strict=True)
            if not dead]  # fmt: skip
    held.extend(record for _, _, record in kept)
    for aligner in aligners:
        if not singly:
            aligner.add_many(partition, topic, [o for o, _, _ in kept], [ts for _, ts, _ in kept],
                             [record for _, _, record in kept], offsets[-1])  # fmt: skip
            continue
        for o, (ts, dead) in zip(offsets, records, strict=True):
            if dead:
                aligner.skip(partition, topic, o)
            else:
                aligner.add(partition, topic, o, ts, (partition, topic, o, serial))


def assert_first_held(new: Aligner[Record], old: Aligner[Record], held: list[Record]) -> None:
    for partition in (0, 1):
        lowest: dict[str, int] = {}
        for p, topic, offset, _ in held:
            if p == partition and offset < lowest.get(topic, offset + 1):
                lowest[topic] = offset
        assert new.first_held(partition) == old.first_held(partition) == lowest
