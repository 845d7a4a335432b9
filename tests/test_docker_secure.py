"""docker/secure/make-secrets.sh, run here as the compose file's `secrets` job runs it: the
files the secured brokers and workers are given, and that they fit docker/compose.secure.yaml.

Needs only `sh` and `openssl` (no Docker engine); skipped, saying so, without openssl.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from assignor.clients import (
    aiokafka_kwargs,
    client_config,
    parse_client_config,
    parse_properties,
)

DOCKER = Path(__file__).resolve().parent.parent / "docker"
SCRIPT = DOCKER / "secure" / "make-secrets.sh"
OPENSSL = shutil.which("openssl")

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")


def _make(directory: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SECRETS_DIR": str(directory), "BROKER_UID": str(os.getuid())}
    return subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("secrets")
    done = _make(directory)
    assert done.returncode == 0, done.stdout + done.stderr
    return directory


def _compose_services() -> dict:
    return dict(yaml.safe_load((DOCKER / "compose.secure.yaml").read_text())["services"])


def _jaas_users(text: str) -> dict[str, str]:
    return dict(re.findall(r'user_(\w+)="([^"]+)"', text))


def test_each_broker_gets_a_key_store_for_its_host_name(secrets: Path) -> None:
    broker = secrets / "broker"
    store_password = (broker / "keystore_creds").read_text()
    assert store_password == (broker / "key_creds").read_text() and len(store_password) == 32
    for name, service in _compose_services().items():
        if not name.startswith("kafka-"):
            continue
        keystore = broker / service["environment"]["KAFKA_SSL_KEYSTORE_FILENAME"]
        assert keystore.exists(), keystore
        # The store opens with the password the image reads, and holds the key and the chain.
        opened = subprocess.run(
            [
                "openssl",
                "pkcs12",
                "-in",
                str(keystore),
                "-passin",
                f"file:{broker / 'keystore_creds'}",
                "-nodes",
            ],
            capture_output=True,
            text=True,
        )
        assert opened.returncode == 0, opened.stderr
        assert "PRIVATE KEY" in opened.stdout and opened.stdout.count("BEGIN CERTIFICATE") == 2
        verified = subprocess.run(
            [
                "openssl",
                "verify",
                "-CAfile",
                str(broker / "ca.pem"),
                "-verify_hostname",
                name,
                str(broker / f"{name}.pem"),
            ],
            capture_output=True,
            text=True,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    assert not (broker / "ca.key").exists()  # nothing can sign another certificate


def test_the_workers_get_the_ca_and_their_client_config_only(secrets: Path) -> None:
    tandem = secrets / "tandem"
    assert sorted(p.name for p in tandem.iterdir()) == ["ca.pem", "tandem.properties"]
    config = parse_client_config((tandem / "tandem.properties").read_text())
    assert (config.security_protocol, config.sasl_mechanism, config.sasl_username) == (
        "SASL_SSL",
        "PLAIN",
        "tandem",
    )
    # Its CA path is where the compose file mounts the volume; the password is the broker's.
    mount = next(v for v in _compose_services()["worker-1"]["volumes"] if v.startswith("tandem-secrets:"))
    assert config.ssl_ca_location == f"{mount.split(':')[1]}/ca.pem"
    users = _jaas_users((secrets / "broker" / "broker_jaas.conf").read_text())
    assert users["tandem"] == config.sasl_password
    local = client_config(
        {
            **parse_properties((tandem / "tandem.properties").read_text()),
            "ssl.ca.location": str(tandem / "ca.pem"),
        }
    )
    assert aiokafka_kwargs(local)["ssl_context"].get_ca_certs()


def test_the_admin_config_is_java_style_and_matches_the_jaas_users(secrets: Path) -> None:
    admin = parse_client_config((secrets / "broker" / "admin.properties").read_text())
    assert admin.security_protocol == "SASL_SSL" and admin.sasl_username == "admin"
    assert _jaas_users((secrets / "broker" / "broker_jaas.conf").read_text())["admin"] == admin.sasl_password
    assert admin.ssl_ca_location == "/etc/kafka/secrets/ca.pem"


def test_secrets_are_private_and_made_once(secrets: Path) -> None:
    for path in (secrets / "broker").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    before = (secrets / "tandem" / "tandem.properties").read_text()
    again = _make(secrets)
    assert again.returncode == 0 and "already made" in again.stdout
    assert (secrets / "tandem" / "tandem.properties").read_text() == before
