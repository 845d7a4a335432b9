"""Enrichment joins declared for the temporal twin's differential tests
(tests/test_pipeline_twin_temporal.py): both `how`s, two forms each, grace and history of a
few milliseconds.

- `*-int`: int keys (JSON), `faust.Record` values on both sides, the time from a field, the
  stream's ids from a field (a table's delete takes its Kafka timestamp); the inner one with a
  `validate` on each input, the left one with a small `max_value_bytes`.
- `*-str`: str keys (raw), any JSON values, the Kafka timestamp, the stream's ids by offset;
  the inner one with the CRC32 partitioner and `history == grace` (every record past grace is
  dropped as late), the left one with none.

Importing this module declares them (no worker is started); Spark's workers import it too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinInput, JoinResults, join_table

PARTITIONS = 3
app = faust.App("twin-tables", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)


class Trade(faust.Record, serializer="json"):
    id: str
    ts: int
    n: int | None = None


class Quote(faust.Record, serializer="json"):
    ts: int
    v: int


def no_thirteen(key: Any, value: Trade) -> str | None:
    return "n is 13" if value.n == 13 else None


def no_nine(key: Any, value: Quote) -> str | None:
    return "v is 9" if value.v == 9 else None


async def ignore(results: JoinResults[Any, Any, Any]) -> None:
    async for _ in results:
        pass


def ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


INT_PARAMETERS = {"inner": (2, 5), "left": (0, 3)}  # how -> (grace, history), ms
STR_PARAMETERS = {"inner": (1, 1), "left": (3, 6)}

for how, (grace, history) in INT_PARAMETERS.items():
    stream = app.topic(
        f"t-{how}-int-s", key_type=int, key_serializer="json", value_type=Trade, partitions=PARTITIONS
    )
    table = app.topic(
        f"t-{how}-int-t", key_type=int, key_serializer="json", value_type=Quote, partitions=PARTITIONS
    )
    inner = how == "inner"
    join_table(
        app,
        JoinInput(stream, validate=no_thirteen if inner else None),
        JoinInput(table, validate=no_nine if inner else None),
        grace=ms(grace),
        history=ms(history),
        how=how,  # type: ignore[arg-type]
        name=f"{how}-int",
        timestamp="ts",
        id="id",
        max_value_bytes=1 << 20 if inner else 23,  # a good stream value with `n` may be too large
        audit=True,
    )(ignore)

for how, (grace, history) in STR_PARAMETERS.items():
    stream, table = (
        app.topic(
            f"t-{how}-str-{s}",
            key_type=str,
            key_serializer="raw",
            value_serializer="json",
            partitions=PARTITIONS,
        )
        for s in ("s", "t")
    )
    join_table(
        app,
        stream,
        table,
        grace=ms(grace),
        history=ms(history),
        how=how,  # type: ignore[arg-type]
        name=f"{how}-str",
        partitioner="crc32" if how == "inner" else "none",
    )(ignore)
