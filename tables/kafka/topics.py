"""The join's own topics: created with its partition count, the changelog compacted; or, on a
cluster where someone else creates topics, checked to be there as they must be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, for_code

from assignor.faust_adapter import clients
from assignor.faust_adapter.clients import Settings

TOPIC_ALREADY_EXISTS = 36
DENIED = {29: "TOPIC_AUTHORIZATION_FAILED", 31: "CLUSTER_AUTHORIZATION_FAILED"}


class TopicsDenied(KafkaError):
    """The broker refused to create topics: the app may not create them (its ACLs)."""

    def __init__(self, topics: Sequence[str], reason: str) -> None:
        super().__init__(f"the broker refused to create {', '.join(topics)}: {reason}")
        self.topics = list(topics)
        self.reason = reason


@dataclass(frozen=True)
class Topic:
    """A topic as the join needs it."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)

    def create_command(self, bootstrap: str, replication_factor: int) -> str:
        """The `kafka-topics.sh` line that creates it as the join needs it."""
        line = (
            f"kafka-topics.sh --bootstrap-server {bootstrap} --create --topic {self.name} "
            f"--partitions {self.partitions} --replication-factor {replication_factor}"
        )
        return line + "".join(f" --config {k}={v}" for k, v in sorted(self.configs.items()))


async def create_topics(
    connection: str | Settings,
    counts: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]] | None = None,
    replication_factor: int = 1,
) -> None:
    """Create topics with their partition counts; existing ones are left as they are. Raises
    `TopicsDenied` when the broker does not let this client create them."""
    admin = clients.admin(clients.settings_of(connection), request_timeout_ms=30000)
    await admin.start()
    try:
        new = [
            NewTopic(name, count, replication_factor, topic_configs=dict((configs or {}).get(name, {})))
            for name, count in counts.items()
        ]
        response = await admin.create_topics(new) if new else None
    finally:
        await admin.close()
    _check_created(response.topic_errors if response is not None else [])


def _check_created(errors: Sequence[tuple[object, ...]]) -> None:
    denied: list[str] = []
    reason = ""
    for name, code, *message in errors:
        if code in (0, TOPIC_ALREADY_EXISTS):
            continue
        if code in DENIED:
            denied.append(str(name))
            reason = f"{DENIED[code]}" + (f" ({message[0]})" if message and message[0] else "")
            continue
        raise for_code(int(code))(f"creating topic {name}: {message[0] if message else ''}")  # type: ignore[call-overload]
    if denied:
        raise TopicsDenied(denied, reason)


async def topic_configs(connection: str | Settings, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each topic's configs as the broker reports them (what was set; defaults may be left out)."""
    if not names:
        return {}
    admin = clients.admin(clients.settings_of(connection), request_timeout_ms=30000)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    finally:
        await admin.close()
    found: dict[str, dict[str, str]] = {}
    for response in responses:
        for _code, _message, _type, name, entries in response.resources:
            found[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return found


def changelog_configs(retention_ms: int | None) -> dict[str, str]:
    """A join changelog's topic settings: compacted, and deleted by time once no record
    in it can still be needed (the join writes no tombstones for expired records)."""
    if retention_ms is None:
        return {"cleanup.policy": "compact"}
    return {"cleanup.policy": "compact,delete", "retention.ms": str(retention_ms)}
