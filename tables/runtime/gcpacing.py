"""When the worker's garbage collector runs (tables/settings.py, `gc_threshold` and
`gc_batch_threshold`).

Python collects its youngest generation after a number of allocations. Almost everything a
join batch allocates (fetched records, decoded values, held entries, matches, results) is
alive until the batch ends and freed by reference counting right after; a collection in the
middle of a batch walks all of it for nothing, and at the default thresholds those
collections were about a tenth of a worker's CPU on a backlog (docs/bench/worker.md). So a
batch defers the collection: the threshold is raised while it runs and restored after it,
and the collection that fell due runs then, over what survived the batch. Python's own
rules for the older generations are untouched, and a batch that allocates past the raised
threshold (a handler making garbage without end) is still collected.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Deferral:
    """Batches deferring now (several joins' batches interleave on the event loop), and the
    youngest generation's threshold of before the first of them."""

    batches: int = 0
    restore_to: int = 0


_deferral = _Deferral()


def raise_gc_threshold(threshold: int) -> None:
    """Collect garbage less often in a worker: raise the youngest generation's threshold to
    `threshold`, never lower it; 0 changes nothing."""
    first, *older = gc.get_threshold()
    if threshold > first:
        gc.set_threshold(threshold, *older)
        log.info("tandem: garbage collection threshold %s (was %s; TANDEM_GC_THRESHOLD)", threshold, first)


@contextlib.contextmanager
def collection_deferred(threshold: int) -> Iterator[None]:
    """Run a batch with the youngest generation's threshold raised to at least `threshold`
    (0: as it is), restoring the threshold of before when the last deferring batch ends."""
    if not threshold:
        yield
        return
    first, *older = gc.get_threshold()
    if not _deferral.batches:
        _deferral.restore_to = first
    _deferral.batches += 1
    if threshold > first:
        gc.set_threshold(threshold, *older)
    try:
        yield
    finally:
        _deferral.batches -= 1
        if not _deferral.batches:
            gc.set_threshold(_deferral.restore_to, *gc.get_threshold()[1:])
