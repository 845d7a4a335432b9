"""The batch twin of each join kind: one module per `JoinKind.name`.

A kind's module has `twin(spark, ref, checked, partitions) -> KindTwin`: from the input
records as the stream's checks left them (pipeline/checks.py: dead letters, null values, and
the accepted records with their event time and id; the same for every kind, as the worker's
intake is) to every record's fate and the join's results as raw bytes with their inputs'
identities; pipeline/twin.py does the rest for every kind (typed columns, fingerprints, dead
letters, counts). It may also have `late_prone(records, spec)`:
the accepted records the stream may have read late (reconcile's `late_by_stream_only`).

A new kind's twin is a module here and a line in `KINDS`; nothing else changes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# JoinKind.name -> the module of its twin.
KINDS = {"windowed": "pipeline.twins.windowed"}

# Every record's fate (`status` of KindTwin.records): before the join (pipeline/checks.py) and in it.
STATUSES = ("accepted", "late", "duplicate", "null_value", "dead_letter")
# The raw results' columns (`KindTwin.results`): the partition, the join key and both values as
# read (null: no partner), the result's time, and each side's input identity.
RAW_RESULTS = (
    "partition int, key binary, left binary, right binary, ts long, "
    "left_topic string, left_offset long, left_rid binary, "
    "right_topic string, right_offset long, right_rid binary"
)


@dataclass
class KindTwin:
    """What a kind's twin computes."""

    records: DataFrame  # the input layout + side, status, category, reason, ts, rid (+ the kind's own)
    results: DataFrame  # RAW_RESULTS
    # Counted per partition from `records` (status values), as the stream's operator counts them.
    counters: tuple[str, ...] = field(default=("late", "duplicate"))


class UnknownKind(LookupError):
    """No twin for this join kind yet."""


def kind_module(name: str) -> ModuleType:
    """The twin module of the join kind `name`."""
    try:
        return importlib.import_module(KINDS[name])
    except KeyError:
        raise UnknownKind(
            f"no batch twin for joins of kind {name!r} yet (twins exist for: {', '.join(KINDS)})"
        ) from None
