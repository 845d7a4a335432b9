"""What a worker checks and creates for a join before it joins its consumer group.

A join whose inputs are not co-partitioned would silently lose most of its
results, so the worker refuses to start instead, naming the topics and counts.
"""

from __future__ import annotations

import logging
from typing import Any

from faust.types import AppT

from assignor.faust_adapter.probes import broker_partition_counts
from assignor.group_scenario import CopartitionError
from tables.kafka.topics import changelog_configs, create_topics
from tables.spec import JoinSpec

log = logging.getLogger(__name__)


class JoinStartupError(RuntimeError):
    """A join cannot start as declared; the message names what to change."""


async def prepare_topics(spec: JoinSpec, bootstrap: str) -> int:
    """Check the join's topics, create the missing ones; returns its partition count."""
    app = spec.app
    own = [spec.changelog_topic, spec.dead_letter_topic]
    counts = await broker_partition_counts(
        bootstrap.split(","), {*spec.input_topics, *own, *spec.table_changelogs()}
    )
    inputs = {t: counts[t] for t in spec.input_topics if t in counts}
    if len(set(inputs.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in sorted(inputs.items()))
        raise CopartitionError(
            f"join {spec.name!r} needs its inputs co-partitioned (one partition count), but: {listed}"
        )
    partitions = next(iter(inputs.values()), None) or _declared_count(spec)
    missing = [t for t in spec.input_topics if t not in inputs]
    if missing:
        if not app.conf.topic_allow_declare:
            raise JoinStartupError(f"join {spec.name!r}: input topic(s) {missing} do not exist")
        log.info(
            "tandem: join %r: creating input topic(s) %s with %s partitions", spec.name, missing, partitions
        )
        await create_topics(
            bootstrap, dict.fromkeys(missing, partitions), None, app.conf.topic_replication_factor
        )
    for topic in own:
        if topic in counts and counts[topic] != partitions:
            raise JoinStartupError(
                f"join {spec.name!r}: topic {topic!r} has {counts[topic]} partitions, its inputs {partitions}"
                " (delete it, or give the join a new name)"
            )
    await create_join_topics(spec, bootstrap, partitions, app.conf.topic_replication_factor)
    _check_tables(spec, counts, partitions)
    _check_no_agent_reads(app, spec)
    return partitions


def _declared_count(spec: JoinSpec) -> int:
    declared = [t.partitions for t in (spec.left.topic, spec.right.topic) if t.partitions]
    return int(declared[0] if declared else spec.app.conf.topic_partitions)


def _check_tables(spec: JoinSpec, counts: dict[str, int], partitions: int) -> None:
    for table in spec.tables:
        changelog = table.changelog_topic.get_topic_name()
        found = counts.get(changelog) or table.partitions or spec.app.conf.topic_partitions
        if found != partitions:
            raise JoinStartupError(
                f"join {spec.name!r}: table {table.name!r} has {found} partitions, the join {partitions}:"
                f" declare it with app.Table(..., partitions={partitions})"
            )


def _check_no_agent_reads(app: AppT, spec: JoinSpec) -> None:
    """The runtime takes a join's records out of the consumer's fetches: an agent on the
    same topic would silently see none of them."""
    for agent in app.agents.values():
        channel: Any = getattr(agent, "channel", None)
        topics = set(getattr(channel, "topics", None) or ())
        shared = topics & set(spec.input_topics)
        if shared:
            raise JoinStartupError(
                f"agent {agent.name!r} and join {spec.name!r} both read {sorted(shared)}: the join's "
                "records never reach an agent; handle them in the join's handler, or read another topic"
            )


async def create_join_topics(spec: JoinSpec, bootstrap: str, partitions: int, replication: int = 1) -> None:
    """The join's changelog (compacted, deleted after its kind's retention) and dead-letter
    topic, with the inputs' partition count."""
    await create_topics(
        bootstrap,
        {spec.changelog_topic: partitions, spec.dead_letter_topic: partitions},
        {spec.changelog_topic: changelog_configs(spec.kind.retention_ms())},
        replication,
    )
