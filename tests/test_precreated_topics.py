"""Topics created by someone else (ACLs that deny applications CreateTopics): with
TANDEM_CREATE_TOPICS=false a worker creates nothing and checks that every topic its join
needs is there as it must be; a worker the broker denies CreateTopics says so in one line.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cluster import wait_for
from tables.kafka.topics import changelog_configs, create_topics
from tables.operators.windowed import DAY_MS
from tables.testing import EmbeddedBroker
from tests.secure_kafka import SecuredBroker
from tests.workers import PARTITIONS, Cluster, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

OFF = {"TANDEM_CREATE_TOPICS": "false", "TOPIC_ALLOW_DECLARE": "false"}
# The reference app's window (app/join.py): after 10 min, grace 1 min.
RETENTION_MS = 10 * 60_000 + 60_000 + DAY_MS


def _create_join_topics(c: Cluster, changelog: bool = True) -> None:
    """What an operator creates for the reference app's join (its dead letters and audit),
    besides its inputs (Faust's own leader topic and the click-through table's changelog,
    which Faust would create)."""
    s = c.settings
    counts = {
        s.dead_letters: PARTITIONS,
        s.audit: PARTITIONS,
        f"{s.app_id}-click-throughs-changelog": PARTITIONS,
    }
    counts[f"{s.app_id}-__assignor-__leader"] = 1
    configs = {}
    if changelog:
        counts[s.changelog] = PARTITIONS
        configs[s.changelog] = changelog_configs(RETENTION_MS)
    asyncio.run(create_topics(c.connection, counts, configs))


def test_with_creation_off_a_worker_runs_on_topics_made_for_it(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path, worker_env=OFF) as c:
        _create_join_topics(c)
        c.worker("w1", "host-a").start()
        c.wait_covered(timeout=60)
        traffic = c.traffic(unique)
        c.send(traffic, 100)
        assert traffic.expected <= c.joins(traffic.expected, timeout=60)


def test_with_creation_off_a_missing_topic_stops_the_worker_naming_the_fix(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path, worker_env=OFF) as c:
        _create_join_topics(c, changelog=False)
        worker = c.worker("w1", "host-a").start()
        assert wait_for(lambda: not worker.alive, 60), "the worker started without its changelog"
        log = worker.log_path.read_text()
        changelog = c.settings.changelog
    assert worker.process is not None and worker.process.returncode != 0
    fix = (
        f"{changelog} is missing: kafka-topics.sh --bootstrap-server {broker.bootstrap} --create "
        f"--topic {changelog} --partitions {PARTITIONS} --replication-factor 1 "
        f"--config cleanup.policy=compact,delete --config retention.ms={RETENTION_MS}"
    )
    assert fix in log
    assert "TANDEM_CREATE_TOPICS=false" in log


def test_a_worker_denied_create_topics_says_so_in_one_line(unique: str, tmp_path: Path) -> None:
    """The front denies CreateTopics of the app's own topics (named after its app id)."""
    deny = f"tandem-test-{unique}-"
    with SecuredBroker(tls=False, sasl=False, deny_create_topics=deny, work_dir=tmp_path / "b") as secured:
        with cluster(secured.broker, unique, tmp_path, secured.bootstrap) as c:
            s = c.settings
            worker = c.worker("w1", "host-a", extra_env={"TOPIC_ALLOW_DECLARE": "false"}).start()
            assert wait_for(lambda: not worker.alive, 60), "the worker started without its topics"
            log = worker.log_path.read_text()
        refusals = secured.refusals()
    assert worker.process is not None and worker.process.returncode != 0
    assert f"the broker does not let this app create {s.changelog}, {s.dead_letters}" in log
    assert "TOPIC_AUTHORIZATION_FAILED" in log and "set TANDEM_CREATE_TOPICS=false" in log
    assert any("CreateTopics" in line for line in refusals)
