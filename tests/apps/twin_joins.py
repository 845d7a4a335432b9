"""Joins declared for the twin's differential tests (tests/test_pipeline_twin.py): every `how`,
two forms each, windows of a few milliseconds.

- `*-int`: int keys (JSON), `faust.Record` values, the time from a field, ids from a field;
  one with a `validate`, one with a small `max_value_bytes`.
- `*-str`: str keys (raw), any JSON values, the Kafka timestamp, ids by offset; one with the
  CRC32 partitioner, one with none.

Importing this module declares them (no worker is started); Spark's workers import it too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import faust

from assignor.faust_adapter.partition_assignor import TandemAssignor
from tables import JoinInput, JoinResults, join

PARTITIONS = 3
app = faust.App("twin-joins", broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)


class Event(faust.Record, serializer="json"):
    id: str
    ts: int
    n: int | None = None


def no_thirteen(key: Any, value: Event) -> str | None:
    return "n is 13" if value.n == 13 else None


async def ignore(results: JoinResults[Any, Any, Any]) -> None:
    async for _ in results:
        pass


def ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


INT_WINDOWS = {"inner": (2, 3, 1), "left": (0, 3, 0), "right": (3, 0, 2), "outer": (1, 1, 1)}
STR_WINDOWS = {"inner": (0, 4, 0), "left": (2, 2, 2), "right": (0, 0, 0), "outer": (3, 1, 0)}

for how, (before, after, grace) in INT_WINDOWS.items():
    left, right = (
        app.topic(
            f"{how}-int-{s}", key_type=int, key_serializer="json", value_type=Event, partitions=PARTITIONS
        )
        for s in ("l", "r")
    )
    join(
        app,
        JoinInput(left, validate=no_thirteen if how == "inner" else None),
        right,
        before=ms(before),
        after=ms(after),
        grace=ms(grace),
        how=how,  # type: ignore[arg-type]
        name=f"{how}-int",
        timestamp="ts",
        id="id",
        max_value_bytes=23 if how == "left" else 1 << 20,  # a good value with `n` may be too large
    )(ignore)

for how, (before, after, grace) in STR_WINDOWS.items():
    left, right = (
        app.topic(
            f"{how}-str-{s}",
            key_type=str,
            key_serializer="raw",
            value_serializer="json",
            partitions=PARTITIONS,
        )
        for s in ("l", "r")
    )
    join(
        app,
        left,
        right,
        before=ms(before),
        after=ms(after),
        grace=ms(grace),
        how=how,  # type: ignore[arg-type]
        name=f"{how}-str",
        partitioner={"right": "crc32", "outer": "none"}.get(how, "murmur2"),  # type: ignore[arg-type]
    )(ignore)

# Self-joins (a topic joined with itself, docs/join-semantics.md "Self-joins"): inner with str
# keys, offsets and the Kafka timestamp; left with Record values, ids and a time field.
SELF_WINDOWS = {"self-inner-str": ("inner", 3, 1, 1), "self-left-int": ("left", 0, 2, 1)}
for name, (how, before, after, grace) in SELF_WINDOWS.items():
    if name.endswith("-str"):
        events = app.topic(
            name, key_type=str, key_serializer="raw", value_serializer="json", partitions=PARTITIONS
        )
        options: dict[str, Any] = {}
    else:
        events = app.topic(name, key_type=int, key_serializer="json", value_type=Event, partitions=PARTITIONS)
        options = {"timestamp": "ts", "id": "id"}
    join(
        app, events, events, before=ms(before), after=ms(after), grace=ms(grace), how=how,  # type: ignore[arg-type]
        name=name, **options,
    )(ignore)  # fmt: skip
