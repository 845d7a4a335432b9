"""Local state faults (issue 17) on real `faust -A app worker` processes, real RocksDB files
and the embedded broker: each ends with the worker running and every expected join in the
output topic, or with a worker that refuses to start and says why, naming the path.

One worker, 2 partitions, no standby (the issue's set-up), so every partition's state lives
in one data dir: `<worker data dir>/tandem-joins/ad-join/<partition>/`. The disk-full case
mounts a real small tmpfs over `tandem-joins` (skipped where mounts are not allowed); the
permission case runs the worker as `nobody` (setpriv), because root ignores file modes.
The changelog-start case needs DeleteRecords, which the embedded broker does not implement:
it runs against a real Kafka named by TANDEM_TEST_KAFKA and is skipped here, with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rocksdict import AccessType, Options, Rdict

from app.cluster import WorkerProcess
from app.settings import JOIN_NAME, Settings, create_topics, from_env
from tables.state.datadir import LOCK_FILE
from tables.state.store import (
    CHANGELOG_ID_FILE,
    DAMAGED_DIR,
    FORMAT_FILE,
    FORMAT_KEY,
    FORMAT_VERSION,
    PartitionStore,
    local_checkpoints,
)
from tables.testing import EmbeddedBroker, high_watermarks, read_records, wait_for
from tests.nobody import skip_unless_nobody_can_run_tandem
from tests.test_tables_store_faults import fill_disk, tmpfs
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

PARTITIONS = 2
NOBODY = 65534  # uid and gid of nobody/nogroup
Row = tuple[str, str, dict[str, Any]]  # topic, key, value


# -- the set-up: one worker, its topics, its traffic ---------------------------------------


class Broker(Protocol):
    bootstrap: str


@dataclasses.dataclass
class Setup:
    """The topics of one test on the shared broker, and the workers it starts."""

    broker: Broker
    settings: Settings
    run_dir: Path
    workers: list[WorkerProcess] = dataclasses.field(default_factory=list)
    base_ts: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))

    def worker(self, name: str = "w1", app_id: str | None = None, **kw: Any) -> WorkerProcess:
        """A worker of the reference app; the same name means the same data dir."""
        kind = kw.pop("kind", WorkerProcess)
        worker = kind(
            name, f"host-{name}", "rack-1", self.broker.bootstrap, app_id or self.settings.app_id,
            self.run_dir, standby_replicas=0, partitions=PARTITIONS, topic_prefix=self.settings.topic_prefix,
            **kw,
        )  # fmt: skip
        self.workers.append(worker)
        return worker

    def state_dir(self, worker: WorkerProcess) -> Path:
        return worker.data_dir / "tandem-joins" / JOIN_NAME

    # -- traffic ----------------------------------------------------------------------

    def impressions(self, numbers: range) -> list[Row]:
        return [
            (self.settings.impressions, f"a{n}",
             {"event_id": f"i{n}", "auction_id": f"a{n}", "campaign_id": f"c{n % 5}", "ts": self.base_ts + n})
            for n in numbers
        ]  # fmt: skip

    def clicks(self, numbers: range, tag: str = "k") -> list[Row]:
        """Clicks within the join window of impression n; `tag` tells one round from another."""
        return [
            (self.settings.clicks, f"a{n}",
             {"event_id": f"{tag}{n}", "auction_id": f"a{n}", "ts": self.base_ts + n + 50})
            for n in numbers
        ]  # fmt: skip

    def send(self, rows: list[Row]) -> list[tuple[str, int, int]]:
        """Produce (keyed: Kafka's murmur2 partitioner, as the join expects); (topic, partition, offset)."""
        return asyncio.run(_send(self.broker.bootstrap, rows))

    def output(self, expected: set[str], timeout: float = 30, settle: float = 1.0) -> Counter[str]:
        """Join id -> times written to the output topic: read until `expected` is covered, and
        `settle` seconds more (so a wrong or repeated result written just after shows)."""
        covered_at: list[float] = []

        def done(records: list[dict[str, Any]]) -> bool:
            if not covered_at and expected <= {r["join_id"] for r in records}:
                covered_at.append(time.monotonic())
            return bool(covered_at) and time.monotonic() - covered_at[0] >= settle

        records = asyncio.run(_read(self.broker.bootstrap, self.settings.joins, done, timeout))
        return Counter(r["join_id"] for r in records)

    def process(self, rows: list[Row], expected: set[str], timeout: float = 30) -> None:
        """Send `rows`, see `expected` in the output and every input offset of `rows` committed
        (so their state and changelog records are written: a batch commits after both)."""
        ends: dict[TopicPartition, int] = {}
        for topic, partition, offset in self.send(rows):
            tp = TopicPartition(topic, partition)
            ends[tp] = max(ends.get(tp, 0), offset + 1)
        written = self.output(expected, timeout, settle=0)
        assert expected <= set(written), difference(expected, written)

        def committed() -> bool:
            found = self.committed()
            return all((found.get(tp) or 0) >= end for tp, end in ends.items())

        assert wait_for(committed, timeout, 0.2), (self.committed(), ends)

    def committed(self, group: str | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offsets of both inputs."""
        tps = [TopicPartition(t, p) for t in (self.settings.impressions, self.settings.clicks)
               for p in range(PARTITIONS)]  # fmt: skip
        return asyncio.run(_committed(self.broker.bootstrap, group or self.settings.app_id, tps))


def joined(numbers: range, tag: str = "k") -> set[str]:
    return {f"i{n}|{tag}{n}" for n in numbers}


def twice(written: Counter[str]) -> list[str]:
    """Results written more than once (at-least-once allows it; none is expected where every
    input offset was committed before the worker stopped)."""
    return sorted(j for j, n in written.items() if n > 1)


def difference(expected: set[str], written: Counter[str]) -> str:
    missing, extra = sorted(expected - set(written)), sorted(set(written) - expected)
    return f"{len(missing)} missing (e.g. {missing[:3]}), {len(extra)} not expected (e.g. {extra[:3]})"


def exactly_once(expected: set[str], written: Counter[str]) -> None:
    """Every expected result written, nothing else, nothing twice."""
    assert set(written) == expected, difference(expected, written)
    assert not twice(written), f"{len(twice(written))} written twice, e.g. {twice(written)[:3]}"


async def _send(bootstrap: str, rows: list[Row]) -> list[tuple[str, int, int]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(t, orjson.dumps(v), key=k.encode()) for t, k, v in rows]
        done = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [(m.topic, m.partition, m.offset) for m in done]


async def _committed(
    bootstrap: str, group: str, tps: list[TopicPartition]
) -> dict[TopicPartition, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()


@pytest.fixture
def setup(broker: EmbeddedBroker, unique: str, tmp_path: Path) -> Iterator[Setup]:
    settings = dataclasses.replace(
        from_env(), app_id=f"faults-{unique}", topic_prefix=f"f{unique}-", partitions=PARTITIONS
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    running = Setup(broker, settings, tmp_path)
    try:
        yield running
    finally:
        for worker in running.workers:
            worker.kill()


# -- waiting on a worker ---------------------------------------------------------------------


def ready(worker: WorkerProcess, timeout: float = 45) -> dict[str, Any]:
    """Wait until the worker owns both partitions, restored; its view of the join."""

    def restored() -> bool:
        worker.check()  # a worker that died fails here, with its log
        view = worker.join() or {}
        rebalance = view.get("last_rebalance") or {}
        return (
            view.get("actives") == list(range(PARTITIONS))
            and not view["restoring"]
            and (rebalance.get("seconds") is not None)
        )

    assert wait_for(restored, timeout, 0.2), f"{worker.name} not ready in {timeout} s:\n{tail(worker)}"
    view = worker.join()
    assert view is not None
    return view


def exited(worker: WorkerProcess, timeout: float = 45) -> int:
    """Wait for a worker that must stop by itself; its exit code."""
    assert worker.process is not None
    try:
        return worker.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{worker.name} kept running:\n{tail(worker)}")


def log_of(worker: WorkerProcess, since: int = 0) -> str:
    """The worker's log (a restarted worker appends to its name's log): from byte `since` on."""
    with worker.log_path.open("rb") as log:
        log.seek(since)
        return log.read().decode(errors="replace")


def log_size(worker: WorkerProcess) -> int:
    return worker.log_path.stat().st_size if worker.log_path.exists() else 0


def tail(worker: WorkerProcess, chars: int = 4000) -> str:
    return log_of(worker)[-chars:] if worker.log_path.exists() else "(no log)"


def changelog_ends(setup: Setup) -> dict[int, int]:
    return asyncio.run(high_watermarks(setup.broker.bootstrap, setup.settings.changelog, PARTITIONS, 15))


def snapshot(directory: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below `directory` (RocksDB's LOG excluded: the open
    of a store RocksDB reads writes its own info log, which is not state)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith("LOG")
    }


# -- 1. a corrupt store ---------------------------------------------------------------------------

ISSUE_IMPRESSIONS = 3000
ISSUE_NEW_PAIRS = 500
TABLE = "click-throughs"  # the reference app's Faust table, declared with the join (`tables=`)
FAUST_OFFSET_KEY = b"__faust\0offset__"  # where Faust keeps a table partition's persisted offset


def rocksdb_files(directory: Path) -> list[Path]:
    """Every RocksDB file below `directory` that a failing disk would leave cut: CURRENT, the
    MANIFEST and the table files, of the join's stores and of Faust's table stores alike."""
    return [
        path
        for path in sorted(directory.rglob("*"))
        if path.is_file()
        and (path.name == "CURRENT" or path.name.startswith("MANIFEST-") or path.suffix == ".sst")
    ]


def table_stores(worker: WorkerProcess) -> Path:
    """Where Faust keeps the worker's table stores (`<data dir>/v1/tables/<table>-<p>.db`)."""
    return worker.data_dir / "v1" / "tables"


def click_throughs_in_changelog(setup: Setup) -> dict[str, int]:
    """Campaign -> clicks joined, from the last value of each key in the table's changelog."""
    changelog = f"{setup.settings.app_id}-{TABLE}-changelog"
    last: dict[str, int] = {}
    for record in asyncio.run(read_records(setup.broker.bootstrap, changelog, PARTITIONS)):
        last[orjson.loads(record.key)] = orjson.loads(record.value)
    per_campaign: Counter[str] = Counter()
    for key, n in last.items():
        per_campaign[key.rsplit("@", 1)[0]] += n
    return dict(sorted(per_campaign.items()))


@pytest.mark.timeout(300)
def test_truncated_state_is_set_aside_and_restored_and_every_join_is_there(setup: Setup) -> None:
    """The issue's scenario: 3,000 impressions and their clicks joined, a clean stop, every RocksDB
    file under the worker's data dir cut to a third (the join's stores and the stores of the
    Faust table declared with it), a restart. Before Tandem guarded Faust's stores the worker
    crashed at each start on the table's store (`Corruption: CURRENT file does not end with
    newline` from faust/stores/rocksdb.py), and no new join arrived."""
    first = setup.worker().start()
    ready(first)
    old = range(ISSUE_IMPRESSIONS)
    setup.process(setup.impressions(old) + setup.clicks(old), joined(old))
    first.stop()
    assert first.process is not None and first.process.returncode == 0, tail(first)
    ends = changelog_ends(setup)

    state, tables = setup.state_dir(first), table_stores(first)
    cut = rocksdb_files(first.data_dir)
    for path in cut:
        os.truncate(path, path.stat().st_size // 3)
    names = [str(path.relative_to(first.data_dir)) for path in cut]
    assert any(n.startswith(f"tandem-joins/{JOIN_NAME}/") and n.endswith(".sst") for n in names), names
    for partition in range(PARTITIONS):  # the table's stores were on disk, and are cut too
        assert (tables / f"{TABLE}-{partition}.db" / "CURRENT") in cut, names

    since = log_size(first)
    again = setup.worker(port=first.port).start()
    view = ready(again, 90)
    rebalance = view["last_rebalance"]
    # Both partitions were damaged, reported no local offsets, and were restored from the whole changelog.
    assert rebalance["moved_cold"] == list(range(PARTITIONS)), rebalance
    assert rebalance["replayed_by_partition"] == {str(p): ends[p] for p in range(PARTITIONS)}, rebalance
    for partition in range(PARTITIONS):
        note = f"state of {JOIN_NAME}[{partition}] was damaged (rocksdb_corruption)"
        assert any(e.startswith(note) and DAMAGED_DIR in e for e in view["events"]), view["events"]
    log = log_of(again, since)
    for partition in range(PARTITIONS):
        assert log.count(f"state store {state / str(partition)} is damaged (rocksdb_corruption") == 1, tail(
            again
        )
    assert "moved it to" in log and "Traceback" not in log, tail(again)
    # The Faust table's stores: one line each, counted in the view and in /metrics.
    for partition in range(PARTITIONS):
        line = (
            f"Faust table {TABLE!r} store {tables / f'{TABLE}-{partition}.db'} is damaged (rocksdb_corruption"
        )
        assert log.count(line) == 1, tail(again)
    worker_view = again.view() or {}
    assert worker_view["damaged_faust_stores"] == {TABLE: {"rocksdb_corruption": PARTITIONS}}, worker_view
    metrics = again.html("/metrics")
    assert f'tandem_damaged_faust_stores_total{{reason="rocksdb_corruption",table="{TABLE}"' in metrics or (
        f'table="{TABLE}",reason="rocksdb_corruption"' in metrics
    ), [line for line in metrics.splitlines() if "damaged" in line]

    # The damaged files are kept for inspection, as they were left.
    kept = sorted((state / DAMAGED_DIR).iterdir())
    assert [k.name.split("-")[0] for k in kept] == [str(p) for p in range(PARTITIONS)], kept
    for k in kept:
        assert "rocksdb_corruption" in (k / "tandem-damage.txt").read_text()
        assert (k / "CURRENT").stat().st_size == 16 // 3
    kept_tables = sorted((tables / DAMAGED_DIR / TABLE).iterdir())
    assert [k.name.rsplit("-", 1)[0] for k in kept_tables] == [
        f"{TABLE}-{p}.db" for p in range(PARTITIONS)
    ], kept_tables
    for k in kept_tables:
        assert "rocksdb_corruption" in (k / "tandem-damage.txt").read_text()
        assert (k / "CURRENT").stat().st_size == 16 // 3

    # Every old impression is back in the join's state: a second click on each auction joins it.
    # And 500 new pairs join as before.
    new = range(ISSUE_IMPRESSIONS, ISSUE_IMPRESSIONS + ISSUE_NEW_PAIRS)
    setup.send(setup.clicks(old, tag="r") + setup.impressions(new) + setup.clicks(new))
    expected = joined(old) | joined(old, "r") | joined(new)
    # Exactly once here: the clean stop committed every input offset, the restart re-read nothing.
    exactly_once(expected, setup.output(expected))
    assert again.alive and (again.join() or {}).get("results") == len(expected) - len(old), again.join()

    # The table, rebuilt by Faust from its changelog, counts every join: what the worker serves
    # equals the sum of the changelog's last values, and both count all of them.
    def table_settled() -> bool:
        served = again.get("/ad/click-throughs")
        return served is not None and sum(served.values()) == len(expected)

    assert wait_for(table_settled, 30, 0.5), again.get("/ad/click-throughs")
    served = again.get("/ad/click-throughs")
    assert served == click_throughs_in_changelog(setup), served


def put_raw(store: Path, key: bytes, value: bytes) -> None:
    """Write one key into a closed store with plain rocksdict, as a bug or a tool would."""
    db = Rdict(str(store), Options(raw_mode=True))
    db.put(key, value)
    db.close()


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(max(path.stat().st_size, 64)))


def test_garbage_files_a_missing_current_and_unreadable_checkpoints(setup: Setup) -> None:
    """Partition 0's files overwritten with garbage, partition 1's CURRENT deleted; restarted.
    Then partition 0's checkpoint hint made garbage and partition 1's checkpoint value
    unreadable; restarted again. Each time: running, every join there."""
    worker = setup.worker().start()
    ready(worker)
    first = range(500)
    setup.process(setup.impressions(first) + setup.clicks(first), joined(first))
    worker.stop()
    state = setup.state_dir(worker)
    for path in (state / "0").iterdir():
        if path.name == "CURRENT" or path.name.startswith("MANIFEST-") or path.suffix == ".sst":
            garbage(path)
    (state / "1" / "CURRENT").unlink()

    worker = setup.worker(port=worker.port).start()
    view = ready(worker)
    found = {e.split(" was damaged (")[0]: e.split(" was damaged (")[1].split(")")[0] for e in view["events"]}
    assert found == {
        f"state of {JOIN_NAME}[0]": "rocksdb_corruption",
        f"state of {JOIN_NAME}[1]": "missing_current",
    }, view["events"]
    second = range(500, 700)
    expected = joined(first) | joined(first, "r") | joined(second)
    setup.process(setup.clicks(first, tag="r") + setup.impressions(second) + setup.clicks(second), expected)
    worker.stop()

    garbage(state / "0" / "tandem-checkpoint")  # what the assignor reads: unreadable now
    put_raw(state / "1", b"checkpoint", b"\x01\x02")  # RocksDB's own checkpoint: not an offset
    worker = setup.worker(port=worker.port).start()
    view = ready(worker)
    rebalance = view["last_rebalance"]
    # Partition 0's files are sound: restored from its RocksDB checkpoint, nothing set aside.
    assert rebalance["replayed_by_partition"]["0"] == 0, rebalance
    assert (
        [e for e in view["events"] if "damaged" in e]
        == [
            e for e in view["events"] if e.startswith(f"state of {JOIN_NAME}[1] was damaged (bad_checkpoint)")
        ]
        != []
    ), view["events"]
    assert "no local checkpoint reported (tandem-checkpoint is damaged)" in log_of(worker)
    setup.send(setup.clicks(first, tag="s") + setup.clicks(second, tag="s"))
    expected |= joined(first, "s") | joined(second, "s")
    written = setup.output(expected)
    exactly_once(expected, written)
    assert len(list((state / DAMAGED_DIR).iterdir())) == 3


# -- 2. a local checkpoint ahead of the changelog's end ------------------------------------------


def test_state_ahead_of_a_recreated_changelog_is_discarded_and_no_record_is_skipped(setup: Setup) -> None:
    """The join's changelog deleted and recreated while w1 was down, and written again by another
    worker (w2) before w1 came back: w1's files hold the old log's state, checkpoints past the new
    log's end. w1's stores are from before topic ids were recorded next to them (the files taken
    away): the offsets tell. w1 discards them and restores the new log from its start: every
    record in it is applied (none skipped), nothing of the old state is left (a replica restored
    elsewhere would not have it either)."""
    old, new = range(400), range(400, 500)
    w1 = setup.worker("w1").start()
    ready(w1)
    setup.process(setup.impressions(old) + setup.clicks(old), joined(old))
    w1.stop()
    checkpoints = local_checkpoints(w1.data_dir / "tandem-joins", JOIN_NAME)
    assert sorted(checkpoints) == list(range(PARTITIONS)), checkpoints
    for partition in range(PARTITIONS):  # as a store written before the ids were recorded
        (setup.state_dir(w1) / str(partition) / CHANGELOG_ID_FILE).unlink()
    asyncio.run(_delete_topic(setup.broker.bootstrap, setup.settings.changelog))

    w2 = setup.worker("w2").start()  # its own data dir; recreates the changelog
    ready(w2)
    setup.process(setup.impressions(new) + setup.clicks(new), joined(new))
    w2.stop()
    ends = changelog_ends(setup)
    assert all(ends[p] <= checkpoints[p] for p in range(PARTITIONS)), (ends, checkpoints)

    w1 = setup.worker("w1", port=w1.port).start()
    view = ready(w1)
    for partition in range(PARTITIONS):
        note = (f"changelog {setup.settings.changelog}[{partition}] ends at {ends[partition]:,}, before the "
                f"local state's checkpoint {checkpoints[partition]:,}")  # fmt: skip
        assert any(e.startswith(note) and "discarding the local state" in e for e in view["events"]), view
    replayed = view["last_rebalance"]["replayed_by_partition"]
    assert replayed == {str(p): ends[p] for p in range(PARTITIONS)}, view
    # A second click on every auction: the new log's impressions all join, the discarded ones do not.
    setup.send(setup.clicks(old, tag="r") + setup.clicks(new, tag="r"))
    expected = joined(old) | joined(new) | joined(new, "r")
    written = setup.output(expected)
    exactly_once(expected, written)
    assert (w1.join() or {}).get("results") == len(new), w1.join()


def faust_offsets(worker: WorkerProcess) -> dict[int, int]:
    """Partition -> the changelog offset Faust persisted in each of the worker's table stores."""
    found: dict[int, int] = {}
    for partition in range(PARTITIONS):
        path = table_stores(worker) / f"{TABLE}-{partition}.db"
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            raw = db.get(FAUST_OFFSET_KEY)
        finally:
            db.close()
        if raw is not None:
            found[partition] = int(raw)
    return found


@pytest.mark.timeout(300)
def test_a_recreated_changelog_grown_past_the_checkpoint_is_not_taken_for_the_old_one(setup: Setup) -> None:
    """Issue 30, 2: the join's changelog and the table's deleted and created again while w1 was
    down, then written by w2 *past* w1's checkpoints before w1 came back. The offsets look right;
    only the topic ids tell the new logs from the old (recorded next to the stores, compared at
    each restore and each open). Before they were, w1 resumed the new logs at its old
    checkpoints: it skipped their first records (w2's impressions there never joined again) and
    kept its old table counts. Now w1 discards its join state and sets its table stores aside,
    and both are rebuilt from the new logs."""
    old = range(400)
    w1 = setup.worker("w1").start()
    ready(w1)
    setup.process(setup.impressions(old) + setup.clicks(old), joined(old))
    w1.stop()
    checkpoints = local_checkpoints(w1.data_dir / "tandem-joins", JOIN_NAME)
    table_checkpoints = faust_offsets(w1)
    assert sorted(checkpoints) == sorted(table_checkpoints) == list(range(PARTITIONS)), checkpoints
    table_changelog = f"{setup.settings.app_id}-{TABLE}-changelog"
    for topic in (setup.settings.changelog, table_changelog):
        asyncio.run(_delete_topic(setup.broker.bootstrap, topic))

    w2 = setup.worker("w2").start()  # its own data dir; creates both changelogs again
    ready(w2)
    rounds = 0
    new = range(1000, 1000)
    while True:  # until both new logs reach past w1's checkpoints
        batch = range(1000 + 300 * rounds, 1000 + 300 * (rounds + 1))
        setup.process(setup.impressions(batch) + setup.clicks(batch), joined(batch))
        new = range(1000, batch.stop)
        rounds += 1
        ends = changelog_ends(setup)
        table_ends = asyncio.run(_high_watermarks(setup, table_changelog))
        past = all(ends[p] > checkpoints[p] + 1 and table_ends[p] > table_checkpoints[p] + 1 for p in ends)
        if past or rounds == 8:
            break
    assert past, (ends, checkpoints, table_ends, table_checkpoints)
    w2.stop()
    served_by_w2 = click_throughs_in_changelog(setup)

    since = log_size(w1)
    w1 = setup.worker("w1", port=w1.port).start()
    view = ready(w1, 90)
    for partition in range(PARTITIONS):
        note = f"changelog {setup.settings.changelog}[{partition}] is not the log the local state came from"
        assert any(e.startswith(note) and "discarding the local state" in e for e in view["events"]), view
    replayed = view["last_rebalance"]["replayed_by_partition"]
    assert replayed == {str(p): ends[p] for p in range(PARTITIONS)}, view
    log = log_of(w1, since)
    for partition in range(PARTITIONS):
        store = table_stores(w1) / f"{TABLE}-{partition}.db"
        line = f"Faust table {TABLE!r} store {store} is from another changelog"
        assert log.count(line) == 1, tail(w1)
    assert (w1.view() or {})["damaged_faust_stores"] == {TABLE: {"changelog_recreated": PARTITIONS}}

    # A second click on every auction: every impression of the new log joins (none skipped),
    # the discarded ones do not; the table counts what the new log counts, and the new clicks.
    setup.send(setup.clicks(old, tag="r") + setup.clicks(new, tag="r"))
    expected = joined(old) | joined(new) | joined(new, "r")
    written = setup.output(expected)
    exactly_once(expected, written)
    assert sum(served_by_w2.values()) == len(new)

    def table_settled() -> bool:
        served = w1.get("/ad/click-throughs")
        return served is not None and sum(served.values()) == 2 * len(new)

    assert wait_for(table_settled, 30, 0.5), (w1.get("/ad/click-throughs"), served_by_w2)
    assert w1.get("/ad/click-throughs") == click_throughs_in_changelog(setup)


async def _high_watermarks(setup: Setup, topic: str) -> dict[int, int]:
    return await high_watermarks(setup.broker.bootstrap, topic, PARTITIONS, 15)


async def _delete_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


# -- 3. a changelog whose beginning is gone -------------------------------------------------------

REAL_KAFKA = os.environ.get("TANDEM_TEST_KAFKA", "")  # host:port of a real Kafka, e.g. docker/compose.yaml
NO_LOG_START_HERE = (
    "moving a changelog's start needs retention or DeleteRecords: the embedded broker (tansu 0.6.0, memory "
    "storage) has no retention and does not implement DeleteRecords (its handler panics: 'not yet "
    "implemented'); set TANDEM_TEST_KAFKA=host:port to run this on a real Kafka"
)


@dataclasses.dataclass
class RealKafka:
    bootstrap: str


@pytest.fixture
def kafka_setup(unique: str, tmp_path: Path) -> Iterator[Setup]:
    if not REAL_KAFKA:
        pytest.skip(NO_LOG_START_HERE)
    settings = dataclasses.replace(
        from_env(), app_id=f"faults-{unique}", topic_prefix=f"f{unique}-", partitions=PARTITIONS
    )
    asyncio.run(create_topics(REAL_KAFKA, settings))
    running = Setup(RealKafka(REAL_KAFKA), settings, tmp_path)
    try:
        yield running
    finally:
        for worker in running.workers:
            worker.kill()


@pytest.mark.timeout(300)
def test_a_changelog_whose_start_moved_past_the_checkpoint_is_restored_from_its_start(
    kafka_setup: Setup,
) -> None:
    """quix-streams#1114. w1 holds the state of t1 and stops; w2 joins t2a, then t2b; the changelog's
    start is then moved past t2a (what retention does to old records): past w1's checkpoints. w1
    comes back: it keeps its files, restores from the changelog's first offset, says so, and is
    ready (not stuck retrying an offset that is gone). Joined again: every impression still held
    somewhere (t1 on w1's disk, t2b in the changelog); t2a's are gone with the records removed."""
    setup = kafka_setup
    group = {"session_timeout_ms": 6000, "heartbeat_ms": 1000}  # Kafka's shortest session is 6 s
    t1, t2a, t2b = range(200), range(200, 300), range(300, 400)
    w1 = setup.worker("w1", **group).start()
    ready(w1, 90)
    setup.process(setup.impressions(t1) + setup.clicks(t1), joined(t1), 60)
    w1.stop()
    checkpoints = local_checkpoints(w1.data_dir / "tandem-joins", JOIN_NAME)
    w2 = setup.worker("w2", **group).start()
    ready(w2, 90)
    setup.process(setup.impressions(t2a) + setup.clicks(t2a), joined(t2a), 60)
    start = changelog_ends(setup)
    setup.process(setup.impressions(t2b) + setup.clicks(t2b), joined(t2b), 60)
    w2.stop()
    assert all(start[p] > checkpoints[p] + 1 for p in range(PARTITIONS)), (start, checkpoints)
    asyncio.run(_delete_records(setup.broker.bootstrap, setup.settings.changelog, start))

    w1 = setup.worker("w1", port=w1.port, **group).start()
    view = ready(w1, 90)
    for p in range(PARTITIONS):
        note = (f"changelog {setup.settings.changelog}[{p}] now starts at {start[p]:,}, after the local "
                f"state's checkpoint {checkpoints[p]:,}")  # fmt: skip
        assert any(e.startswith(note) and f"restoring from {start[p]:,}" in e for e in view["events"]), view
    setup.send(setup.clicks(t1, tag="r") + setup.clicks(t2a, tag="r") + setup.clicks(t2b, tag="r"))
    expected = joined(t1) | joined(t2a) | joined(t2b) | joined(t1, "r") | joined(t2b, "r")
    written = setup.output(expected, 60, settle=3)
    exactly_once(expected, written)


async def _delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, p): RecordsToDelete(o) for p, o in before.items()})
    finally:
        await admin.close()


# -- 4. two workers on one data dir ----------------------------------------------------------------


@dataclasses.dataclass
class SharingWorker(WorkerProcess):
    """A worker of its own name (log, port) on another worker's data dir."""

    shares: Path | None = None

    @property
    def data_dir(self) -> Path:
        return self.shares or super().data_dir


def test_a_second_worker_on_the_same_data_dir_refuses_and_the_first_runs_on(setup: Setup) -> None:
    first = setup.worker("w1").start()
    view = ready(first)
    before = (view["rebalances"], (first.view() or {}).get("epoch"))
    second = setup.worker("w2", kind=SharingWorker, shares=first.data_dir).start()
    assert exited(second) != 0
    joins_dir = first.data_dir / "tandem-joins"
    assert first.process is not None
    message = f"data dir {joins_dir} is in use by process {first.process.pid} (lock {joins_dir / LOCK_FILE})"
    log = log_of(second)
    assert message in log and "one worker per data dir" in log, tail(second)
    assert "rocksdict" not in log and "IO error" not in log, tail(second)  # no traceback from RocksDB
    # The first never noticed: no rebalance, and it joins as before.
    numbers = range(300)
    setup.send(setup.impressions(numbers) + setup.clicks(numbers))
    written = setup.output(joined(numbers))
    exactly_once(joined(numbers), written)
    view = first.join() or {}
    assert (view.get("rebalances"), (first.view() or {}).get("epoch")) == before and not view["events"], view
    assert first.alive


# -- 5. a data dir reused under another app id -----------------------------------------------------


def test_a_data_dir_of_another_app_id_is_refused_naming_both_and_left_untouched(setup: Setup) -> None:
    """Issue 30, 3: a redeploy under a new app id kept the old volume (the same data dir). Faust's
    table store there holds offsets of the old app's changelog; before the check the worker
    crashed at every start on Faust's ConsistencyError (an orchestrator would crash-loop it).
    Now it refuses at once, before it joins its group, in one line naming the dir and both app
    ids, and touches nothing; given a data dir of its own, the new app runs."""
    first = setup.worker("w1").start()
    ready(first)
    numbers = range(300)
    setup.process(setup.impressions(numbers) + setup.clicks(numbers), joined(numbers))
    first.stop()
    before = snapshot(first.data_dir)

    other_app = f"{setup.settings.app_id}-v2"
    since = log_size(first)
    again = setup.worker("w1", app_id=other_app, port=first.port).start()
    assert exited(again) == 1, tail(again)
    log = log_of(again, since)
    refused = (
        f"tandem cannot start: data dir {first.data_dir.absolute()} holds the state of app id "
        f"{setup.settings.app_id!r}, and this worker's app id is {other_app!r}"
    )
    assert log.count(refused) == 1, tail(again)
    assert "Traceback" not in log and "ConsistencyError" not in log, tail(again)
    assert "assigned actives" not in log, tail(again)  # refused before it joined the group
    lock = f"tandem-joins/{LOCK_FILE}"  # the lock file holds the pid of the last process to lock
    assert {k: v for k, v in snapshot(first.data_dir).items() if k != lock} == {
        k: v for k, v in before.items() if k != lock
    }  # nothing moved, opened or rebuilt

    fresh = setup.worker("w2", app_id=other_app).start()  # its own data dir: it runs
    ready(fresh)
    more = range(300, 400)
    setup.send(setup.impressions(more) + setup.clicks(more))
    assert joined(more) <= set(setup.output(joined(more)))


# -- 6. a store of a newer state format -------------------------------------------------------------


def test_a_store_of_a_newer_format_is_refused_and_left_untouched(setup: Setup) -> None:
    """A rollback: partition 0's store written by the next state format (its key in RocksDB and
    the format file next to it, as tables/state/store.py requires of a version that bumps the format).
    The worker stops before it joins its group, naming the store; not a file of it changes."""
    worker = setup.worker()
    state = setup.state_dir(worker)
    for partition in range(PARTITIONS):  # state as this version writes it
        store = PartitionStore(state / str(partition))
        store.write({b"k%d" % n: b"v" * 100 for n in range(1000)}, 999)
        store.close()
    newer = FORMAT_VERSION + 1
    put_raw(state / "0", FORMAT_KEY, newer.to_bytes(8, "big"))
    (state / "0" / FORMAT_FILE).write_text(f"tandem-state-format {newer}\n")
    before = snapshot(state)

    worker.start()
    assert exited(worker) != 0
    log = log_of(worker)
    expected = f"state store {state / '0'} has state format {newer}, this code knows up to {FORMAT_VERSION}"
    assert f"tandem cannot start: {expected}" in log and "Traceback" not in log, tail(worker)
    assert "assigned actives" not in log, tail(worker)  # refused before it joined the group
    assert snapshot(state) == before  # every file as it was: nothing moved, opened or rebuilt
    assert not (state / DAMAGED_DIR).exists()


# -- 7. a data dir the worker's user cannot read --------------------------------------------------


@dataclasses.dataclass
class NobodyWorker(WorkerProcess):
    """The worker run as `nobody`: root ignores file modes."""

    def start(self) -> NobodyWorker:
        self.stopped = False
        log = self.log_path.open("ab")
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        self.process = subprocess.Popen(
            [*as_nobody, sys.executable, "-m", "faust", "-A", self.app_module, "worker", "-l", "info"],
            cwd=self.cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env()},
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        return self


@pytest.fixture
def public_setup(broker: EmbeddedBroker, unique: str) -> Iterator[Setup]:
    """A set-up whose run dir `nobody` can reach (pytest's tmp_path is under a 0700 directory)."""
    skip_unless_nobody_can_run_tandem()
    run_dir = Path(tempfile.mkdtemp(prefix="tandem-app-faults-", dir="/tmp"))
    run_dir.chmod(0o755)
    settings = dataclasses.replace(
        from_env(), app_id=f"faults-{unique}", topic_prefix=f"f{unique}-", partitions=PARTITIONS
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    running = Setup(broker, settings, run_dir)
    try:
        yield running
    finally:
        for worker in running.workers:
            worker.kill()
        shutil.rmtree(run_dir, ignore_errors=True)


def chown_tree(top: Path, uid: int) -> None:
    os.chown(top, uid, uid)
    for path in top.rglob("*"):
        os.chown(path, uid, uid, follow_symlinks=False)


def test_a_state_directory_the_worker_cannot_read_stops_it_with_the_path(public_setup: Setup) -> None:
    """The worker run as nobody on a data dir that is its own but for one partition's store,
    copied in as root (0700). It stops before it joins its group, naming that directory; once
    the directory is handed over it starts, and joins."""
    setup = public_setup
    worker = setup.worker("w1", kind=NobodyWorker)
    locked_out = setup.state_dir(worker) / "1"
    PartitionStore(locked_out).close()
    chown_tree(worker.data_dir, NOBODY)
    os.chown(locked_out, 0, 0)
    locked_out.chmod(0o700)

    worker.start()
    assert exited(worker) != 0
    log = log_of(worker)
    joins_dir = worker.data_dir / "tandem-joins"
    refused = f"data dir {joins_dir}: {locked_out} is not readable and writable by this user"
    assert refused in log, tail(worker)
    assert f"tandem cannot start: {refused}" in log, tail(worker)
    assert "rocksdict" not in log and "IO error" not in log, tail(worker)
    assert "assigned actives" not in log, tail(worker)  # refused before it joined the group

    chown_tree(locked_out, NOBODY)  # the operator fixes it
    worker = setup.worker("w1", kind=NobodyWorker, port=worker.port).start()
    ready(worker)
    numbers = range(200)
    setup.process(setup.impressions(numbers) + setup.clicks(numbers), joined(numbers))
    assert (worker.join() or {}).get("results") == len(numbers)


# -- 5. the disk full while the worker writes state ------------------------------------------------


def test_a_full_disk_stops_the_worker_without_acking_and_a_restart_loses_nothing(setup: Setup) -> None:
    """The join state on a real 16 MB tmpfs (the worker's other files on the usual disk), filled
    up while the worker runs; then impressions come in. Their state cannot be written: the
    worker must stop without committing their input offsets, and after the space is freed a
    restart must find every one of them (their clicks, sent only then, all join)."""
    worker = setup.worker()
    joins_dir = worker.data_dir / "tandem-joins"
    joins_dir.mkdir(parents=True)
    with tmpfs(joins_dir, "16m"):
        try:
            worker.start()
            ready(worker)
            before, during = range(300), range(300, 600)
            sent = setup.send(setup.impressions(before) + setup.clicks(before))
            assert joined(before) <= set(setup.output(joined(before)))
            impressions = setup.settings.impressions
            ends = {TopicPartition(t, p): o + 1 for t, p, o in sorted(sent) if t == impressions}
            filler = fill_disk(joins_dir)
            since = log_size(worker)
            setup.send(setup.impressions(during))
            assert exited(worker, 30) != 0
            log = log_of(worker, since)
            stopped = f"tandem: join '{JOIN_NAME}' stops the worker: state store {joins_dir / JOIN_NAME}"
            assert stopped in log, tail(worker)
            assert "write failed (ENOSPC" in log and "nothing of this write was kept" in log, tail(worker)
            # Nothing acked: no impression that came after the disk filled up is committed.
            committed = setup.committed()
            assert all((committed[tp] or 0) <= end for tp, end in ends.items()), (committed, ends)
            filler.unlink()  # space returns

            worker = setup.worker(port=worker.port).start()
            view = ready(worker)
            setup.send(setup.clicks(during) + setup.clicks(before, tag="r"))
            expected = joined(before) | joined(during) | joined(before, "r")
            written = setup.output(expected)
            exactly_once(expected, written)
            assert not view["events"], view  # nothing was damaged: the state is sound
        finally:
            worker.kill()


def test_a_restore_onto_a_full_disk_waits_for_space_and_loses_nothing(setup: Setup) -> None:
    """The worker's state restored onto a new 16 MB tmpfs that has a few hundred KB left: enough
    to start and open the stores, not to write what the changelog holds. The restore fails and
    is retried, the store reopened at its checkpoint each time (it takes no writes after a failed
    one); the partitions are not processed meanwhile. Once space is freed the restore completes
    and every impression is there."""
    worker = setup.worker()
    joins_dir = worker.data_dir / "tandem-joins"
    joins_dir.mkdir(parents=True)
    with tmpfs(joins_dir, "16m"):
        try:
            worker.start()
            ready(worker)
            old = range(3000)
            setup.process(setup.impressions(old) + setup.clicks(old), joined(old))
            worker.stop()
            shutil.rmtree(joins_dir / JOIN_NAME)  # a new disk: the state comes from the changelog
            filler = fill_disk(joins_dir)
            os.truncate(filler, filler.stat().st_size - 256 * 1024)

            since = log_size(worker)
            worker = setup.worker(port=worker.port).start()

            def retried() -> bool:
                worker.check()
                view = worker.join() or {}
                reopened = any("(ENOSPC): reopened" in e for e in view.get("events", []))
                return bool(view.get("restoring")) and reopened

            assert wait_for(retried, 30, 0.2), tail(worker)
            log = log_of(worker, since)
            assert "restore of [0, 1] failed; retrying" in log, tail(worker)
            assert "No space left on device" in log, tail(worker)
            filler.unlink()  # space returns
            ready(worker, 30)
            setup.send(setup.clicks(old, tag="r"))
            expected = joined(old) | joined(old, "r")
            written = setup.output(expected)
            exactly_once(expected, written)
        finally:
            worker.kill()
