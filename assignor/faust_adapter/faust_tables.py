"""What this worker's Faust tables hold, read from Faust's table recovery and stores: the
changelog offsets the assignor reports for warm-ups (KIP-441) and a standby's lag. And the
one hook into the opening of Faust's RocksDB table stores (`guard_table_stores`), through
which Tandem sets a damaged store aside (tables/state/faust_stores.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP, AppT

from assignor.faust_adapter import internals


def faust_table_offsets(app: AppT) -> dict[str, dict[int, int]]:
    """Changelog topic -> partition -> offset held by this worker's Faust tables (not global
    ones): what standbys and warm-ups have read (Faust's recovery), and what the open RocksDB
    stores of actives persisted. A partition read to the end of an empty changelog counts as
    offset 0 (warm-ups need an offset to be caught up); Faust's -1 (nothing read yet) is no
    offset at all. Called from the consumer's thread: copies before it reads."""
    found: dict[str, dict[int, int]] = {}
    recovery = getattr(app.tables, "_recovery", None)  # None before the worker started
    if recovery is None:
        return found
    for offsets in (dict(recovery.active_offsets), dict(recovery.standby_offsets)):
        for tp, offset in offsets.items():
            table = recovery.tp_to_table.get(tp)
            if table is None or getattr(table, "is_global", False):
                continue
            if offset is not None and offset < 0:
                offset = None  # Faust's "nothing read": not an offset to report
            if offset is None and faust_standby_lag(app, tp) == 0:
                offset = 0
            if offset is not None:
                found.setdefault(tp.topic, {})[tp.partition] = int(offset)
    for table in list(app.tables.values()):
        if getattr(table, "is_global", False):
            continue
        topic = table.changelog_topic.get_topic_name()
        for partition in list(getattr(table.data, "_dbs", {})):  # open RocksDB stores only
            persisted = table.persisted_offset(TP(topic, partition))
            if persisted is not None and persisted >= 0:
                mine = found.setdefault(topic, {})
                mine[partition] = max(int(persisted), mine.get(partition, -1))
    return found


def faust_standby_lag(app: AppT, tp: TP) -> int | None:
    """Records a Faust table's standby (or warm-up) changelog partition is behind its end,
    from the consumer's high watermark (None: not known yet)."""
    try:
        end = app.consumer.highwater(tp)
    except Exception:  # not assigned on the consumer (yet)
        return None
    if end is None:
        return None
    recovery = getattr(app.tables, "_recovery", None)
    offset = recovery.standby_offsets.get(tp) if recovery is not None else None
    return max(0, int(end) - 1 - (-1 if offset is None else int(offset)))


internals.require(__name__, TableManager, "_recovery")
internals.require(__name__, Recovery, "active_offsets", "standby_offsets", "tp_to_table", instance=True)
internals.require(__name__, RocksDBStore, "_dbs", instance=True)


# -- the opening of a Faust table store ------------------------------------------------------


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
