"""Faust's table stores, guarded as they open (tables/state/faust_stores.py): on real RocksDB files
written and opened by Faust's own open (`faust.stores.rocksdb.RocksDBOptions.open`), what is
damaged or from another changelog is set aside (bounded, with a note) and an empty store opened;
what is sound, locked or read-only is left as it is. The worker-level test is the issue's
scenario in tests/test_app_state_faults.py."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faust.stores.rocksdb import RocksDBOptions
from faust.stores.rocksdb import Store as FaustRocksDBStore

from tables.kafka.table_stores import TableStore
from tables.state.faust_stores import FaustStoreGuard
from tables.state.store import CHANGELOG_ID_FILE, DAMAGED_DIR, read_changelog_id

TABLE = "click-throughs"
CHANGELOG = "app-click-throughs-changelog"
OFFSET_KEY = FaustRocksDBStore.offset_key


def table_store(tabledir: Path, partition: int = 0, read_only: bool = False) -> TableStore:
    return TableStore(
        table=TABLE,
        changelog=CHANGELOG,
        partition=partition,
        path=tabledir / f"{TABLE}-{partition}.db",
        tabledir=tabledir,
        read_only=read_only,
        offset_key=OFFSET_KEY,
    )


def faust_open(store: TableStore) -> Callable[[], Any]:
    """Faust's own open of a table store (rocksdict, Faust's options)."""
    return lambda: RocksDBOptions(max_open_files=64, block_cache_size=1 << 20).open(store.path)


def written(store: TableStore, records: int = 2000, offset: int = 41) -> None:
    """A store as Faust leaves it: records, its persisted offset, closed and flushed."""
    db = faust_open(store)()
    for n in range(records):
        db.put(b"campaign-%05d" % n, b"%d" % n)
    db.put(OFFSET_KEY, b"%d" % offset)
    db.flush()
    db.close()


def truncate_all(path: Path) -> None:
    for file in path.iterdir():
        if file.name == "CURRENT" or file.name.startswith("MANIFEST-") or file.suffix == ".sst":
            os.truncate(file, file.stat().st_size // 3)


DAMAGES: list[tuple[str, Callable[[Path], object], str]] = [
    ("every file cut to a third", truncate_all, "rocksdb_corruption"),
    ("garbage CURRENT", lambda d: (d / "CURRENT").write_bytes(os.urandom(40)), "rocksdb_corruption"),
    ("CURRENT deleted", lambda d: (d / "CURRENT").unlink(), "missing_current"),
    ("sst files cut", lambda d: [os.truncate(f, 100) for f in d.glob("*.sst")], "rocksdb_corruption"),
    ("persisted offset not a number", lambda d: _put(d, OFFSET_KEY, b"\xff\x00"), "bad_checkpoint"),
]


def _put(path: Path, key: bytes, value: bytes) -> None:
    db = RocksDBOptions().open(path)
    db.put(key, value)
    db.close()


@pytest.mark.parametrize(("damage", "reason"), [(d[1], d[2]) for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_a_damaged_table_store_is_set_aside_and_an_empty_one_opened(
    tmp_path: Path, damage: Callable[[Path], object], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = table_store(tmp_path)
    written(store)
    damage(store.path)
    before = sorted(p.name for p in store.path.iterdir())
    guard = FaustStoreGuard()
    with caplog.at_level(logging.WARNING, logger="tables.state.faust_stores"):
        db = guard.open(store, faust_open(store))
    try:
        assert db.get(OFFSET_KEY) is None  # no persisted offset: Faust restores from the start
        assert db.get(b"campaign-00001") is None
    finally:
        db.close()
    (kept,) = (tmp_path / DAMAGED_DIR / TABLE).iterdir()
    assert kept.name.startswith(f"{TABLE}-0.db-")
    if reason != "bad_checkpoint":  # a store that failed to open is kept as it was left
        assert set(before) <= {p.name for p in kept.iterdir()}, before
    assert reason in (kept / "tandem-damage.txt").read_text()
    assert guard.damage_counts() == {TABLE: {reason: 1}}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"tandem: Faust table {TABLE!r} store {store.path} is damaged ({reason}: ")
    assert f"moved it to {kept}: Faust restores partition 0 from {CHANGELOG}" in lines[0]
    assert guard.events == [lines[0].removeprefix("tandem: ")]


def test_a_sound_store_is_opened_as_it_is_and_its_changelog_recorded(tmp_path: Path) -> None:
    store = table_store(tmp_path)
    written(store)
    guard = FaustStoreGuard()
    db = guard.open(store, faust_open(store))
    try:
        assert db.get(OFFSET_KEY) == b"41" and db.get(b"campaign-00007") == b"7"
    finally:
        db.close()
    assert not (tmp_path / DAMAGED_DIR).exists() and guard.damage_counts() == {}
    # The changelog's id was not known at the open: recorded as soon as it is.
    assert not (store.path / CHANGELOG_ID_FILE).exists() and guard.waiting_for_ids()
    guard.record_ids({CHANGELOG: "aa" * 16})
    assert read_changelog_id(store.path, CHANGELOG) == "aa" * 16 and not guard.waiting_for_ids()
    db = guard.open(store, faust_open(store))  # the same changelog: untouched
    db.close()
    assert guard.damage_counts() == {}


def test_a_store_of_a_changelog_created_again_is_set_aside(tmp_path: Path) -> None:
    """The table's changelog was deleted and created again (a new topic id): the store's records
    and persisted offset belong to the old log, however the offsets compare."""
    store = table_store(tmp_path)
    written(store)
    guard = FaustStoreGuard()
    guard.record_ids({CHANGELOG: "aa" * 16})
    guard.open(store, faust_open(store)).close()
    assert read_changelog_id(store.path, CHANGELOG) == "aa" * 16

    again = FaustStoreGuard()  # the next start: the topic has a new id
    again.record_ids({CHANGELOG: "bb" * 16})
    db = again.open(store, faust_open(store))
    try:
        assert db.get(OFFSET_KEY) is None and db.get(b"campaign-00007") is None
    finally:
        db.close()
    assert again.damage_counts() == {TABLE: {"changelog_recreated": 1}}
    assert "is from another changelog (changelog_recreated: its records came from" in again.events[0]
    assert read_changelog_id(store.path, CHANGELOG) == "bb" * 16  # the empty store is the new log's


def test_a_locked_store_is_refused_and_nothing_is_moved(tmp_path: Path) -> None:
    """Held open (its LOCK): Faust retries that; moving the files would destroy a live store."""
    store = table_store(tmp_path)
    written(store)
    holder = faust_open(store)()
    try:
        with pytest.raises(Exception, match="lock") as refused:
            FaustStoreGuard().open(store, faust_open(store))
        assert "lock" in repr(refused.value).lower()  # what Faust's retry looks for
    finally:
        holder.close()
    assert not (tmp_path / DAMAGED_DIR).exists()


def test_a_read_only_store_is_never_moved(tmp_path: Path) -> None:
    store = table_store(tmp_path, read_only=True)
    written(store)
    truncate_all(store.path)
    with pytest.raises(Exception, match="Corruption"):
        FaustStoreGuard().open(store, faust_open(store))
    assert not (tmp_path / DAMAGED_DIR).exists()


def test_at_most_three_damaged_copies_are_kept_per_table(tmp_path: Path) -> None:
    guard = FaustStoreGuard()
    for partition in (0, 1, 0, 1, 0):
        store = table_store(tmp_path, partition)
        written(store)
        truncate_all(store.path)
        guard.open(store, faust_open(store)).close()
    kept = sorted((tmp_path / DAMAGED_DIR / TABLE).iterdir())
    assert len(kept) == 3, kept
    assert guard.damage_counts() == {TABLE: {"rocksdb_corruption": 5}}
