"""Trades enriched with the quote of their symbol as of the trade: `faust -A examples.trades worker`.

An enrichment join (`tables.join_table`): each trade is joined with the latest quote of its
symbol at or before the trade's time, not with whatever quote the worker happens to hold
when it reads the trade. A quote may arrive up to 5 s late (in event time) and still be
seen; quotes are kept for an hour back, and a symbol's latest quote however old. A left
join: a trade before any quote of its symbol comes out too, with no quote. Each result is
written to `enriched-trades` with the mid price and the slippage, and the notional traded
per symbol is totalled in a Faust table kept with the join (`tables=[...]`).

The batch side needs nothing more: `python -m pipeline join --app examples.trades` computes the
same join on Spark from the topics, and `python -m pipeline reconcile --app examples.trades`
checks what the workers produced against it (through the join's audit topic).

Settings from the environment: TRADES_BROKER (kafka://localhost:9092), TRADES_APP_ID
(trades), TRADES_DATA_DIR (trades-data), TRADES_WEB_PORT (6066), TRADES_PARTITIONS (4); and
Faust's own (BROKER_URL, WEB_PORT, APP_DATADIR, ...), which win over these.
"""

from __future__ import annotations

import os
from datetime import timedelta

import faust
from faust.web import Request, Response, View

from tables import JoinInput, JoinResults, TandemAssignor, join_table

PARTITIONS = int(os.environ.get("TRADES_PARTITIONS", "4"))

app = faust.App(
    os.environ.get("TRADES_APP_ID", "trades"),
    broker=os.environ.get("TRADES_BROKER", "kafka://localhost:9092"),
    PartitionAssignor=TandemAssignor,
    store="rocksdb://",
    datadir=os.environ.get("TRADES_DATA_DIR", "trades-data"),
    web_port=int(os.environ.get("TRADES_WEB_PORT", "6066")),
    web_bind="127.0.0.1",
    topic_partitions=PARTITIONS,
)


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


class EnrichedTrade(faust.Record, serializer="json"):
    trade_id: str
    symbol: str
    qty: int
    price_cents: int
    ts: int
    quote_ts: int | None = None  # the quote it was priced against (None: no quote yet)
    mid_cents: int | None = None
    slippage_cents: int | None = None  # price paid above the mid


# Both keyed by symbol, with one partition count (Tandem checks it at start-up).
trades = app.topic("trades", key_type=str, value_type=Trade, partitions=PARTITIONS)
quotes = app.topic("quotes", key_type=str, value_type=Quote, partitions=PARTITIONS)
enriched = app.topic("enriched-trades", key_type=str, value_type=EnrichedTrade, partitions=PARTITIONS)
notional = app.Table("notional-by-symbol", key_type=str, default=int, partitions=PARTITIONS)


@join_table(
    app,
    JoinInput(trades, timestamp="ts", id="trade_id"),  # a trade sent twice is joined once
    JoinInput(quotes, timestamp="ts"),  # a null quote (a delete) takes its Kafka timestamp
    grace=timedelta(seconds=5),  # a quote up to 5 s late is still seen
    history=timedelta(hours=1),  # how far back quotes are kept (the latest always)
    how="left",
    tables=[notional],
    audit=True,  # one small record per result: `python -m pipeline reconcile --app examples.trades`
)
async def enrich(results: JoinResults[str, Trade, Quote]) -> None:
    async for symbol, trade, quote, ts in results:
        assert trade is not None  # a left join: every result has its trade
        mid = (quote.bid_cents + quote.ask_cents) // 2 if quote is not None else None
        await enriched.send(
            key=symbol,  # None for a trade produced without a key: it comes out un-priced (KIP-962)
            value=EnrichedTrade(
                trade_id=trade.trade_id,
                symbol=trade.symbol if symbol is None else symbol,
                qty=trade.qty,
                price_cents=trade.price_cents,
                ts=ts,
                quote_ts=quote.ts if quote is not None else None,
                mid_cents=mid,
                slippage_cents=trade.price_cents - mid if mid is not None else None,
            ),
        )
        if symbol is not None:  # keyed by the join key: its partition (a keyless trade has none)
            notional[symbol] += trade.qty * trade.price_cents


@app.page("/notional/{symbol}/")
@app.table_route(table=notional, match_info="symbol")
async def symbol_notional(web: View, request: Request, symbol: str) -> Response:
    """A symbol's notional traded, answered by the worker that owns it."""
    return web.json({"symbol": symbol, "cents": notional[symbol]})
