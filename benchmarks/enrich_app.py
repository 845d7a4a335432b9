"""The enrichment benchmark's worker: `faust -A benchmarks.enrich_app worker`
(benchmarks/bench_enrich.py).

examples/trades.py's join, on the reference app's settings (app/settings.py: the TANDEM_*
environment, so app.cluster.WorkerProcess starts it): trades enriched with the quote of
their symbol as of the trade (`tables.join_table`, a left join, 5 s of grace, an hour of
history), the notional traded per symbol totalled in a Faust table kept with the join. Its
handler takes whole batches and queues its output with `send_soon`, as the reference app's
does (examples/trades.py awaits one `send` per result). Topics: `{prefix}trades`,
`{prefix}quotes`, and `BENCH_ENRICH_OUTPUT` (default `{prefix}enriched-trades`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import faust

from app.join import faust_settings
from app.settings import from_env
from tables import JoinInput, JoinResults, TandemAssignor, join_table

JOIN = "enrich"
GRACE = timedelta(seconds=5)
HISTORY = timedelta(hours=1)


class Trade(faust.Record, serializer="json"):
    trade_id: str
    symbol: str
    qty: int
    price_cents: int
    ts: int  # ms since the epoch


class Quote(faust.Record, serializer="json"):
    symbol: str
    bid_cents: int
    ask_cents: int
    ts: int


def enriched(symbol: str, trade: Trade, quote: Quote | None, ts: int) -> dict[str, Any]:
    """One `enriched-trades` record (examples/trades.py's EnrichedTrade, as JSON)."""
    mid = (quote.bid_cents + quote.ask_cents) // 2 if quote is not None else None
    return {
        "trade_id": trade.trade_id,
        "symbol": symbol,
        "qty": trade.qty,
        "price_cents": trade.price_cents,
        "ts": ts,
        "quote_ts": quote.ts if quote is not None else None,
        "mid_cents": mid,
        "slippage_cents": trade.price_cents - mid if mid is not None else None,
    }


settings = from_env()
app = faust.App(settings.app_id, PartitionAssignor=TandemAssignor, **faust_settings(settings))
prefix = settings.topic_prefix
trades = app.topic(f"{prefix}trades", key_type=str, value_type=Trade)
quotes = app.topic(f"{prefix}quotes", key_type=str, value_type=Quote)
# The benchmark gives each run an output topic of its own.
output = app.topic(os.environ.get("BENCH_ENRICH_OUTPUT") or f"{prefix}enriched-trades", key_type=str)
notional = app.Table("notional-by-symbol-partition", default=int, partitions=settings.partitions)


@join_table(
    app,
    JoinInput(trades, timestamp="ts", id="trade_id"),
    JoinInput(quotes, timestamp="ts"),
    grace=GRACE,
    history=HISTORY,
    how="left",
    name=JOIN,
    tables=[notional],
)
async def enrich(results: JoinResults[str, Trade, Quote]) -> None:
    async for batch in results.batches():
        traded = 0
        for symbol, trade, quote, ts in batch.results:
            assert trade is not None  # a left join: every result has its trade
            results.send_soon(output, key=symbol, value=enriched(symbol, trade, quote, ts))
            traded += trade.qty * trade.price_cents
        # One entry per partition (a million symbols would make a million table keys).
        notional[str(batch.partition)] += traded


__all__ = ["JOIN", "app"]
