"""The join's own topics: created with its partition count, the changelog compacted; or, on a
cluster where someone else creates topics, checked to be there as they must be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError, for_code
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from assignor import clients
from assignor.clients import Settings

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


# -- topic ids (KIP-516): what tells a topic from another of the same name -------------------


class _Uuid(AbstractType[bytes]):
    """Kafka's UUID: 16 bytes as they are."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return bytes(value).ljust(16, b"\0")[:16]

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        return data.read(16)


class _MetadataResponseV10(Response):
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),  # fmt: skip
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),  # fmt: skip
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


class _MetadataRequestV10(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 10
    RESPONSE_TYPE = _MetadataResponseV10
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)),
        ),  # fmt: skip
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _TopicIdsRequest(Request[_MetadataRequestV10]):
    """Metadata v10, the first version whose answer holds topic ids (Kafka 2.8+)."""

    API_KEY = 3

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def build(self, request_struct_class: type[_MetadataRequestV10]) -> _MetadataRequestV10:
        topics: list[tuple[bytes, str, dict[str, object]]] = [(bytes(16), name, {}) for name in self.names]
        return request_struct_class(topics, False, False, False, {})


async def topic_ids(connection: str | Settings, names: Sequence[str]) -> dict[str, str]:
    """Each existing topic's id, as the broker's metadata reports it (hex): a topic deleted and
    created again under the same name gets a new one. Topics the broker does not know, or
    has no id for (Kafka before 2.8: no Metadata v10, or an all-zero id), are left out;
    a broker that cannot answer this gives {}. Never creates a topic."""
    if not names:
        return {}
    try:
        response = await clients.ask_any(clients.settings_of(connection), _TopicIdsRequest(names))
    except (IncompatibleBrokerVersion, NotImplementedError):  # a broker older than Kafka 2.8
        return {}
    found: dict[str, str] = {}
    for error_code, name, topic_id, *_ in response.topics:
        if error_code == 0 and name and any(topic_id):
            found[name] = topic_id.hex()
    return found
