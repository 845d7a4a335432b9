"""The compiled loop of the join with its index in RocksDB (tables/operators/_fastwindow.pyx)
against the Python one it mirrors (`StoredIndexJoin.process`), side by side over the same random
streams, on real RocksDB files behind the runtime's overlay and on a plain in-memory map: after
every batch the matches (order, types), the changelog, counters, stream time, live records and
everything the state holds must be the same; operators made again over their files mid-stream;
events past the compiled range and of the wrong types fail or pass alike."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tables.operators.kv import KV, MemoryKV
from tables.operators.stored_window import StoredIndexJoin
from tables.operators.windowed import JoinType, JoinWindow, Match
from tables.operators.windowed_kind import WindowedKind
from tables.state.partition import StatePartition
from tables.state.store import open_store
from tests.test_tables_index import Run, runs

fastwindow = pytest.importorskip(
    "tables.operators._fastwindow",
    reason="tables.operators._fastwindow is not built (python setup.py build_ext --inplace)",
)
compiled: Callable[[StoredIndexJoin, Any], list[Match]] = fastwindow.process_many


def python(join: StoredIndexJoin, events: Any) -> list[Match]:
    return [match for event in events for match in join.process(*event)]


def _state_of(join: StoredIndexJoin) -> tuple[Any, ...]:
    return (
        join.stream_time,
        join.counters(),
        join.live_records,
        join._due,
        join._ahead_until,
        list(join._ahead),
    )


def _partition(path: Path, window: JoinWindow, join_type: JoinType, ids: bool) -> StatePartition:
    kind = WindowedKind(window, join_type, index="rocksdb", filter_bytes=16)  # keys collide: both paths
    return StatePartition(open_store(path), kind, "active", ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_compiled_loop_is_the_python_one_over_rocksdb(run: Run) -> None:
    join_type, window, ids, batches, restart_after, _ = run
    with tempfile.TemporaryDirectory() as tmp:
        fast = _partition(Path(tmp) / "fast", window, join_type, ids)
        slow = _partition(Path(tmp) / "slow", window, join_type, ids)
        try:
            for number, batch in enumerate(batches):
                got = compiled(fast.operator, batch)  # type: ignore[arg-type]
                expected = python(slow.operator, batch)  # type: ignore[arg-type]
                assert got == expected, batch
                assert [type(m) for m in got] == [type(m) for m in expected]
                assert _state_of(fast.operator) == _state_of(slow.operator)  # type: ignore[arg-type]
                assert fast.operator.take_changes() == slow.operator.take_changes()
                fast.write(number)
                slow.write(number)
                assert list(fast.store.scan(b"", b"\xff")) == list(slow.store.scan(b"", b"\xff"))
                if number == restart_after:
                    for part in (fast, slow):
                        part.store.close()
                    fast, slow = (_partition(p.store.path, window, join_type, ids) for p in (fast, slow))
        finally:
            fast.store.close()
            slow.store.close()


@settings(max_examples=60, deadline=None)
@given(runs())
def test_the_compiled_loop_is_the_python_one_over_a_plain_map(run: Run) -> None:
    """A state that is no batch overlay: the loop calls its `put`."""
    join_type, window, ids, batches, _, _ = run
    states: list[KV] = [MemoryKV(), MemoryKV()]
    fast, slow = (StoredIndexJoin(state, window, join_type, ids, filter_bytes=4) for state in states)
    for batch in batches:
        assert compiled(fast, batch) == python(slow, batch), batch
        assert _state_of(fast) == _state_of(slow)
        assert fast.take_changes() == slow.take_changes()
        assert list(states[0].scan(b"", b"\xff")) == list(states[1].scan(b"", b"\xff"))


FAR = (1 << 61) + 3  # past the compiled range: the Python way, inside the same batch


@pytest.mark.parametrize(
    "odd",
    [
        ("left", b"a", FAR, b"far", b"v"),
        ("right", b"a", -FAR, b"early", b"v"),
        ("left", bytearray(b"a"), 10, b"ba", b"v"),
        ("left", b"a", 10, b"str", "not bytes"),
        ("left", b"a", 10.5, b"float", b"v"),
        ("middle", b"a", 10, b"side", b"v"),
    ],
    ids=["far", "far back", "bytearray key", "str value", "float time", "no such side"],
)
def test_events_the_compiled_loop_does_not_take_go_the_python_way(odd: tuple[Any, ...]) -> None:
    window = JoinWindow(5, 5, 5)
    before = [("left", b"a", 8, b"l1", b"x"), ("right", b"a", 9, b"r1", b"y")]
    after = [("right", b"a", 12, b"r2", b"z")]
    outcomes = []
    for loop in (compiled, python):
        join = StoredIndexJoin(MemoryKV(), window, JoinType.OUTER, False, filter_bytes=64)
        try:
            outcome: Any = loop(join, [*before, odd, *after])
        except Exception as error:  # the same error, whichever loop
            outcome = (type(error), str(error))
        outcomes.append((outcome, _state_of(join)))
    assert outcomes[0] == outcomes[1]
