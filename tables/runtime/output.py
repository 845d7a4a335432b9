"""A join's output on this worker (Kafka Streams' RecordCollector): the handler's
`send_soon` records, the changelog messages of the Faust tables it updated, and the batch's
dead letters, produced as whole record batches and acknowledged before the batch commits.

Nothing one record holds can make the batch fail for ever (docs/reliability.md, "Hostile input"):
a dead letter keeps at most `LETTER_KEEPS_BYTES` of the record's key and value (their full
length and SHA-256 kept beside), and a record no broker would take (over the producer's
`max_request_size`) is not sent: a result is dead-lettered, a letter skipped with an error
logged and counted (`JoinStats.letters_skipped`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from faust.types import AppT
from faust.types.tuples import FutureMessage

from tables.compiled import CompiledPart
from tables.kafka.batches import RecordsTooLarge, producer_of, start_sending
from tables.kafka.handler_sends import collected_records, fail_sends, send_record, settle_sends
from tables.operators.base import Match, fingerprint
from tables.records.codecs import Rejected
from tables.records.partitioners import partitions_for
from tables.records.sides import Letter
from tables.runtime.results import Outgoing
from tables.runtime.stats import JoinStats
from tables.spec import JoinSpec

Record = tuple[bytes | None, bytes | None, Any]  # key, value, headers
# This process, in the audit records' writer (with the join's assignment count).
PROCESS = f"{os.getpid():x}-{uuid.uuid4().hex[:8]}"
# What a dead letter keeps of a record's key and of its value: the first 16 KiB each, as text
# (a byte may take 6 as JSON text, "\u0001"), so that a letter stays near 200 KB at most, within
# any broker's message limit, whatever the record. What is cut is named by its length and hash.
LETTER_KEEPS_BYTES = 16 * 1024
LETTER_REASON_CHARS = 1000  # a `validate` reason is the app's own text: cut as well
log = logging.getLogger(__name__)


class Collector:
    """Everything one join sends on this worker."""

    def __init__(self, spec: JoinSpec, send_batch_bytes: int, stats: JoinStats) -> None:
        self.spec = spec
        self.app: AppT = spec.app
        self.send_batch_bytes = send_batch_bytes
        self.stats = stats
        self.partitions: int | None = None  # the inputs' partition count (start-up check)
        self.outbox: list[Outgoing] = []  # the handler's send_soon records
        # Faust sends the handler queued with their partition known (its tables' changelogs),
        # produced with the batch's output (tables/kafka/handler_sends.py).
        self.faust_sends: list[FutureMessage] = []
        # With the join's `audit` option: the batch's audit records by partition, and who writes them.
        self.audited: dict[int, list[Record]] = {}
        self.writer = PROCESS

    def audit(self, feed: list[tuple[int, Match]], idle: bool = False) -> None:
        """One audit record per result handed to the handler (`audit_value` below; its fingerprint:
        tables/operators/base.py), sent with the batch's output to the result's partition of the
        audit topic (`idle`: the results were released by an idle partition's clock).
        Compiled where it is built (`AUDIT`: one call for the batch's results), except for idle
        releases, which are rare and whose records carry one more field; `python_audit` is its
        reference."""
        fast = AUDIT.fast
        if fast is not None and not idle:
            fast(feed, self.audited, self.writer, audit_value, orjson.dumps, hashlib.blake2b)
        else:
            self.python_audit(feed, idle)

    def python_audit(self, feed: list[tuple[int, Match]], idle: bool = False) -> None:
        audited, writer = self.audited, self.writer
        for partition, match in feed:
            # The partition's list before the value, as the compiled loop makes it.
            records = audited.setdefault(partition, [])
            records.append((match.key, audit_value(partition, match, writer, idle), ()))

    async def send(self, letters: list[Letter]) -> None:
        """The handler's sends, its tables' changelogs, the audit records and the dead letters,
        in whole batches; then Faust's own pending sends (the handler's other `topic.send()`s); all
        acknowledged."""
        producer = producer_of(self.app)
        size = self.send_batch_bytes
        outbox, self.outbox[:] = list(self.outbox), []
        acks: list[tuple[Awaitable[Any], int]] = []
        for (topic, partition), records in (await self._by_partition(outbox)).items():
            acks += await self._start_results(producer, topic, partition, records, letters)
            await asyncio.sleep(0)  # encoding a batch's results per partition: the loop's turn between
        faust_acks = await self._start_faust_sends(producer, size, letters)
        audited, self.audited = self.audited, {}
        for partition, records in audited.items():
            acks += await start_sending(producer, self.spec.audit_topic, partition, records, batch_bytes=size)
        for partition, records in self._letters(letters).items():
            acks += await self._start_letters(producer, partition, records)
        for letter in letters:
            self.stats.dead_letters[letter[5].category] += 1
        await self.app.producer.flush()
        for future, _ in acks:
            await future
        for futs, sent in faust_acks:
            try:
                metadata = [(await future, count) for future, count in sent]
            except BaseException as error:
                fail_sends(futs, error)
                raise
            settle_sends(futs, metadata)

    async def _start_results(
        self, producer: Any, topic: str, partition: int, records: list[Record], letters: list[Letter]
    ) -> list[tuple[Awaitable[Any], int]]:
        """Start producing the handler's records to one partition; one too large for any broker
        is dead-lettered instead (retried, it would be refused for ever)."""
        try:
            return await start_sending(producer, topic, partition, records, batch_bytes=self.send_batch_bytes)
        except RecordsTooLarge as refused:
            letters += [self._unsendable(refused, records[i], size) for i, size in refused.too_large.items()]
            rest = [r for i, r in enumerate(records) if i not in refused.too_large]
            return await start_sending(producer, topic, partition, rest, batch_bytes=self.send_batch_bytes)

    async def _start_faust_sends(
        self, producer: Any, size: int, letters: list[Letter]
    ) -> list[tuple[list[FutureMessage], list[tuple[Awaitable[Any], int]]]]:
        """Start producing the Faust messages the handler queued (its tables' changelogs), per
        topic and partition in the order queued; what to await and settle. A message too large
        for any broker fails (its future says why, as Faust's would) and is dead-lettered."""
        sends, self.faust_sends[:] = list(self.faust_sends), []
        self.stats.faust_sends += len(sends)
        started = []
        for (topic, partition), futs in collected_records(sends).items():
            records = [send_record(fut) for fut in futs]
            try:
                acks = await start_sending(producer, topic, partition, records, batch_bytes=size)
            except RecordsTooLarge as refused:
                for i, too_large in refused.too_large.items():
                    letters.append(self._unsendable(refused, records[i], too_large))
                    fail_sends([futs[i]], refused)
                futs = [fut for i, fut in enumerate(futs) if i not in refused.too_large]
                records = [r for i, r in enumerate(records) if i not in refused.too_large]
                acks = await start_sending(producer, topic, partition, records, batch_bytes=size)
            started.append((futs, acks))
        return started

    def _unsendable(self, refused: RecordsTooLarge, record: Record, size: int) -> Letter:
        """The dead letter of a record of the handler's that no broker would take."""
        reason = (
            f"a record of the handler's of {size} bytes to {refused.topic} is over the producer's "
            f"max_request_size ({refused.limit} bytes)"
        )
        # Kept on the dead-letter topic's partitions (the join's): the output topic may have more.
        partition = zlib.crc32(record[0] or b"") % (self.partitions or 1)
        return ("", partition, -1, record[0], record[1], Rejected(reason, "too_large"))

    async def _start_letters(
        self, producer: Any, partition: int, records: list[Record]
    ) -> list[tuple[Awaitable[Any], int]]:
        """Start producing dead letters to one partition. A letter too large even when cut
        (a producer's max_request_size below `LETTER_KEEPS_BYTES`) is skipped, counted and
        logged: retried, it would stop the join for ever."""
        topic, size = self.spec.dead_letter_topic, self.send_batch_bytes
        try:
            return await start_sending(producer, topic, partition, records, batch_bytes=size)
        except RecordsTooLarge as refused:
            self.stats.letters_skipped += len(refused.too_large)
            log.error(
                "tandem: join %r skips %d dead letter(s) no broker would take (%s); raise the "
                "producer's max_request_size (producer_max_request_size) to keep them",
                self.spec.name, len(refused.too_large), refused,
            )  # fmt: skip
            rest = [r for i, r in enumerate(records) if i not in refused.too_large]
            return await start_sending(producer, topic, partition, rest, batch_bytes=size)

    async def _by_partition(self, outbox: list[Outgoing]) -> dict[tuple[str, int], list[Record]]:
        """Each record's partition: given, or its key's under Kafka's murmur2 (a whole batch at
        once), or the result's own when the key is the join key and the topic has the join's
        partition count (the input's partitioner was checked to be murmur2)."""
        counts: dict[str, int] = {}
        for topic in {o[0] for o in outbox if o[1] is None}:
            counts[topic] = len(await producer_of(self.app).partitions_for(topic))
        same = self.spec.partitioner == "murmur2"
        unplaced = [
            i
            for i, o in enumerate(outbox)
            if o[1] is None and not (same and o[5] is not None and counts[o[0]] == self.partitions)
        ]
        placed: dict[int, int] = {}
        for topic in {outbox[i][0] for i in unplaced}:
            mine = [i for i in unplaced if outbox[i][0] == topic]
            found = partitions_for([outbox[i][2] for i in mine], counts[topic], "murmur2")  # type: ignore[misc]
            placed.update(zip(mine, found.tolist(), strict=True))
        grouped: dict[tuple[str, int], list[Record]] = {}
        for i, (topic, partition, key, value, headers, same_key) in enumerate(outbox):
            if partition is None:
                partition = placed.get(i, same_key)
            grouped.setdefault((topic, partition), []).append((key, value, headers))  # type: ignore[arg-type]
        return grouped

    def _letters(self, letters: list[Letter]) -> dict[int, list[Record]]:
        return letter_records(self.spec.name, letters)


def letter_records(join: str, letters: list[Letter]) -> dict[int, list[Record]]:
    """Dead letters as JSON (docs/join-semantics.md, "Bad records"), by partition."""
    out: dict[int, list[Record]] = {}
    for topic, partition, offset, key, value, why in letters:
        letter = {
            "join": join,
            "topic": topic or None,
            "partition": partition,
            "offset": offset if offset >= 0 else None,
            "reason": why.reason[:LETTER_REASON_CHARS],
            "category": why.category,
            **_kept("key", key),
            **_kept("value", value),
        }
        letter_key = key if key is None or len(key) <= LETTER_KEEPS_BYTES else key[:LETTER_KEEPS_BYTES]
        out.setdefault(partition, []).append((letter_key, orjson.dumps(letter), ()))
    return out


# tables/operators/_fastjoin.pyx's `audit_many`, where it is built and in use (`AUDIT.active`).
AUDIT: CompiledPart[Callable[..., None]] = CompiledPart(
    "tables.operators._fastjoin", lambda module: module.audit_many, "the audit records' fingerprints"
)


def audit_value(partition: int, match: Match, writer: str, idle: bool = False) -> bytes:
    """An audit record's value (JSON): the result's partition, timestamp and fingerprint (hex),
    and its writer, this process and the join's assignment (copies of a result by two writers
    were handed over again after a crash or a rebalance: at least once); `"idle": true` for a
    result released by an idle partition's clock (the `idle` option), which the batch twin
    cannot know of."""
    found = fingerprint(match.key, match.left, match.right, match.timestamp)
    record: dict[str, object] = {
        "partition": partition, "ts": match.timestamp, "fingerprint": found.hex(), "writer": writer
    }  # fmt: skip
    if idle:
        record["idle"] = True
    return orjson.dumps(record)


def handler_error_letter(partition: int, match: Match, reason: str) -> Letter:
    """The dead letter of a result that made the handler raise: both sides and the time."""
    value = orjson.dumps(
        {"left": _text(match.left), "right": _text(match.right), "timestamp": match.timestamp}
    )
    return ("", partition, -1, match.key, value, Rejected(reason[:500], "handler_error"))


def _kept(name: str, raw: bytes | None) -> dict[str, Any]:
    """A key or value in a dead letter, as text: whole up to LETTER_KEEPS_BYTES, else its
    first LETTER_KEEPS_BYTES bytes with `<name>_bytes` (its length) and `<name>_sha256`."""
    if raw is None or len(raw) <= LETTER_KEEPS_BYTES:
        return {name: _text(raw)}
    return {
        name: _text(raw[:LETTER_KEEPS_BYTES]),
        f"{name}_bytes": len(raw),
        f"{name}_sha256": hashlib.sha256(raw).hexdigest(),
    }


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")
