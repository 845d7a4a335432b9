"""Faust's own table stores (every RocksDB-backed `app.Table`, those a join declares with
`tables=` among them), kept alive as Tandem's join stores are (tables/state/store.py).

Their files are a cache of the table's changelog too, so a store that cannot be trusted is
set aside and Faust rebuilds it, instead of crashing the worker at every start:

    guard = FaustStoreGuard()
    guard_table_stores(guard.open)     # tables/kafka/table_stores.py: Faust's opens
    guard.record_ids({changelog: topic id})   # what each changelog is (tables/kafka/topics.py)

At each open of a table partition's store, `FaustStoreGuard.open`:

- a store whose files are damaged (RocksDB reports corruption or cannot open them, CURRENT is
  missing beside other RocksDB files, the persisted offset is not a number) is moved to
  `<tabledir>/.damaged/<table>/<table>-<partition>.db-<UTC time>/` with a note
  (`tandem-damage.txt`; the newest `KEEP_DAMAGED` per table are kept), logged in one WARNING
  line, counted (`counts`, the view, `/metrics`), and an empty store opened in its place:
  with no persisted offset, Faust restores the partition from the start of its changelog;
- a store that holds another changelog's records (the topic was deleted and created again:
  its id differs from the one recorded next to the files) is set aside the same way;
- a store Faust cannot open for a reason outside its files (its lock held, permissions, a
  full or read-only disk) is left as it is: Faust retries a held lock, and the rest stops the
  worker with RocksDB's own message;
- a read-only store (shared with another app) is never touched.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from tables.kafka.table_stores import OpenDatabase, TableStore
from tables.state.store import (
    DAMAGED_DIR,
    KEEP_DAMAGED,
    StoreCorruptError,
    classify_open_error,
    inspect_before_open,
    move_aside,
    one_line,
    read_changelog_id,
    write_changelog_id,
)

log = logging.getLogger(__name__)

EVENTS_KEPT = 20


class FaustStoreGuard:
    """Checks each Faust table store as Faust opens it; sets aside what cannot be trusted."""

    def __init__(self, keep: int = KEEP_DAMAGED) -> None:
        self.keep = keep
        self.changelog_ids: dict[str, str] = {}  # changelog topic -> its id, when the broker has one
        self.counts: dict[str, Counter[str]] = {}  # table -> reason -> stores set aside
        self.events: list[str] = []  # the last EVENTS_KEPT stores set aside, for the view
        self._unrecorded: dict[Path, str] = {}  # stores opened before their changelog's id was known

    # -- Faust's open, guarded ---------------------------------------------------------------

    def open(self, store: TableStore, open_database: OpenDatabase) -> Any:
        """Open the store as Faust would; set it aside first if it cannot be trusted."""
        if store.read_only:
            return open_database()
        problem = self._before_open(store)
        if problem is None:
            try:
                database = open_database()
            except Exception as error:
                found = classify_open_error(store.path, error)
                if not isinstance(found, StoreCorruptError):
                    raise  # the machine, not the files (Faust retries a held lock), or a bug
                problem = found
            else:
                problem = _after_open(store, database)
                if problem is None:
                    self._record_id(store)
                    return database
                _close(database, store.path)
        self._set_aside(store, problem)
        database = open_database()
        self._record_id(store)
        return database

    def _before_open(self, store: TableStore) -> StoreCorruptError | None:
        try:
            inspect_before_open(store.path)
        except StoreCorruptError as damage:
            return damage
        recorded = read_changelog_id(store.path, store.changelog)
        current = self.changelog_ids.get(store.changelog)
        if recorded is not None and current is not None and recorded != current:
            detail = (
                f"its records came from {store.changelog} with topic id {recorded}, the topic now has "
                f"id {current}: it was deleted and created again"
            )
            return StoreCorruptError(store.path, "changelog_recreated", detail)
        return None

    def _set_aside(self, store: TableStore, problem: StoreCorruptError) -> None:
        into = store.tabledir / DAMAGED_DIR / store.table
        moved_to = move_aside(store.path, problem.reason, problem.detail, self.keep, into=into)
        self.counts.setdefault(store.table, Counter())[problem.reason] += 1
        what = "is from another changelog" if problem.reason == "changelog_recreated" else "is damaged"
        detail = one_line(problem.detail)
        message = (
            f"Faust table {store.table!r} store {store.path} {what} ({problem.reason}: {detail}); "
            f"moved it to {moved_to}: Faust restores partition {store.partition} from {store.changelog}"
        )
        log.warning("tandem: %s", message)
        self.events = [*self.events[-(EVENTS_KEPT - 1) :], message]

    # -- which changelog each store came from ------------------------------------------------

    def record_ids(self, ids: dict[str, str]) -> None:
        """The changelogs' topic ids (tables/kafka/topics.py `topic_ids`): checked at each open
        from now on, and recorded next to the stores opened before they were known."""
        self.changelog_ids.update(ids)
        for path, changelog in list(self._unrecorded.items()):
            topic_id = self.changelog_ids.get(changelog)
            if topic_id is not None:
                del self._unrecorded[path]
                if path.is_dir() and read_changelog_id(path, changelog) is None:
                    write_changelog_id(path, changelog, topic_id)

    def waiting_for_ids(self) -> bool:
        """Stores are open whose changelog's id is not known yet."""
        return bool(self._unrecorded)

    def _record_id(self, store: TableStore) -> None:
        topic_id = self.changelog_ids.get(store.changelog)
        if topic_id is None:
            self._unrecorded[store.path] = store.changelog
        elif read_changelog_id(store.path, store.changelog) != topic_id:
            write_changelog_id(store.path, store.changelog, topic_id)

    def damage_counts(self) -> dict[str, dict[str, int]]:
        """Table -> reason -> stores set aside by this process."""
        return {table: dict(reasons) for table, reasons in sorted(self.counts.items())}


def _after_open(store: TableStore, database: Any) -> StoreCorruptError | None:
    """Damage that opens: a persisted offset that is not a number (Faust would crash on it)."""
    try:
        raw = database.get(store.offset_key)
    except Exception as error:
        found = classify_open_error(store.path, error)
        if isinstance(found, StoreCorruptError):
            return found
        raise
    if raw is None:
        return None
    try:
        int(raw)
    except (TypeError, ValueError):
        return StoreCorruptError(store.path, "bad_checkpoint", f"persisted offset {bytes(raw)[:16]!r}")
    return None


def _close(database: Any, path: Path) -> None:
    try:
        database.close()
    except Exception as error:  # it is set aside next: only a note
        log.debug("Faust table store %s: close failed (%r)", path, error)
