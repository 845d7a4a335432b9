"""`tandem-topic`: Kafka topics as a Spark data source (Python Data Source API).

No Kafka connector jar exists on these machines, so this reads topic partitions
through aiokafka inside Spark's Python workers: one input partition per offset
range (large ranges split in `splitSize` pieces), in batch and as a stream.

    spark.read.format("tandem-topic").option("bootstrap", "127.0.0.1:9092")
        .option("topic", "impressions,clicks").load()

Options: `bootstrap` (or `kafka.bootstrap.servers`), `kafka.client.config` (a client
properties file for a secured cluster: security.protocol, sasl.*, ssl.*; each reader opens
it, so it must be at that path where the readers run), `topic` (comma-separated),
`startingOffsets` / `endingOffsets` ("earliest", "latest" or JSON
{"topic": {"partition": offset}}), `splitSize` (offsets per input partition,
default 500000), `maxOffsetsPerTrigger` (streaming read limit) and
`latestOffsetForm` ("current" or "legacy": which `latestOffset` form the stream
reader exposes; both are supported so the source runs on Spark 4.0 to 4.3+).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

try:  # Spark 4.2+: read limits and availableNow for Python stream readers
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0 and 4.1: latestOffset() has no arguments

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in: no read limits before Spark 4.2."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Stand-in."""

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: Spark < 4.2 never calls prepareForTriggerAvailableNow."""


from pipeline.kafka import Connection, Span, offsets, read_span

SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary, seq long"
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("seq", pa.int64()),
    ]
)
DEFAULT_SPLIT = 500_000
Offsets = dict[str, int]  # 'topic:partition' -> offset


class SpanPartition(InputPartition):
    """One offset range of one topic partition."""

    def __init__(self, span: Span) -> None:
        super().__init__(span)
        self.span = span


def _seq(headers: Sequence[tuple[str, bytes]] | None) -> int | None:
    """The producer's merged arrival sequence number, when it wrote one (pipeline.produce)."""
    for name, raw in headers or ():
        if name == "seq":
            return int(raw)
    return None


def read_partition(target: str | Connection, span: Span) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records of one span (runs in a Python worker)."""
    for records in read_span(target, span):
        columns = [
            [span.topic] * len(records),
            [span.partition] * len(records),
            [r.offset for r in records],
            [r.timestamp for r in records],
            [r.key for r in records],
            [r.value for r in records],
            [_seq(r.headers) for r in records],
        ]
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, ARROW_SCHEMA, strict=True)],
            schema=ARROW_SCHEMA,
        )


def _parse_offsets(spec: str, bounds: dict[str, tuple[int, int]], default: str) -> Offsets:
    """'earliest', 'latest' or JSON {"topic": {"p": offset}} (-2 earliest, -1 latest)."""
    spec = spec or default
    if spec in ("earliest", "latest"):
        return {tp: b[0] if spec == "earliest" else b[1] for tp, b in bounds.items()}
    given: dict[str, dict[str, int]] = json.loads(spec)
    chosen = _parse_offsets(default, bounds, default)
    for topic, per_partition in given.items():
        for partition, offset in per_partition.items():
            tp = f"{topic}:{partition}"
            if tp in bounds:
                chosen[tp] = {-2: bounds[tp][0], -1: bounds[tp][1]}.get(offset, offset)
    return chosen


def plan_spans(start: Offsets, end: Offsets, split: int) -> list[SpanPartition]:
    """Input partitions covering [start, end) of every topic partition, `split` offsets each."""
    parts: list[SpanPartition] = []
    for tp in sorted(end):
        topic, partition = tp.rsplit(":", 1)
        first, last = start.get(tp, 0), end[tp]
        for lo in range(first, last, max(1, split)):
            parts.append(SpanPartition(Span(topic, int(partition), lo, min(last, lo + split))))
    return parts


class _Options:
    def __init__(self, options: Mapping[str, str]) -> None:
        bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ValueError("tandem-topic needs the option 'bootstrap'")
        # A client properties file (secured clusters), read where each reader connects.
        self.connection = Connection(bootstrap, options.get("kafka.client.config") or None)
        self.topics = [t.strip() for t in options.get("topic", "").split(",") if t.strip()]
        if not self.topics:
            raise ValueError("tandem-topic needs the option 'topic'")
        self.starting = options.get("startingOffsets", "earliest")
        self.ending = options.get("endingOffsets", "latest")
        self.split = int(options.get("splitSize", DEFAULT_SPLIT))
        max_offsets = options.get("maxOffsetsPerTrigger")
        self.max_offsets = int(max_offsets) if max_offsets else None

    def bounds(self) -> dict[str, tuple[int, int]]:
        return offsets(self.connection, self.topics)


class TopicBatchReader(DataSourceReader):
    def __init__(self, options: _Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        bounds = self.options.bounds()
        start = _parse_offsets(self.options.starting, bounds, "earliest")
        end = _parse_offsets(self.options.ending, bounds, "latest")
        return plan_spans(start, end, self.options.split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SpanPartition):
            # No span to read (every topic empty, e.g. a dead-letter topic with no letter):
            # Spark then reads one partition of its own making, which holds nothing.
            return
        yield from read_partition(self.options.connection, partition.span)


def advance(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Move from `start` towards `latest` by at most `max_rows` offsets, fairly over partitions."""
    end = {tp: max(start.get(tp, 0), latest[tp]) for tp in latest}
    backlog = {tp: end[tp] - start.get(tp, 0) for tp in end}
    budget = max_rows
    chosen = {tp: start.get(tp, 0) for tp in end}
    pending = sorted(tp for tp in backlog if backlog[tp] > 0)
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        for tp in list(pending):
            step = min(share, backlog[tp], budget)
            chosen[tp] += step
            backlog[tp] -= step
            budget -= step
            if backlog[tp] == 0:
                pending.remove(tp)
            if budget == 0:
                break
    return chosen


class _TopicStream(DataSourceStreamReader):
    """Offsets are {'topic:partition': next offset}; commits are left to Spark's checkpoint."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.target: Offsets | None = None  # set by availableNow: never read past it

    def initialOffset(self) -> dict[str, Any]:
        bounds = self.options.bounds()
        return _parse_offsets(self.options.starting, bounds, "earliest")

    def _latest(self) -> Offsets:
        if self.target is not None:
            return dict(self.target)
        return {tp: b[1] for tp, b in self.options.bounds().items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return plan_spans(start, end, self.options.split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SpanPartition):
            # No span to read (every topic empty, e.g. a dead-letter topic with no letter):
            # Spark then reads one partition of its own making, which holds nothing.
            return
        yield from read_partition(self.options.connection, partition.span)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""


class TopicStreamReader(_TopicStream, SupportsTriggerAvailableNow):
    """Reads with a limit (`maxOffsetsPerTrigger`) and honours trigger(availableNow=True).

    `latestOffset` takes both forms: `()` as Spark <= 4.1 calls it, `(start, limit)` as
    Spark 4.2+ does (its signature has parameters, so 4.2+ passes them).
    """

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: b[1] for tp, b in self.options.bounds().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets:
            return ReadMaxRows(self.options.max_offsets)
        return ReadAllAvailable()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        latest = self._latest()
        if start is None or not isinstance(limit, ReadMaxRows):
            return latest
        return advance(start, latest, limit.max_rows)


class LegacyTopicStreamReader(_TopicStream):
    """The Spark <= 4.1 reader shape: `latestOffset()` without arguments, no read limit.

    Spark 4.2+ still drives such readers; this class keeps that path tested.
    """

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        return self._latest()


class TopicDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tandem-topic"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopicBatchReader(_Options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = _Options(self.options)
        if self.options.get("latestOffsetForm", "current") == "legacy":
            return LegacyTopicStreamReader(options)
        return TopicStreamReader(options)
