"""What the broker says of topics, read with short-lived clients: partition counts (the
start-up check) and end offsets (the leader's warm-up planning, Faust's table recovery).

End offsets can come from fetch responses' high watermarks instead of ListOffsets, which the
embedded broker answers short when a batch holds several records
(docs/embedded-broker.md).
"""

from __future__ import annotations

import asyncio
import logging

import aiokafka
from faust.types import TP

from assignor import clients, internals
from assignor.clients import Settings

log = logging.getLogger(__name__)


async def fetched_high_watermarks(
    settings: Settings, tps: list[TP], timeout_s: float = 30.0
) -> dict[TP, int]:
    """Each partition's high watermark as a fetch response reports it (correct on every broker)."""
    if not tps:
        return {}  # a worker with only standbys: aiokafka's end_offsets([]) never returns
    probe = _probe(settings)
    await probe.start()
    try:
        wanted = [aiokafka.TopicPartition(tp.topic, tp.partition) for tp in tps]
        marks = await _fetched_marks(probe, wanted, timeout_s)
        return {TP(tp.topic, tp.partition): mark for tp, mark in marks.items()}
    finally:
        await probe.stop()


def _probe(settings: Settings) -> aiokafka.AIOKafkaConsumer:
    return clients.consumer(settings, fetch_max_wait_ms=100, enable_auto_commit=False)


async def _fetched_marks(
    probe: aiokafka.AIOKafkaConsumer, wanted: list[aiokafka.TopicPartition], timeout_s: float
) -> dict[aiokafka.TopicPartition, int]:
    probe.assign(wanted)
    ends = await probe.end_offsets(wanted)  # short by up to a batch: read its last batch
    for tp in wanted:
        probe.seek(tp, max(0, int(ends[tp]) - 1))
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        marks = {tp: probe.highwater(tp) for tp in wanted}
        if None not in marks.values():
            return {tp: int(mark) for tp, mark in marks.items()}
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no high watermark for {[tp for tp, m in marks.items() if m is None]}")
        await probe.getmany(timeout_ms=200, max_records=1)


async def end_offsets(
    settings: Settings, topics: set[str], from_fetch: bool, timeout_s: float
) -> dict[str, dict[int, int]]:
    """topic -> partition -> end offset of every partition of the topics that exist: from fetch
    responses' high watermarks (`from_fetch`, for a broker whose ListOffsets is short) or from
    ListOffsets. Raises TimeoutError after `timeout_s`; the caller decides what that means."""
    probe = _probe(settings)

    async def lookup() -> dict[aiokafka.TopicPartition, int]:
        await probe.start()
        cluster = await probe._client.fetch_all_metadata()
        wanted = [
            aiokafka.TopicPartition(t, p)
            for t in sorted(topics)
            for p in sorted(cluster.partitions_for_topic(t) or ())
        ]
        if not wanted:
            return {}
        if from_fetch:
            return await _fetched_marks(probe, wanted, timeout_s)
        return {tp: int(end) for tp, end in (await probe.end_offsets(wanted)).items()}

    try:
        found = await asyncio.wait_for(lookup(), timeout_s)
    finally:
        await probe.stop()
    result: dict[str, dict[int, int]] = {}
    for tp, end in found.items():
        result.setdefault(tp.topic, {})[tp.partition] = end
    return result


async def broker_partition_counts(settings: Settings, topics: set[str]) -> dict[str, int]:
    """Partition counts of the topics that exist on the broker (missing ones are left out)."""
    client = clients.metadata_client(settings)
    try:
        await client.bootstrap()
        cluster = await client.fetch_all_metadata()
    finally:
        await client.close()
    counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
    return {t: n for t, n in counts.items() if n}


internals.require(__name__, aiokafka.AIOKafkaConsumer, "_client", instance=True)
