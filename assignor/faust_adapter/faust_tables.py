"""What this worker's Faust tables hold, read from Faust's table recovery and stores: the
changelog offsets the assignor reports for warm-ups (KIP-441) and a standby's lag (the join
runtime's probes ask it too). The hook into the opening of their stores is the join
runtime's (tables/kafka/table_stores.py)."""

from __future__ import annotations

from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP, AppT

from assignor import internals


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


internals.require(__name__, FaustConsumer, "highwater")
internals.require(__name__, TableManager, "_recovery")
internals.require(__name__, Recovery, "active_offsets", "standby_offsets", "tp_to_table", instance=True)
internals.require(__name__, RocksDBStore, "_dbs", instance=True)
