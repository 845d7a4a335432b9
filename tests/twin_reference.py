"""The stream's side of the twin's tests: records as Kafka holds them, fed in the arrival
order of docs/pipeline.md to the stream's own code (the partitioner check, the side codecs
made from the declaration, the join kind's operator over a MemoryKV), and the same records
through the twin, each outcome in one shape to compare; and `mostly`, how both differential
tests weight their drawn inputs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from pipeline.apps import JoinRef
from pipeline.inputs import RAW_SCHEMA
from pipeline.twin import TwinOutput, run_twin
from pipeline.twins import COUNTER_OF, END_OF_TIME
from tables.operators.base import Match, fingerprint, join_events
from tables.operators.kv import MemoryKV
from tables.records.codecs import DROPPED, Rejected
from tables.records.partitioners import find_misplaced, misplaced_reason


@dataclass
class Row:
    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    seq: int | None


def arrival(rows: list[Row], spec: Any) -> list[Row]:
    """docs/pipeline.md's order of each partition's records: seq, else Kafka timestamp, left
    before right, offset (as pipeline/twins/windowed.py sorts them)."""
    rank = {spec.left.name: 0, spec.right.name: 1}

    def order(r: Row) -> tuple[Any, ...]:
        seq = (0, r.seq) if r.seq is not None else (1, 0)
        stamp = (0, 0) if r.timestamp is None else (1, r.timestamp)
        return (r.partition, seq, stamp, rank[r.topic], r.offset)

    return sorted(rows, key=order)


# -- the stream's side: its own checks and operator, fed in arrival order -------------------


@dataclass
class Outcome:
    results: Counter[tuple[int, str, int]]  # (partition, fingerprint, ts)
    letters: list[tuple[str, int, int, str, str]]  # topic, partition, offset, category, reason
    null_values: dict[str, int]
    counters: dict[int, dict[str, int]]  # partition -> late, duplicates
    unmatched: int = 0  # results without a partner (the stream's side counts them)
    deletes: int = 0  # a table's null values accepted as deletes (the stream's side counts them)


def stream(ref: JoinRef, rows: list[Row], partitions: int, close_inputs: bool = False) -> Outcome:
    """The stream's code over `rows` in arrival order; with `close_inputs`, then every
    partition's operator advanced to the end of time (as JoinTestDriver.close_inputs)."""
    spec = ref.spec()
    by_side = spec.codecs()
    # A self-join's one topic is its left input (its operator takes each record in both roles).
    codecs = {spec.right.name: by_side["right"], spec.left.name: by_side["left"]}
    sides = {spec.right.name: "right", spec.left.name: "left"}
    operators: dict[int, Any] = {}
    out = Outcome(Counter(), [], {"left": 0, "right": 0}, {})
    for row in arrival(rows, spec):
        operator = operators.setdefault(row.partition, spec.kind.operator(MemoryKV(), spec.ids))
        found = find_misplaced([row.key], row.partition, partitions, spec.partitioner)
        if found:
            reason = misplaced_reason(row.partition, found[0].expected, spec.partitioner)
            out.letters.append((row.topic, row.partition, row.offset, "wrong_partition", reason))
            continue
        checked = codecs[row.topic].accept(row.key, row.value, row.offset, row.timestamp)
        if checked is DROPPED:
            out.null_values[sides[row.topic]] += 1
        elif isinstance(checked, Rejected):
            out.letters.append((row.topic, row.partition, row.offset, checked.category, checked.reason))
        else:
            event = (sides[row.topic], row.key, checked[0], checked[1], row.value)
            out.deletes += row.value is None
            _count(out, row.partition, join_events(operator.process_many, [event]))
    if close_inputs:
        for partition, operator in operators.items():
            _count(out, partition, operator.advance(END_OF_TIME))
    out.counters = {p: dict(op.counters()) for p, op in operators.items() if any(op.counters().values())}
    return out


def _count(out: Outcome, partition: int, matches: list[Match]) -> None:
    for m in matches:
        out.unmatched += m.left is None or m.right is None
        out.results[(partition, fingerprint(m.key, m.left, m.right, m.timestamp).hex(), m.timestamp)] += 1


# -- the twin's side -------------------------------------------------------------------------------


def frame_of(spark: SparkSession, rows: list[Row]) -> DataFrame:
    """The rows in the input layout."""
    return spark.createDataFrame(
        [(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.seq) for r in rows], RAW_SCHEMA
    )


def twin(
    spark: SparkSession, ref: JoinRef, rows: list[Row], partitions: int, close_inputs: bool = False
) -> Outcome:
    return outcome_of(run_twin(spark, ref, frame_of(spark, rows), partitions, close_inputs=close_inputs))


def outcome_of(output: TwinOutput) -> Outcome:
    """The twin's results, dead letters, null values and counters (its records unpersisted)."""
    try:
        records = output.records.collect()
        results = output.results.select("partition", "fingerprint", "ts").collect()
    finally:
        output.unpersist()
    out = Outcome(Counter((r["partition"], r["fingerprint"], r["ts"]) for r in results), [],
                  {"left": 0, "right": 0}, {})  # fmt: skip
    names = {status: COUNTER_OF[status] for status in output.counters}
    for r in records:
        if r["status"] == "dead_letter":
            out.letters.append((r["topic"], r["partition"], r["offset"], r["category"], r["reason"]))
        elif r["status"] == "null_value":
            out.null_values[r["side"]] += 1
        elif r["status"] in names:
            mine = out.counters.setdefault(r["partition"], dict.fromkeys(names.values(), 0))
            mine[names[r["status"]]] += 1
    return out


# -- inputs ------------------------------------------------------------------------------------


def mostly(good: st.SearchStrategy[Any], *rest: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` three times in four, else one of `rest` (`st.one_of` draws its branches evenly,
    repeated or not): a result needs good records of one key on both inputs. Shrinks to `good`."""
    return st.integers(0, 3).flatmap(lambda n: good if n < 3 else st.one_of(*rest))
