"""The reference worker with its join body replaced by a no-op: `faust -A
benchmarks.consume_only_app worker` takes the same fetches from the same consumer, with
the same settings, assignor, state start-up and web view as `faust -A app worker`, and
only moves the offsets Faust may commit past what it took (no checks, no alignment, no
join, no output). Its rate is what the runtime reads: the consume-only row of
benchmarks/bench_worker.py.
"""

from __future__ import annotations

from faust.types import TP

import app as _reference
from app.settings import JOIN_NAME
from tables import runtime_of
from tables.kafka.consumer import InputRecord
from tables.runtime.task import JoinTask

app = _reference.app


class ConsumeOnlyTask(JoinTask):
    """A join task whose batch only records how far each input partition was taken."""

    async def _process(self, fetches: list[dict[TP, list[InputRecord]]]) -> None:
        state = self.state
        assert state is not None
        for fetch in fetches:
            for tp, records in fetch.items():
                if records and tp.partition in state.ready:  # as the join: restored ones only
                    self.stats.read[self.intake.sides[tp.topic]] += len(records)
                    self.intake.read_next[tp] = self.intake.commit_at[tp] = records[-1].offset + 1
        self.stats.batches += 1


runtime_of(app).tasks[JOIN_NAME].__class__ = ConsumeOnlyTask
