"""The `idle` option (docs/join-semantics.md, "Idle partitions"): a quiet partition, its inputs
read to their end, has its stream time moved on with the wall clock, so that a pending result
comes out without other traffic. Through the test driver's `idle(seconds)`, which moves the
clock the worker's task reads and runs the task's own check."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import faust
import orjson
import pytest

from tables import JoinDeclarationError, JoinResults, TandemAssignor, join, join_table
from tables.testing import JoinTestDriver

pytestmark = pytest.mark.usefixtures("join_loop")  # the compiled loop and the pure-Python one
counter = itertools.count()


def _app() -> faust.App:
    return faust.App(f"idle-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)


def parcels(idle: Any = timedelta(seconds=10)) -> tuple[Any, dict[str, Any]]:
    """Parcel scans enriched with depots (a left enrichment, 30 s of grace), `audit` on."""
    app = _app()
    scans = app.topic("scans", key_type=str, value_serializer="json", partitions=2)
    depots = app.topic("depots", key_type=str, value_serializer="json", partitions=2)

    @join_table(app, scans, depots, how="left", grace=30, timestamp="ts", audit=True, idle=idle)
    async def located(results: JoinResults[str, dict[str, Any], dict[str, Any]]) -> None:
        async for _ in results:
            pass

    return located, {"scans": scans, "depots": depots}


async def test_a_quiet_partition_releases_its_pending_result() -> None:
    located, t = parcels()
    async with JoinTestDriver(located) as d:
        await d.send(t["depots"], key="p1", value={"depot": "north", "ts": 1_000}, timestamp=1_000)
        await d.send(t["scans"], key="p1", value={"scan": 1, "ts": 2_000}, timestamp=2_000)
        await d.idle(5)  # not yet idle (10 s)
        await d.idle(10)  # idle: stream time 2 s + 15 s, not past 2 s + 30 s of grace
        assert d.results() == []
        await d.idle(20)  # quiet 35 s: stream time 37 s, past 32 s
        assert [(r.key, r.left["scan"], r.right["depot"], r.timestamp) for r in d.results()] == [
            ("p1", 1, "north", 2_000)
        ]
        assert d.counters()["idle_results"] == 1
        audit = [orjson.loads(s.value) for s in d.sent(located.audit_topic)]
        assert [a.get("idle") for a in audit] == [True]
        await d.idle(3_600)  # nothing more, nothing again
        assert len(d.results()) == 1


async def test_a_record_starts_the_quiet_time_again() -> None:
    located, t = parcels()
    async with JoinTestDriver(located) as d:
        await d.send(t["scans"], key="p1", value={"scan": 1, "ts": 2_000}, timestamp=2_000)
        await d.idle(9)  # not idle yet (10 s)
        await d.send(t["scans"], key="p1", value={"scan": 2, "ts": 3_000}, timestamp=3_000)
        # Quiet 25 s since scan 2 (34 s since scan 1, which would have released it): stream
        # time 3 s + 25 s, scan 1 not due (32 s).
        await d.idle(25)
        assert d.results() == []
        await d.idle(10)  # quiet 35 s: 38 s passes 32 s and 33 s
        assert [r.left["scan"] for r in d.results()] == [1, 2]


async def test_without_the_option_a_quiet_partition_waits() -> None:
    located, t = parcels(idle=None)
    async with JoinTestDriver(located) as d:
        await d.send(t["scans"], key="p1", value={"scan": 1, "ts": 2_000}, timestamp=2_000)
        await d.idle(3_600)
        assert d.results() == [] and d.counters()["idle_results"] == 0


async def test_an_idle_result_is_not_given_again_after_a_restart() -> None:
    located, t = parcels()
    async with JoinTestDriver(located) as d:
        await d.send(t["scans"], key="p1", value={"scan": 1, "ts": 2_000}, timestamp=2_000)
        await d.send(t["scans"], key="p9", value={"scan": 9, "ts": 2_000}, timestamp=2_000)
        await d.idle(40)
        assert sorted(r.left["scan"] for r in d.results()) == [1, 9]
        await d.restore()  # the state rebuilt from the changelog alone: the stream time was in it
        await d.idle(3_600)
        assert len(d.results()) == 2


async def test_a_windowed_left_join_releases_an_unmatched_record_when_idle() -> None:
    app = _app()
    clicks = app.topic("clicks", key_type=str, value_serializer="json", partitions=1)
    views = app.topic("views", key_type=str, value_serializer="json", partitions=1)

    @join(app, clicks, views, within=10, grace=5, how="left", timestamp="ts", idle=1)
    async def paired(results: JoinResults[str, dict[str, Any], dict[str, Any]]) -> None:
        async for _ in results:
            pass

    async with JoinTestDriver(paired) as d:
        await d.send(clicks, key="a", value={"ts": 1_000}, timestamp=1_000)
        await d.idle(20)  # stream time 1 s + 20 s: not past 1 s + 10 + 10 + 5 s
        assert d.results() == []
        await d.idle(10)
        assert [(r.key, r.right) for r in d.results()] == [("a", None)]


@pytest.mark.parametrize("idle", [0, -1, "soon"])
def test_a_bad_idle_is_refused(idle: Any) -> None:
    with pytest.raises(JoinDeclarationError, match="idle"):
        parcels(idle=idle)
