"""Chaos run: the reference app under SIGKILLs and broker stalls, judged record by record.

    python -m app.chaos --events 1000000 --workers 4 --kills 20 --pauses 3

Starts its own embedded broker (pausing a shared one would stall other runs),
3-4 worker processes with standby replicas 1, and a producer of generated
traffic (with duplicates and every kind of bad record). Meanwhile it SIGKILLs
random workers and restarts them on their old data dirs, and SIGSTOPs the
broker a few times. Then it waits until the group has committed every input
offset and judges the output twice: here, against the join ids the generator
knows it must produce (raw copies, distinct ids, copies that disagree), and with
`python -m pipeline reconcile --app app`: the join's audit, dead letters and counters against
its batch twin over the topics (the generic path any app takes; with --deduped-reconcile also
the audit deduped by fingerprint, with no duplicate allowed).
Exit 0 when nothing is missing or spurious, every bad record is dead-lettered where
it was read (topic, partition, offset) with its reason, and every null value is
dropped, never dead-lettered: read past (the group committed past its offset) and in no
dead letter, both judged from the topics, not from a worker. The workers' own counts of null
values (`null_values` in their views, per process lifetime) are reported besides: a worker
about to be killed is asked with a bounded, generous timeout, and one that does not answer
is an uncounted lifetime, not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from app.cluster import REPO, WorkerProcess, covered, wait_for
from app.settings import JOIN_NAME, Settings, create_topics, from_env
from assignor import clients
from tables.testing import EmbeddedBroker, high_watermarks, uncommitted
from tables.testing import create_topics as create_topics_named

DAY_MS = 24 * 3600 * 1000


# -- traffic -------------------------------------------------------------------


def bad_records(i: int, run: str, now: int) -> list[tuple[str, bytes | None, bytes | None]]:
    """Every kind of bad input (docs/join-semantics.md), as (reason tag, key, value)."""
    key = f"{run}-bad{i}"
    good = {"event_id": f"{run}-x{i}", "auction_id": key, "campaign_id": "c", "ts": now}

    def v(**changes: Any) -> bytes:
        record = {**good, **changes}
        return json.dumps({k: x for k, x in record.items() if x is not _DROP}).encode()

    return [
        ("malformed", key.encode(), b'{"event_id": "broken", "auction_id": '),
        ("not-utf8", key.encode(), b"\xff\xfe{\x00"),
        ("array", key.encode(), b"[1, 2, 3]"),
        ("wrong-type", key.encode(), v(ts="soon")),
        ("bool-ts", key.encode(), v(ts=True)),
        ("missing-field", key.encode(), v(event_id=_DROP)),
        ("null-key", key.encode(), v(auction_id=None)),
        ("empty-key", b"", v(auction_id="")),
        ("key-mismatch", key.encode(), v(auction_id=key + "-other")),
        ("oversized", key.encode(), v(campaign_id="x" * (70 * 1024))),
        ("past", key.encode(), v(ts=now - 8 * DAY_MS)),
        ("future", key.encode(), v(ts=now + 2 * DAY_MS)),
        ("null-value", key.encode(), None),
        ("null-kafka-key", None, v()),
    ]


_DROP = object()
NULL_VALUE = "null-value"  # dropped and counted by the join, not dead-lettered (Kafka Streams 3.8+)

# (topic, key, value, the kind of bad record or None)
Sent = tuple[str, bytes | None, bytes | None, str | None]
Place = tuple[str, int, int]  # topic, partition, offset


@dataclasses.dataclass
class Generator:
    """Impressions, clicks 1-5 s later (sent when event time reaches them), duplicates, bad.

    Event time advances `per_ms` auctions a millisecond from the wall clock at the
    start, so a consumer reading one topic far ahead of the other (a fetch
    batch) stays well inside the join's 60 s grace: no record is late.
    """

    impressions: str
    clicks: str
    run: str
    ctr: float = 0.5
    duplicate_every: int = 40
    bad_every: int = 50
    per_ms: int = 5
    seed: int = 7
    start_ms: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))
    expected: set[str] = dataclasses.field(default_factory=set)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._pending: list[tuple[int, str, bytes]] = []  # (ts, key, value) of clicks
        self._bad_kinds = 0

    def _count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n

    def step(self, i: int) -> list[Sent]:
        """Records for auction `i`: due clicks, its impression, maybe a duplicate or a bad one."""
        ts = self.start_ms + i // self.per_ms
        out = self._due_clicks(ts)
        auction = f"{self.run}-a{i}"
        imp = {"event_id": f"{self.run}-i{i}", "auction_id": auction,
               "campaign_id": f"campaign-{i % 5}", "ts": ts}  # fmt: skip
        out.append((self.impressions, auction.encode(), json.dumps(imp).encode(), None))
        self._count("impressions")
        if self._random.random() < self.ctr:
            click = {"event_id": f"{self.run}-c{i}", "auction_id": auction,
                     "ts": ts + self._random.randint(1, 5000)}  # fmt: skip
            heapq.heappush(self._pending, (click["ts"], auction, json.dumps(click).encode()))
            self.expected.add(f"{self.run}-i{i}|{self.run}-c{i}")
        if self.duplicate_every and i % self.duplicate_every == 0:
            out.append(out[-1])
            self._count("duplicates")
        if self.bad_every and i % self.bad_every == self.bad_every - 1:
            out.append(self._bad(i, ts))
        return out

    def _bad(self, i: int, ts: int) -> Sent:
        kinds = bad_records(i, self.run, ts)
        kind, key, value = kinds[self._bad_kinds % len(kinds)]
        self._bad_kinds += 1
        self._count("bad")
        self._count(f"bad:{kind}")
        topic = self.clicks if self._bad_kinds % 2 else self.impressions
        return topic, key, value, kind

    def _due_clicks(self, now_ts: int) -> list[Sent]:
        out: list[Sent] = []
        while self._pending and self._pending[0][0] <= now_ts:
            _, key, value = heapq.heappop(self._pending)
            out.append((self.clicks, key.encode(), value, None))
            self._count("clicks")
        return out

    def flush(self) -> list[Sent]:
        return self._due_clicks(sys.maxsize)


async def produce(bootstrap: str, gen: Generator, events: int, rate: float | None,
                  bad_places: dict[str, list[Place]]) -> int:  # fmt: skip
    """Send about `events` records (at `rate` a second if given); returns how many. Where
    each bad record landed goes to `bad_places` (kind -> places)."""
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5,
                                max_request_size=2 * 1024 * 1024, request_timeout_ms=60000)  # fmt: skip
    await producer.start()
    sent, i, began = 0, 0, time.monotonic()
    landed: list[tuple[str, asyncio.Future[Any]]] = []
    try:
        while sent < events:
            for topic, key, value, kind in gen.step(i):
                future = await producer.send(topic, value, key=key)
                if kind is not None:
                    landed.append((kind, future))
                sent += 1
            i += 1
            if rate and (ahead := began + sent / rate - time.monotonic()) > 0:
                await asyncio.sleep(ahead)
        for topic, key, value, _ in gen.flush():
            await producer.send(topic, value, key=key)
            sent += 1
        await producer.flush()
        for kind, future in landed:
            meta = await future
            bad_places.setdefault(kind, []).append((meta.topic, meta.partition, meta.offset))
    finally:
        await producer.stop()
    return sent


# -- chaos ---------------------------------------------------------------------


@dataclasses.dataclass
class Chaos:
    broker: EmbeddedBroker
    workers: list[WorkerProcess]
    rng: random.Random
    log: Callable[[str], None]
    kills: int = 0
    pauses: int = 0
    paused_s: float = 0.0
    null_values: int = 0  # counted by worker lifetimes that ended (read just before each kill)
    uncounted_lifetimes: int = 0  # killed without answering: their count is unknown
    worst_loop_stall_s: float = 0.0  # the longest event-loop stall a worker reported

    def kill_one(self, down_max_s: float) -> None:
        """SIGKILL a random live worker; restart it on its old data dir after a while."""
        victim = self.rng.choice([w for w in self.workers if w.alive])
        self.count_null_values(victim)
        victim.kill()
        self.kills += 1
        self.log(f"kill #{self.kills}: {victim.name} (SIGKILL)")
        time.sleep(self.rng.uniform(0.0, down_max_s))
        victim.start()

    def count_null_values(self, worker: WorkerProcess, timeout_s: float = 15.0) -> None:
        """Add what this lifetime of the worker counted as null values (its counters start at 0
        in each process), asking for up to `timeout_s` (a busy machine may keep a worker from
        answering for seconds); no answer makes the lifetime uncounted. Only a report: the
        verdict on null values comes from the topics (`judge_null_values`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = worker.view(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if view is not None:
                self.null_values += sum(view["joins"][JOIN_NAME]["null_values"].values())
                loop = view.get("loop") or {}
                self.worst_loop_stall_s = max(self.worst_loop_stall_s, float(loop.get("worst_stall_s") or 0))
                return
            if time.monotonic() >= deadline or not worker.alive:
                self.uncounted_lifetimes += 1
                return
            time.sleep(0.2)

    def pause_broker(self, seconds: float) -> None:
        """SIGSTOP the broker for `seconds` (longer than the session: members time out)."""
        self.broker.pause()
        try:
            time.sleep(seconds)
        finally:
            self.broker.resume()
        self.pauses += 1
        self.paused_s += seconds
        self.log(f"pause #{self.pauses}: broker stopped for {seconds:.1f} s")

    def run(self, kills: int, pauses: int, gap: tuple[float, float], down_max_s: float,
            pause_s: tuple[float, float]) -> None:  # fmt: skip
        """`kills` kills, with `pauses` broker stalls spread among them."""
        pause_at = set(self.rng.sample(range(kills), min(pauses, kills)))
        for n in range(kills):
            time.sleep(self.rng.uniform(*gap))
            self.kill_one(down_max_s)
            if n in pause_at:
                time.sleep(self.rng.uniform(*gap))
                self.pause_broker(self.rng.uniform(*pause_s))


# -- drain and judge -----------------------------------------------------------


async def committed(bootstrap: str, group: str, topics: list[str], partitions: int) -> dict:
    """The group's committed offsets (partitions listed: tansu cannot answer without)."""
    admin = clients.admin(clients.settings_of(bootstrap))
    await admin.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
        return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items()}
    finally:
        await admin.close()


async def backlog(bootstrap: str, settings: Settings) -> int:
    """Input records the group has not committed yet."""
    topics = [settings.impressions, settings.clicks]
    return await uncommitted(bootstrap, settings.app_id, topics, settings.partitions)


async def read_all(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every record value of `topic`, up to the high watermarks."""
    return [value for _, _, value in await read_keyed(bootstrap, topic, partitions)]


async def read_keyed(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes | None, bytes]]:
    """Every record of `topic` up to the high watermarks: (partition, key, value)."""
    ends = await high_watermarks(bootstrap, topic, partitions)
    consumer = clients.consumer(clients.settings_of(bootstrap), max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    found: list[tuple[int, bytes | None, bytes]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and await _behind(consumer, tps, ends):
            batch = await consumer.getmany(timeout_ms=500, max_records=10000)
            found.extend((r.partition, r.key, r.value or b"") for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return found


async def _behind(consumer: AIOKafkaConsumer, tps: list[TopicPartition], ends: dict[int, int]
                  ) -> bool:  # fmt: skip
    for tp in tps:
        if await consumer.position(tp) < ends[tp.partition]:
            return True
    return False


def judge_output(values: list[bytes], expected: set[str]) -> dict[str, int]:
    """Raw copies, distinct join ids, lost/spurious against the generator, disagreeing copies."""
    first: dict[str, bytes] = {}
    unreadable = disagree = 0
    for value in values:
        try:
            join_id = json.loads(value)["join_id"]
        except (ValueError, KeyError, TypeError):
            unreadable += 1
            continue
        if first.setdefault(join_id, value) != value:
            disagree += 1  # a re-emitted result must be byte-for-byte the same result
    ids = set(first)
    return {
        "expected": len(expected),
        "raw_records": len(values),
        "distinct_join_ids": len(ids),
        "raw_duplicates": len(values) - unreadable - len(ids),
        "lost": len(expected - ids),
        "spurious": len(ids - expected),
        "copies_that_disagree": disagree,
        "unreadable": unreadable,
        "deduped_records": len(ids),
    }


def judge_dead_letters(values: list[bytes], bad_places: dict[str, list[Place]]) -> dict[str, Any]:
    """Each bad record the generator sent is in the dead-letter topic (once or more), where
    it was read; a null value never is (it is dropped and counted)."""
    letters = [json.loads(v) for v in values]
    keyed = {(x["topic"], x["partition"], x["offset"]) for x in letters}
    reasons: dict[str, int] = {}
    categories: dict[str, int] = {}
    for letter in letters:
        reason = re.sub(r"\d+", "N", letter["reason"].split(":")[0])
        reasons[reason] = reasons.get(reason, 0) + 1
        categories[letter["category"]] = categories.get(letter["category"], 0) + 1
    lettered = {kind: [p for p in places if p not in keyed] for kind, places in bad_places.items()}
    missing = sum(len(left) for kind, left in lettered.items() if kind != NULL_VALUE)
    nulls = bad_places.get(NULL_VALUE, [])
    return {"bad_sent": sum(map(len, bad_places.values())), "null_values_sent": len(nulls),
            "letters": len(letters), "distinct_letters": len(keyed), "missing_letters": missing,
            "null_values_dead_lettered": sum(1 for p in nulls if p in keyed),
            "missing_by_kind": {k: len(v) for k, v in lettered.items() if v and k != NULL_VALUE},
            "reasons": reasons, "categories": categories}  # fmt: skip


def judge_null_values(
    chaos: Chaos,
    workers: list[WorkerProcess],
    places: list[Place],
    letters: list[bytes],
    done: dict[tuple[str, int], int],
) -> dict[str, Any]:
    """Every null value sent was dropped: the group committed past its offset (read and done
    with) and no dead letter names it; both from the topics, whichever workers died. The
    workers' counts over their lifetimes are reported besides (at least one count per record
    sent where every lifetime answered; more when a record is read again after a kill)."""
    for worker in workers:
        chaos.count_null_values(worker)
    lettered = {(x["topic"], x["partition"], x["offset"]) for x in map(json.loads, letters)}
    read_past = sum(1 for topic, partition, offset in places if (done.get((topic, partition)) or 0) > offset)
    return {"sent": len(places), "read_past": read_past,
            "dead_lettered": sum(1 for place in places if place in lettered),
            "counted": chaos.null_values, "uncounted_lifetimes": chaos.uncounted_lifetimes}  # fmt: skip


def reconcile(bootstrap: str, s: Settings, out: Path, shuffle: int = 12,
              audit: str | None = None) -> dict[str, Any]:  # fmt: skip
    """`python -m pipeline reconcile --app app` over the topics, the app built as the workers
    built it (its settings from the environment): the join's audit, with redelivered
    duplicates allowed (at least once), or `audit` (a copy deduped by fingerprint) strictly."""
    cmd = [sys.executable, "-m", "pipeline", "reconcile", "--app", "app", "--bootstrap", bootstrap,
           "--json", str(out), "--master", "local[2]", "--shuffle-partitions", str(shuffle)]  # fmt: skip
    cmd += ["--audit-topic", audit, "--strict-duplicates"] if audit else []
    env = {**os.environ, "TANDEM_APP_ID": s.app_id, "TANDEM_TOPIC_PREFIX": s.topic_prefix,
           "TANDEM_PARTITIONS": str(s.partitions), "TANDEM_BROKER": f"kafka://{bootstrap}"}  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    print(done.stdout, flush=True)
    report: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    return {"exit": done.returncode, "totals": report.get("results"), "ok": report.get("ok"),
            "letters": report.get("letters"), "counters": report.get("counters"),
            "failures": report.get("failures"), "stderr_tail": done.stderr[-2000:]}  # fmt: skip


async def dedupe_audit(bootstrap: str, s: Settings, topic: str) -> int:
    """The join's audit with each result's first copy only (by fingerprint), to `topic`: what
    an idempotent consumer of the output keeps, judged with no duplicate allowed."""
    audit = f"{s.app_id}-{JOIN_NAME}-audit"
    seen: set[str] = set()
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=20)
    await producer.start()
    try:
        for partition, key, value in await read_keyed(bootstrap, audit, s.partitions):
            fingerprint = json.loads(value)["fingerprint"]
            if fingerprint not in seen:
                seen.add(fingerprint)
                await producer.send(topic, value, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    return len(seen)


# -- the run -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="input records (default 1M)")
    p.add_argument("--rate", type=float, default=0, help="records/s to produce (0: as fast)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (3 or 4)")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--standby-replicas", type=int, default=1)
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs (each followed by a restart)")
    p.add_argument("--pauses", type=int, default=3, help="broker SIGSTOP/SIGCONT stalls")
    p.add_argument("--gap", type=float, nargs=2, default=(3.0, 10.0), help="s between faults")
    p.add_argument("--down", type=float, default=4.0, help="max s a killed worker stays down")
    p.add_argument("--pause-s", type=float, nargs=2, default=(1.0, 5.0), help="stall length")
    p.add_argument("--drain-timeout", type=float, default=3600)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--run-dir", type=Path, default=None, help="logs, data dirs, report")
    p.add_argument("--shuffle-partitions", type=int, default=12, help="for reconcile's Spark")
    p.add_argument(
        "--deduped-reconcile",
        action="store_true",
        help="also reconcile the audit deduped by fingerprint, with no duplicate allowed",
    )
    p.add_argument(
        "--protocol",
        choices=["eager", "cooperative"],
        default=None,
        help="TANDEM_REBALANCE_PROTOCOL of every worker (default: the workers' own default)",
    )
    p.add_argument("--no-reconcile", action="store_true", help="skip the Spark judge")
    p.add_argument("--json", type=Path, help="write the figures here too")
    return p


def _settings(run: str, partitions: int) -> Settings:
    return dataclasses.replace(from_env(), app_id=f"tandem-chaos-{run}",
                               topic_prefix=f"c{run}-", partitions=partitions)  # fmt: skip


def _workers(args: argparse.Namespace, broker: EmbeddedBroker, s: Settings, run_dir: Path,
             ) -> list[WorkerProcess]:  # fmt: skip
    return [
        WorkerProcess(
            f"w{i}",
            f"host-{i}",
            f"rack-{i % 2}",
            broker.bootstrap,
            s.app_id,
            run_dir,
            standby_replicas=args.standby_replicas,
            partitions=s.partitions,
            topic_prefix=s.topic_prefix,
            extra_env={} if args.protocol is None else {"TANDEM_REBALANCE_PROTOCOL": args.protocol},
        )  # fmt: skip
        for i in range(args.workers)
    ]


def _log(began: float) -> Callable[[str], None]:
    return lambda text: print(f"[{time.monotonic() - began:7.1f} s] {text}", flush=True)


def _all_answer(workers: list[WorkerProcess]) -> bool:
    # covered() skips workers that do not answer yet (starting, restoring).
    return all(w.view() is not None for w in workers)


def _drain(bootstrap: str, s: Settings, workers: list[WorkerProcess], timeout: float,
           log: Callable[[str], None]) -> float:  # fmt: skip
    """Wait until every worker is back and the group committed every input offset."""
    began = time.monotonic()
    last = [-1]

    def drained() -> bool:
        left = asyncio.run(backlog(bootstrap, s))
        if left != last[0]:
            log(f"drain: {left:,} input records not committed yet")
            last[0] = left
        return left == 0 and _all_answer(workers) and covered(workers, s.partitions)

    if not wait_for(drained, timeout, interval=5.0):
        behind = asyncio.run(_partitions_behind(bootstrap, s))
        raise TimeoutError(f"not drained within {timeout} s: (committed, end) of partitions behind: {behind}")
    return time.monotonic() - began


async def _partitions_behind(bootstrap: str, s: Settings) -> dict[str, tuple[int, int]]:
    """Input partitions whose group's committed offset is short of their end."""
    topics = [s.impressions, s.clicks]
    done = await committed(bootstrap, s.app_id, topics, s.partitions)
    found = {}
    for topic in topics:
        for partition, end in (await high_watermarks(bootstrap, topic, s.partitions)).items():
            offset = done.get((topic, partition), -1)
            if offset < end:
                found[f"{topic}:{partition}"] = (offset, end)
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    log, rng, run_id = _log(began), random.Random(args.seed), uuid.uuid4().hex[:8]
    run_dir = args.run_dir or Path("/tmp") / f"tandem-chaos-{run_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_dir=run_dir) as broker:
        s = _settings(run_id, args.partitions)
        asyncio.run(create_topics(broker.bootstrap, s))
        workers = _workers(args, broker, s, run_dir)
        try:
            return _run(args, broker, s, workers, rng, log, run_dir, began)
        finally:
            for worker in workers:
                worker.kill()


def _run(args: argparse.Namespace, broker: EmbeddedBroker, s: Settings,
         workers: list[WorkerProcess], rng: random.Random, log: Callable[[str], None],
         run_dir: Path, began: float) -> dict[str, Any]:  # fmt: skip
    log(f"broker {broker.bootstrap} (pid {broker.pid}); {len(workers)} workers; run dir {run_dir}")
    for worker in workers:
        worker.start()
    if not wait_for(lambda: _all_answer(workers) and covered(workers, s.partitions), 180):
        raise TimeoutError(f"the group did not form within 180 s; logs in {run_dir}")
    log("group formed: every partition covered")
    gen = Generator(s.impressions, s.clicks, s.app_id, seed=args.seed)
    sent: list[int] = []
    bad_places: dict[str, list[Place]] = {}
    producer = threading.Thread(
        target=lambda: sent.append(
            asyncio.run(produce(broker.bootstrap, gen, args.events, args.rate or None, bad_places))
        )
    )
    producer.start()
    chaos = Chaos(broker, workers, rng, log)
    chaos.run(args.kills, args.pauses, tuple(args.gap), args.down, tuple(args.pause_s))
    producer.join(timeout=args.drain_timeout)
    assert sent, "the producer did not finish"
    log(f"chaos done ({chaos.kills} kills, {chaos.pauses} pauses); produced {sent[0]:,}")
    drain_s = _drain(broker.bootstrap, s, workers, args.drain_timeout, log)
    log(f"drained in {drain_s:.0f} s after the last fault")
    return _judge(args, broker, s, gen, chaos, sent[0], bad_places, run_dir, began, log)


def _judge(args: argparse.Namespace, broker: EmbeddedBroker, s: Settings, gen: Generator,
           chaos: Chaos, sent: int, bad_places: dict[str, list[Place]], run_dir: Path,
           began: float, log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    output = asyncio.run(read_all(broker.bootstrap, s.joins, s.partitions))
    letters = asyncio.run(read_all(broker.bootstrap, s.dead_letters, s.partitions))
    figures: dict[str, Any] = {
        "events": sent, "workers": len(chaos.workers), "partitions": s.partitions,
        "standby_replicas": args.standby_replicas, "protocol": args.protocol or "default",
        "kills": chaos.kills,
        "broker_pauses": chaos.pauses, "broker_paused_s": round(chaos.paused_s, 1),
        "generated": gen.counts, "output": judge_output(output, gen.expected),
        "dead_letters": judge_dead_letters(letters, bad_places),
        "null_values": judge_null_values(
            chaos, chaos.workers, bad_places.get(NULL_VALUE, []), letters,
            asyncio.run(committed(broker.bootstrap, s.app_id, [s.impressions, s.clicks], s.partitions))),
    }  # fmt: skip
    figures["worst_loop_stall_s"] = round(chaos.worst_loop_stall_s, 3)
    log(f"output: {json.dumps(figures['output'])}")
    log(f"dead letters: {json.dumps(figures['dead_letters'])}")
    log(f"null values: {json.dumps(figures['null_values'])}")
    if not args.no_reconcile:
        judged = reconcile(broker.bootstrap, s, run_dir / "reconcile.json", args.shuffle_partitions)
        figures["reconcile"] = judged
        log(f"reconcile: exit {figures['reconcile']['exit']}, {figures['reconcile']['totals']}")
    if args.deduped_reconcile:
        deduped = f"{s.app_id}-{JOIN_NAME}-audit-deduped"
        asyncio.run(create_topics_named(broker.bootstrap, [deduped], s.partitions))
        written = asyncio.run(dedupe_audit(broker.bootstrap, s, deduped))
        judged = reconcile(broker.bootstrap, s, run_dir / "reconcile-deduped.json", args.shuffle_partitions,
                           audit=deduped)  # fmt: skip
        figures["reconcile_deduped"] = {**judged, "topic": deduped, "written": written}
        log(f"reconcile (audit deduped by fingerprint): exit {judged['exit']}, {judged['totals']}")
    figures["seconds"] = round(time.monotonic() - began, 1)
    figures["ok"] = ok(figures)
    return figures


def ok(figures: dict[str, Any]) -> bool:
    out, dl, nulls = figures["output"], figures["dead_letters"], figures["null_values"]
    clean = out["lost"] == out["spurious"] == out["copies_that_disagree"] == out["unreadable"] == 0
    letters = dl["missing_letters"] == dl["null_values_dead_lettered"] == 0
    dropped = nulls["read_past"] == nulls["sent"] and nulls["dead_lettered"] == 0
    # A lifetime killed without answering may have counted some: then only >= 0 is known.
    counted = dropped and (nulls["counted"] >= nulls["sent"] or nulls["uncounted_lifetimes"] > 0)
    judges = [figures.get("reconcile"), figures.get("reconcile_deduped")]
    return clean and letters and counted and all(j is None or j["exit"] == 0 for j in judges)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    figures = run(args)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
