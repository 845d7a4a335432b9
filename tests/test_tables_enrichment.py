"""Enrichment joins (`tables.join_table`) declared in an app and run through the test driver:
the declaration's rules, deletes from null table values, the as-of lookup with grace, the
handler, its sends and tables (the operator's own rules: tests/test_tables_temporal.py)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import faust
import pytest

from tables import JoinDeclarationError, JoinInput, JoinResults, TandemAssignor, join_table
from tables.testing import JoinTestDriver

counter = itertools.count()


class Trade(faust.Record, serializer="json"):
    trade_id: str
    qty: int
    ts: int


class Quote(faust.Record, serializer="json"):
    mid: int
    ts: int


def trades_app(how: str = "left") -> tuple[faust.App, Any, dict[str, Any]]:
    app = faust.App(f"enrich-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    trades = app.topic("trades", key_type=str, value_type=Trade, partitions=1)
    quotes = app.topic("quotes", key_type=str, value_type=Quote, partitions=1)
    out = app.topic("priced", key_type=str, partitions=1)
    volume = app.Table("volume", default=int, partitions=1)

    @join_table(
        app, JoinInput(trades, timestamp="ts", id="trade_id"), JoinInput(quotes, timestamp="ts"),
        grace=timedelta(seconds=5), history=timedelta(minutes=10), how=how, tables=[volume],  # type: ignore[arg-type]
    )  # fmt: skip
    async def priced(results: JoinResults[str, Trade, Quote]) -> None:
        async for symbol, trade, quote, ts in results:
            await out.send(key=symbol, value={"trade": trade.trade_id, "mid": quote and quote.mid, "ts": ts})
            volume[symbol] += trade.qty

    return app, priced, {"trades": trades, "quotes": quotes, "out": out, "volume": volume}


async def test_each_trade_gets_the_quote_as_of_its_time_once_grace_has_passed() -> None:
    app, priced, t = trades_app()
    async with JoinTestDriver(priced) as d:
        await d.send(t["quotes"], key="ACME", value=Quote(mid=100, ts=1_000), timestamp=1_000)
        await d.send(t["trades"], key="ACME", value=Trade(trade_id="t1", qty=5, ts=3_000), timestamp=3_000)
        await d.send(
            t["quotes"], key="ACME", value=Quote(mid=101, ts=2_000), timestamp=2_000
        )  # late, in grace
        await d.send(t["quotes"], key="ACME", value=Quote(mid=105, ts=4_000), timestamp=4_000)  # after t1
        assert d.sent(t["out"]) == []  # t1 waits for its grace: stream time 4 s, not past 3 s + 5 s
        await d.send(t["trades"], key="ACME", value=Trade(trade_id="t2", qty=1, ts=9_000), timestamp=9_000)
        assert [s.value for s in d.sent(t["out"])] == [{"trade": "t1", "mid": 101, "ts": 3_000}]
        await d.send(t["quotes"], key="ACME", value=None, timestamp=9_500)  # a delete from 9.5 s on
        await d.send(t["trades"], key="ACME", value=Trade(trade_id="t3", qty=2, ts=10_000), timestamp=10_000)
        await d.close_inputs()
        assert [s.value for s in d.sent(t["out"])][1:] == [
            {"trade": "t2", "mid": 105, "ts": 9_000},
            {"trade": "t3", "mid": None, "ts": 10_000},  # left: the quote was deleted
        ]
        assert d.table(t["volume"]) == {"ACME": 8}
        assert d.counters()["null_values"] == {"left": 0, "right": 0}  # a table's null is a delete


async def test_an_inner_enrichment_drops_what_finds_no_table_value() -> None:
    app, priced, t = trades_app("inner")
    async with JoinTestDriver(priced) as d:
        await d.send(t["trades"], key="NEW", value=Trade(trade_id="t1", qty=1, ts=1_000), timestamp=1_000)
        await d.send(t["quotes"], key="NEW", value=Quote(mid=7, ts=2_000), timestamp=2_000)
        await d.send(t["trades"], key="NEW", value=Trade(trade_id="t2", qty=1, ts=2_500), timestamp=2_500)
        await d.close_inputs()
        assert [s.value["trade"] for s in d.sent(t["out"])] == ["t2"]


async def test_state_survives_a_restore_from_the_changelog() -> None:
    app, priced, t = trades_app()
    async with JoinTestDriver(priced) as d:
        await d.send(t["quotes"], key="X", value=Quote(mid=1, ts=1_000), timestamp=1_000)
        await d.send(t["trades"], key="X", value=Trade(trade_id="a", qty=1, ts=2_000), timestamp=2_000)
        await d.restore()
        await d.close_inputs()
        assert [s.value for s in d.sent(t["out"])] == [{"trade": "a", "mid": 1, "ts": 2_000}]


def test_an_enrichment_declaration_is_checked() -> None:
    app = faust.App(f"enrich-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    trades = app.topic("trades", key_type=str, value_type=Trade)
    quotes = app.topic("quotes", key_type=str, value_type=Quote)

    async def handler(results: JoinResults[Any, Any, Any]) -> None:
        async for _ in results:
            pass

    with pytest.raises(JoinDeclarationError, match="an enrichment join is 'inner' or 'left'"):
        join_table(app, trades, quotes, how="outer")(handler)  # type: ignore[arg-type]
    with pytest.raises(JoinDeclarationError, match="history .* must be at least grace"):
        join_table(app, trades, quotes, grace=60, history=30)(handler)
    with pytest.raises(JoinDeclarationError, match="it takes no id="):
        join_table(app, trades, JoinInput(quotes, id="mid"))(handler)
    spec = join_table(app, trades, quotes, grace=5)(handler)
    assert spec.kind.describe() == {
        "kind": "temporal",
        "how": "inner",
        "grace_ms": 5000,
        "history_ms": 86_400_000,
    }
