"""The windowed join as declared (`tables.join`): its window, its type, and which operator
keeps its index of live records where (`TANDEM_WINDOW_INDEX`): by default `BudgetedJoin`,
in memory within the worker's budget and in the state beyond it (budgeted_window.py), or, as
an override, always `WindowedJoin` in memory (tables/operators/windowed.py) or always
`StoredIndexJoin` in the state (stored_window.py). Its own module because the stored one
builds on the in-memory one: the kind chooses between them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tables.operators import keys
from tables.operators.base import Operator
from tables.operators.budgeted_window import BudgetedJoin, IndexBudget
from tables.operators.kv import KV
from tables.operators.stored_window import StoredIndexJoin
from tables.operators.windowed import DAY_MS, JoinType, JoinWindow, WindowedJoin

WINDOW_INDEXES = ("budget", "memory", "rocksdb")
WINDOW_INDEX_ENV = "TANDEM_WINDOW_INDEX"


def window_index_from_env() -> str:
    """Where the windowed join keeps its index of live records: TANDEM_WINDOW_INDEX, `budget`
    (the default: in memory within TANDEM_WINDOW_INDEX_BUDGET_MB, in the state beyond it),
    `memory` (always in memory: fastest, a few hundred bytes per live record, unbounded) or
    `rocksdb` (always in the state: memory bounded by RocksDB's caches, more CPU per record).
    docs/operations.md."""
    raw = os.environ.get(WINDOW_INDEX_ENV, "").strip().lower() or "budget"
    if raw not in WINDOW_INDEXES:
        raise ValueError(f"{WINDOW_INDEX_ENV}={raw!r}: use one of {', '.join(WINDOW_INDEXES)}")
    return raw


FILTER_MB_ENV = "TANDEM_WINDOW_INDEX_FILTER_MB"


def filter_bytes_from_env() -> int:
    """TANDEM_WINDOW_INDEX_FILTER_MB: the key filter of the index in RocksDB, per partition
    (tables/operators/stored_window.py, KeyFilter), 4 by default; unused with the index in memory."""
    raw = os.environ.get(FILTER_MB_ENV, "").strip()
    try:
        megabytes = float(raw) if raw else 4.0
    except ValueError:
        raise ValueError(f"{FILTER_MB_ENV}={raw!r} is not a number") from None
    if megabytes <= 0:
        raise ValueError(f"{FILTER_MB_ENV} must be positive, not {raw}")
    return max(1, int(megabytes * (1 << 20)))


BUDGET_MB_ENV = "TANDEM_WINDOW_INDEX_BUDGET_MB"
DEFAULT_BUDGET_MB = 32.0
_BUDGETS: dict[int, IndexBudget] = {}


def index_budget_from_env() -> IndexBudget:
    """The budget of the process's in-memory window indexes (TANDEM_WINDOW_INDEX_BUDGET_MB,
    32 by default; 0: every index in the state from its first record), one for every join
    and partition of the process that reads the same setting."""
    raw = os.environ.get(BUDGET_MB_ENV, "").strip()
    try:
        megabytes = float(raw) if raw else DEFAULT_BUDGET_MB
    except ValueError:
        raise ValueError(f"{BUDGET_MB_ENV}={raw!r} is not a number") from None
    if not megabytes >= 0:
        raise ValueError(f"{BUDGET_MB_ENV} must be 0 or more, not {raw}")
    limit = int(megabytes * (1 << 20))
    budget = _BUDGETS.get(limit)
    if budget is None:
        budget = _BUDGETS[limit] = IndexBudget(limit)
    return budget


@dataclass(frozen=True)
class WindowedKind:
    """A windowed stream-stream join (`tables.join`), as the runtime makes and shows it."""

    window: JoinWindow
    join_type: JoinType
    name: str = "windowed"
    table_side: None = None  # two streams
    index: str = field(default_factory=window_index_from_env)  # "budget", "memory" or "rocksdb"
    filter_bytes: int = field(default_factory=filter_bytes_from_env)  # per partition, in the state
    # With "budget": the memory all in-memory indexes of the process share.
    budget: IndexBudget = field(default_factory=index_budget_from_env, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.index not in WINDOW_INDEXES:
            raise ValueError(f"window index {self.index!r}: use one of {', '.join(WINDOW_INDEXES)}")

    @property
    def unscanned(self) -> tuple[bytes, ...]:
        """With the index in memory the join reads its records by key (the one scan, indexing
        them, runs before anything is pending), so the batch overlay need not index any key
        (tables/operators/kv.py). With it in the state, records and due times are range-scanned."""
        if self.index == "rocksdb":
            return (keys.ID_INDEX, keys.META)
        return (keys.RECORD, keys.META)

    @property
    def how(self) -> str:
        return self.join_type.value

    def operator(self, state: KV, ids: bool) -> Operator:
        if self.index == "rocksdb":
            return StoredIndexJoin(state, self.window, self.join_type, ids, self.filter_bytes)
        if self.index == "memory":
            return WindowedJoin(state, self.window, self.join_type, ids)
        return BudgetedJoin(state, self.window, self.join_type, ids, self.budget, self.filter_bytes)

    def emits_unmatched(self) -> bool:
        return bool(self.join_type.unmatched_sides)

    def retention_ms(self) -> int:
        """Kafka Streams' window-store default: the window, its grace, and a day."""
        w = self.window
        return w.before + w.after + w.grace + DAY_MS

    def describe(self) -> dict[str, Any]:
        w = self.window
        return {
            "kind": self.name,
            "how": self.how,
            "window_ms": {"before": w.before, "after": w.after, "grace": w.grace},
            "window_index": self.index,
            **({"window_index_budget_mb": self.budget.limit / (1 << 20)} if self.index == "budget" else {}),
        }
