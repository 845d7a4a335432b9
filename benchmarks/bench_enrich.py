"""Enrichment join throughput, memory and restore (issue 28): one Tandem worker of an app like
examples/trades.py (`tables.join_table`) against a bare consumer and Quix Streams' `join_asof`
on the same topics, in the same run.

    PYTHONPATH=. .venv/bin/python -m benchmarks.bench_enrich --keys 1000000 --trades 300000 --rounds 2

Input, loaded once on the embedded broker (4 partitions, keyed and co-partitioned by symbol,
murmur2): a table of `--keys` quotes (one per symbol, 1 ms apart in event time), then a stream
of `--trades` trades (2 ms apart, after every quote, each of a random symbol), then one quote
per partition an hour later in event time, which moves every partition's stream time past
the last trade's grace (Tandem emits a result once stream time passes its trade's time plus
grace). So the table is loaded first and the trades enrich against it, as an app does that
starts on a reference table's topic; every trade must come out with its symbol's quote.

Pipelines, each a process of its own started fresh (a new consumer group from the start and
an empty state), rounds alternating:

- bare consumer: one aiokafka consumer assigned every partition of both topics, orjson-decoding
  each value (bench_worker.py's), nothing else: the yardstick.
- tandem: `faust -A benchmarks.enrich_app worker` (examples/trades.py's join: a left join, 5 s
  grace, an hour of history, a Faust table, results produced as JSON); timed as
  bench_worker.py times its worker, from the last poll of its view that saw it own every
  partition with nothing read, until every record is read and every result handled.
- quix join_asof: Quix Streams' `join_asof(how="left", grace_ms=an hour)` of the same topics,
  results produced as JSON (benchmarks/quix_join.py, in its own environment).

Each join's output topic is read back: a result per trade, each with its symbol's quote
(`correct`). Peak RSS is each process's VmHWM at its end. With `--before DIR`, a pipeline
`tandem (before)` runs the same worker from another checkout of the project (DIR: e.g. main,
with its compiled extensions built), alternating with this one in each round on the same
input: on a loaded machine, compare the two in one run. With `--restore`, the Tandem worker
of the last round is killed (SIGKILL) and a new one started on an empty data directory with
the same app id: the time from its start, and from its assignment, until every partition is
restored from the changelog. Results: docs/bench/enrich.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.cluster import REPO, WorkerProcess
from assignor import clients
from benchmarks.bench_worker import PARTITIONS, cpu_seconds, create_inputs, peak_rss_kb
from benchmarks.enrich_app import HISTORY, JOIN
from benchmarks.quix_env import run_quix
from tables.kafka.batches import send_records
from tables.records.partitioners import partition_for, partitions_for
from tables.testing import EmbeddedBroker

BARE = "bare consumer"
TANDEM = "tandem"
TANDEM_BEFORE = "tandem (before)"  # --before: the worker of another checkout
QUIX = "quix join_asof"
PIPELINES = (BARE, TANDEM, QUIX)
PREFIX = "we-"
CHUNK = 100_000  # records generated and produced at a time
QUOTE_STEP_MS = 1
TRADE_STEP_MS = 2
POLL_S = 0.1
LOGS = REPO / "benchmarks" / "out" / "bench-enrich-logs"  # the workers' logs, kept


@dataclasses.dataclass(frozen=True)
class Input:
    """What was loaded: the symbols' quote times are `quotes_from + i * QUOTE_STEP_MS`."""

    keys: int
    trades: int
    quotes_from: int
    total: int  # input records, ticks included

    def quote_ts(self, symbol: str) -> int:
        return self.quotes_from + int(symbol[1:]) * QUOTE_STEP_MS


def symbol(i: int) -> bytes:
    return b"S%09d" % i


def quotes(keys: int, start_ts: int) -> Iterator[tuple[bytes, bytes]]:
    for i in range(keys):
        bid = 1_000 + i % 9_000
        yield (
            symbol(i),
            orjson.dumps(
                {"symbol": symbol(i).decode(), "bid_cents": bid, "ask_cents": bid + 2, "ts": start_ts + i}
            ),
        )


def trades(count: int, keys: int, start_ts: int, seed: int = 3) -> Iterator[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    for n in range(count):
        key = symbol(rng.randrange(keys))
        yield (
            key,
            orjson.dumps(
                {
                    "trade_id": f"t{n}",
                    "symbol": key.decode(),
                    "qty": 1 + n % 7,
                    "price_cents": 1_000 + n % 9_000,
                    "ts": start_ts + n * TRADE_STEP_MS,
                }
            ),
        )


def ticks(ts: int) -> list[tuple[bytes, bytes]]:
    """One quote per partition at `ts` (for symbols no trade has)."""
    found: dict[int, bytes] = {}
    n = 0
    while len(found) < PARTITIONS:
        key = b"tick-%d" % n
        found.setdefault(partition_for(key, PARTITIONS, "murmur2"), key)
        n += 1
    return [
        (key, orjson.dumps({"symbol": key.decode(), "bid_cents": 1, "ask_cents": 3, "ts": ts}))
        for key in found.values()
    ]


async def produce(bootstrap: str, topic: str, rows: Iterator[tuple[bytes, bytes]]) -> int:
    """Produce keyed rows as whole record batches, murmur2-partitioned; returns how many."""
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    sent = 0
    try:
        while chunk := [row for _, row in zip(range(CHUNK), rows, strict=False)]:
            per_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
            placed = partitions_for([k for k, _ in chunk], PARTITIONS, "murmur2")
            for row, partition in zip(chunk, placed, strict=True):
                per_partition.setdefault(int(partition), []).append(row)
            for partition, records in per_partition.items():
                await send_records(producer, topic, partition, records)
            sent += len(chunk)
    finally:
        await producer.stop()
    return sent


def topics() -> tuple[str, str]:
    return f"{PREFIX}trades", f"{PREFIX}quotes"


async def load(bootstrap: str, keys: int, count: int) -> Input:
    """The table, then the stream, then the ticks; event times end before the wall clock."""
    trades_topic, quotes_topic = topics()
    await create_inputs(bootstrap, [trades_topic, quotes_topic], PARTITIONS)
    quotes_from = int(time.time() * 1000) - 3 * 3_600_000 - keys * QUOTE_STEP_MS - count * TRADE_STEP_MS
    trades_from = quotes_from + keys * QUOTE_STEP_MS
    total = await produce(bootstrap, quotes_topic, quotes(keys, quotes_from))
    total += await produce(bootstrap, trades_topic, trades(count, keys, trades_from))
    last = trades_from + count * TRADE_STEP_MS
    total += await produce(bootstrap, quotes_topic, iter(ticks(last + 3_600_000)))
    return Input(keys, count, quotes_from, total)


# -- checking a join's output ---------------------------------------------------------


async def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of `topic` (to its high watermark, read from fetch responses)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[tuple[bytes | None, bytes | None]] = []
        idle = 0
        while idle < 5:
            fetched = await consumer.getmany(timeout_ms=200)
            for records in fetched.values():
                out.extend((r.key, r.value) for r in records)
            done = True
            for tp in tps:
                high = consumer.highwater(tp)
                done = done and high is not None and await consumer.position(tp) >= high
            idle = idle + 1 if done and not fetched else 0
        return out
    finally:
        await consumer.stop()


async def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark, from fetch responses (tansu answers ListOffsets short)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        for _ in range(50):
            await consumer.getmany(timeout_ms=100, max_records=1)
            if all(consumer.highwater(tp) is not None for tp in tps):
                break
        return {tp.partition: int(consumer.highwater(tp) or 0) for tp in tps}
    finally:
        await consumer.stop()


async def checked_output(bootstrap: str, output: str, data: Input, timeout: float) -> dict[str, int]:
    """`check_output` of a live worker's output, read again until every trade is in it or
    `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        checked = check_output(await read_all(bootstrap, output), data, quix=False)
        if checked["distinct"] >= data.trades or time.monotonic() > deadline:
            return checked
        await asyncio.sleep(2.0)


def check_output(rows: list[tuple[bytes | None, bytes | None]], data: Input, quix: bool) -> dict[str, int]:
    """Results, distinct trades among them, and trades whose result carries their symbol's quote."""
    seen: set[str] = set()
    correct: set[str] = set()
    for _, raw in rows:
        value = orjson.loads(raw or b"null")
        trade, quote_ts = (
            (value["left"], (value["right"] or {}).get("ts")) if quix else (value, value["quote_ts"])
        )
        seen.add(trade["trade_id"])
        if quote_ts == data.quote_ts(trade["symbol"]):
            correct.add(trade["trade_id"])
    return {"results": len(rows), "distinct": len(seen), "correct": len(correct)}


# -- the pipelines ----------------------------------------------------------------------


def run_bare(bootstrap: str, data: Input, timeout: float) -> dict[str, Any]:
    """bench_worker.py's bare aiokafka consumer on both topics, in a process of its own."""
    trades_topic, quotes_topic = topics()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_worker", "--bare", "read", bootstrap, trades_topic,
         quotes_topic, "-", "-"],  # fmt: skip
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=True,
    )  # fmt: skip
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if run["records"] != data.total:
        raise RuntimeError(f"{BARE}: read {run['records']} records, not {data.total}")
    return run


def worker(
    bootstrap: str, app_id: str, run_dir: Path, name: str, output: str, source: Path = REPO
) -> WorkerProcess:
    """A Tandem worker of the enrichment app, run from the checkout `source`."""
    return WorkerProcess(
        name, "host-1", "rack-1", bootstrap, app_id, run_dir,
        standby_replicas=0, partitions=PARTITIONS, topic_prefix=PREFIX, app_module="benchmarks.enrich_app",
        extra_env={"BENCH_ENRICH_OUTPUT": output, "PYTHONPATH": str(source)}, cwd=source,
    )  # fmt: skip


def join_of(view: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if view is None else view["joins"].get(JOIN)


async def run_tandem(
    bootstrap: str, data: Input, run_dir: Path, timeout: float, restore: bool, source: Path = REPO
) -> dict[str, Any]:
    """One worker (of the checkout `source`) from an empty state until every record is read and
    every trade's result handled; with `restore`, then its SIGKILL and a new worker restoring on
    an empty disk."""
    uid = uuid.uuid4().hex[:6]
    app_id, output = f"we-tandem-{uid}", f"{PREFIX}out-tandem-{uid}"
    await create_inputs(bootstrap, [output], PARTITIONS)
    process = worker(bootstrap, app_id, run_dir, f"tandem-{uid}", output, source).start()
    first: tuple[float, int, float] | None = None
    last: tuple[float, int, float] | None = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{TANDEM}: not done in {timeout} s (last: {last}; log {process.log_path})"
                )
            process.check()
            join = join_of(process.view())
            assert process.process is not None
            now, cpu = time.perf_counter(), cpu_seconds(process.process.pid)
            if join is not None and len(join["actives"]) == PARTITIONS:
                read = int(sum(join["read"].values()))
                if not read:
                    first = (now, 0, cpu)  # the last poll before the first record read
                elif first is not None:
                    last = (now, read, cpu)
                    # Every trade accounted for: a result, or dropped as late (a join that
                    # loses some must not hang the benchmark: the output check shows it).
                    late = join["operator_counters"].get("late", 0)
                    if read >= data.total and join["results"] + late >= data.trades:
                        counters = {
                            "forced": join["forced"], "rebalances": join["rebalances"],
                            "dead_letters": join["dead_letters"], **join["operator_counters"],
                        }  # fmt: skip
                        break
            await asyncio.sleep(POLL_S)
        peak = peak_rss_kb(process.process.pid)
        # The view counts results as they are handed to the handler: wait for them in the
        # output (a kill would lose those in flight to the restoring worker's topic).
        checked = await checked_output(bootstrap, output, data, timeout=120.0)
        if restore:
            process.kill()
            restored = await time_restore(bootstrap, app_id, run_dir, uid, output, timeout, source)
    finally:
        process.stop(10)
        LOGS.mkdir(parents=True, exist_ok=True)
        shutil.copy(process.log_path, LOGS / process.log_path.name)
    assert first is not None and last is not None
    run = {"records": last[1], "wall": last[0] - first[0], "cpu": last[2] - first[2], "peak_rss_kb": peak}
    return {**run, **checked, "counters": counters, **({"restore": restored} if restore else {})}


async def time_restore(
    bootstrap: str, app_id: str, run_dir: Path, uid: str, output: str, timeout: float, source: Path = REPO
) -> dict[str, Any]:
    """A new worker of `app_id` on an empty data directory: seconds from its start and from its
    assignment until every partition is restored, and the changelog records it replayed."""
    changelog = await high_watermarks(bootstrap, f"{app_id}-{JOIN}-changelog")
    started = time.time()
    # Its own output topic: what it reads again past the killed worker's last commit (at least
    # once) it joins again, and must not count in the first worker's results.
    again = f"{output}-again"
    await create_inputs(bootstrap, [again], PARTITIONS)
    process = worker(bootstrap, app_id, run_dir, f"restorer-{uid}", again, source).start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            process.check()
            join = join_of(process.view())
            if join is not None:
                history = join["rebalance_history"]
                if len(join["actives"]) == PARTITIONS and not join["restoring"] and history:
                    done = time.time()
                    assert process.process is not None
                    return {
                        "from_start_s": done - started,
                        "from_assignment_s": done - float(history[-1]["at"]),
                        "changelog_records": changelog,
                        "peak_rss_kb": peak_rss_kb(process.process.pid),
                    }
            await asyncio.sleep(POLL_S)
        raise RuntimeError(f"restore not done in {timeout} s (log {process.log_path})")
    finally:
        process.stop(10)


async def run_quix_asof(bootstrap: str, data: Input, run_dir: Path, timeout: float) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:6]
    output = f"{PREFIX}out-quix-{uid}"
    await create_inputs(bootstrap, [output], PARTITIONS)
    trades_topic, quotes_topic = topics()
    config = {
        "mode": "asof", "bootstrap": bootstrap, "group": f"we-quix-{uid}",
        "state_dir": str(run_dir / f"quix-{uid}"), "left": trades_topic, "right": quotes_topic,
        "output": output, "total": data.total, "expected": data.trades, "how": "left",
        "grace_ms": int(HISTORY.total_seconds() * 1000),
    }  # fmt: skip
    run = await asyncio.to_thread(run_quix, config, timeout)
    checked = check_output(await read_all(bootstrap, output), data, quix=True)
    return {**run, **checked}


# -- the run --------------------------------------------------------------------------


async def bench(
    keys: int,
    count: int,
    rounds: int,
    pipelines: list[str],
    restore: bool,
    timeout: float,
    before: Path | None = None,
) -> str:
    runs: dict[str, list[dict[str, Any]]] = {}
    lines: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-enrich-") as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        started = time.perf_counter()
        data = await load(broker.bootstrap, keys, count)
        lines.append(f"loaded {data.total:,} records in {time.perf_counter() - started:.0f} s")
        for n in range(rounds):
            for name in pipelines:
                run_dir = Path(tmp) / f"r{n}"
                run_dir.mkdir(exist_ok=True)
                if name == BARE:
                    run = await asyncio.to_thread(run_bare, broker.bootstrap, data, timeout)
                elif name in (TANDEM, TANDEM_BEFORE):
                    source = before if name == TANDEM_BEFORE and before is not None else REPO
                    last_round = restore and n == rounds - 1
                    run = await run_tandem(broker.bootstrap, data, run_dir, timeout, last_round, source)
                else:
                    run = await run_quix_asof(broker.bootstrap, data, run_dir, timeout)
                run["load"] = os.getloadavg()[0]
                runs.setdefault(name, []).append(run)
                lines.append(f"{name} round {n + 1}: {describe(run)}")
    return report(runs, data, rounds, lines)


def describe(run: dict[str, Any]) -> str:
    text = (
        f"{run['records'] / run['wall']:,.0f}/s wall, {run['cpu'] / run['records'] * 1e6:.1f} µs CPU per "
        f"record ({run['records']:,} records timed), peak RSS {run['peak_rss_kb'] / 1024:,.0f} MB, "
        f"load {run['load']:.2f}"
    )
    if "correct" in run:
        text += f"; {run['results']:,} results, {run['distinct']:,} trades, {run['correct']:,} correct"
    if "counters" in run:
        text += f"; the worker's counters {run['counters']}"
    if "restore" in run:
        r = run["restore"]
        text += (
            f"; restore on an empty disk: {r['from_start_s']:.1f} s from the new worker's start, "
            f"{r['from_assignment_s']:.1f} s from its assignment, changelog records per partition "
            f"{r['changelog_records']}, peak RSS {r['peak_rss_kb'] / 1024:,.0f} MB"
        )
    return text


def report(runs: dict[str, list[dict[str, Any]]], data: Input, rounds: int, lines: list[str]) -> str:
    """Best rate and CPU per record of each pipeline, ratios to the bare consumer and to Quix."""
    best = {
        name: (max(r["records"] / r["wall"] for r in rs), min(r["cpu"] / r["records"] * 1e6 for r in rs))
        for name, rs in runs.items()
    }
    rows = []
    for name, rs in runs.items():
        rate, cpu = best[name]
        vs = [f"{rate / best[o][0]:.2f}" if o in best else "-" for o in (BARE, QUIX)]
        cpu_vs = f"{best[QUIX][1] / cpu:.2f}" if QUIX in best else "-"
        peak = max(r["peak_rss_kb"] for r in rs) / 1024
        checked = (
            f"{min(r['correct'] for r in rs):,} of {data.trades:,}" if "correct" in rs[0] else "-"
        )  # fmt: skip
        rows.append(
            f"| {name} | {rate:,.0f} | {vs[0]} | {vs[1]} | {cpu:.1f} | {cpu_vs} | {peak:,.0f} | {checked} |"
        )
    return "\n".join(
        [
            f"Input: {data.keys:,} table keys (quotes) then {data.trades:,} stream records (trades), "
            f"{data.total:,} records in all, {PARTITIONS} partitions; best of {rounds} alternating rounds; "
            f"load average at the end {os.getloadavg()[0]:.2f}.",
            "",
            "| pipeline | records/s (wall) | vs bare consumer | vs Quix | µs CPU per record | "
            "Quix's CPU per record / this | peak RSS MB | trades enriched correctly |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            *(f"- {line}" for line in lines),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="table keys (one quote each)")
    parser.add_argument("--trades", type=int, default=300_000, help="stream records")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help=f"of {', '.join(PIPELINES)}")
    parser.add_argument("--restore", action="store_true", help="time a restore after the last tandem run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout, whose worker runs as `tandem (before)`",
    )
    args = parser.parse_args()
    pipelines = [name.strip() for name in args.pipelines.split(",") if name.strip()]
    if unknown := [name for name in pipelines if name not in PIPELINES]:
        parser.error(f"unknown pipeline(s) {unknown}")
    if args.before is not None:
        if TANDEM in pipelines:
            pipelines.insert(pipelines.index(TANDEM), TANDEM_BEFORE)
        args.before = args.before.resolve()
    print(
        asyncio.run(
            bench(args.keys, args.trades, args.rounds, pipelines, args.restore, args.timeout, args.before)
        )
    )


if __name__ == "__main__":
    main()
