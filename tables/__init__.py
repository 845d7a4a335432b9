"""Tandem's joins for Faust apps: windowed stream-stream joins with RocksDB state.

    from tables import JoinResults, join

    @join(app, orders, payments, within=timedelta(minutes=10), how="left")
    async def paid(results: JoinResults[int, Order, Payment]) -> None:
        async for key, order, payment, ts in results:
            ...

Declaring a join is all an app does: the runtime (tables/runtime/task.py) declares the
join's co-partition group to Tandem's assignor, checks partition counts at start-up,
dead-letters bad records, aligns the inputs by event time, keeps the state in RocksDB
with its changelog, restores and replicates it, and commits input offsets only once
their results are handled and acknowledged. Semantics: docs/join-semantics.md.
"""

from tables.api import (
    Duration,
    How,
    JoinDeclarationError,
    JoinInput,
    JoinResult,
    JoinSpec,
    Partitioner,
    join,
)
from tables.records.codecs import MAX_TS_MS
from tables.runtime.results import JoinBatch, JoinResults
from tables.runtime.startup import JoinStartupError
from tables.settings import RuntimeSettings

__all__ = [
    "MAX_TS_MS",
    "Duration",
    "How",
    "JoinBatch",
    "JoinDeclarationError",
    "JoinInput",
    "JoinResult",
    "JoinResults",
    "JoinSpec",
    "JoinStartupError",
    "Partitioner",
    "RuntimeSettings",
    "join",
]
