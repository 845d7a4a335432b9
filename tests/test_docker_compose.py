"""docker/compose.yaml: valid for docker-compose, three KRaft brokers, labelled workers.

No Docker engine runs here; `docker-compose config` validates and renders the file
without one. Skipped, with the reason, when the binary is absent.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

COMPOSE = Path(__file__).resolve().parent.parent / "docker" / "compose.yaml"
BINARY = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    BINARY is None, reason="docker-compose is not installed (apt-get install -y docker-compose)"
)


@functools.cache
def _compose(*args: str) -> str:
    assert BINARY is not None
    done = subprocess.run([BINARY, "-f", str(COMPOSE), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _services() -> dict[str, str]:
    """The rendered config's text of each service (blocks indented under `services:`)."""
    rendered = _compose("config")
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
