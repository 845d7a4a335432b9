"""docker/compose.yaml: valid for docker-compose, three KRaft brokers, labelled workers;
docker/compose.secure.yaml: the same cluster with only SASL_SSL listeners, ACLs, and workers
that read a client config and create no topics.

No Docker engine runs here; `docker-compose config` validates and renders the file
without one. Skipped, with the reason, when the binary is absent.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parent.parent / "docker" / "compose.yaml"
SECURE_COMPOSE = COMPOSE.with_name("compose.secure.yaml")
BINARY = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    BINARY is None, reason="docker-compose is not installed (apt-get install -y docker-compose)"
)


@functools.cache
def _compose(*args: str, file: Path = COMPOSE) -> str:
    assert BINARY is not None
    done = subprocess.run([BINARY, "-f", str(file), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _services(file: Path = COMPOSE) -> dict[str, str]:
    """The rendered config's text of each service (blocks indented under `services:`)."""
    rendered = _compose("config", file=file)
    body = rendered.split("\nvolumes:")[0]
    blocks = re.split(r"^  (\S+):\n", body, flags=re.M)[1:]
    return dict(zip(blocks[::2], blocks[1::2], strict=True))


def _env(block: str, name: str) -> str:
    found = re.search(rf"^\s+{name}: (.+)$", block, flags=re.M)
    assert found, name
    return found.group(1).strip().strip("'\"")


def test_compose_file_is_valid_and_names_brokers_and_workers() -> None:
    names = _compose("config", "--services").split()
    assert {"kafka-1", "kafka-2", "kafka-3"} <= set(names)
    assert {"worker-1", "worker-2", "worker-3"} <= set(names)


def test_brokers_form_one_kraft_quorum_on_three_racks() -> None:
    services = _services()
    racks = set()
    for n in (1, 2, 3):
        block = services[f"kafka-{n}"]
        assert "apache/kafka" in block
        assert _env(block, "KAFKA_PROCESS_ROLES") == "broker,controller"
        assert _env(block, "KAFKA_NODE_ID") == str(n)
        voters = _env(block, "KAFKA_CONTROLLER_QUORUM_VOTERS")
        assert voters == "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
        racks.add(_env(block, "KAFKA_BROKER_RACK"))
    assert len(racks) == 3


def test_workers_have_host_and_rack_labels_and_standbys() -> None:
    services = _services()
    hosts, racks = set(), set()
    for n in (1, 2, 3):
        block = services[f"worker-{n}"]
        assert "faust" in block or "docker/Dockerfile" in block
        assert _env(block, "TANDEM_BROKER").count("kafka-") == 3
        assert int(_env(block, "TANDEM_STANDBY_REPLICAS")) >= 1
        assert _env(block, "TANDEM_REPLICATION_FACTOR") == "3"
        hosts.add(_env(block, "TANDEM_HOST"))
        racks.add(_env(block, "TANDEM_RACK"))
    assert len(hosts) >= 2 and len(racks) >= 2
    # The app's topics are created with one partition count (co-partitioning); the workers
    # create the join's changelog and dead-letter topic with the inputs' count.
    topics = services["topics"]
    assert topics.count("--partitions 12") == 1 and "TANDEM_PARTITIONS: '12'" in str(services)
    assert "impressions clicks ad-joins" in topics and "changelog" not in topics


# -- docker/compose.secure.yaml ------------------------------------------------------------------


def test_secure_compose_file_is_valid_and_names_its_services() -> None:
    names = set(_compose("config", "--services", file=SECURE_COMPOSE).split())
    assert names == {"secrets", "kafka-1", "kafka-2", "kafka-3", "setup", "worker-1", "worker-2", "worker-3"}


def _secure() -> dict[str, Any]:
    """The secured compose file as docker-compose renders it, parsed."""
    return dict(yaml.safe_load(_compose("config", file=SECURE_COMPOSE))["services"])


def test_secure_brokers_listen_only_with_sasl_ssl_and_enforce_acls() -> None:
    services = _secure()
    for n in (1, 2, 3):
        broker = services[f"kafka-{n}"]
        env = broker["environment"]
        protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert set(protocols.values()) == {"SASL_SSL"}, protocols
        assert {entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")} <= set(protocols)
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"SASL_SSL://kafka-{n}:9092"
        assert env["KAFKA_SSL_KEYSTORE_FILENAME"] == f"kafka-{n}.p12"
        assert "java.security.auth.login.config=/etc/kafka/secrets/broker_jaas.conf" in env["KAFKA_OPTS"]
        assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
        assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
        assert env["KAFKA_SUPER_USERS"] == "User:admin"
        assert "broker-secrets:/etc/kafka/secrets:ro" in broker["volumes"]
        assert broker["depends_on"]["secrets"]["condition"] == "service_completed_successfully"


def test_secure_workers_read_a_client_config_and_create_no_topics() -> None:
    services = _secure()
    for n in (1, 2, 3):
        worker = services[f"worker-{n}"]
        env = worker["environment"]
        assert env["TANDEM_CLIENT_CONFIG"] == "/etc/tandem/secrets/tandem.properties"
        assert "tandem-secrets:/etc/tandem/secrets:ro" in worker["volumes"]
        assert not any("broker-secrets" in v for v in worker["volumes"])
        assert env["TANDEM_CREATE_TOPICS"] == "false" and env["TOPIC_ALLOW_DECLARE"] == "false"
        assert worker["ports"] == [f"127.0.0.1:{6065 + n}:6066/tcp"]  # the host's loopback only
        assert worker["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    setup = "\n".join(services["setup"]["command"])
    # Everything the app needs is created by the admin; the tandem user gets no Create.
    for topic in ("impressions", "clicks", "ad-joins", "tandem-ad-join-ad-join-changelog",
                  "tandem-ad-join-ad-join-dead-letters", "tandem-ad-join-click-throughs-changelog",
                  "tandem-ad-join-__assignor-__leader"):  # fmt: skip
        assert f"{topic}" in setup, topic
    assert "cleanup.policy=compact,delete" in setup and "--allow-principal User:tandem" in setup
    assert set(re.findall(r"--operation (\w+)", setup)) == {"Read", "Write", "Describe", "DescribeConfigs"}
