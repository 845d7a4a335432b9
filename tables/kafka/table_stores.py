"""The one hook into the opening of Faust's RocksDB table stores (`guard_table_stores`),
through which the join runtime sets a damaged store aside (the policy:
tables/state/faust_stores.py). The patch is the least Faust offers: the one method every open
goes through, declared to `internals.require` below and checked at start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faust.stores.rocksdb import Store as RocksDBStore

from assignor import internals


@dataclass(frozen=True)
class TableStore:
    """One partition of a Faust table's RocksDB store, as Faust is about to open it."""

    table: str  # the table's name
    changelog: str  # its changelog topic
    partition: int
    path: Path  # the store's directory (`<tabledir>/<table>-<partition>.db`)
    tabledir: Path  # where Faust keeps every table store of the app
    read_only: bool  # opened read-only (a store shared with another app): never to be moved
    offset_key: bytes  # the key of the changelog offset Faust persisted in it


OpenDatabase = Callable[[], Any]
OpenGuard = Callable[[TableStore, OpenDatabase], Any]
_guard: dict[str, OpenGuard] = {}
_faust_open = RocksDBStore._open_for_partition


def guard_table_stores(guard: OpenGuard | None) -> None:
    """Route every open of a Faust RocksDB table store's partition (faust/stores/rocksdb.py
    `Store._open_for_partition`: at an assignment, at a standby's first changelog records, at
    Faust's reads of persisted offsets) through `guard(store, open)`, which calls `open()` (Faust's
    own open, as many times as it needs) and returns the database. One guard per process; None
    removes it. The patch is the least Faust offers: the one method every open goes through."""
    if guard is None:
        _guard.pop("guard", None)
        return
    _guard["guard"] = guard
    RocksDBStore._open_for_partition = _guarded_open  # type: ignore[method-assign, assignment]


def _guarded_open(store: RocksDBStore, partition: int) -> Any:
    guard = _guard.get("guard")
    if guard is None:
        return _faust_open(store, partition)
    table = store.table
    about = TableStore(
        table=str(table.name),
        changelog=str(table.changelog_topic.get_topic_name()),
        partition=partition,
        path=Path(store.partition_path(partition)),
        tabledir=Path(store.path),
        read_only=bool(store.read_only),
        offset_key=bytes(store.offset_key),
    )
    return guard(about, lambda: _faust_open(store, partition))


internals.require(__name__, RocksDBStore, "_open_for_partition")
