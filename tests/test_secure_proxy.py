"""The secured front of the embedded broker (tests/secure_kafka.py): real clients through
TLS, SASL PLAIN and SCRAM, and the refusals a secured Kafka listener gives.

Every client here is real: aiokafka, confluent-kafka (librdkafka) and a Faust worker, on a
real tansu broker whose metadata names only the proxy. Certificates are made by `openssl`
in the test; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import ScramAuthenticator, create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from tables.testing import WorkerProcess, embedded_env, free_port, wait_for
from tests.secure_kafka import (
    API_VERSIONS,
    PLAIN_FAILED,
    SASL_API_VERSIONS,
    KafkaFrontProxy,
    PlainServer,
    SaslFailed,
    ScramCredential,
    ScramServer,
    SecuredBroker,
    ensure_api_versions,
    make_test_certificates,
    scram_failed,
)

REPO = Path(__file__).resolve().parent.parent
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
RECORDS = 12

# -- the protocol pieces, against aiokafka's own client code -----------------------------------


def _api_versions_response(version: int, entries: list[tuple[int, int, int]], tail: bytes) -> bytes:
    body = struct.pack(">ih", 7, 0)
    if version >= 3:
        body += bytes([len(entries) + 1]) + b"".join(struct.pack(">hhh", *e) + b"\x00" for e in entries)
    else:
        body += struct.pack(">i", len(entries)) + b"".join(struct.pack(">hhh", *e) for e in entries)
    return body + tail


def _api_versions(response: bytes, version: int) -> tuple[dict[int, tuple[int, int]], bytes]:
    """Parse back with aiokafka's own response classes (v0-2) or by hand (v3)."""
    from aiokafka.protocol.admin import ApiVersionResponse_v0, ApiVersionResponse_v1

    if version < 3:
        cls = ApiVersionResponse_v0 if version == 0 else ApiVersionResponse_v1
        parsed = cls.decode(response[4:])
        return {k: (lo, hi) for k, lo, hi in parsed.api_versions}, b""
    count = response[6] - 1
    found, offset = {}, 7
    for _ in range(count):
        key, lo, hi = struct.unpack_from(">hhh", response, offset)
        found[key] = (lo, hi)
        offset += 7
    return found, response[offset:]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_answer_names_the_sasl_versions_the_proxy_implements(version: int) -> None:
    tail = b"" if version == 0 else struct.pack(">i", 0) + (b"\x01\x00\x02ab" if version >= 3 else b"")
    upstream = [(0, 0, 9), (3, 0, 12), (36, 0, 5), (API_VERSIONS, 0, 4)]  # too new a SaslAuthenticate
    fixed = ensure_api_versions(_api_versions_response(version, upstream, tail), version, SASL_API_VERSIONS)
    versions, rest = _api_versions(fixed, version)
    assert versions == {0: (0, 9), 3: (0, 12), 17: (0, 1), 36: (0, 2), 18: (0, 4)}
    if version >= 3:
        assert rest == tail  # throttle time and the tagged features, byte for byte
    # An answer that already says so is left as it was; an error answer is never touched.
    assert ensure_api_versions(fixed, version, SASL_API_VERSIONS) == fixed
    error = struct.pack(">ih", 7, 35) + b"\x00\x00\x00\x00"
    assert ensure_api_versions(error, version, SASL_API_VERSIONS) == error


def _run_scram(server: ScramServer, mechanism: str, username: str, password: str) -> None:
    """aiokafka's SCRAM client (its generator, unchanged) against the proxy's SCRAM server."""
    client = ScramAuthenticator(
        loop=None, sasl_plain_password=password, sasl_plain_username=username, sasl_mechanism=mechanism
    )
    reply: bytes | None = None
    while True:
        try:
            token, _ = client._authenticator.send(reply)
        except StopIteration:
            return
        reply, _done = server.step(token)


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_server_accepts_aiokafka_and_refuses_a_wrong_password(mechanism: str) -> None:
    users = {"alice": "right horse battery", "b,o=b": "x"}
    credentials = {name: ScramCredential.from_password(mechanism, pw) for name, pw in users.items()}
    for name, password in users.items():
        server = ScramServer(mechanism, credentials)
        _run_scram(server, mechanism, name, password)  # aiokafka checks the server's signature too
        assert server.username == name
    for name, password in (("alice", "wrong"), ("nobody", "x")):
        with pytest.raises(SaslFailed) as failure:
            _run_scram(ScramServer(mechanism, credentials), mechanism, name, password)
        assert str(failure.value) == scram_failed(mechanism)
        assert "alice" not in str(failure.value)  # Kafka does not say whether the user exists


def test_plain_server_checks_password_and_authorization_id() -> None:
    server = PlainServer({"alice": "pw"})
    assert server.step(b"\x00alice\x00pw") == (b"", True)
    assert PlainServer({"alice": "pw"}).step(b"alice\x00alice\x00pw") == (b"", True)
    for token in (b"\x00alice\x00nope", b"\x00bob\x00pw", b"\x00alice\x00pw\x00"):
        with pytest.raises(SaslFailed):
            PlainServer({"alice": "pw"}).step(token)
    with pytest.raises(SaslFailed, match=PLAIN_FAILED):
        PlainServer({"alice": "pw"}).step(b"\x00alice\x00pwx")
    with pytest.raises(SaslFailed, match="authorization id"):
        PlainServer({"alice": "pw"}).step(b"root\x00alice\x00pw")


def test_test_certificates_verify_strictly(tmp_path: Path) -> None:
    """A TLS handshake between the made server and client contexts, with X.509 strict checks."""
    certificates = make_test_certificates(tmp_path)
    client = certificates.client_context(with_client_cert=True)
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    server = certificates.server_context(require_client_cert=True)

    async def handshake() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peercert")
            writer.write(dict(x[0] for x in peer["subject"])["commonName"].encode() + b"\n")
            await writer.drain()
            writer.close()

        listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server)
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
        )
        line = await reader.readline()
        writer.close()
        listener.close()
        return line.decode().strip()

    assert asyncio.run(handshake()) == "tandem-client"
    # The encrypted copy of the client key opens with its password only.
    client.load_cert_chain(
        certificates.client_cert_file,
        certificates.client_key_encrypted_file,
        password=certificates.key_password,
    )
    with pytest.raises(ssl.SSLError):
        client.load_cert_chain(
            certificates.client_cert_file, certificates.client_key_encrypted_file, password="no"
        )


# -- real clients through a real broker ----------------------------------------------------------

MODES = {"ssl": (True, False), "sasl_plaintext": (False, True), "sasl_ssl": (True, True)}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SecuredBroker]]:
    """One broker behind each kind of listener, for the module (each test has its own topics)."""
    brokers: dict[str, SecuredBroker] = {}
    try:
        for name, (tls, sasl) in MODES.items():
            work_dir = tmp_path_factory.mktemp(name)
            brokers[name] = SecuredBroker(tls=tls, sasl=sasl, work_dir=work_dir).start()
        yield brokers
    finally:
        for broker in brokers.values():
            broker.stop()


def _topic() -> str:
    return f"secured-{uuid.uuid4().hex[:10]}"


async def _aiokafka_round_trip(settings: dict[str, Any], topic: str) -> list[bytes]:
    """Create a topic with the admin client, produce records, read them back."""
    admin = AIOKafkaAdminClient(**settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
        assert topic in await admin.list_topics()
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**settings)
    await producer.start()
    try:
        for i in range(RECORDS):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**settings, fetch_max_wait_ms=100, enable_auto_commit=False)
    await consumer.start()
    seen: list[bytes] = []
    try:
        partitions = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        async with asyncio.timeout(30):
            while len(seen) < RECORDS:
                batch = await consumer.getmany(timeout_ms=300)
                seen.extend(r.value for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return seen


CASES = [("ssl", "PLAIN")] + [(mode, m) for mode in ("sasl_plaintext", "sasl_ssl") for m in ("PLAIN", *SCRAM)]


@pytest.mark.broker
@pytest.mark.parametrize(("mode", "mechanism"), CASES)
async def test_aiokafka_produces_and_reads_back_through_the_proxy(
    secured: dict[str, SecuredBroker], mode: str, mechanism: str
) -> None:
    broker = secured[mode]
    before, refused = len(broker.authentications()), len(broker.refusals())
    seen = await _aiokafka_round_trip(broker.aiokafka_settings(mechanism), _topic())
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(RECORDS))
    assert broker.refusals()[refused:] == []
    if broker.sasl:  # every connection (bootstrap, then each node and the coordinator) logged in
        logins = broker.authentications()[before:]
        assert logins and all(f"'{broker.username}' with {mechanism}" in line for line in logins)


@pytest.mark.broker
async def test_metadata_names_only_the_proxy(secured: dict[str, SecuredBroker]) -> None:
    """A client that bootstraps on the broker's own port is sent to the proxy for everything else."""
    broker = secured["sasl_ssl"]
    client = AIOKafkaClient(bootstrap_servers=broker.broker.bootstrap)
    await client.bootstrap()
    try:
        nodes = {(b.host, b.port) for b in client.cluster.brokers()}
    finally:
        await client.close()
    assert nodes == {("127.0.0.1", broker.proxy_port)}


@pytest.mark.broker
async def test_a_plaintext_client_is_refused_by_the_tls_listener(
    secured: dict[str, SecuredBroker], caplog: pytest.LogCaptureFixture
) -> None:
    broker = secured["ssl"]
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, client_id="plaintext-intruder", request_timeout_ms=5000
    )
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        async with asyncio.timeout(60):
            await producer.start()
    await producer.stop()
    assert time.monotonic() - started < 60
    assert wait_for(lambda: broker.refusals(), timeout=10, interval=0.1)
    # The proxy names the client that bypassed TLS, as the diagnosis needed.
    assert any(
        "plaintext ApiVersions" in line and "'plaintext-intruder' on a TLS listener" in line
        for line in broker.refusals()
    ), broker.refusals()


@pytest.mark.broker
async def test_a_client_that_does_not_trust_the_ca_is_refused(secured: dict[str, SecuredBroker]) -> None:
    broker = secured["ssl"]
    stranger = ssl.create_default_context()  # the system's CAs, not the test CA
    with pytest.raises((ssl.SSLCertVerificationError, KafkaConnectionError)):
        async with asyncio.timeout(60):
            conn = await create_conn(
                "127.0.0.1",
                broker.proxy_port,
                security_protocol="SSL",
                ssl_context=stranger,
                request_timeout_ms=5000,
            )
            conn.close()


@pytest.mark.broker
@pytest.mark.parametrize("mode", ["sasl_plaintext", "sasl_ssl"])
@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
async def test_wrong_credentials_are_an_authentication_error_not_a_hang(
    secured: dict[str, SecuredBroker], mode: str, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker = secured[mode]
    secret = f"not-the-password-{uuid.uuid4().hex[:6]}"
    settings = broker.aiokafka_settings(mechanism, password=secret)
    expected = PLAIN_FAILED if mechanism == "PLAIN" else scram_failed(mechanism)
    # One connection: aiokafka raises the broker's error, with Kafka's message.
    with pytest.raises(SaslAuthenticationFailed, match=expected):
        async with asyncio.timeout(30):
            await create_conn(
                "127.0.0.1",
                broker.proxy_port,
                **{k: v for k, v in settings.items() if k != "bootstrap_servers"},
                request_timeout_ms=5000,
            )
    # A producer: start() fails at once (aiokafka logs the authentication error, then gives up).
    producer = AIOKafkaProducer(**settings, request_timeout_ms=5000)
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        async with asyncio.timeout(30):
            await producer.start()
    await producer.stop()
    assert "SaslAuthenticationFailed" in caplog.text and expected in caplog.text
    # The proxy says who and how, never the password.
    assert wait_for(lambda: any(mechanism in line for line in broker.refusals()), timeout=10, interval=0.1)
    assert any(f"user '{broker.username}' with {mechanism}" in line for line in broker.refusals())
    assert secret not in broker.proxy.log_text()


@pytest.mark.broker
async def test_a_client_without_sasl_is_refused_by_the_sasl_listener(
    secured: dict[str, SecuredBroker],
) -> None:
    broker = secured["sasl_plaintext"]
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, client_id="no-sasl", request_timeout_ms=5000
    )
    with pytest.raises(KafkaConnectionError):
        async with asyncio.timeout(60):
            await producer.start()
    await producer.stop()
    assert wait_for(lambda: any("'no-sasl'" in line for line in broker.refusals()), timeout=10, interval=0.1)
    assert any("Metadata" in line and "before SASL authentication" in line for line in broker.refusals())


@pytest.mark.broker
async def test_an_unsupported_mechanism_is_refused_in_process(secured: dict[str, SecuredBroker]) -> None:
    """KafkaFrontProxy in this event loop, offering only SCRAM-SHA-512: a PLAIN client hears
    UNSUPPORTED_SASL_MECHANISM with the list, as from Kafka."""
    broker = secured["sasl_plaintext"]
    proxy = KafkaFrontProxy(
        ("127.0.0.1", broker.broker.port), users={"alice": "pw"}, mechanisms=["SCRAM-SHA-512"]
    )
    await proxy.start()
    try:
        common = {"security_protocol": "SASL_PLAINTEXT", "request_timeout_ms": 5000}
        with pytest.raises(UnsupportedSaslMechanismError):
            async with asyncio.timeout(30):
                await create_conn(
                    "127.0.0.1", proxy.port, sasl_mechanism="PLAIN", sasl_plain_username="alice",
                    sasl_plain_password="pw", **common,
                )  # fmt: skip
        async with asyncio.timeout(30):
            conn = await create_conn(
                "127.0.0.1", proxy.port, sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                sasl_plain_password="pw", **common,
            )  # fmt: skip
        assert conn.connected()
        conn.close()
    finally:
        await proxy.close()


def _request(api_key: int, version: int, correlation_id: int, body: bytes, flexible: bool = False) -> bytes:
    """A size-prefixed request, header v1 (v2 with `flexible`), client id 'raw'."""
    header = (
        struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw" + (b"\x00" if flexible else b"")
    )
    return struct.pack(">i", len(header) + len(body)) + header + body


async def _response(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


@pytest.mark.broker
async def test_the_wire_forms_no_client_here_sends(secured: dict[str, SecuredBroker]) -> None:
    """SaslHandshake v0 (bare tokens after it) and SaslAuthenticate v2 (compact fields, as
    Java clients send it), byte for byte as the Kafka protocol lays them out."""
    broker = secured["sasl_plaintext"]
    proxy = KafkaFrontProxy(("127.0.0.1", broker.broker.port), users={"alice": "pw"}, mechanisms=["PLAIN"])
    await proxy.start()
    try:
        async with asyncio.timeout(30):
            # SaslHandshake v0, then the PLAIN token bare; then a Metadata v0 goes to the broker.
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(_request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN"))
            assert await _response(reader) == struct.pack(">ihih", 1, 0, 1, 5) + b"PLAIN"
            writer.write(struct.pack(">i", 9) + b"\x00alice\x00pw")
            assert await reader.readexactly(4) == struct.pack(">i", 0)
            writer.write(_request(3, 0, 2, struct.pack(">i", 0)))
            assert (await _response(reader))[:4] == struct.pack(">i", 2)
            writer.close()
            # ... and a wrong password there: the connection closes, with no answer (as Kafka).
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(_request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN"))
            await _response(reader)
            writer.write(struct.pack(">i", 9) + b"\x00alice\x00no")
            assert await reader.read(4) == b""
            writer.close()
            # SaslHandshake v1, then SaslAuthenticate v2: a wrong then a right password.
            for password, error in ((b"no", 58), (b"pw", 0)):
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                writer.write(_request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
                await _response(reader)
                token = b"\x00alice\x00" + password
                writer.write(_request(36, 2, 7, bytes([len(token) + 1]) + token + b"\x00", flexible=True))
                answer = await _response(reader)
                assert answer[:5] == struct.pack(">i", 7) + b"\x00"  # response header v1
                assert struct.unpack(">h", answer[5:7])[0] == error
                if error:
                    length = answer[7] - 1
                    assert answer[8 : 8 + length].decode() == PLAIN_FAILED
                    assert await reader.read(1) == b""
                else:  # null message, empty bytes, session lifetime 0, no tagged fields
                    assert answer[7:] == b"\x00\x01" + struct.pack(">q", 0) + b"\x00"
                writer.close()
    finally:
        await proxy.close()


@pytest.mark.broker
async def test_client_certificates_when_the_listener_requires_them(tmp_path: Path) -> None:
    with SecuredBroker(tls=True, sasl=False, client_auth=True, work_dir=tmp_path) as broker:
        seen = await _aiokafka_round_trip(broker.aiokafka_settings(), _topic())
        assert len(seen) == RECORDS
        assert broker.certificates is not None
        anonymous = broker.certificates.client_context(with_client_cert=False)
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            security_protocol="SSL",
            ssl_context=anonymous,
            request_timeout_ms=5000,
        )
        with pytest.raises(KafkaConnectionError):
            async with asyncio.timeout(60):
                await producer.start()
        await producer.stop()
        assert wait_for(lambda: any("TLS handshake failed" in r for r in broker.refusals()), 10, 0.1)


# -- confluent-kafka (librdkafka) ---------------------------------------------------------------


def _librdkafka_round_trip(properties: dict[str, str], topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(properties)
    for future in admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=20).values():
        future.result(timeout=30)
    producer = Producer(properties)
    for i in range(RECORDS):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**properties, "group.id": f"g-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(seen) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
    finally:
        consumer.close()
    return seen


LIBRDKAFKA_CASES = [
    ("ssl", "PLAIN"),
    ("sasl_plaintext", "PLAIN"),
    ("sasl_ssl", "SCRAM-SHA-256"),
    ("sasl_ssl", "SCRAM-SHA-512"),
]


@pytest.mark.broker
@pytest.mark.parametrize(("mode", "mechanism"), LIBRDKAFKA_CASES)
def test_confluent_kafka_produces_and_reads_back_through_the_proxy(
    secured: dict[str, SecuredBroker], mode: str, mechanism: str
) -> None:
    broker = secured[mode]
    refused = len(broker.refusals())
    seen = _librdkafka_round_trip(broker.client_properties(mechanism), _topic())
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(RECORDS))
    assert broker.refusals()[refused:] == []


@pytest.mark.broker
def test_confluent_kafka_reports_wrong_credentials(secured: dict[str, SecuredBroker]) -> None:
    from confluent_kafka import KafkaError, Producer

    broker = secured["sasl_ssl"]
    errors: list[Any] = []
    properties = {
        **broker.client_properties("SCRAM-SHA-256"),
        "sasl.password": "wrong",
        "error_cb": errors.append,
    }
    producer = Producer(properties)
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    authentication = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert authentication, errors
    assert scram_failed("SCRAM-SHA-256") in authentication[0].str()


# -- a Faust app, in a worker process -------------------------------------------------------------

FAUST_CASES = [
    ("ssl", "ssl_context", "PLAIN"),
    ("ssl", "ssl_credentials", "PLAIN"),
    ("ssl", "ssl_context_credentials", "PLAIN"),
    ("sasl_ssl", "sasl", "PLAIN"),
    ("sasl_plaintext", "sasl", "SCRAM-SHA-256"),
    ("sasl_ssl", "sasl", "SCRAM-SHA-512"),
    ("sasl_ssl", "client_config", "SCRAM-SHA-256"),
    ("ssl", "client_config", "PLAIN"),
]


@pytest.mark.broker
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("mode", "faust_mode", "mechanism"), FAUST_CASES)
def test_a_faust_app_produces_and_consumes_with_its_broker_credentials(
    secured: dict[str, SecuredBroker], tmp_path: Path, mode: str, faust_mode: str, mechanism: str
) -> None:
    broker = secured[mode]
    out = tmp_path / "echo.out"
    env = {
        **embedded_env(),
        "SECURED_BROKER": f"kafka://{broker.bootstrap}",
        "SECURED_APP_ID": f"secured-{uuid.uuid4().hex[:8]}",
        "SECURED_TOPIC": _topic(),
        "SECURED_MODE": faust_mode,
        "SECURED_CA": str(broker.ca_file or ""),
        "SECURED_MECHANISM": mechanism,
        "SECURED_USERNAME": broker.username if broker.sasl else "",
        "SECURED_PASSWORD": broker.password if broker.sasl else "",
        "SECURED_OUT": str(out),
        "SECURED_COUNT": "20",
        "SECURED_DATA_DIR": str(tmp_path / "data"),
        "SECURED_CLIENT_CONFIG": str(broker.write_client_config(tmp_path / "client.properties", mechanism)),
    }
    port = free_port()
    env["SECURED_WEB_PORT"] = str(port)
    worker = WorkerProcess("w1", "tests.apps.secured_echo", tmp_path, env, port=port, cwd=REPO)
    refused_before = len(broker.refusals())
    worker.start()
    try:

        def done() -> bool:
            worker.check()
            return out.exists() and len(out.read_text().splitlines()) >= 20

        assert wait_for(done, timeout=90), worker.log_path.read_text()[-3000:]
    finally:
        worker.stop()
    assert sorted(out.read_text().splitlines()) == sorted(f"record-{i}" for i in range(20))
    # Every connection Faust opened used its settings: the proxy turned none away.
    assert broker.refusals()[refused_before:] == []
    if broker.sasl:
        assert broker.password not in worker.log_path.read_text()


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_a_faust_worker_with_a_wrong_password_stops_with_the_brokers_message(
    secured: dict[str, SecuredBroker], tmp_path: Path
) -> None:
    """Plain Faust's own behaviour (the baseline for Tandem's workers): start-up fails once,
    with the broker's SASL error in the log, and the worker exits; no retry loop."""
    broker = secured["sasl_ssl"]
    wrong = f"wrong-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        **embedded_env(),
        "SECURED_BROKER": f"kafka://{broker.bootstrap}",
        "SECURED_APP_ID": f"secured-{uuid.uuid4().hex[:8]}",
        "SECURED_MODE": "sasl",
        "SECURED_CA": str(broker.ca_file),
        "SECURED_MECHANISM": "SCRAM-SHA-256",
        "SECURED_USERNAME": broker.username,
        "SECURED_PASSWORD": wrong,
        "SECURED_OUT": str(tmp_path / "echo.out"),
        "SECURED_WEB_PORT": str(port),
        "SECURED_DATA_DIR": str(tmp_path / "data"),
    }
    worker = WorkerProcess("w1", "tests.apps.secured_echo", tmp_path, env, port=port, cwd=REPO).start()
    try:
        assert wait_for(lambda: not worker.alive, timeout=60), "the worker kept retrying"
    finally:
        worker.stop()
    assert worker.process is not None and worker.process.returncode != 0
    text = worker.log_path.read_text()
    assert "SaslAuthenticationFailed" in text and scram_failed("SCRAM-SHA-256") in text
    assert wrong not in text and not (tmp_path / "echo.out").exists()
