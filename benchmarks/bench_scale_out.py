"""Scale-out from 2 to 3 workers under continuous input, with a large join state (issue 12):
Tandem with warm-ups (KIP-441), Tandem without, and the join on Faust's own tables with
Faust's stock assignor (benchmarks/faust_table_app.py), one after the other on one broker.

Each run: a fresh app id, 6 partitions, `--state` impressions of join state per partition
written straight into the changelog (the Tandem join's, or the Faust table's), two workers
(standby replicas 1) that restore it, `--rate` impressions a second (each clicked), then a
third worker. Reported:

- **longest gap**: over all partitions, the longest time from the third worker's start
  until the run ends (3 s after balance) in which a partition produced no joined output
  (output records' CreateTime, set by the worker that joined them);
- **restored cold**: changelog records restored into partitions that moved to a member
  without their state (Tandem: `moved_cold`; Faust: what its recovery replayed into actives);
- **balanced**: from the third worker's start until every partition is active on one of the
  three, restored, the third one holds some, and (Tandem) no move is pending;
- **joins not read back**: expected joins missing from the output once none came for 3 s
  (a worker still behind counts here, as well as a loss).

    flock /tmp/lead/bench.lock .venv/bin/python benchmarks/bench_scale_out.py --state 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cluster import WorkerProcess, covered, wait_for  # noqa: E402
from app.settings import Settings, create_topics, from_env  # noqa: E402
from app.traffic import Traffic  # noqa: E402
from tables.kafka.batches import send_records  # noqa: E402
from tables.kafka.topics import changelog_configs  # noqa: E402
from tables.kafka.topics import create_topics as create_with_configs  # noqa: E402
from tables.testing import EmbeddedBroker  # noqa: E402
from tests.scale_out import (  # noqa: E402
    Background,
    keys_by_partition,
    longest_gaps,
    send_changelog,
    state_records,
)

PARTITIONS = 6
MODES = {
    "tandem+warmups": ("app", {"TANDEM_WARMUPS": "1"}),
    "tandem-nowarmups": ("app", {"TANDEM_WARMUPS": "0"}),
    "faust-tables": ("benchmarks.faust_table_app", {}),
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def fill_faust_table(bootstrap: str, topic: str, keys: dict[int, list[str]], ts: int) -> int:
    """The Faust table's changelog after these impressions: JSON key, JSON entry."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=512 * 1024)
    await producer.start()
    try:
        for partition, auctions in keys.items():
            for start in range(0, len(auctions), 20_000):
                records = [
                    (json.dumps(a).encode(), json.dumps({"left": [{"event_id": f"{a}-i", "auction_id": a,
                                                                    "campaign_id": "c", "ts": ts}]}).encode())
                    for a in auctions[start : start + 20_000]
                ]  # fmt: skip
                await send_records(producer, topic, partition, records)
    finally:
        await producer.stop()
    return sum(map(len, keys.values()))


def balanced(workers: list[WorkerProcess]) -> bool:
    views = [w.view() for w in workers]
    if any(v is None or not v["joins"]["ad-join"]["actives"] for v in views):
        return False
    group = views[0].get("group_rebalance") or {}  # type: ignore[union-attr]
    return covered(workers, PARTITIONS) and not group.get("pending_moves")


def restored_cold(workers: list[WorkerProcess], since_s: float) -> int:
    total = 0
    for worker in workers:
        join = worker.join() or {}
        history = join.get("rebalance_history") or [{"at": since_s, **join.get("last_rebalance", {})}]
        for r in history:
            if r.get("at", 0) >= since_s:
                by = r.get("replayed_by_partition", {})
                total += sum(int(by.get(str(p), 0)) for p in r.get("moved_cold", []))
    return total


async def read_all(bootstrap: str, topic: str, quiet_s: float = 3.0) -> list[tuple[int, int, str]]:
    """Every output record (partition, CreateTime ms, join id), until none come for `quiet_s`."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[tuple[int, int, str]] = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            batch = await consumer.getmany(timeout_ms=300, max_records=50_000)
            for records in batch.values():
                last = time.monotonic()
                seen += [(r.partition, r.timestamp, json.loads(r.value)["join_id"]) for r in records]
    finally:
        await consumer.stop()
    return seen


class State:
    """The state's keys and the join's changelog records, made once for every mode."""

    def __init__(self, per_partition: int) -> None:
        self.ts = int(time.time() * 1000)
        self.keys = keys_by_partition(per_partition, PARTITIONS, "k")
        self._records: dict[int, list[tuple[bytes, bytes]]] | None = None

    def records(self) -> dict[int, list[tuple[bytes, bytes]]]:
        if self._records is None:
            started = time.monotonic()
            self._records = state_records(self.keys, self.ts)
            say(f"join state made in {time.monotonic() - started:.0f} s")
        return self._records


def one_run(
    broker: EmbeddedBroker, mode: str, args: argparse.Namespace, run_dir: Path, state: State
) -> dict[str, Any]:
    app_module, env = MODES[mode]
    tag = uuid.uuid4().hex[:8]
    settings: Settings = replace(
        from_env(), app_id=f"scale-{tag}", topic_prefix=f"s{tag}-", partitions=PARTITIONS
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    started = time.monotonic()
    if app_module == "app":
        changelog, configs = settings.changelog, changelog_configs(None)
        records = state.records()
        started = time.monotonic()
        asyncio.run(create_with_configs(broker.bootstrap, {changelog: PARTITIONS}, {changelog: configs}))
        written = asyncio.run(send_changelog(broker.bootstrap, changelog, records))
    else:
        changelog, configs = f"{settings.app_id}-ad-join-seen-changelog", {"cleanup.policy": "compact"}
        asyncio.run(create_with_configs(broker.bootstrap, {changelog: PARTITIONS}, {changelog: configs}))
        written = asyncio.run(fill_faust_table(broker.bootstrap, changelog, state.keys, state.ts))
    say(f"{mode}: {written:,} changelog records written in {time.monotonic() - started:.0f} s")
    extra = {
        "TANDEM_ACCEPTABLE_RECOVERY_LAG": str(args.lag),
        "TANDEM_PROBING_REBALANCE_INTERVAL_S": "60",
        **env,
    }

    def worker(name: str, host: str) -> WorkerProcess:
        return WorkerProcess(name, host, "rack-1", broker.bootstrap, settings.app_id, run_dir / tag,
                             partitions=PARTITIONS, topic_prefix=settings.topic_prefix,
                             app_module=app_module, extra_env=extra)  # fmt: skip

    workers = [worker("w1", "host-a").start(), worker("w2", "host-b").start()]
    try:
        if not wait_for(lambda: balanced(workers), args.timeout):
            raise RuntimeError(f"{mode}: two workers not ready; logs in {run_dir / tag}")
        say(f"{mode}: two workers ready after {time.monotonic() - started:.0f} s")
        traffic = Traffic(settings.impressions, settings.clicks, run=f"r{tag}", click_ratio=1.0, bad_every=0,
                          duplicate_every=0)  # fmt: skip
        background = Background(broker.bootstrap, traffic, args.rate).start()
        time.sleep(5)
        joined_at = time.time()
        workers.append(worker("w3", "host-c").start())
        ok = wait_for(lambda: balanced(workers), args.timeout, interval=0.2)
        balance_s = time.time() - joined_at if ok else None
        time.sleep(3)
        ended_at = time.time()
        sent = background.stop()
        outputs = asyncio.run(read_all(broker.bootstrap, settings.joins))
        gaps = longest_gaps(outputs, PARTITIONS, int(joined_at * 1000), int(ended_at * 1000))
        lost = len(sent.expected - {j for _, _, j in outputs})
        return {"mode": mode, "state": args.state, "gap": max(gaps.values()), "gaps": gaps,
                "cold": restored_cold(workers, joined_at), "balanced": balance_s, "lost": lost}  # fmt: skip
    finally:
        for w in workers:
            w.kill()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | state per partition | longest output gap (s) | gap per partition (s) | restored cold | "
        "balanced after (s) | joins not read back |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        per = ", ".join(f"{g:.1f}" for _, g in sorted(r["gaps"].items()))
        bal = "not in time" if r["balanced"] is None else f"{r['balanced']:.1f}"
        lines.append(
            f"| {r['mode']} | {r['state']:,} | {r['gap']:.1f} | {per} | {r['cold']:,} | {bal} | {r['lost']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state", type=int, default=100_000, help="impressions of state per partition")
    parser.add_argument("--rate", type=float, default=150.0, help="impressions a second (each clicked)")
    parser.add_argument("--lag", type=int, default=10_000, help="acceptable_recovery_lag (the default)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each settle")
    parser.add_argument("--modes", default=",".join(MODES), help="comma separated: " + "; ".join(MODES))
    parser.add_argument("--keep", action="store_true", help="keep the workers' logs")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-scale-out-"))
    rows = []
    state = State(args.state)
    with EmbeddedBroker(log_dir=run_dir / "broker") as broker:
        for mode in args.modes.split(","):
            rows.append(one_run(broker, mode.strip(), args, run_dir, state))
            say(json.dumps(rows[-1]))
    print(table(rows))
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
