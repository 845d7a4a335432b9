"""Global-table join: each stream record joined with the **current** value of a table every
worker holds whole (Kafka Streams' KStream-GlobalKTable join). The rules are
docs/join-semantics.md, "Global tables".

Pure operator, no I/O. The stream side is "left"; the table is not an input of the operator
at all: the runtime keeps it up to date in its own store (tables/runtime/global_table.py)
and the operator reads it through `TableLookup.get`. The lookup key is computed from the
stream record's value (`key_of`: its bytes in, the table's serialized key out, or None when
the record has no key to look up). A result is emitted at once, never held: nothing is
pending, so the operator's state holds nothing but what the runtime keeps with it (the
inputs' positions).

    join = GlobalLookup(table, key_of, how="left")
    matches = join.process_many(events)   # (side "left", key, ts, record id, value) each
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tables.operators import keys
from tables.operators.base import Event, Match, Side
from tables.operators.kv import KV

HOWS = ("inner", "left")
COUNTERS = ("no_lookup_key",)


class TableLookup(Protocol):
    """The table every worker holds whole: its current value of a serialized key."""

    def get(self, key: bytes) -> bytes | None: ...


# The stream value's bytes -> the serialized key to look up (None: nothing to look up).
LookupKey = Callable[[bytes], bytes | None]


class GlobalLookup:
    """The global-table join of one stream partition (an `Operator`)."""

    def __init__(self, table: TableLookup, key_of: LookupKey, how: str = "inner") -> None:
        if how not in HOWS:
            raise ValueError(f"how must be one of {HOWS}, not {how!r}")
        self.table = table
        self.key_of = key_of
        self.how = how
        self._left = how == "left"
        self.stream_time: int | None = None
        # Records whose value gave no key to look up (None): unmatched, emitted by a left join.
        self.no_lookup_key = 0

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        """Each stream record joined at once with the table's value of its lookup key, as the
        table is now: the match, or with `how="left"` the record alone."""
        results: list[Match] = []
        get, key_of, left = self.table.get, self.key_of, self._left
        for side, key, ts, _record_id, value in events:
            if side != "left" or value is None:
                raise ValueError(f"a global-table join takes stream records only, not {side!r} {value!r}")
            if self.stream_time is None or ts > self.stream_time:
                self.stream_time = ts
            lookup = key_of(value)
            if lookup is None:
                self.no_lookup_key += 1
                found = None
            else:
                found = get(lookup)
            if found is not None or left:
                results.append(Match(key, value, found, ts))
        return results

    def advance(self, stream_time: int) -> list[Match]:
        """Nothing is ever pending: stream time moves, nothing falls due."""
        if self.stream_time is None or stream_time > self.stream_time:
            self.stream_time = stream_time
        return []

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        return []

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Nothing of the operator's own is kept (the runtime's positions are not its keys)."""

    def finish_restore(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        """Stream records whose value gave no lookup key (since this worker took the partition)."""
        return {"no_lookup_key": self.no_lookup_key}

    @property
    def live_records(self) -> None:
        """None: nothing is held in memory (the table is in its own RocksDB store)."""
        return None

    def index_memory(self) -> None:
        return None


class _NotStarted:
    """The table of a join whose worker has not restored it yet: a lookup then is a bug."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def get(self, key: bytes) -> bytes | None:
        raise RuntimeError(f"the global table {self.topic!r} is not restored yet: no lookup before it is")


@dataclass(eq=False)
class GlobalKind:
    """A global-table join (docs/join-semantics.md, "Global tables"), as the runtime makes and
    shows it. `table` and `decode` are bound when the join is declared and its worker starts:
    the table store (tables/runtime/global_table.py, or the test driver's), and how the stream
    value's bytes become the app's value (the stream's codec)."""

    how: str
    table_topic: str
    lookup: Callable[[Any], bytes | None]  # the app's stream value -> serialized lookup key
    key_field: str | None = None  # the stream value's field holding the key (or a function's)
    name: str = "global"
    table_side: Side = "right"  # the table: its null values are deletes
    unscanned: tuple[bytes, ...] = field(default=(keys.META,))
    is_global: bool = True
    table: TableLookup | None = None
    decode: Callable[[bytes], Any] | None = None

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise ValueError(f"how must be one of {HOWS}, not {self.how!r}")

    def key_of(self, raw: bytes) -> bytes | None:
        """The lookup key of a stream value's bytes. A value the stream's check accepted had its
        key computed then (a key function that raised sent it to the dead letters): raising now
        is the key function changing its mind, and the record is taken as having no key."""
        decode = self.decode
        assert decode is not None, "the stream's decoder is bound at declaration"
        try:
            return self.lookup(decode(raw))
        except Exception:
            return None

    def operator(self, state: KV, ids: bool) -> GlobalLookup:
        return GlobalLookup(self.table or _NotStarted(self.table_topic), self.key_of, self.how)

    def emits_unmatched(self) -> bool:
        return self.how == "left"

    def retention_ms(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "how": self.how, "table": self.table_topic}
