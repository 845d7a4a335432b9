"""Workers of the reference app on a secured broker: TLS, and SASL over TLS, with every
client the workers open (Faust's, and Tandem's own: the start-up probes, the topic admin,
the restore and standby consumers) going through the app's own settings.

The embedded broker sits behind a TLS and SASL front (tests/secure_kafka.py) and
advertises only the front's port, so a client that ignored the settings could not connect
at all: the front logs every refusal, and the test asserts there was none. The workers join,
one is SIGKILLed and the survivor takes over (restore and standby over the secured
connection), and every expected result arrives. A known secret (the SASL password) must
never show in the logs, the view, the pages, /metrics or the dead letters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cluster import wait_for
from assignor import clients
from tables.testing import EmbeddedBroker
from tests.secure_kafka import SecuredBroker
from tests.workers import cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

MODES = {
    "tls": {"tls": True, "sasl": False, "mechanism": "PLAIN"},
    "sasl-scram-over-tls": {"tls": True, "sasl": True, "mechanism": "SCRAM-SHA-512"},
    "sasl-plain": {"tls": False, "sasl": True, "mechanism": "PLAIN"},
}


@pytest.mark.parametrize("mode", ["tls", "sasl-scram-over-tls"])
def test_workers_join_fail_over_and_restore_through_a_secured_broker(
    mode: str, unique: str, tmp_path: Path
) -> None:
    spec = MODES[mode]
    with SecuredBroker(tls=spec["tls"], sasl=spec["sasl"], work_dir=tmp_path / "secured") as secured:
        config = secured.write_client_config(tmp_path / "client.properties", spec["mechanism"])
        connection = secured.aiokafka_settings(spec["mechanism"])
        env = {"TANDEM_CLIENT_CONFIG": str(config)}
        with cluster(secured.broker, unique, tmp_path, connection, env) as c:
            workers = [c.worker("w1", "host-a").start(), c.worker("w2", "host-b").start()]
            c.wait_covered(timeout=90)
            traffic = c.traffic(unique)
            c.send(traffic, 200)
            assert traffic.expected <= c.joins(traffic.expected, timeout=60)
            victim = max(workers, key=lambda w: len(w.join()["actives"]))  # type: ignore[index]
            victim.kill()
            c.send(traffic, 200)
            c.wait_covered(timeout=90)
            (survivor,) = c.live()
            join_ids = c.joins(traffic.expected, timeout=60)
            assert traffic.expected <= join_ids, f"missing {len(traffic.expected - join_ids)}"
            assert join_ids <= traffic.expected
            view = survivor.join()
            assert view is not None and sorted(view["actives"]) == list(range(6))
            assert view["last_rebalance"]["moved_warm"], view["last_rebalance"]  # standbys, tailed over TLS
            letters = c.read(c.settings.dead_letters, lambda rs: len(rs) >= traffic.bad, 30)
            pages = [
                survivor.get("/tandem/", timeout=10),
                survivor.html(),
                survivor.html("/tandem/group"),
                survivor.html("/metrics"),
                letters,
                *(w.log_path.read_text() for w in workers),
            ]
        # Every connection went through the front with TLS (and SASL): none was refused.
        assert secured.refusals() == []
        if spec["sasl"]:
            assert secured.authentications(), "no client authenticated"
            assert all(secured.password not in str(page) for page in pages), "the password leaked"
        plaintext = clients.settings_of(secured.bootstrap)
        with pytest.raises(clients.ConnectionFailed):
            asyncio.run(clients.check_connection(plaintext, timeout_s=10))


def test_wrong_credentials_stop_the_worker_in_one_clear_line(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """A worker whose SASL password is wrong stops at once, saying so, instead of retrying."""
    with SecuredBroker(tls=False, sasl=True, work_dir=tmp_path / "secured") as secured:
        config = secured.write_client_config(tmp_path / "client.properties", "PLAIN")
        config.write_text(config.read_text().replace(secured.password, "not-the-password"))
        connection = secured.aiokafka_settings("PLAIN")
        with cluster(
            secured.broker, unique, tmp_path, connection, {"TANDEM_CLIENT_CONFIG": str(config)}
        ) as c:
            worker = c.worker("w1", "host-a").start()
            assert wait_for(lambda: not worker.alive, 60), "the worker kept retrying"
            log = worker.log_path.read_text()
    assert worker.process is not None and worker.process.returncode == 1
    assert "tandem cannot start: Kafka refused the credentials at" in log.splitlines()[-1]
    assert "as 'tandem'" in log and "Traceback" not in log
    assert "not-the-password" not in log and secured.password not in log
