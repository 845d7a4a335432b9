"""examples/trades.py (an enrichment join) end to end with its batch twin: trades and quotes
with quotes late within grace, deletes, duplicates by id, null values, bad records and trades
before any quote, produced with `pipeline.produce` (the join's partitioner, seq headers) to a
broker of its own; two real worker processes, one SIGKILLed mid-run and restarted; then a
quote an hour later on every partition (every trade's grace passes), then records late by the
stream's own rules: trades and quotes older than history (dropped, counted in `late` and
`late_updates`), trades past grace within history (joined at once) and quotes more than grace
late within history (seen by the trades joined after them); then
`python -m pipeline reconcile --app examples.trades` (in this process, on the shared
SparkSession) over the topics and the join's audit.

Expected: nothing missing or spurious, no copy by one writer twice, the dead letters alike,
the twin's counters as sent, and every trade in `enriched-trades` priced against the quote a
small model says (the latest accepted quote of its symbol at or before the trade, none after a
delete; none for a trade produced without a key, which comes out at once). Run with `-s` to
see the report and the counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import reconcile
from pipeline.apps import find_join
from pipeline.produce import produce
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, wait_for
from tests import pipeline_e2e
from tests.pipeline_e2e import encoded
from tests.spark_fixtures import spark_session
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4  # examples/trades.py's default (TRADES_PARTITIONS)
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)
HOUR = 3_600_000  # the join's history
SYMBOLS = [f"S{i:02d}" for i in range(16)]
# Live traffic is sent in ~3 s: its minute of event time runs 20x the clock. A worker takes an
# input read to the end its last fetch saw as caught up (tables/records/alignment.py), so a
# fetch of the other input back a little later can move stream time ahead by 20x that delay.
# With 10 minutes in 3 s (200x), 25 ms were a trade's 5 s of grace: a producer's copy sent
# again a second after the original came after the original's grace and was joined again
# (2 runs in 8 on a busy machine). At 20x it takes a fetch 200 ms late. (Which of this and the
# wait below was at work was not established; the test guards against both.)
QUOTE_EVERY = 600  # ms between two quotes of a symbol


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def trade(n: int | str, symbol: str, ts: int) -> dict[str, Any]:
    return {"trade_id": f"t{n}", "symbol": symbol, "qty": 1 + len(str(n)) % 5, "price_cents": 1000, "ts": ts}


def quote(symbol: str, ts: int, cents: int) -> dict[str, Any]:
    return {"symbol": symbol, "bid_cents": cents, "ask_cents": cents + 2, "ts": ts}


# Bad records, each with the category both sides must give it.
BAD = [
    ({"side": "left", "key": "S01", "value_raw": '{"trade_id": '}, "undecodable"),
    ({"side": "left", "key": "S02", "value": {**trade("bad", "S02", T0), "qty": "many"}}, "wrong_type"),
    ({"side": "right", "key": "S03", "value": {"symbol": "S03", "bid_cents": 1}}, "wrong_type"),
    # A keyless quote can be no key's version; a keyless trade is a result (KIP-962: below).
    ({"side": "right", "key_raw": None, "value": quote("S04", T0, 5)}, "null_key"),
    ({"side": "right", "key": "S05", "value_raw": "[1, "}, "undecodable"),
    ({"side": "left", "key": "S06", "value": trade("neg", "S06", -5)}, "timestamp"),
]


def wave_one(seed: int = 7) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Live traffic, sorted by when it is sent: quotes every 0.6 s per symbol over a minute
    (every 7th sent 3 s late: within the 5 s grace), a delete of every 4th symbol's quote
    midway, trades at random times (every 50th at a quote's exact time, 16 before any quote),
    every 11th trade sent again a second later, null-valued trades and bad records."""
    rng = random.Random(seed)
    rows: list[tuple[int, dict[str, Any]]] = []
    counts = {"duplicates": 0, "null_values": 0}
    for i, symbol in enumerate(SYMBOLS):
        for q in range(100):
            u = T0 + 5_000 + q * QUOTE_EVERY + i * 37
            if q == 50 and i % 4 == 0:  # a delete: no quote from u until the next one
                rows.append((u, {"side": "right", "key": symbol, "value": None, "timestamp": u}))
                continue
            sent = u + 3_000 if q % 7 == 3 else u
            rows.append(
                (
                    sent,
                    {"side": "right", "key": symbol, "value": quote(symbol, u, 100 * i + q), "timestamp": u},
                )
            )
    quote_times = sorted(r["timestamp"] for _, r in rows)
    for n in range(1500):
        symbol = SYMBOLS[rng.randrange(len(SYMBOLS))]
        ts = T0 + rng.randint(5_000, 5_000 + 100 * QUOTE_EVERY)
        if n % 50 == 0:  # at a quote's exact time: that quote counts (at or before)
            ts = T0 + 5_000 + rng.randrange(100) * QUOTE_EVERY + SYMBOLS.index(symbol) * 37
        rows.append((ts, {"side": "left", "key": symbol, "value": trade(n, symbol, ts), "timestamp": ts}))
        if n % 11 == 0:  # the same trade again, a second later: one trade, counted as a duplicate
            rows.append(
                (ts + 1_000, {"side": "left", "key": symbol, "value": trade(n, symbol, ts), "timestamp": ts})
            )
            counts["duplicates"] += 1
        if n % 60 == 0:
            rows.append((ts + 3, {"side": "left", "key": symbol, "value": None, "timestamp": ts}))
            counts["null_values"] += 1
        if n % 100 == 0:
            bad, _ = BAD[(n // 100) % len(BAD)]
            rows.append((ts + 5, {**bad, "timestamp": ts}))
        if n % 250 == 0:  # a trade without a Kafka key: out at once, un-priced (KIP-962)
            rows.append((ts + 7, {"side": "left", "key_raw": None, "value": trade(f"nokey{n}", symbol, ts),
                                  "timestamp": ts}))  # fmt: skip
    for i, symbol in enumerate(SYMBOLS):  # before the symbol's first quote: no quote (a left join)
        ts = T0 + 1_000 + i
        rows.append(
            (ts, {"side": "left", "key": symbol, "value": trade(f"early{i}", symbol, ts), "timestamp": ts})
        )
    assert quote_times[0] > T0 + 1_000 + len(SYMBOLS)
    rows.sort(key=lambda r: r[0])
    return [row for _, row in rows], counts


def ticks() -> list[dict[str, Any]]:
    """A quote an hour later on every partition: stream time passes every trade's grace."""
    symbols = {partition_for(f"TICK{i}".encode(), PARTITIONS, "murmur2"): f"TICK{i}" for i in range(100)}
    ts = T0 + HOUR
    return [{"side": "right", "key": s, "value": quote(s, ts, 1), "timestamp": ts} for s in symbols.values()]


def late_wave() -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Once stream time is T0 + 1 h (history 1 h), in time order: trades and quotes older than
    history (dropped and counted), trades past grace within history (joined at once), quotes
    more than grace late within history (kept) and trades after them that see them."""

    def stream(name: str, symbol: str, ts: int) -> dict[str, Any]:
        return {"side": "left", "key": symbol, "value": trade(name, symbol, ts)}

    rows = [stream(f"old{i}", SYMBOLS[i], T0 - 60_000 + i * 1_000) for i in range(9)]
    rows += [
        {"side": "right", "key": SYMBOLS[i], "value": quote(SYMBOLS[i], T0 - 120_000 + i, 7)}
        for i in range(5)
    ]
    rows += [stream(f"past{k}", SYMBOLS[k], T0 + 30_000 * (k + 1) + 777) for k in range(10)]
    for i in range(6):
        u = T0 + 1_800_000 + i * 1_000
        rows.append({"side": "right", "key": SYMBOLS[i], "value": quote(SYMBOLS[i], u, 9_000 + i)})
        rows.append(stream(f"seen{i}", SYMBOLS[i], u + 500))
    for row in rows:
        row["timestamp"] = row["value"]["ts"]
    rows.sort(key=lambda r: r["timestamp"])
    return rows, {"late": 9, "late_updates": 5}


def priced(waves: list[list[dict[str, Any]]]) -> dict[str, int | None]:
    """The model: each trade that makes a result -> the ts of the latest quote of its symbol
    at or before it (None: none, or a delete), over the quotes the join keeps."""
    quotes: dict[str, list[tuple[int, int | None]]] = {}
    trades: dict[str, dict[str, Any]] = {}
    keyless: set[str] = set()  # trades without a Kafka key: a result with no quote (KIP-962)
    for row in (r for wave in waves for r in wave):
        if row.get("key_raw", "") is None and row["side"] == "left":
            keyless.add(row["value"]["trade_id"])
            continue
        if "key" not in row or "value_raw" in row or row.get("key_raw", "") is None:
            continue
        value = row["value"]
        if row["side"] == "right" and (value is None or {"bid_cents", "ask_cents"} <= set(value)):
            ts = row["timestamp"]
            if ts >= T0:  # older ones come after an hour of stream time: dropped (late_updates)
                quotes.setdefault(row["key"], []).append((ts, None if value is None else ts))
        elif (
            row["side"] == "left"
            and value is not None
            and isinstance(value["qty"], int)
            and value["ts"] >= T0
        ):
            trades.setdefault(value["trade_id"], value)
    found = {}
    for trade_id, value in trades.items():
        versions = [v for v in quotes.get(value["symbol"], []) if v[0] <= value["ts"]]
        found[trade_id] = max(versions)[1] if versions else None
    return found | dict.fromkeys(keyless)


def test_trades_stream_reconciles_with_its_twin_after_a_kill(spark: SparkSession, tmp_path: Path) -> None:
    spec = find_join("examples.trades", "enrich")  # the defaults: app id "trades", 4 partitions
    assert spec.audit and spec.kind.name == "temporal"
    wave1, expected = wave_one()
    late, dropped = late_wave()
    waves = [encoded(spec, wave1, 0)]
    waves.append(encoded(spec, ticks(), len(waves[0])))
    waves.append(encoded(spec, late, len(waves[0]) + len(waves[1])))
    model = priced([wave1, ticks(), late])

    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        asyncio.run(create_topics(broker.bootstrap, ["trades", "quotes", "enriched-trades"], PARTITIONS))
        env = {
            **embedded_env(),
            "TRADES_BROKER": f"kafka://{broker.bootstrap}",
            "TANDEM_STANDBY_REPLICAS": "1",
            # An input of unknown end (a just-assigned partition, its first fetch not back)
            # holds the other 2 s by default: 40 s of this traffic's event time (QUOTE_EVERY).
            "TANDEM_ALIGN_MAX_WAIT_MS": "30000",
        }
        workers = [
            WorkerProcess(
                name, "examples.trades", tmp_path, {**env, "TRADES_DATA_DIR": str(tmp_path / name)}, cwd=REPO
            )
            for name in ("w1", "w2")
        ]
        for worker in workers:
            worker.extra_env["TRADES_WEB_PORT"] = str(worker.port)
            worker.start()
        inputs = list(spec.input_topics)
        try:
            assert wait_for(lambda: _covered(workers), 90), "the workers did not share the partitions"
            # Sent over ~3 s, the kill lands while the workers join it.
            sender = threading.Thread(
                target=lambda: asyncio.run(produce(broker.bootstrap, spec, waves[0], rate=1200))
            )
            sender.start()
            time.sleep(1.5)
            workers[0].kill()  # mid-run: what it handed over but did not commit is handed over again
            sender.join(60)
            time.sleep(2.0)
            workers[0].start()
            for wave in waves[1:]:  # each once the stream has taken everything before it
                assert wait_for(lambda: _drained(broker.bootstrap, workers, inputs), 120), "the stream lags"
                asyncio.run(produce(broker.bootstrap, spec, wave))
            assert wait_for(lambda: _drained(broker.bootstrap, workers, inputs), 120), "the stream lags"
            assert wait_for(lambda: _covered(workers), 60)
            out = asyncio.run(
                _read(
                    broker.bootstrap,
                    "enriched-trades",
                    lambda rs: {r["trade_id"] for r in rs} >= set(model),
                    60,
                )
            )

            report_path = tmp_path / "report.json"
            args = ["--app", "examples.trades", "--bootstrap", broker.bootstrap, "--master", "local[2]",
                    "--examples", "10", "--strict-counters", "--json", str(report_path)]  # fmt: skip
            status = reconcile.main(args)
            report = json.loads(report_path.read_text())
        finally:
            for worker in workers:
                worker.stop(15)

    results, letters, counters = report["results"], report["letters"], report["counters"]
    counts = report["twin_counts"]
    print(
        json.dumps({"results": results, "letters": letters, "counters": counters, "twin": counts}, indent=1)
    )
    # The stream's output, against the model: every trade once at least, priced as of its time.
    by_trade: dict[str, list[dict[str, Any]]] = {}
    for record in out:
        by_trade.setdefault(record["trade_id"], []).append(record)
    assert set(by_trade) == set(model), "trades lost or made up"
    for trade_id, quote_ts in model.items():
        assert {r["quote_ts"] for r in by_trade[trade_id]} == {quote_ts}, (trade_id, by_trade[trade_id])
    # The twin, against the stream (reconcile) and against what was sent.
    assert status == 0 and report["ok"], report["failures"]
    assert results["missing"] == results["spurious"] == results["repeated"] == results["misplaced"] == 0
    assert results["late_by_stream_only"] == 0
    assert results["matched"] == len(model)
    with_quote = sum(q is not None for q in model.values())
    assert counts["results"] == {"matched": with_quote, "left_only": len(model) - with_quote, "right_only": 0}
    assert 0 < with_quote < len(model)
    sent_bad: dict[str, int] = {}
    for n in range(0, 1500, 100):
        category = BAD[(n // 100) % len(BAD)][1]
        sent_bad[category] = sent_bad.get(category, 0) + 1
    assert counts["dead_letters"] == dict(sorted(sent_bad.items()))
    assert letters["matched"] == sum(sent_bad.values())
    assert letters["missing"] == letters["spurious"] == letters["other_category"] == 0
    assert counts["input"]["null_value"] == {"left": expected["null_values"], "right": 0}
    twin_counters = {
        "late": dropped["late"],
        "duplicates": expected["duplicates"],
        "late_updates": dropped["late_updates"],
    }
    assert counters["twin"] == twin_counters
    # Records read again after the kill are skipped as re-reads, not counted by the operator.
    assert counters["stream"] == twin_counters


def _drained(bootstrap: str, workers: list[WorkerProcess], topics: list[str]) -> bool:
    return pipeline_e2e.drained(bootstrap, "trades", workers, topics, PARTITIONS)


def _covered(workers: list[WorkerProcess]) -> bool:
    return pipeline_e2e.covered(workers, "enrich", PARTITIONS)
