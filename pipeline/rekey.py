"""A rekeyed input (`JoinInput(topic, key=...)`) on Spark: the twin reads the source topic and
rekeys each record as the worker's rekeyer does (tables/runtime/rekeyer.py), with the same code
(`Repartition.rekey()`: tables/records/rekey.py), into the rows the join's repartition topic
would hold: its name, the new key, the partition the join's partitioner gives that key, the
source record's timestamp and `seq`.

A repartitioned record's offset is its place in its repartition partition: the stream's order
there is the order the rekeyers produced in, one source partition's records in their order,
those of several interleaved as they were fetched; the twin numbers them by `seq`, then the
timestamp, then the source partition and offset (docs/pipeline.md, "Rekeyed inputs"). A record
whose key cannot be found keeps its source topic, partition and offset: the checks
(pipeline/checks.py) dead-letter it there, as the rekeyer does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.apps import JoinRef
from pipeline.inputs import RAW_COLUMNS, RAW_SCHEMA
from tables.records.codecs import Rejected
from tables.records.partitioners import partition_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The input layout, with where a repartitioned record was read (null for the others).
_SOURCE_SCHEMA = RAW_SCHEMA + ", source_partition int, source_offset long"


def rekey_batches(
    ref: JoinRef, partitions: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow's function: each source record with a key moved to its repartition topic's
    row (its offset set later); every other row as it was."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        spec = ref.spec()
        partitioner = spec.partitioner if spec.partitioner != "none" else "murmur2"
        rekeys = {r.source.name: (r.name, r.rekey().key_of) for r in spec.repartitions}
        for batch in batches:
            rows = batch.to_pydict()
            n = batch.num_rows
            source_partition: list[int | None] = [None] * n
            source_offset: list[int | None] = [None] * n
            for i in range(n):
                found = rekeys.get(rows["topic"][i])
                if found is None:
                    continue
                target, key_of = found
                key = key_of(rows["value"][i])
                if isinstance(key, Rejected):
                    continue  # dead-lettered by the checks, where it was read
                source_partition[i], source_offset[i] = rows["partition"][i], rows["offset"][i]
                rows["topic"][i], rows["key"][i] = target, key
                rows["partition"][i] = partition_for(key, partitions, partitioner)
            arrays = [pa.array(rows[name], type=batch.schema.field(name).type) for name in RAW_COLUMNS]
            arrays += [pa.array(source_partition, pa.int32()), pa.array(source_offset, pa.int64())]
            yield pa.RecordBatch.from_arrays(
                arrays, names=[*RAW_COLUMNS, "source_partition", "source_offset"]
            )

    return run


def rekeyed(raw: DataFrame, ref: JoinRef, partitions: int) -> DataFrame:
    """The input layout with each rekeyed input's records as its repartition topic holds them
    (nothing changes for a join with no rekeyed input)."""
    spec = ref.spec()
    if not spec.repartitions:
        return raw
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    moved = raw.select(*RAW_COLUMNS).mapInArrow(rekey_batches(ref, partitions), _SOURCE_SCHEMA)
    order = Window.partitionBy("topic", "partition").orderBy(
        F.col("seq").asc_nulls_last(),
        F.col("timestamp").asc_nulls_first(),
        F.col("source_partition"),
        F.col("source_offset"),
    )
    numbered = F.when(F.col("source_offset").isNull(), F.col("offset")).otherwise(
        F.row_number().over(order) - 1
    )
    return moved.withColumn("offset", numbered.cast("long")).select(*RAW_COLUMNS)
