"""What a user's worker exposes (issue 36, findings 5 and 6): a real `faust -A app worker`
of an app written as the README says, with no web or logging settings of its own.

- Its web server listens on 127.0.0.1 unless WEB_BIND (or the app) says otherwise, and
  Faust's `/table/` endpoints (table contents) are off unless the app turns them on.
- At `-l debug`, with SASL PLAIN and SCRAM through the secured front, no log line holds the
  password or the SASL bytes (aiokafka logs every request it sends at DEBUG).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

import pytest

from tables.testing import EmbeddedBroker, WorkerProcess, embedded_env, wait_for
from tests.secure_kafka import SecuredBroker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parent.parent


class DebugWorker(WorkerProcess):
    """A worker started as `faust -A <module> worker -l debug`, on this checkout's code."""

    def start(self) -> Self:
        self.stopped = False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "faust", "-A", self.app_module, "worker", "-l", "debug"],
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **self.env()},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self


def user_worker(broker: str, unique: str, tmp_path: Path, **env: str) -> DebugWorker:
    worker = DebugWorker("w1", "tests.apps.user_app", tmp_path)
    worker.extra_env.update(
        {
            **embedded_env(),
            "BROKER_URL": f"kafka://{broker}",
            "WEB_PORT": str(worker.port),
            "APP_DATADIR": str(tmp_path / "data"),
            "USER_APP_ID": f"user-app-{unique}",
            "USER_APP_PREFIX": f"u{unique}-",
            **env,
        }
    )
    return worker


def listening_addresses(port: int) -> set[str]:
    """The local addresses a socket listens on at `port` (Linux's /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(_address(address))
    return found


def _address(hex_address: str) -> str:
    if len(hex_address) == 8:  # IPv4, little-endian
        return ".".join(str(int(hex_address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return "::" if int(hex_address, 16) == 0 else hex_address


def joined(worker: WorkerProcess) -> bool:
    """The worker holds partitions of its join (a crash fails the test with its log)."""
    worker.check()
    return bool((worker.view() or {}).get("joins", {}).get("paid", {}).get("actives"))


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize(("env", "bound"), [({}, "127.0.0.1"), ({"WEB_BIND": "0.0.0.0"}, "0.0.0.0")])  # noqa: S104
def test_a_user_app_serves_its_pages_on_the_loopback_unless_told_otherwise(
    broker: EmbeddedBroker, unique: str, tmp_path: Path, env: dict[str, str], bound: str
) -> None:
    worker = user_worker(broker.bootstrap, unique, tmp_path, **env).start()
    try:
        assert wait_for(lambda: worker.check() or listening_addresses(worker.port), 60), (
            worker.log_path.read_text()[-3000:]
        )
        assert listening_addresses(worker.port) == {bound}
        assert wait_for(lambda: worker.view() is not None, 60), worker.log_path.read_text()[-3000:]
        assert status(worker.port, "/table/") == 404  # Faust's table contents: off by default
        assert status(worker.port, "/router/") == 200  # who owns what: what the group page shows
    finally:
        worker.stop(15)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_debug_worker_logs_no_sasl_secret(mechanism: str, unique: str, tmp_path: Path) -> None:
    with SecuredBroker(tls=False, sasl=True, work_dir=tmp_path / "secured") as secured:
        worker = user_worker(
            secured.bootstrap,
            unique,
            tmp_path,
            USER_APP_USERNAME=secured.username,
            USER_APP_PASSWORD=secured.password,
            USER_APP_MECHANISM=mechanism,
        ).start()
        try:
            assert wait_for(lambda: joined(worker), 120), worker.log_path.read_text()[-3000:]
        finally:
            worker.stop(15)
        assert secured.authentications(), "no client authenticated"
    log = worker.log_path.read_text(errors="replace")
    sasl_lines = [line for line in log.splitlines() if "SaslAuthenticate" in line]
    assert sasl_lines, "no DEBUG line of the SASL exchange: was the worker at -l debug?"
    assert all("sasl_auth_bytes=[redacted]" in line for line in sasl_lines), sasl_lines[:3]
    assert secured.password not in log
    assert "sasl_auth_bytes=b'" not in log


def test_what_the_app_sets_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """web_bind and web_tables_enabled are the app's where it sets them: a keyword, its config
    object, or the environment (real faust.App objects, configured as a user would)."""
    import faust

    from assignor.faust_adapter import web_defaults

    def configured(**options: object) -> faust.App:
        app = faust.App(f"a-{len(options)}", **options)
        web_defaults.apply(app)
        return app

    plain = configured()
    assert plain.conf.web_bind == "127.0.0.1" and plain.conf.web_tables_enabled is False
    chosen = configured(web_bind="0.0.0.0", web_tables_enabled=True)  # noqa: S104
    assert chosen.conf.web_bind == "0.0.0.0" and chosen.conf.web_tables_enabled is True  # noqa: S104
    from_object = faust.App("from-object")
    from_object.config_from_object({"web_bind": "10.0.0.7"})
    web_defaults.apply(from_object)
    assert from_object.conf.web_bind == "10.0.0.7"
    monkeypatch.setenv("WEB_BIND", "192.0.2.1")
    monkeypatch.setenv("APP_WEB_TABLES_ENABLED", "true")
    from_env = configured(broker="kafka://127.0.0.1:1")
    assert from_env.conf.web_bind == "192.0.2.1" and from_env.conf.web_tables_enabled is True


def test_a_loopback_server_advertised_elsewhere_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """Other workers cannot reach a worker that listens on 127.0.0.1 but advertises another
    host: the worker says so at start (the default changed; multi-machine groups set WEB_BIND)."""
    import asyncio

    import faust

    from assignor.faust_adapter import web_defaults

    for canonical, warned in (("http://worker-2.internal:6066", True), ("http://localhost:6066", False)):
        app = faust.App(f"advertised-{warned}", canonical_url=canonical)
        web_defaults.apply(app)
        caplog.clear()
        asyncio.run(web_defaults.warn_if_unreachable(app))
        assert ("other workers cannot reach it" in caplog.text) is warned, caplog.text


def test_the_mask_hides_remembered_secrets_and_secret_assignments() -> None:
    import logging

    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1

    from assignor import log_masking

    log_masking.install()
    log_masking.remember("pässw0rd-for-the-mask")
    request = SaslAuthenticateRequest_v1(b"\x00u\x00p\xc3\xa4ssw0rd-for-the-mask")
    record = logging.getLogger("aiokafka.conn").makeRecord(
        "aiokafka.conn", logging.DEBUG, __file__, 1, "Request to %s: %s (%s) sasl.password=%s",
        ("h:1", request, b"x", "plain-text-pw"), None,
    )  # fmt: skip
    message = record.getMessage()
    assert "ssw0rd" not in message and "plain-text-pw" not in message, message
    assert "SaslAuthenticateRequest_v1(sasl_auth_bytes=[redacted])" in message
    assert (
        log_masking.mask("a 'pässw0rd-for-the-mask' and b'p\\xc3\\xa4ssw0rd-for-the-mask'").count(
            "[redacted]"
        )
        == 2
    )
