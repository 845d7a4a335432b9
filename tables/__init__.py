"""Tandem's joins for Faust apps: stream joins with RocksDB state that survive rebalances.

    from tables import JoinResults, TandemAssignor, join

    app = faust.App("paid", broker=..., PartitionAssignor=TandemAssignor)

    @join(app, orders, payments, within=timedelta(minutes=10), how="left")
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for key, order, payment, ts in results:
            ...

Declaring a join is all an app does: the runtime (tables/runtime/) declares the join's
co-partition group to Tandem's assignor, checks partition counts at start-up, dead-letters
bad records, aligns the inputs by event time, keeps the state in RocksDB with its
changelog (tables/state/), restores and replicates it, and commits input offsets only once
their results are handled and acknowledged. Semantics: docs/join-semantics.md. The layers,
from the bottom: operators and records (pure), spec, kafka, state, runtime, web, api
(docs/tables.md). A new kind of join is an `Operator`, its `JoinKind` and `join_of_kind`
(docs/tables.md, "Adding a join kind").
"""

from assignor.faust_adapter import TandemAssignor
from tables._version import __version__
from tables.api import (
    JOIN_OPTION_DEFAULTS,
    JoinOptions,
    join,
    join_global,
    join_of_kind,
    join_table,
    runtime_of,
)
from tables.operators.base import Event, JoinKind, Match, Operator, Side
from tables.operators.kv import KV
from tables.operators.meta import StateMeta
from tables.records.codecs import MAX_TS_MS
from tables.runtime.results import JoinBatch, JoinResult, JoinResults
from tables.runtime.startup import JoinStartupError
from tables.settings import RuntimeSettings
from tables.spec import Duration, How, JoinDeclarationError, JoinInput, JoinSpec, Partitioner

__all__ = [
    "JOIN_OPTION_DEFAULTS",
    "KV",
    "MAX_TS_MS",
    "Duration",
    "Event",
    "How",
    "JoinBatch",
    "JoinDeclarationError",
    "JoinInput",
    "JoinKind",
    "JoinOptions",
    "JoinResult",
    "JoinResults",
    "JoinSpec",
    "JoinStartupError",
    "Match",
    "Operator",
    "Partitioner",
    "RuntimeSettings",
    "Side",
    "StateMeta",
    "TandemAssignor",
    "__version__",
    "join",
    "join_of_kind",
    "join_table",
    "join_global",
    "runtime_of",
]
