"""What a worker checks and creates for a join before it joins its consumer group.

A join whose inputs are not co-partitioned would silently lose most of its
results, so the worker refuses to start instead, naming the topics and counts.
"""

from __future__ import annotations

import logging

from assignor.clients import Settings, bootstrap_of
from assignor.faust_adapter import CopartitionError, broker_partition_counts
from tables.kafka.topics import Topic, TopicsDenied, changelog_configs, create_topics, topic_configs
from tables.spec import JoinSpec

log = logging.getLogger(__name__)


class JoinStartupError(RuntimeError):
    """A join cannot start as declared; the message names what to change."""


async def prepare_topics(spec: JoinSpec, settings: Settings, create: bool = True) -> int:
    """Check the join's topics and create the missing ones (`create`), or, where someone else
    creates topics (`create` False: TANDEM_CREATE_TOPICS=false), check that every one is there
    as the join needs it. Returns the join's partition count."""
    own = [spec.changelog_topic, spec.dead_letter_topic, *([spec.audit_topic] if spec.audit else [])]
    sources = spec.source_topics
    global_table = [spec.right.name] if spec.is_global else []  # read whole: any partition count
    counts = await broker_partition_counts(
        settings, {*spec.input_topics, *own, *spec.table_changelogs(), *sources, *global_table}
    )
    missing_sources = [t for t in sources if t not in counts]
    if missing_sources:
        raise JoinStartupError(f"join {spec.name!r}: input topic(s) {missing_sources} do not exist")
    inputs = {t: counts[t] for t in spec.input_topics if t in counts}
    if len(set(inputs.values())) > 1:
        listed = ", ".join(f"{t}={n}" for t, n in sorted(inputs.items()))
        raise CopartitionError(
            f"join {spec.name!r} needs its inputs co-partitioned (one partition count), but: {listed}"
        )
    # Both inputs rekeyed, their repartition topics not made yet: as many as the larger source.
    partitions = next(iter(inputs.values()), None) or max((counts[t] for t in sources), default=None)
    partitions = partitions or _declared_count(spec)
    for topic in own:
        if topic in counts and counts[topic] != partitions:
            raise JoinStartupError(
                f"join {spec.name!r}: topic {topic!r} has {counts[topic]} partitions, its inputs {partitions}"
                " (delete it, or give the join a new name)"
            )
    needed = join_topics(spec, partitions)
    for table in global_table:
        if table not in counts:  # created, or asked for, like a missing input
            needed.append(Topic(table, int(spec.right.topic.partitions or spec.app.conf.topic_partitions)))
    if create:
        await _create_missing(spec, settings, needed, counts, inputs)
    else:
        await _check_precreated(spec, settings, needed, counts)
    _check_tables(spec, counts, partitions)
    return partitions


def join_topics(spec: JoinSpec, partitions: int) -> list[Topic]:
    """Every topic the join needs of the broker: its inputs (a rekeyed input's repartition
    topic, made here like the changelog), its changelog (compacted, deleted after its kind's
    retention), its dead-letter topic and, with `audit`, its audit topic, with one partition
    count."""
    return [
        *(Topic(name, partitions) for name in spec.input_topics),
        Topic(spec.changelog_topic, partitions, changelog_configs(spec.kind.retention_ms())),
        Topic(spec.dead_letter_topic, partitions),
        *([Topic(spec.audit_topic, partitions)] if spec.audit else []),
    ]


async def _create_missing(
    spec: JoinSpec, settings: Settings, needed: list[Topic], counts: dict[str, int], inputs: dict[str, int]
) -> None:
    app = spec.app
    repartitions = {r.name for r in spec.repartitions}
    inputs_and_table = {*spec.input_topics, spec.right.name}  # a global table: asked for like an input
    missing_inputs = [
        t.name
        for t in needed
        if t.name in inputs_and_table and t.name not in counts and t.name not in repartitions
    ]
    if missing_inputs and not app.conf.topic_allow_declare:
        raise JoinStartupError(f"join {spec.name!r}: input topic(s) {missing_inputs} do not exist")
    missing = [t for t in needed if t.name not in counts]
    if not missing:
        return
    log.info("tandem: join %r: creating %s", spec.name, ", ".join(t.name for t in missing))
    try:
        await create_topics(
            settings,
            {t.name: t.partitions for t in missing},
            {t.name: dict(t.configs) for t in missing},
            app.conf.topic_replication_factor,
        )
    except TopicsDenied as denied:
        raise JoinStartupError(
            f"join {spec.name!r}: the broker does not let this app create {', '.join(denied.topics)} "
            f'({denied.reason}): have them created (docs/operations.md, "Secured clusters") and set '
            "TANDEM_CREATE_TOPICS=false"
        ) from None


async def _check_precreated(
    spec: JoinSpec, settings: Settings, needed: list[Topic], counts: dict[str, int]
) -> None:
    """TANDEM_CREATE_TOPICS=false: every topic there, with its partition count and, for the
    changelog, compaction; else one error listing each problem and the line that fixes it."""
    present = [t.name for t in needed if t.name in counts]
    configs = await topic_configs(settings, present)
    bootstrap, replication = bootstrap_of(settings), spec.app.conf.topic_replication_factor
    problems = []
    for topic in needed:
        if topic.name not in counts:
            problems.append(f"{topic.name} is missing: {topic.create_command(bootstrap, replication)}")
        elif counts[topic.name] != topic.partitions:
            problems.append(
                f"{topic.name} has {counts[topic.name]} partitions, the join needs {topic.partitions}"
            )
        elif "compact" in topic.configs.get("cleanup.policy", "") and "compact" not in configs.get(
            topic.name, {}
        ).get("cleanup.policy", ""):
            wanted = topic.configs["cleanup.policy"]
            problems.append(
                f"{topic.name} is not compacted: kafka-configs.sh --bootstrap-server {bootstrap} --alter "
                f"--entity-type topics --entity-name {topic.name} --add-config cleanup.policy=[{wanted}]"
            )
    if problems:
        raise JoinStartupError(f"join {spec.name!r} (TANDEM_CREATE_TOPICS=false): " + "; ".join(problems))


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
