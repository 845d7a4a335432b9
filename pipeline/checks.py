"""What the stream does with each input record before the join, on Spark: the same code.

A record is checked as a worker checks it (tables/runtime/intake.py, `Intake.check`): first
its partition (`tables.records.partitioners.find_misplaced`, per topic partition, under the
join's partitioner), then its side's codec (`SideCodec.accept`, made by
`JoinSpec.codecs`: tables/records/sides.py from the declaration: key and value types, serializers,
`max_value_bytes`, `validate`, `timestamp`, `id`). So the twin dead-letters exactly what the
stream does, with the same category and reason, counts the same null values, and joins each
good record with the same event time and id.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.inputs import RAW_COLUMNS, RAW_SCHEMA
from tables.records.codecs import DROPPED, Rejected
from tables.records.partitioners import find_misplaced, misplaced_reason

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The fate of an input record before the join.
ACCEPTED, NULL, DEAD = "accepted", "null_value", "dead_letter"
# The input layout and what the checks found: the side, the status, a dead letter's category
# and reason, an accepted record's event time and id.
CHECKED_SCHEMA = (
    RAW_SCHEMA + ", side string, status string, category string, reason string, ts long, rid binary"
)
_OFFSET = struct.Struct(">Q")  # a record id that is its offset (tables/records/codecs.py)
_TYPES = {"side": pa.string(), "status": pa.string(), "category": pa.string(), "reason": pa.string(),
          "ts": pa.int64(), "rid": pa.binary()}  # fmt: skip


@dataclass
class Checked:
    """One batch of records, checked: a status per record and, for an accepted one, its event
    time and id; for a dead letter, its category and reason (index-aligned lists)."""

    status: list[str]
    ts: list[int | None]
    rid: list[bytes | None]
    category: list[str | None]
    reason: list[str | None]


class Checker:
    """The stream's checks of one join, in a Spark Python worker."""

    def __init__(self, ref: JoinRef, partitions: int | None) -> None:
        spec = ref.spec()
        self.partitioner = spec.partitioner
        self.partitions = partitions
        codecs = ref.codecs()
        # A self-join's one topic is its left input (the operator takes each record in both roles).
        self.accepts = {spec.right.name: codecs["right"].accept, spec.left.name: codecs["left"].accept}
        # A rekeyed input's record still on its source topic: its key could not be found
        # (pipeline/rekey.py); dead-lettered with the rekeyer's reason.
        self.rekeys = {r.source.name: r.rekey().key_of for r in spec.repartitions}
        # A global table is read whole and unchecked by every worker (its own partition count;
        # its values decoded only in a result): its records are all taken, as they are.
        self.unchecked = spec.right.name if spec.is_global else None

    def check(self, batch: pa.RecordBatch) -> Checked:
        """The records of `batch` (columns of the input layout), in batch order."""
        topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        stamps = batch.column("timestamp").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        n = len(keys)
        out = Checked([ACCEPTED] * n, [None] * n, [None] * n, [None] * n, [None] * n)
        misplaced = self._misplaced(topics, partitions, keys)
        accepts = self.accepts
        rekeys = self.rekeys
        for i in range(n):
            if topics[i] in rekeys:
                why = rekeys[topics[i]](values[i])
                assert isinstance(why, Rejected), "a rekeyed record is on its repartition topic"
                out.status[i], out.category[i], out.reason[i] = DEAD, why.category, why.reason
                continue
            if topics[i] == self.unchecked:
                out.ts[i], out.rid[i] = stamps[i], _OFFSET.pack(offsets[i])
                continue
            expected = misplaced.get(i)
            if expected is not None:
                out.status[i], out.category[i] = DEAD, "wrong_partition"
                out.reason[i] = misplaced_reason(partitions[i], expected, self.partitioner)
                continue
            found = accepts[topics[i]](keys[i], values[i], offsets[i], stamps[i])
            if type(found) is tuple:
                out.ts[i], out.rid[i] = found[0], found[1]
            elif found is DROPPED:
                out.status[i] = NULL
            else:
                out.status[i], out.category[i], out.reason[i] = DEAD, found.category, found.reason
        return out

    def _misplaced(
        self, topics: list[str], partitions: list[int], keys: list[bytes | None]
    ) -> dict[int, int]:
        """Row -> the partition its key belongs to, for rows read from another partition (the
        check runs per topic partition, as on a fetch)."""
        count = self.partitions
        if self.partitioner == "none" or not count:
            return {}
        groups: dict[tuple[str, int], list[int]] = {}
        for i, tp in enumerate(zip(topics, partitions, strict=True)):
            # A source topic is not partitioned by the join key, a global table by its own count.
            if tp[0] not in self.rekeys and tp[0] != self.unchecked:
                groups.setdefault(tp, []).append(i)
        found: dict[int, int] = {}
        for (_, partition), rows in groups.items():
            for m in find_misplaced([keys[i] for i in rows], partition, count, self.partitioner):
                found[rows[m.index]] = m.expected
        return found


def check_batches(
    ref: JoinRef, partitions: int | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The checks as mapInArrow takes them: each batch of the input layout with CHECKED_SCHEMA's
    columns added (the checker is made in the Python worker)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        checker = Checker(ref, partitions)
        spec = ref.spec()
        sides = {spec.right.name: "right", spec.left.name: "left"}  # a self-join's topic: "left"
        sides.update({r.source.name: r.side for r in spec.repartitions})
        for batch in batches:
            found = checker.check(batch)
            columns = {
                "side": [sides[t] for t in batch.column("topic").to_pylist()],
                "status": found.status,
                "category": found.category,
                "reason": found.reason,
                "ts": found.ts,
                "rid": found.rid,
            }
            arrays = [batch.column(name) for name in RAW_COLUMNS]
            arrays += [pa.array(values, type=_TYPES[name]) for name, values in columns.items()]
            yield pa.RecordBatch.from_arrays(arrays, names=[*RAW_COLUMNS, *columns])

    return run


def checked(raw: DataFrame, ref: JoinRef, partitions: int | None) -> DataFrame:
    """Every input record checked as the stream checks it (CHECKED_SCHEMA): in parallel over
    the input, in no particular order (a record's check depends on nothing else)."""
    return raw.mapInArrow(check_batches(ref, partitions), CHECKED_SCHEMA)
