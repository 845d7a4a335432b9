"""The batch twin of a temporal (enrichment) join: the stream's own operator, in order.

A temporal join's outcome for a stream record depends on the order of everything before it:
stream time decides whether it waits out its grace, is joined at once or is dropped as late,
and which table versions it sees is decided by what was accepted before the record that moves
stream time past its grace (docs/join-semantics.md, "Enrichment", rules 1-12). So the twin
does not restate those rules in SQL: it runs `tables.operators.temporal.TemporalJoin` itself.

1. The stream's own checks (pipeline/checks.py, shared by every kind): wrong partition, then
   the side's codec. The table side's codec has `deletes`: its null value is accepted as a
   delete (its Kafka timestamp, its offset as id), not dropped as a null value.
2. Each partition's checked records on one Spark partition, sorted in the arrival order of
   docs/pipeline.md (`seq`, else the Kafka timestamp, stream before table, offset).
3. One ordered pass per partition (`mapInArrow`): every accepted record handed to the
   operator (`process_many`) as the worker hands it, over the worker's own state layers (an
   `Overlay` over a RocksDB `PartitionStore` in a temporary directory, written and cleared
   after each Arrow batch as a worker commits a batch; the memory used does not grow with the
   number of keys). A record's fate is what the operator counted for it: `duplicate`, `late`
   (a stream record older than history), `late_update` (a table update older than history),
   else `accepted`. Each result the operator emits is traced (`TracedJoin`, the operator
   with two methods wrapped) to the stream record it joined and the table version that
   answered, so it carries both inputs' identities. At the end of a partition nothing more
   is emitted (what the stream has emitted by the final stream time), or with `close_inputs`
   the operator's `advance` to END_OF_TIME, as the test driver's `close_inputs()`. A
   null-keyed stream record (accepted in a left join only: KIP-962) is a result with no table
   value at once, as the worker gives it (`tables.operators.base.join_events`), and never
   reaches the operator.

Why not Spark SQL for the lookups: the version a pending record sees is the latest with
`u <= t` *among those accepted before it falls due* (a table update more than `grace` late
but within `history` is seen by later lookups only), so an as-of join would need the arrival
order as a second dimension, and the fates (duplicates, late, late updates) need the ordered
pass anyway. The pass is bounded by the partition count, as the windowed twin's is.

tests/test_pipeline_twin_temporal.py holds this to the stream's operator, record for record.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.checks import ACCEPTED, CHECKED_SCHEMA
from pipeline.twins import COUNTER_OF, END_OF_TIME, KindTwin, in_arrival_order
from tables.operators.base import Match
from tables.operators.kv import KV, Overlay
from tables.operators.temporal import PRESENT, TemporalJoin, TemporalKind, version_offset
from tables.spec import JoinSpec
from tables.state.store import PartitionStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The checked records (pipeline/checks.py) with each one's fate (`status`: late, duplicate,
# late_update) and the stream time before it.
RECORDS_SCHEMA = CHECKED_SCHEMA + ", st_before long"
# What the pass writes: the records, and after them the results, as rows of the same schema
# with status RESULT: the stream record's columns (topic, partition, offset, key, value, rid),
# the result's time in `ts`, and the table version that answered (none: null).
PASS_SCHEMA = RECORDS_SCHEMA + ", table_value binary, table_offset long, table_rid binary"
RESULT = "result"
# Where the pass keeps each partition's state (default: the system's temporary directory).
STATE_DIR_ENV = "TANDEM_TWIN_STATE_DIR"

ArrowPass = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
_STATUS_OF = {counter: status for status, counter in COUNTER_OF.items()}
_RECORD_ONLY = ("table_value", "table_offset", "table_rid")


def kind_of(spec: JoinSpec) -> TemporalKind:
    kind = spec.kind
    assert isinstance(kind, TemporalKind), kind
    return kind


class TracedJoin(TemporalJoin):
    """The stream's operator, unchanged, also telling for each stream record it joins (due or
    at once) which record it was, whether it made a result, and which version answered."""

    def __init__(self, state: KV, how: str, grace: int, history: int, ids: bool) -> None:
        super().__init__(state, how, grace, history, ids)
        # (key, record id, made a result, the answering version's offset or None), in order.
        self.joined: list[tuple[bytes, bytes, bool, int | None]] = []
        self._found: tuple[bytes, bytes] | None = None

    def _version_at(self, key: bytes, ts: int) -> tuple[bytes, bytes] | None:
        self._found = found = super()._version_at(key, ts)
        return found

    def _emit(self, key: bytes, ts: int, record_id: bytes, value: bytes, results: list[Match]) -> None:
        self._found = None
        before = len(results)
        super()._emit(key, ts, record_id, value, results)
        found = self._found
        offset = version_offset(found[0]) if found is not None and found[1][:1] == PRESENT else None
        self.joined.append((key, record_id, len(results) > before, offset))


class Partition:
    """One partition's operator over its own RocksDB state, in a temporary directory."""

    def __init__(self, number: int, kind: TemporalKind, ids: bool) -> None:
        self.number = number
        self.path = tempfile.mkdtemp(prefix=f"tandem-twin-{number}-", dir=os.environ.get(STATE_DIR_ENV))
        self.store = PartitionStore(Path(self.path) / "state")
        self.overlay = Overlay(self.store, unscanned=kind.unscanned)
        self.operator = TracedJoin(self.overlay, kind.how, kind.grace_ms, kind.history_ms, ids)
        # The stream records waiting for their results: (key, record id) -> offset.
        self.waiting: dict[tuple[bytes, bytes], int] = {}

    def commit(self) -> None:
        """What a worker does at the end of a batch: the changes to the store, the overlay cleared."""
        self.operator.take_changes()
        self.store.write(self.overlay.pending, None)
        self.overlay.clear()

    def close(self) -> None:
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)


class Pass:
    """The ordered pass over every partition's records (module docstring, 3)."""

    def __init__(self, ref: JoinRef, close_inputs: bool) -> None:
        spec = ref.spec()
        self.kind = kind_of(spec)
        self.ids = spec.ids
        self.stream_topic = spec.left.name
        self.close_inputs = close_inputs
        self.current: Partition | None = None
        self.results: dict[str, list[Any]] = {}
        self._reset_results()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            for batch in batches:
                yield self.batch(batch)
                yield self._take_results()
            self._end_partition()
            yield self._take_results()
        finally:
            if self.current is not None:
                self.current.close()

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        partitions = batch.column("partition").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        offsets = batch.column("offset").to_pylist()
        sides = batch.column("side").to_pylist()
        status = batch.column("status").to_pylist()
        ts = batch.column("ts").to_pylist()
        rid = batch.column("rid").to_pylist()
        st_before: list[int | None] = [None] * len(keys)
        for i, number in enumerate(partitions):
            if self.current is None or number != self.current.number:  # partition by partition
                self._end_partition()
                self.current = Partition(number, self.kind, self.ids)
            if status[i] != ACCEPTED:
                continue
            operator = self.current.operator
            st_before[i] = operator.stream_time
            if keys[i] is None:  # a lone result at once, not the operator's (KIP-962)
                self._result(keys[i], values[i], ts[i], offsets[i], rid[i], None, None)
                continue
            counted = operator.counters()
            matches = operator.process_many(((sides[i], keys[i], ts[i], rid[i], values[i]),))
            dropped = [name for name, n in operator.counters().items() if n != counted[name]]
            if dropped:
                status[i] = _STATUS_OF[dropped[0]]
            elif sides[i] == "left":
                self.current.waiting[(keys[i], rid[i])] = offsets[i]
            self._trace(matches)
        if self.current is not None:
            self.current.commit()
        names = batch.schema.names
        arrays = [pa.array(status, type=pa.string()) if n == "status" else batch.column(n) for n in names]
        arrays.append(pa.array(st_before, type=pa.int64()))
        arrays += [pa.nulls(len(keys), type=pa.binary()), pa.nulls(len(keys), type=pa.int64()),
                   pa.nulls(len(keys), type=pa.binary())]  # fmt: skip
        return pa.RecordBatch.from_arrays(arrays, names=[*names, "st_before", *_RECORD_ONLY])

    def _trace(self, matches: list[Match]) -> None:
        """Each stream record the operator joined: its result (if it made one) as a row."""
        current = self.current
        assert current is not None
        joined, waiting = current.operator.joined, current.waiting
        made = iter(matches)
        for key, record_id, has_result, table_offset in joined:
            offset = waiting.pop((key, record_id))
            if not has_result:
                continue
            match = next(made)
            self._result(key, match.left, match.timestamp, offset, record_id, match.right, table_offset)
        joined.clear()
        assert next(made, None) is None, "a result the trace did not see"

    def _result(
        self, key: bytes | None, value: bytes | None, ts: int, offset: int, record_id: bytes,
        table_value: bytes | None, table_offset: int | None,
    ) -> None:  # fmt: skip
        """One result as a row (the stream record's key, value, offset and id; the answering
        table version's value and offset, or none)."""
        assert self.current is not None
        out = self.results
        out["partition"].append(self.current.number)
        out["key"].append(key)
        out["value"].append(value)
        out["ts"].append(ts)
        out["offset"].append(offset)
        out["rid"].append(record_id)
        out["table_value"].append(table_value)
        out["table_offset"].append(table_offset)

    def _end_partition(self) -> None:
        current = self.current
        if current is None:
            return
        if self.close_inputs:
            self._trace(current.operator.advance(END_OF_TIME))
        current.close()
        self.current = None

    def _reset_results(self) -> None:
        columns = ("partition", "key", "value", "ts", "offset", "rid", "table_value", "table_offset")
        self.results = {name: [] for name in columns}

    def _take_results(self) -> pa.RecordBatch:
        found, n = self.results, len(self.results["key"])
        self._reset_results()
        table_rid = [None if o is None else o.to_bytes(8, "big") for o in found["table_offset"]]
        columns: dict[str, pa.Array] = {
            "topic": pa.array([self.stream_topic] * n, type=pa.string()),
            "partition": pa.array(found["partition"], type=pa.int32()),
            "offset": pa.array(found["offset"], type=pa.int64()),
            "timestamp": pa.nulls(n, type=pa.int64()),
            "key": pa.array(found["key"], type=pa.binary()),
            "value": pa.array(found["value"], type=pa.binary()),
            "seq": pa.nulls(n, type=pa.int64()),
            "side": pa.array(["left"] * n, type=pa.string()),
            "status": pa.array([RESULT] * n, type=pa.string()),
            "category": pa.nulls(n, type=pa.string()),
            "reason": pa.nulls(n, type=pa.string()),
            "ts": pa.array(found["ts"], type=pa.int64()),
            "rid": pa.array(found["rid"], type=pa.binary()),
            "st_before": pa.nulls(n, type=pa.int64()),
            "table_value": pa.array(found["table_value"], type=pa.binary()),
            "table_offset": pa.array(found["table_offset"], type=pa.int64()),
            "table_rid": pa.array(table_rid, type=pa.binary()),
        }
        return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def passes(ref: JoinRef, close_inputs: bool) -> ArrowPass:
    """The pass as mapInArrow takes it (its state is made in the Python worker)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from Pass(ref, close_inputs)(batches)

    return run


def twin(
    spark: SparkSession, ref: JoinRef, checked: DataFrame, partitions: int | None, close_inputs: bool = False
) -> KindTwin:
    """The twin of a temporal join over its checked input records (pipeline/checks.py)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spec = ref.spec()
    ordered = in_arrival_order(spark, spec, checked, partitions)
    # The pass runs the operator over every record: once, for the records and the results.
    out = ordered.mapInArrow(passes(ref, close_inputs), PASS_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    records = out.filter(F.col("status") != RESULT).drop(*_RECORD_ONLY)
    found = F.col("table_offset").isNotNull()
    results = out.filter(F.col("status") == RESULT).select(
        "partition", "key", F.col("value").alias("left"), F.col("table_value").alias("right"), "ts",
        F.col("topic").alias("left_topic"), F.col("offset").alias("left_offset"),
        F.col("rid").alias("left_rid"), F.when(found, F.lit(spec.right.name)).alias("right_topic"),
        F.col("table_offset").alias("right_offset"), F.col("table_rid").alias("right_rid"),
    )  # fmt: skip
    return KindTwin(records, results, counters=("late", "duplicate", "late_update"), cached=(out,))


def late_prone(records: DataFrame, spec: JoinSpec) -> DataFrame:
    """(topic, partition, offset) of the accepted records the stream may have read later than
    the twin did: a worker reading a backlog takes every earlier record of the same input
    partition first, so its stream time may reach the latest time among them
    (docs/pipeline.md). A stream record whose grace ends before that time may have been joined
    at once, over fewer versions, or dropped as late; a table update older than history by
    then may have been dropped. Their results may be missing from the stream."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    kind = kind_of(spec)
    # (A null-keyed record is a result at once, moving no stream time: never late, no cause.)
    valid = records.filter(
        F.col("status").isin(ACCEPTED, "late", "duplicate", "late_update") & F.col("key").isNotNull()
    )
    earlier = (
        Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    )
    prone = F.when(F.col("side") == "left", F.col("ts") + kind.grace_ms).otherwise(
        F.col("ts") + kind.history_ms
    )
    return (
        valid.withColumn("read_before", F.max("ts").over(earlier))
        .filter((F.col("status") == ACCEPTED) & (prone < F.col("read_before")))
        .select("topic", "partition", "offset")
    )
