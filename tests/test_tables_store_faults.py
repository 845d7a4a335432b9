"""Local state faults at the store level (issue 17), on real RocksDB files and real processes.

Every damaged store here is made the way a failing disk or a half-copied volume leaves one:
files truncated, overwritten with garbage or deleted, then opened by the real code. The
disk-full and read-only cases mount a real small tmpfs where the machine allows it (root with
CAP_SYS_ADMIN) and skip with the reason otherwise; `test_write_past_file_size_limit_*` injects
the same kind of OS error without privileges (RLIMIT_FSIZE in a child process, so the
kernel refuses the write with EFBIG). Permission cases run a child as `nobody` (setpriv),
because root ignores file modes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from tables.state import store as store_module
from tables.state.datadir import (
    APP_FILE,
    LOCK_FILE,
    DataDirError,
    DataDirLocked,
    DataDirOfAnotherApp,
    check_data_dir,
    claim_data_dir,
    lock_data_dir,
)
from tables.state.store import (
    CHECKPOINT_KEY,
    DAMAGED_DIR,
    FORMAT_FILE,
    FORMAT_KEY,
    FORMAT_VERSION,
    HINT_FILE,
    PartitionStore,
    StateFormatError,
    StoreCorruptError,
    StoreOpenError,
    StoreWriteError,
    damage_counts,
    encode_checkpoint,
    local_checkpoints,
    open_store,
    rebuild_store,
    safe_checkpoint,
)
from tests.nobody import skip_unless_nobody_can_run_tandem

ROOT = Path(__file__).resolve().parents[1]
BATCHES = 3
NOBODY = 65534  # uid and gid of nobody/nogroup
PER_BATCH = 1000


# -- helpers -------------------------------------------------------------------------


def record(batch: int, n: int) -> tuple[bytes, bytes]:
    return b"r%d-%04d" % (batch, n), b"v%d-%d" % (batch, n) * 4


def fill_store(path: Path, batches: int = BATCHES, close_between: bool = True) -> int:
    """A store of `batches` x 1000 records with checkpoint `batches - 1`; closed between
    batches (a close flushes) so it has several table files, like a worker's after restarts."""
    store = PartitionStore(path)
    for batch in range(batches):
        store.write(dict(record(batch, n) for n in range(PER_BATCH)), batch)
        if close_between:
            store.close()
            store = PartitionStore(path)
    store.close()
    return batches - 1


def records_in(store: PartitionStore) -> int:
    return sum(1 for _ in store.scan(b"r", b"s"))


def child(code: str, user: int | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run Python code in a child process with this worktree's packages (as `user` if given)."""
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    return subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def truncate(path: Path, fraction: float = 1 / 3) -> None:
    os.truncate(path, int(path.stat().st_size * fraction))


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(max(path.stat().st_size, 64)))


def only(directory: Path, pattern: str) -> list[Path]:
    found = sorted(directory.glob(pattern))
    assert found, f"no {pattern} in {directory}"
    return found


def legacy_store(path: Path) -> None:
    """What the pre-versioning PartitionStore wrote: data and a checkpoint, no format key."""
    db = Rdict(str(path), Options(raw_mode=True))
    db.put(b"r0-0000", b"v")
    db.put(CHECKPOINT_KEY, encode_checkpoint(7))
    db.close()


def put_raw(path: Path, key: bytes, value: bytes) -> None:
    db = Rdict(str(path), Options(raw_mode=True))
    db.put(key, value)
    db.close()


def truncated_manifest_of_one_session(path: Path) -> None:
    """A store written in one session, its memtable flushed after each batch (what a full
    memtable does), closed, then its MANIFEST cut to a third: RocksDB opens it empty."""
    shutil.rmtree(path)
    store = PartitionStore(path)
    for batch in range(BATCHES):
        store.write(dict(record(batch, n) for n in range(PER_BATCH)), batch)
        store._db.flush()
    store.close()
    [truncate(f) for f in only(path, "MANIFEST-*")]


def stale_files_under_newer_hint(path: Path) -> None:
    """A volume snapshot of the files rolled back under a hint written after it."""
    snapshot = path.parent / "snapshot"
    shutil.copytree(path, snapshot)
    store = PartitionStore(path)
    store.write({b"r9-0000": b"v"}, 99)
    store.close()
    hint = (path / HINT_FILE).read_bytes()
    shutil.rmtree(path)
    snapshot.rename(path)
    (path / HINT_FILE).write_bytes(hint)


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A real small tmpfs at `mount_point`, unmounted after; skips where mounts are forbidden."""
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_disk(directory: Path) -> Path:
    """Fill the file system of `directory` to the last byte. Unbuffered: a buffered file kept
    what did not fit and raised ENOSPC again from close()."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out, contextlib.suppress(OSError):
        for _ in range(100_000):  # bounded: a tmpfs here is a few MB
            out.write(b"\0" * 65536)
    return filler


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A temporary directory `nobody` can reach (pytest's own is under a 0700 directory)."""
    skip_unless_nobody_can_run_tandem()
    path = Path(tempfile.mkdtemp(prefix="tandem-faults-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def damage_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tables.state.store" and r.levelno == logging.WARNING and "is damaged" in r.getMessage()
    ]


# -- 1. damaged stores are moved aside and replaced by an empty one ---------------------

DAMAGES: list[tuple[str, Callable[[Path], object], str]] = [
    (
        "truncate every file to a third",
        lambda d: [truncate(f) for f in d.iterdir() if f.name != "LOCK"],
        "rocksdb_corruption",
    ),
    ("truncate CURRENT", lambda d: truncate(d / "CURRENT"), "rocksdb_corruption"),
    ("garbage CURRENT", lambda d: garbage(d / "CURRENT"), "rocksdb_corruption"),
    (
        "CURRENT names a missing MANIFEST",
        lambda d: (d / "CURRENT").write_text("MANIFEST-999999\n"),
        "rocksdb_open_failed",
    ),
    ("CURRENT deleted", lambda d: (d / "CURRENT").unlink(), "missing_current"),
    (
        "CURRENT is a directory",
        lambda d: ((d / "CURRENT").unlink(), (d / "CURRENT").mkdir()),
        "rocksdb_open_failed",
    ),
    ("truncate MANIFEST", lambda d: [truncate(f) for f in only(d, "MANIFEST-*")], "rocksdb_corruption"),
    ("truncate MANIFEST of one session", truncated_manifest_of_one_session, "lost_data"),
    ("garbage MANIFEST", lambda d: [garbage(f) for f in only(d, "MANIFEST-*")], "rocksdb_corruption"),
    ("MANIFEST deleted", lambda d: [f.unlink() for f in only(d, "MANIFEST-*")], "rocksdb_open_failed"),
    ("truncate sst files", lambda d: [truncate(f) for f in only(d, "*.sst")], "rocksdb_corruption"),
    ("garbage sst files", lambda d: [garbage(f) for f in only(d, "*.sst")], "rocksdb_corruption"),
    ("one sst file deleted", lambda d: only(d, "*.sst")[0].unlink(), "rocksdb_corruption"),
    ("a file where the directory was", lambda d: (shutil.rmtree(d), d.write_bytes(b"x")), "not_a_directory"),
    ("unreadable checkpoint value", lambda d: put_raw(d, CHECKPOINT_KEY, b"\x01\x02"), "bad_checkpoint"),
    ("unreadable format value", lambda d: put_raw(d, FORMAT_KEY, b"\x01"), "bad_format"),
    ("format version zero", lambda d: put_raw(d, FORMAT_KEY, bytes(8)), "bad_format"),
    ("written before format versions", lambda d: (shutil.rmtree(d), legacy_store(d)), "unversioned"),
    ("files rolled back under a newer hint", stale_files_under_newer_hint, "checkpoint_behind_hint"),
]


@pytest.mark.parametrize(("damage", "reason"), [c[1:] for c in DAMAGES], ids=[c[0] for c in DAMAGES])
def test_damaged_store_is_moved_aside_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object], reason: str
) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path)
    damage(path)
    before = damage_counts().get(reason, 0)

    with caplog.at_level(logging.WARNING, logger="tables.state.store"):
        store = open_store(path)

    assert store.damage is not None and store.damage.reason == reason, store.damage
    assert store.checkpoint is None and records_in(store) == 0  # empty: restore from offset 0
    moved = store.damage.moved_to
    assert moved.parent == tmp_path / "joins" / DAMAGED_DIR and moved.name.startswith("0-")
    assert moved.exists()
    if moved.is_dir():
        assert reason in (moved / "tandem-damage.txt").read_text()
    assert damage_counts()[reason] == before + 1
    [warning] = damage_warnings(caplog)
    assert str(path) in warning and str(moved) in warning and reason in warning
    # The new store is a working one: written, reopened, no second complaint.
    store.write({b"r0-0000": b"v"}, 41)
    store.close()
    reopened = open_store(path)
    assert reopened.damage is None and reopened.checkpoint == 41 and safe_checkpoint(path) == 41
    reopened.close()


def test_the_constructor_refuses_a_damaged_store_and_moves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path)
    truncate(path / "CURRENT")

    def data_files() -> dict[str, bytes]:  # RocksDB's own info LOG is rolled at every open
        return {f.name: f.read_bytes() for f in path.iterdir() if not f.name.startswith("LOG")}

    before = data_files()
    with pytest.raises(StoreCorruptError) as raised:
        PartitionStore(path)
    assert raised.value.reason == "rocksdb_corruption" and str(path) in str(raised.value)
    assert "CURRENT file does not end with newline" in raised.value.detail
    assert data_files() == before
    assert not (tmp_path / "joins" / DAMAGED_DIR).exists()


def test_at_most_three_damaged_copies_are_kept_per_table(tmp_path: Path) -> None:
    table = tmp_path / "joins"
    moved: list[Path] = []
    for partition in range(5):
        path = table / str(partition % 2)
        fill_store(path, batches=1)
        truncate(path / "CURRENT")
        store = open_store(path)
        assert store.damage is not None
        moved.append(store.damage.moved_to)
        store.close()
        shutil.rmtree(path)
    kept = sorted(p.name for p in (table / DAMAGED_DIR).iterdir())
    assert kept == sorted(p.name for p in moved[-3:])  # the newest three, of either partition


def test_closing_twice_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store whose write failed is closed before it is reopened, and again by whoever held it."""
    store = PartitionStore(tmp_path / "joins" / "0")
    assert store.failed is None
    store.close()
    with caplog.at_level(logging.WARNING):
        store.close()
    assert not caplog.records


def test_a_healthy_store_reopens_untouched_after_its_process_was_killed(tmp_path: Path) -> None:
    """No false alarm: state still in RocksDB's log (the process died without a close)."""
    path = tmp_path / "joins" / "0"
    done = child(f"""
        import os
        from tables.state.store import PartitionStore
        store = PartitionStore({str(path)!r})
        for batch in range(5):
            store.write({{b"r%d-%04d" % (batch, n): b"v" for n in range(1000)}}, batch)
        os.kill(os.getpid(), 9)
    """)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert safe_checkpoint(path) == 4
    store = open_store(path)
    assert store.damage is None and store.checkpoint == 4 and records_in(store) == 5000
    store.close()


def test_moving_the_checkpoint_back_is_not_mistaken_for_damage(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    store = PartitionStore(path)
    store.write({b"r0-0000": b"v"}, 100)
    store.write({b"r0-0001": b"v"}, 3)  # a changelog that was recreated: offsets start again
    assert safe_checkpoint(path) == 3
    store.close()
    reopened = open_store(path)
    assert reopened.damage is None and reopened.checkpoint == 3
    reopened.close()


def test_a_corrupt_block_found_while_reading_is_a_store_corrupt_error(tmp_path: Path) -> None:
    """Garbage inside a table file passes the open (RocksDB checks blocks when read)."""
    path = tmp_path / "joins" / "0"
    fill_store(path)
    for table_file in only(path, "*.sst"):
        data = bytearray(table_file.read_bytes())
        data[len(data) // 3 : len(data) // 3 + 200] = os.urandom(200)
        table_file.write_bytes(bytes(data))
    store = open_store(path)
    assert store.damage is None
    with pytest.raises(StoreCorruptError) as raised:
        for batch in range(BATCHES):
            for n in range(PER_BATCH):
                store.get(record(batch, n)[0])
    assert raised.value.reason == "corruption_while_open" and "checksum mismatch" in raised.value.detail
    with pytest.raises(StoreCorruptError) as in_scan:
        records_in(store)
    before = damage_counts().get("corruption_while_open", 0)
    # The error's traceback holds the scan's frame: its iterator must not keep RocksDB open.
    fresh = rebuild_store(store, in_scan.value)
    assert fresh.damage is not None and fresh.damage.moved_to.is_dir()
    assert fresh.checkpoint is None and records_in(fresh) == 0
    assert damage_counts()["corruption_while_open"] == before + 1
    fresh.close()


# -- 2. the format version -----------------------------------------------------------


def test_a_new_store_gets_the_format_version(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    PartitionStore(path).close()
    db = Rdict(str(path), Options(raw_mode=True))
    assert db.get(FORMAT_KEY) == (2).to_bytes(8, "big") == FORMAT_VERSION.to_bytes(8, "big")
    db.close()


def test_a_newer_format_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path)
    put_raw(path, FORMAT_KEY, (3).to_bytes(8, "big"))
    before = damage_counts()
    for opener in (PartitionStore, open_store):
        with pytest.raises(StateFormatError) as raised:
            opener(path)
        assert (raised.value.found, raised.value.known) == (3, 2)
        assert str(path) in str(raised.value) and "format 3" in str(raised.value)
    assert not (tmp_path / "joins" / DAMAGED_DIR).exists() and damage_counts() == before
    db = Rdict(str(path), Options(raw_mode=True))  # every record still there
    assert sum(1 for _ in db.keys(from_key=b"r")) >= BATCHES * PER_BATCH
    db.close()


def files_of(path: Path) -> dict[str, bytes]:
    """Every file of a store but RocksDB's info LOG (which any open, even read-only, writes)."""
    files = sorted(path.iterdir())
    return {p.name: p.read_bytes() for p in files if p.is_file() and not p.name.startswith("LOG")}


def test_a_store_records_its_format_next_to_its_files(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path, batches=1)
    assert (path / FORMAT_FILE).read_text() == f"tandem-state-format {FORMAT_VERSION}\n"
    (path / FORMAT_FILE).write_bytes(b"\x00garbage")  # unreadable: the key in RocksDB decides
    PartitionStore(path).close()
    assert (path / FORMAT_FILE).read_text() == f"tandem-state-format {FORMAT_VERSION}\n"


def test_a_newer_format_file_is_refused_before_rocksdb_opens_anything(tmp_path: Path) -> None:
    """What a rollback finds: the next version wrote its format file. Nothing is opened for
    writing (an open rewrites CURRENT, the MANIFEST and OPTIONS), at start or at assignment."""
    data = tmp_path / "data"
    path = data / "joins" / "0"
    fill_store(path)
    (path / FORMAT_FILE).write_text(f"tandem-state-format {FORMAT_VERSION + 1}\n")
    (data / "joins" / DAMAGED_DIR / "1-old").mkdir(parents=True)  # set aside: not checked
    (data / "joins" / DAMAGED_DIR / "1-old" / FORMAT_FILE).write_text("tandem-state-format 99\n")
    before = files_of(path)
    for refuse in (PartitionStore, open_store, lambda p: check_data_dir(p.parent.parent)):
        with pytest.raises(StateFormatError) as raised:
            refuse(path)
        assert raised.value.path == path
        assert (raised.value.found, raised.value.known) == (FORMAT_VERSION + 1, FORMAT_VERSION)
    assert files_of(path) == before and not (data / "joins" / DAMAGED_DIR / "0").exists()


def test_an_older_format_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the next layout change does to stores of this one (no migration written)."""
    path = tmp_path / "joins" / "0"
    fill_store(path)
    monkeypatch.setattr(store_module, "FORMAT_VERSION", FORMAT_VERSION + 1)
    store = open_store(path)
    assert store.damage is not None and store.damage.reason == "old_format"
    store.close()


def test_a_format_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    """Format 1 also stored the join's time and id indexes (`x`, `i`): opening it deletes
    them, keeps everything else and the checkpoint, and moves nothing aside."""
    path = tmp_path / "joins" / "0"
    store = PartitionStore(path)
    kept = {b"rLkey": b"\x00v", b"m:late": b"\x80" + bytes(7), b"j": b"", b"y": b"after"}
    store.write({**kept, b"x\x80abc": b"", b"xz": b"", b"iLkey": b""}, 41)
    store.write({FORMAT_KEY: store_module._FORMAT.pack(1)}, None)
    store.close()
    migrated = open_store(path)
    try:
        assert migrated.damage is None and migrated.checkpoint == 41
        stored = dict(migrated.scan(b"", b"\xff"))
        assert {k: v for k, v in stored.items() if k not in (FORMAT_KEY, CHECKPOINT_KEY)} == kept
        assert stored[FORMAT_KEY] == store_module._FORMAT.pack(FORMAT_VERSION)
    finally:
        migrated.close()
    assert not (path.parent / DAMAGED_DIR).exists()


# -- 3. the assignor's checkpoint read -------------------------------------------------


def test_safe_checkpoint_reads_a_store_open_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from tables.state.store import PartitionStore
            store = PartitionStore({str(path)!r})
            store.write({{b"r0-0000": b"v"}}, 12)
            print("written", flush=True)
            sys.stdin.read()
        """),
        ],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "written\n"
        assert safe_checkpoint(path) == 12
    finally:
        holder.kill()
        holder.wait(timeout=10)


SAFE_CASES: list[tuple[str, Callable[[Path], object]]] = [
    ("every file truncated to a third", lambda d: [truncate(f) for f in d.iterdir() if f.name != "LOCK"]),
    ("truncate CURRENT", lambda d: truncate(d / "CURRENT")),
    ("CURRENT deleted", lambda d: (d / "CURRENT").unlink()),
    ("MANIFEST deleted", lambda d: [f.unlink() for f in only(d, "MANIFEST-*")]),
    ("garbage hint", lambda d: garbage(d / HINT_FILE)),
    ("truncated hint", lambda d: truncate(d / HINT_FILE, 0.5)),
    ("a file where the directory was", lambda d: (shutil.rmtree(d), d.write_bytes(b"x"))),
    ("a directory where the hint was", lambda d: ((d / HINT_FILE).unlink(), (d / HINT_FILE).mkdir())),
]


@pytest.mark.parametrize("damage", [d for _, d in SAFE_CASES], ids=[n for n, _ in SAFE_CASES])
def test_safe_checkpoint_is_none_for_an_unreadable_store_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object]
) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path)
    assert safe_checkpoint(path) == BATCHES - 1
    damage(path)
    with caplog.at_level(logging.WARNING, logger="tables.state.store"):
        assert safe_checkpoint(path) is None
        assert safe_checkpoint(path) is None
    messages = [r.getMessage() for r in caplog.records if r.name == "tables.state.store"]
    assert len(messages) == 1 and str(path) in messages[0]


def test_safe_checkpoint_of_nothing_is_none_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tables.state.store"):
        assert safe_checkpoint(tmp_path / "joins" / "0") is None
        store = PartitionStore(tmp_path / "joins" / "1")  # open, nothing written yet
        assert safe_checkpoint(tmp_path / "joins" / "1") is None
        store.close()
    assert not caplog.records


def test_safe_checkpoint_of_a_store_this_user_cannot_read(public_tmp: Path) -> None:
    path = public_tmp / "joins" / "0"
    fill_store(path)
    path.chmod(0o700)
    done = child(
        f"""
        from tables.state.store import safe_checkpoint
        print(safe_checkpoint({str(path)!r}))
    """,
        user=NOBODY,
    )
    assert done.returncode == 0 and done.stdout == "None\n", done.stderr
    assert "Permission denied" in done.stderr  # the one log line


def test_local_checkpoints_skip_damaged_partitions(tmp_path: Path) -> None:
    for partition in range(3):
        fill_store(tmp_path / "joins" / str(partition))
    truncate(tmp_path / "joins" / "1" / "CURRENT")
    assert local_checkpoints(tmp_path, "joins") == {0: BATCHES - 1, 2: BATCHES - 1}
    assert local_checkpoints(tmp_path / "missing", "joins") == {}


# -- 4. one process per data dir -------------------------------------------------------


def test_a_second_process_cannot_take_the_data_dir(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from tables.state.datadir import lock_data_dir
            lock = lock_data_dir({str(tmp_path)!r})
            print("locked", flush=True)
            sys.stdin.read()
        """),
        ],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(DataDirLocked) as raised:
            lock_data_dir(tmp_path)
        assert raised.value.holder_pid == holder.pid
        assert str(tmp_path) in str(raised.value) and f"process {holder.pid}" in str(raised.value)
    finally:
        holder.kill()  # however it dies, the kernel drops its lock
        holder.wait(timeout=10)
    with lock_data_dir(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(DataDirLocked):  # a second lock in the same process is refused too
            lock_data_dir(tmp_path)
    lock_data_dir(tmp_path).release()


def test_a_store_open_in_another_process_is_refused_not_moved(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    fill_store(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from tables.state.store import PartitionStore
            store = PartitionStore({str(path)!r})
            print("open", flush=True)
            sys.stdin.read()
        """),
        ],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(StoreOpenError) as raised:
            open_store(path)
        assert str(path) in str(raised.value) and "LOCK" in str(raised.value)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert not (tmp_path / "joins" / DAMAGED_DIR).exists()
    store = open_store(path)
    assert store.damage is None and store.checkpoint == BATCHES - 1
    with pytest.raises(StoreOpenError):  # the same store twice in one process
        open_store(path)
    store.close()


# -- 5. an unusable data dir at start --------------------------------------------------


def test_check_data_dir_creates_a_missing_one(tmp_path: Path) -> None:
    assert check_data_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())


def test_a_data_dir_is_claimed_by_its_app_and_refused_to_another(tmp_path: Path) -> None:
    """The first start records the app id; the same app passes again; another app id is refused
    naming the dir and both ids, and nothing in the dir changes."""
    data_dir = tmp_path / "data"
    claim_data_dir(data_dir, "ads-v1")
    assert (data_dir / APP_FILE).read_text() == "ads-v1\n"
    claim_data_dir(data_dir, "ads-v1")
    (data_dir / "state").write_bytes(b"x")
    before = sorted((p.name, p.read_bytes()) for p in data_dir.iterdir())
    with pytest.raises(DataDirOfAnotherApp) as refused:
        claim_data_dir(data_dir, "ads-v2")
    assert str(refused.value).startswith(
        f"data dir {data_dir} holds the state of app id 'ads-v1', and this worker's app id is 'ads-v2'"
    )
    assert (refused.value.owner, refused.value.app_id, refused.value.path) == ("ads-v1", "ads-v2", data_dir)
    assert sorted((p.name, p.read_bytes()) for p in data_dir.iterdir()) == before
    # A data dir from before the record is taken as the first app's to start on it.
    older = tmp_path / "older"
    older.mkdir()
    claim_data_dir(older, "ads-v2")
    assert (older / APP_FILE).read_text() == "ads-v2\n"


def test_a_file_where_the_data_dir_should_be(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    with pytest.raises(DataDirError) as raised:
        check_data_dir(tmp_path / "data")
    assert str(tmp_path / "data") in str(raised.value) and "is a file" in str(raised.value)
    with pytest.raises(DataDirError) as below_a_file:
        check_data_dir(tmp_path / "data" / "worker-1")
    assert "Not a directory" in str(below_a_file.value) and "ENOTDIR" in str(below_a_file.value)


def test_a_data_dir_this_user_cannot_write(public_tmp: Path) -> None:
    """Run as nobody: a root-owned data dir (0755) can be listed but not written."""
    data = public_tmp / "data"
    data.mkdir()
    done = child(
        f"""
        from tables.state.datadir import DataDirError, check_data_dir
        try:
            check_data_dir({str(data)!r})
        except DataDirError as error:
            print(error)
    """,
        user=NOBODY,
    )
    assert done.returncode == 0, done.stderr
    assert str(data) in done.stdout and "Permission denied" in done.stdout and "EACCES" in done.stdout


def test_a_partition_directory_this_user_cannot_write(public_tmp: Path) -> None:
    """The data dir belongs to the worker's user, a partition's directory does not (a copy made as root)."""
    data = public_tmp / "data"
    fill_store(data / "joins" / "3", batches=1)
    os.chown(data, NOBODY, NOBODY)
    os.chown(data / "joins", NOBODY, NOBODY)
    done = child(
        f"""
        from tables.state.datadir import DataDirError, check_data_dir
        try:
            check_data_dir({str(data)!r})
        except DataDirError as error:
            print(error)
    """,
        user=NOBODY,
    )
    assert done.returncode == 0, done.stderr
    assert str(data / "joins" / "3") in done.stdout and "not readable and writable" in done.stdout


def test_a_read_only_data_dir(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as data:
        with pytest.raises(DataDirError) as raised:
            check_data_dir(data)
        assert str(data) in str(raised.value) and "EROFS" in str(raised.value)
        with pytest.raises(StoreOpenError) as store_error:
            open_store(data / "joins" / "0")
        assert "Read-only file system" in str(store_error.value)


# -- 6. a full disk while writing ------------------------------------------------------


def test_disk_full_write_fails_clearly_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "8m") as disk:
        path = disk / "joins" / "0"
        store = open_store(path)
        for batch in range(3):
            store.write(dict(record(batch, n) for n in range(200)), batch)  # acknowledged
        filler = fill_disk(disk)

        with pytest.raises(StoreWriteError) as raised:
            store.write({b"big-%d" % n: os.urandom(1000) for n in range(2000)}, 3)
        assert raised.value.errno == errno.ENOSPC and raised.value.path == path
        assert str(path) in str(raised.value) and "ENOSPC" in str(raised.value)
        assert store.checkpoint == 2 and safe_checkpoint(path) == 2  # the hint never leads
        assert store.get(b"big-0") is None and store.get(record(2, 199)[0]) == record(2, 199)[1]
        with pytest.raises(StoreWriteError):  # refuses more writes until reopened
            store.write({b"small": b"x"}, 4)
        assert store.failed is raised.value  # what a restore checks before it retries
        store.close()  # never raises, even though it cannot flush

        with pytest.raises(StoreOpenError) as full:  # still full: refused, not moved aside
            open_store(path)
        assert "No space left on device" in str(full.value)
        assert not (disk / "joins" / DAMAGED_DIR).exists()

        filler.unlink()  # space returns
        reopened = open_store(path)
        assert reopened.damage is None and reopened.checkpoint == 2
        assert records_in(reopened) == 600 and reopened.get(b"big-0") is None
        reopened.write({b"after": b"x"}, 3)
        reopened.close()


def test_write_past_file_size_limit_fails_clearly_and_loses_nothing(tmp_path: Path) -> None:
    """Needs no mount: the kernel refuses the write (EFBIG) because the child process lowered
    its own RLIMIT_FSIZE, an OS error injected at the storage boundary, not in our code."""
    path = tmp_path / "joins" / "0"
    done = child(f"""
        import os, resource, signal
        from tables.state.store import PartitionStore, StoreWriteError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = PartitionStore({str(path)!r})
        for batch in range(3):
            store.write({{b"r%d-%04d" % (batch, n): b"v" * 50 for n in range(200)}}, batch)
        log_size = max(f.stat().st_size for f in store.path.glob("*.log"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (log_size + 4096, resource.RLIM_INFINITY))
        try:
            store.write({{b"big-%d" % n: os.urandom(1000) for n in range(2000)}}, 3)
        except StoreWriteError as error:
            print("errno", error.errno, "checkpoint", store.checkpoint)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        store.close()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"errno {errno.EFBIG} checkpoint 2\n"
    store = open_store(path)
    assert store.damage is None and store.checkpoint == 2 and records_in(store) == 600
    assert store.get(b"big-0") is None
    store.close()


# -- known limit ---------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="RocksDB takes a truncated MANIFEST for an older version of the database and replays its log "
    "on top; see docs/tables.md, 'Local faults'",
)
def test_a_truncated_manifest_after_a_kill_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "joins" / "0"
    done = child(f"""
        import os
        from tables.state.store import PartitionStore
        store = PartitionStore({str(path)!r})
        for batch in range(3):
            store.write({{b"r%d-%04d" % (batch, n): b"v" for n in range(1000)}}, batch)
            store._db.flush()  # what a full memtable does: one table file per batch
        store.write({{b"r9-%04d" % n: b"v" for n in range(1000)}}, 9)
        os.kill(os.getpid(), 9)
    """)
    assert done.returncode == -signal.SIGKILL, done.stderr
    truncate(only(path, "MANIFEST-*")[0], 0.6)
    store = open_store(path)
    assert store.damage is not None or records_in(store) == 4000
