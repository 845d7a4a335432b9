"""The trades/quotes enrichment example (examples/trades.py) end to end, on real worker
processes started by the dev kit (tables.testing.LocalCluster): two workers with standbys, a
SIGKILL and the survivor's takeover, the victim's restart, and a third worker joining with
warm-ups. Every trade comes out priced against the quote a reference model says (the latest
quote of its symbol at or before the trade), nothing is lost, and a trade comes out twice
only with the same content (at least once); the notional per symbol is in the Faust table."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from assignor import clients
from tables.testing import LocalCluster, wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parent.parent
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)
SYMBOLS = [f"S{i:02d}" for i in range(12)]


def quotes_and_trades(seed: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Quotes every few seconds per symbol over 10 minutes; trades in between (some before a
    symbol's first quote, some at a quote's exact time), in three batches."""
    rng = random.Random(seed)
    quotes = [
        {
            "symbol": s,
            "bid_cents": 100 * i + q,
            "ask_cents": 100 * i + q + 2,
            "ts": T0 + 5_000 + q * 7_000 + i,
        }
        for i, s in enumerate(SYMBOLS)
        for q in range(80)
    ]
    trades = []
    for n in range(300):
        symbol = rng.choice(SYMBOLS)
        ts = T0 + rng.randint(0, 560_000)
        if n % 25 == 0:  # exactly at a quote's time: that quote counts (at or before)
            ts = next(q["ts"] for q in quotes if q["symbol"] == symbol)
        trades.append(
            {"trade_id": f"t{n}", "symbol": symbol, "qty": 1 + n % 5, "price_cents": 1000 + n, "ts": ts}
        )
    return quotes, trades


def priced_as_of(trade: dict[str, Any], quotes: list[dict[str, Any]]) -> int | None:
    """The reference: the ts of the latest quote of the trade's symbol at or before it."""
    found = [q["ts"] for q in quotes if q["symbol"] == trade["symbol"] and q["ts"] <= trade["ts"]]
    return max(found) if found else None


async def produce(bootstrap: str, topic: str, rows: list[dict[str, Any]], key: str) -> None:
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    try:
        for row in sorted(rows, key=lambda r: r["ts"]):
            await producer.send(
                topic, json.dumps(row).encode(), key=row[key].encode(), timestamp_ms=row["ts"]
            )
        await producer.flush()
    finally:
        await producer.stop()


def test_trades_priced_as_of_their_time_through_a_kill_a_restart_and_a_scale_out(tmp_path: Path) -> None:
    quotes, trades = quotes_and_trades()
    batches = [trades[:100], trades[100:200], trades[200:]]
    # Later quotes on every partition move stream time past every trade's grace at the end.
    ticks = [{"symbol": s, "bid_cents": 1, "ask_cents": 1, "ts": T0 + 3_600_000} for s in SYMBOLS]
    env = {"TRADES_PARTITIONS": "4"}
    with LocalCluster(
        "examples.trades", 2, standbys=1, partitions=4, run_dir=tmp_path, cwd=REPO, env=env
    ) as c:
        c.wait_ready()
        asyncio.run(produce(c.bootstrap, "quotes", quotes, "symbol"))
        c.wait_caught_up()  # every quote a version before any trade is read
        asyncio.run(produce(c.bootstrap, "trades", batches[0], "symbol"))
        victim = c.workers[0]
        victim.kill()
        asyncio.run(produce(c.bootstrap, "trades", batches[1], "symbol"))
        c.wait_ready(timeout=120)  # the survivor owns everything, restored from its standbys
        restarted = c.add_worker(victim.name)  # the victim restarts, on its own data dir
        third = c.add_worker("worker-3")  # a scale-out: warm-ups first, then the move
        c.wait_ready(timeout=180)
        asyncio.run(produce(c.bootstrap, "trades", batches[2], "symbol"))
        asyncio.run(produce(c.bootstrap, "quotes", ticks, "symbol"))
        every = {t["trade_id"] for t in trades}
        out = asyncio.run(
            _read(c.bootstrap, "enriched-trades", lambda rs: {r["trade_id"] for r in rs} >= every, 120)
        )
        by_trade: dict[str, list[dict[str, Any]]] = {}
        for record in out:
            by_trade.setdefault(record["trade_id"], []).append(record)
        assert set(by_trade) == {t["trade_id"] for t in trades}, "trades lost"
        for trade in trades:
            results = by_trade[trade["trade_id"]]
            assert all(r == results[0] for r in results), results  # a repeat is the same result
            assert results[0]["quote_ts"] == priced_as_of(trade, quotes), (trade, results[0])
        notional: dict[str, int] = {}
        for trade in trades:
            notional[trade["symbol"]] = notional.get(trade["symbol"], 0) + trade["qty"] * trade["price_cents"]
        asker = third if third.alive else restarted
        # At least once: a result handled just before the SIGKILL may be counted again.
        # Through the scale-out's rebalances (warm-ups, then the move) a table route may answer
        # nothing for a while: as long as the scale-out itself may take, below.
        assert wait_for(
            lambda: all(v is not None and v >= notional[s] for s, v in _notional(asker).items()), 180
        ), (_notional(asker), notional)
        # The scale-out completes: the new worker warmed up, then took partitions over.
        owns = lambda w: ((w.view() or {}).get("joins", {}).get("enrich") or {}).get("actives")  # noqa: E731
        assert wait_for(lambda: owns(third), 180), third.view()
        c.wait_ready(timeout=120)
        views = [w.view() for w in c.live()]
        assert all(v is not None for v in views)
        joins = [v["joins"]["enrich"] for v in views]  # type: ignore[index]
        assert sorted(p for j in joins for p in j["actives"]) == [0, 1, 2, 3]
        assert all(j["kind"] == "temporal" and j["how"] == "left" for j in joins)


def _notional(worker: Any) -> dict[str, int | None]:
    """Each symbol's notional, asked of one worker (Faust routes it to the table's owner)."""
    found: dict[str, int | None] = {}
    for symbol in SYMBOLS:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/notional/{symbol}/", timeout=5) as r:
                found[symbol] = json.loads(r.read())["cents"]
        except OSError:
            found[symbol] = None
    return found
