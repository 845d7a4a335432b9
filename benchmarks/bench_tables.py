"""Benchmarks of the join state on its own (no worker); prints Markdown tables
(results: docs/bench/tables.md).

    .venv/bin/python -m benchmarks.bench_tables                       # everything
    .venv/bin/python -m benchmarks.bench_tables --only stages --records 100000 [--profile]
    .venv/bin/python -m benchmarks.bench_tables --only restore --restore-records 1000000
    .venv/bin/python -m benchmarks.bench_tables --only memory --memory-keys 10000000

- stages: CPU per input record of each step a worker's batch takes, on the generic
  state (`tables.state.partition.StatePartition`: RocksDB + write overlay + `WindowedJoin`),
  with the reference app's own input checks and result handling, without Kafka;
- restore: a `tables.state.JoinState` restored from local files plus the changelog's
  tail, against a full replay of the changelog (a ratio measured in the same run);
- memory: resident set size as the state grows to N join keys.

The former "throughput" section (a hand-written consume loop around the old
JoinTables, against a Faust-style table join) is gone: benchmarks/bench_worker.py
measures the real worker against a bare consumer, the worker consuming only, and the
join on Faust's own tables.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from app.records import ad_join
from app.settings import JOIN_NAME, from_env
from app.traffic import ad_events
from tables.kafka.topics import changelog_configs, create_topics
from tables.operators import keys
from tables.operators.keys import Side
from tables.operators.windowed import JoinType, JoinWindow
from tables.operators.windowed_kind import WindowedKind
from tables.records.codecs import Accepted, SideCodec
from tables.state.manager import JoinState
from tables.state.partition import StatePartition
from tables.state.store import PartitionStore
from tables.testing import EmbeddedBroker

WINDOW = JoinWindow()  # the reference app's: before 0, after 10 min, grace 1 min
Event = tuple[Side, bytes, bytes]  # side, key, value


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def recent_events(impressions: int) -> list[Event]:
    """app.traffic.ad_events ending an hour ago (the app rejects records older than 7 days)."""
    base_ts = int(time.time() * 1000) - 3_600_000 - impressions * 10
    return [
        (s, e["auction_id"].encode(), orjson.dumps(e)) for s, e in ad_events(impressions, base_ts=base_ts)
    ]


def reference_codecs() -> dict[Side, SideCodec]:
    """The reference app's input checks, as its join runner holds them (no broker needed)."""
    from app.join import build
    from tables import runtime_of

    settings = from_env()
    app = build(settings)
    return runtime_of(app).tasks[JOIN_NAME].intake.codecs


def open_partition(path: Path, join_type: JoinType, window: JoinWindow = WINDOW) -> StatePartition:
    """One active partition of the state, as a worker holds it (ids: the ad join's event ids)."""
    return StatePartition(PartitionStore(path), WindowedKind(window, join_type), "active", ids=True)


# -- stages: where the CPU of a record goes, without Kafka ---------------------------


def bench_stages(records: int, batch: int, work: Path, profile: bool) -> list[str]:
    """The ad join (inner, event ids) over RocksDB + overlay, a commit every `batch` input
    records: CPU per input record of each step of a worker's batch (the changelog is only
    taken, not produced: that is the broker's part)."""
    events = recent_events(records)
    codecs = reference_codecs()
    part = open_partition(work / "stages" / JOIN_NAME / "0", JoinType.INNER)
    names = ["check (decode + validate)", "process", "results (decode + handler's record)",
             "take_changes", "RocksDB write"]  # fmt: skip
    spent = dict.fromkeys(names, 0.0)
    results = changes = rejected = 0
    clock = time.process_time
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    key_of = codecs["left"].key
    left_of, right_of = codecs["left"].value, codecs["right"].value
    for start in range(0, len(events), batch):
        t0 = clock()
        checked = [
            (side, key, value, codecs[side].check(key, value, start + n, None))
            for n, (side, key, value) in enumerate(events[start : start + batch])
        ]
        t1 = clock()
        join = part.join
        matches = []
        for side, key, value, found in checked:
            if type(found) is Accepted:
                matches += join.process(side, key, found.ts, found.record_id, value)
            else:
                rejected += 1
        t2 = clock()
        out = []
        for m in matches:
            auction = key_of(m.key)
            left = None if m.left is None else left_of(m.left)
            right = None if m.right is None else right_of(m.right)
            out.append(orjson.dumps(ad_join(auction, left, right, m.timestamp)))
        t3 = clock()
        logged = join.take_changes()
        t4 = clock()
        part.write(start + batch)
        t5 = clock()
        for name, spent_here in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            spent[name] += spent_here
        results, changes = results + len(out), changes + len(logged)
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    part.store.close()
    n = len(events)
    return [
        f"{n:,} records ({records:,} impressions), the reference app's inner join with event ids, "
        f"a commit every {batch:,} records: {results:,} results, {changes:,} changelog records, "
        f"{rejected:,} rejected.",
        "",
        "| stage | µs CPU per input record |",
        "| --- | ---: |",
        *(f"| {name} | {value / n * 1e6:.2f} |" for name, value in spent.items()),
        f"| **total** | **{sum(spent.values()) / n * 1e6:.2f}** |",
    ]


# -- memory -------------------------------------------------------------------------


def bench_memory(count: int, step: int, work: Path, path: str) -> list[str]:
    """Left-join state of `count` impressions that never expire (the window outlasts the
    run), one join key each. path=process: through WindowedJoin.process (matching and
    expiry included); path=restore: through WindowedJoin.restore, the path of a standby
    or a restore, which writes the same keys for a fraction of the CPU."""
    part = open_partition(work / "mem" / JOIN_NAME / "0", JoinType.LEFT, JoinWindow(0, 10**12, 0))
    rows = [f"| 0 | {rss_mb():.0f} | 0 | |"]
    started = time.perf_counter()
    base_ts = int(time.time() * 1000)
    for n in range(1, count + 1):
        key, ts, event_id = f"auction-{n}".encode(), base_ts + n, f"i{n}".encode()
        value = b'{"event_id":"i%d","auction_id":"auction-%d","campaign_id":"c7","ts":%d}' % (n, n, ts)
        if path == "process":
            part.join.process("left", key, ts, event_id, value)
        else:
            part.join.restore(keys.record_key("left", key, ts, event_id), b"\x00" + value)
        if n % 2000 == 0:
            part.join.take_changes()  # the changelog is not part of this measurement
            part.write(n)
        if n % step == 0:
            rate = n / (time.perf_counter() - started)
            rows.append(f"| {n:,} | {rss_mb():.0f} | {dir_mb(part.store.path):.0f} | {rate:,.0f} |")
            print(rows[-1], flush=True)
    part.store.close()
    return [
        f"Path: `{path}`. Keys = impressions held in state (a record, its expiry index entry and "
        "its id entry each; values are the records' JSON, about 80 bytes).",
        "",
        "| join keys in state | resident MB | files MB | keys/s so far |",
        "| ---: | ---: | ---: | ---: |",
        *rows,
    ]


# -- restore ------------------------------------------------------------------------


def _state(bootstrap: str, topic: str, data_dir: Path) -> JoinState:
    return JoinState(bootstrap, topic, data_dir, kind=WindowedKind(WINDOW, JoinType.INNER), ids=True,
                     table=JOIN_NAME)  # fmt: skip


async def _open_active(state: JoinState) -> None:
    """Partition 0 active and restored (what a worker does at an assignment)."""
    moves = await state.assign({0}, set())
    await state.restore(moves.to_restore, lambda partition: None)


async def write_changelog(bootstrap: str, topic: str, records: int, tail_fraction: float,
                          writer_dir: Path, local_dir: Path) -> tuple[int, int]:  # fmt: skip
    """A worker joins `records` input records on partition 0, committing every 5,000; a copy
    of its files is taken when all but the tail is in. Returns (changelog end, input records)."""
    codecs = reference_codecs()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    writer = _state(bootstrap, topic, writer_dir)
    await _open_active(writer)
    snapshot_at = int(records * (1 - tail_fraction))
    written = 0
    try:
        for n, (side, key, value) in enumerate(recent_events(records)[:records], 1):
            found = codecs[side].check(key, value, n, None)
            if type(found) is Accepted:
                writer.active(0).operator.process(side, key, found.ts, found.record_id, value)
            written = n
            if n % 5000 == 0 or n == snapshot_at:
                await writer.commit(0, producer)
            if n == snapshot_at:
                await writer.close()  # files are copied closed, then the writer goes on
                shutil.copytree(writer_dir, local_dir)
                await _open_active(writer)
        await writer.commit(0, producer)
        end = writer.local_offsets()[0] + 1
    finally:
        await writer.close()
        await producer.stop()
    return end, written


async def bench_restore(records: int, tail_fraction: float, work: Path) -> list[str]:
    """Restore from the copy of the files + the tail, then from nothing."""
    with EmbeddedBroker(log_dir=work / "broker-r") as broker:
        topic = "restore-changelog"
        await create_topics(broker.bootstrap, {topic: 1}, {topic: changelog_configs(None)})
        writer_dir, local_dir = work / "writer", work / "local"
        end, written = await write_changelog(broker.bootstrap, topic, records, tail_fraction,
                                             writer_dir, local_dir)  # fmt: skip
        timings: dict[str, tuple[float, int]] = {}
        for name, data_dir in (("local files + tail", local_dir), ("full replay", work / "empty")):
            state = _state(broker.bootstrap, topic, data_dir)
            started = time.perf_counter()
            await _open_active(state)
            timings[name] = (time.perf_counter() - started, state.recovery.progress[0].restored)
            assert state.local_offsets()[0] == end - 1, (name, state.local_offsets(), end)
            await state.close()
    local, full = timings["local files + tail"], timings["full replay"]
    return [
        f"Changelog of {end:,} records ({written:,} input records, the reference app's inner join), "
        f"one partition; tail = the last {tail_fraction:.0%} of the input.",
        "",
        "| restore | changelog records read | seconds | speed-up |",
        "| --- | ---: | ---: | ---: |",
        f"| full replay (no local files) | {full[1]:,} | {full[0]:.2f} | 1.0 |",
        f"| local files + tail | {local[1]:,} | {local[0]:.2f} | {full[0] / local[0]:.1f}x |",
    ]


def _section(title: str, lines: Callable[[], list[str]]) -> None:
    print(f"\n## {title}\n\n" + "\n".join(lines()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["stages", "restore", "memory"])
    parser.add_argument("--records", type=int, default=100_000, help="impressions for stages")
    parser.add_argument("--memory-keys", type=int, default=10_000_000)
    parser.add_argument("--memory-step", type=int, default=1_000_000)
    parser.add_argument("--memory-path", choices=["restore", "process"], default="restore")
    parser.add_argument("--restore-records", type=int, default=1_000_000)
    parser.add_argument("--tail-fraction", type=float, default=0.01)
    parser.add_argument("--stages-batch", type=int, default=3000, help="records per commit")
    parser.add_argument("--profile", action="store_true", help="stages: cProfile, top 20")
    args = parser.parse_args()
    os.environ.setdefault("TANDEM_APP_ID", "bench-tables")  # the reference app, never started
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as tmp:
        work = Path(tmp)
        # Memory first: its resident size then holds as little of the other sections as can be.
        sections: list[tuple[str | None, str, Callable[[], Any]]] = [
            ("memory", "Memory", lambda: bench_memory(args.memory_keys, args.memory_step, work,
                                                      args.memory_path)),
            ("stages", "Stages", lambda: bench_stages(args.records, args.stages_batch, work, args.profile)),
            ("restore", "Restore", lambda: asyncio.run(
                bench_restore(args.restore_records, args.tail_fraction, work))),
        ]  # fmt: skip
        for name, title, run in sections:
            if args.only in (None, name):
                _section(title, run)


if __name__ == "__main__":
    main()
