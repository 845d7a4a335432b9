"""A join's input on this worker, from fetched records to the events its operators take
(Kafka Streams' PartitionGroup, with the record checks in front).

Per input partition it checks each fetched record (partitioner, then its side's codec: bad
ones become dead letters, null values are counted), holds the good ones in the aligner
(tables/records/alignment.py) and releases each partition's records in event-time order
across the join's inputs. It pauses an input the aligner holds too much of (left out of
fetches) and keeps what was already fetched of it aside, unchecked, until it is resumed.
It knows, per input partition, the next offset to read and the offset Faust may commit:
never past a record still held. Records read again that the partition's state already holds
(after a restart, a takeover or a rebalance: tables/records/positions.py) are skipped and
counted as re-reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from faust.types import TP

from tables.kafka.consumer import InputRecord
from tables.operators.base import InputEvent, Side
from tables.records.alignment import Aligner
from tables.records.codecs import Rejected, SideCodec
from tables.records.partitioners import find_misplaced, misplaced_reason
from tables.records.positions import InputPosition
from tables.records.sides import Letter, check_records
from tables.runtime.ports import InputOffsets
from tables.runtime.stats import JoinStats
from tables.settings import RuntimeSettings
from tables.spec import JoinSpec

log = logging.getLogger(__name__)

MISPLACED_WARN_EVERY_S = 60.0  # a warning per input at most this often

Fetch = dict[TP, list[InputRecord]]


class Intake:
    """The input side of one join on this worker."""

    def __init__(
        self, spec: JoinSpec, settings: RuntimeSettings, stats: JoinStats, offsets: InputOffsets
    ) -> None:
        self.spec = spec
        self.offsets = offsets  # the inputs' high watermarks and committed offsets
        self.settings = settings
        self.stats = stats
        # Each input topic's side (a self-join's one topic: its records are "left", and its
        # operator takes each in both roles: tables/operators/self_join.py).
        self.sides: dict[str, Side] = {spec.right.name: "right", spec.left.name: "left"}
        self.codecs: dict[Side, SideCodec] = spec.codecs()
        self.aligner: Aligner[InputEvent] = Aligner(
            list(spec.topics),
            max_wait_s=settings.align_max_wait_ms / 1000,
            max_held=settings.align_max_held,
        )
        self.partitions: int | None = None  # the inputs' partition count (start-up check)
        self.ahead: set[TP] = set()  # inputs read far ahead of their partner (Aligner.ahead)
        # Records of those inputs fetched before the pause took effect, kept out of the
        # aligner (in offset order) until their input is resumed: the pause is exact.
        self.deferred: Fetch = {}
        self.read_next: dict[TP, int] = {}  # after the last record taken into a batch
        self.commit_at: dict[TP, int] = {}  # what Faust may commit
        # Partitions read past records without checking any (all of them re-reads): their
        # commit offset moves with this batch, though no record of theirs is in it.
        self.read_past: set[int] = set()
        # How far the state had taken each input partition when it was handed to this task:
        # records below that it holds are re-reads (dropped while the fetches reach it).
        self.resume: dict[TP, InputPosition] = {}
        # Values built on arrival (checked and validated) in this batch, by the id of their
        # bytes, with the bytes kept alive: a result takes one instead of building it again.
        self.built: dict[int, tuple[bytes, Any]] = {}
        self._misplaced_warned: dict[str, float] = {}  # topic -> when its last warning was logged

    # -- a batch's records ------------------------------------------------------------

    def take(self, fetches: list[Fetch], ready: set[int]) -> tuple[list[Fetch], Fetch]:
        """The deferred records now resumed, then `fetches`, in that order, as the batch
        sees them, and the records left out because their partition is not ready (still
        restoring, or not assigned here yet): the caller sets those partitions back so that
        they are read again. Records of paused inputs are deferred."""
        taken: list[Fetch] = []
        not_ready: Fetch = {}
        resumed = self._resume_deferred()
        upto = dict(self.read_next)  # the next offset not yet taken, per input partition
        for fetch in [resumed, *fetches]:
            kept: Fetch = {}
            for tp, records in fetch.items():
                if not records:
                    continue
                if tp.partition not in ready:
                    not_ready.setdefault(tp, []).extend(records)
                    continue
                done = upto.get(tp)
                if done is not None and records[0].offset < done and fetch is not resumed:
                    # Read again for another join of this topic, set back to where that one is
                    # not done (Runtime.rewind): this one has taken these already.
                    records = [r for r in records if r.offset >= done]
                    if not records:
                        continue
                if tp in self.resume and fetch is not resumed:
                    records = self._skip_rereads(tp, records)
                    if not records:
                        continue
                upto[tp] = records[-1].offset + 1
                if fetch is not resumed and (tp in self.ahead or tp in self.deferred):
                    self.deferred.setdefault(tp, []).extend(records)  # after those deferred before
                    continue
                kept[tp] = records
            taken.append(kept)
        return taken, not_ready

    def _skip_rereads(self, tp: TP, records: list[InputRecord]) -> list[InputRecord]:
        """`records` without those the state already holds (counted as re-reads); the resume
        point is dropped once the reads have passed it."""
        position = self.resume[tp]
        if records[-1].offset + 1 >= position.read_next:
            del self.resume[tp]
        if records[0].offset >= position.read_next:
            return records
        done = position.done
        kept = [r for r in records if not done(r.offset)]
        skipped = len(records) - len(kept)
        if skipped:
            rereads = self.stats.rereads
            rereads[tp.partition] = rereads.get(tp.partition, 0) + skipped
        if not kept:  # all done: read past them, and commit past them with this batch
            self.read_next[tp] = max(self.read_next.get(tp, 0), records[-1].offset + 1)
            self.read_past.add(tp.partition)
        return kept

    def positions(self, partition: int) -> dict[str, bytes]:
        """Input topic -> how far the partition has been taken (InputPosition, encoded): to be
        written with the state of a batch that released the partition's records. Not for an
        input still below its resume point: the position the state has stays right."""
        found: dict[str, bytes] = {}
        for topic in self.spec.topics:
            tp = TP(topic, partition)
            read = self.read_next.get(tp)
            if read is not None and tp not in self.resume:
                found[topic] = InputPosition(read, tuple(self.aligner.held_runs(partition, topic))).encode()
        return found

    def resume_from(self, partition: int, positions: Mapping[str, bytes]) -> None:
        """The partition's state has taken its inputs this far (its `positions`): records
        read again below are re-reads."""
        for topic, raw in positions.items():
            position = InputPosition.decode(raw)
            tp = TP(topic, partition)
            if position is not None and tp.topic in self.sides:
                self.resume[tp] = position

    def check(self, tp: TP, records: list[InputRecord], letters: list[Letter]) -> None:
        """Check a partition's fetched records (in offset order): the good ones are held by
        the aligner, the bad ones added to `letters`, null values counted."""
        side = self.sides[tp.topic]
        partition, topic = tp.partition, tp.topic
        self.stats.read[side] += len(records)
        last_read = records[-1].offset
        misplaced = self._misplaced(tp, records)
        if misplaced:
            records = self._letter_misplaced(tp, records, misplaced, letters)
            if not records:  # every record dead-lettered: all of them are done
                self.read_next[tp] = last_read + 1
                return
        checked = check_records(self.codecs[side], side, tp, records, letters, self.built)
        # The others (dead letters, null values) count as read too, up to the last (a fetch of a
        # partition is in offset order).
        self.aligner.add_many(partition, topic, checked.offsets, checked.stamps, checked.events, last_read)
        if checked.nulls:
            self.stats.null_values[side] += checked.nulls
        self.read_next[tp] = records[-1].offset + 1

    def release(self, partition: int) -> list[InputEvent]:
        """Held records of the partition now due, given how far each input has been read."""
        highwater = self.offsets.highwater
        committed = self.offsets.committed()
        ends: dict[str, int | None] = {}
        starts: dict[str, int | None] = {}
        for topic in self.spec.topics:
            tp = TP(topic, partition)
            ends[topic] = highwater(tp)  # None until a fetch has seen it
            starts[topic] = committed.get(tp)
        return self.aligner.release(partition, ends, starts)

    def batch_done(self, partitions: Iterable[int]) -> None:
        """After a batch is committed: move what Faust may commit, and pause or resume inputs."""
        self._move_commit_offsets({*partitions, *self.read_past})
        self.read_past = set()
        self.note_ahead()
        self.built = {}

    # -- the partitioner check -----------------------------------------------------------

    def _misplaced(self, tp: TP, records: list[InputRecord]) -> dict[int, int]:
        """Index -> the partition its key belongs to, for records on the wrong partition: they
        could never meet their partner (a producer with another partitioner)."""
        partitioner, count = self.spec.partitioner, self.partitions
        if partitioner == "none" or not count:
            return {}
        keys = [r.key for r in records]
        return {m.index: m.expected for m in find_misplaced(keys, tp.partition, count, partitioner)}

    def _letter_misplaced(
        self, tp: TP, records: list[InputRecord], misplaced: dict[int, int], letters: list[Letter]
    ) -> list[InputRecord]:
        """Dead-letter the misplaced records (checked first, as the batch twin does); the rest."""
        partitioner = self.spec.partitioner
        for index, expected in misplaced.items():
            record = records[index]
            reason = misplaced_reason(tp.partition, expected, partitioner)
            letters.append((tp.topic, tp.partition, record.offset, record.key, record.value,
                            Rejected(reason, "wrong_partition")))  # fmt: skip
            self.aligner.skip(tp.partition, tp.topic, record.offset)
        now = time.monotonic()
        if now - self._misplaced_warned.get(tp.topic, -MISPLACED_WARN_EVERY_S) >= MISPLACED_WARN_EVERY_S:
            self._misplaced_warned[tp.topic] = now
            example = next(iter(misplaced))
            log.warning(
                "tandem: join %r: %s record(s) of %s read from partition %s belong to another partition "
                "under %s (e.g. offset %s belongs to %s): dead-lettered; check the producer's partitioner",
                self.spec.name, len(misplaced), tp.topic, tp.partition, partitioner,
                records[example].offset, misplaced[example],
            )  # fmt: skip
        return [r for i, r in enumerate(records) if i not in misplaced]

    # -- pausing inputs read far ahead --------------------------------------------------------

    def _resume_deferred(self) -> Fetch:
        """Deferred records of inputs no longer paused, oldest first, to be taken before anything
        fetched after them: per partition up to what fills half the aligner's cap (at least a
        batch, so that an input holding the release back always moves on); the rest stays
        deferred (hours of backlog can be in flight: all of it at once would hit the cap)."""
        resumed: Fetch = {}
        room: dict[int, int] = {}
        half, batch = self.aligner.max_held // 2, self.settings.batch_max_records
        for tp in [tp for tp in self.deferred if tp not in self.ahead]:
            if tp.partition not in room:
                room[tp.partition] = max(half - self.aligner.held(tp.partition), batch)
            take, records = room[tp.partition], self.deferred[tp]
            if take <= 0:
                continue
            if take >= len(records):
                resumed[tp] = self.deferred.pop(tp)
            else:
                resumed[tp], self.deferred[tp] = records[:take], records[take:]
            room[tp.partition] -= len(resumed[tp])
        return resumed

    def note_ahead(self) -> None:
        """Stop fetching the inputs the aligner holds too much of, until their partner catches
        up: what the fetcher is not handed stays on the broker, not in memory."""
        ahead = {TP(t, p) for p, topics in self.aligner.ahead().items() for t in topics}
        if ahead != self.ahead:
            log.debug("tandem: join %r: reads of %s paused (event-time order)", self.spec.name, sorted(ahead))
        self.ahead = ahead

    def _move_commit_offsets(self, partitions: Iterable[int]) -> None:
        read_next, commit_at, first_held = self.read_next, self.commit_at, self.aligner.first_held
        for partition in partitions:
            firsts = first_held(partition)
            for topic in self.spec.topics:
                tp = TP(topic, partition)
                read = read_next.get(tp)
                if read is None:
                    continue
                held = firsts.get(topic)
                commit_at[tp] = read if held is None or read < held else held

    # -- rebalances -------------------------------------------------------------------------

    def forget(self) -> int:
        """Drop every held and deferred record (read again after the rebalance); how many were
        held."""
        held = self.aligner.held()
        self.aligner.forget()
        self.deferred = {}
        self.note_ahead()
        return held

    def hand_over(self, partitions: set[int]) -> int:
        """Partitions handed over (a cooperative revoke): drop what is held or deferred of
        them (their next owner reads it from the committed offset), keeping the offsets that
        are committed for the handover; how many records were held."""
        held = 0
        for partition in partitions:
            held += self.aligner.held(partition)
            self.aligner.drop_partition(partition)
        for tp in [tp for tp in self.deferred if tp.partition in partitions]:
            del self.deferred[tp]
        self.note_ahead()
        return held

    def keep_only(self, active: set[int]) -> None:
        """A new assignment: forget the partitions no longer active here."""
        for partition in set(self.aligner.holding()) - active:
            self.aligner.drop_partition(partition)
        # (A kept partition's deferred records stay: a cooperative round keeps what it fetched.)
        self.deferred = {tp: records for tp, records in self.deferred.items() if tp.partition in active}
        for tp in [tp for tp in self.read_next if tp.partition not in active]:
            self.read_next.pop(tp, None)
            self.commit_at.pop(tp, None)
        for tp in [tp for tp in self.resume if tp.partition not in active]:
            del self.resume[tp]
        self.note_ahead()

    def input_lag(self, partition: int) -> int | None:
        """Input records not yet taken into a batch, over the join's inputs (None: the end, or
        where reading starts, not known yet)."""
        committed = self.offsets.committed()
        total = 0
        for topic in self.spec.topics:
            tp = TP(topic, partition)
            high = self.offsets.highwater(tp)
            position = self.read_next.get(tp)
            if position is None:
                position = committed.get(tp)
            if high is None:
                return None
            if position is None:
                if high == 0:  # an empty input: nothing to read, wherever reading starts
                    continue
                # Just assigned, Faust has not set where it starts yet (counting from 0 showed
                # the whole topic as lag for a moment after each rebalance).
                return None
            total += max(0, high - position)
        return total
