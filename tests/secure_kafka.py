"""A secured front for the embedded broker: TLS, SASL (PLAIN, SCRAM-SHA-256/512) or both.

The embedded broker (tansu 0.6.0) cannot do either itself: its `--cert` and `--key` refuse to
be given together and `--cert` alone leaves the listener in plaintext; its `--authentication`
offers only SCRAM, and no user can be created (`tansu user create` is refused by a broker
that requires authentication, and the memory storage forgets users made before). So tests
put this proxy in front of it:

    with SecuredBroker(tls=True, sasl=True) as broker:
        producer = AIOKafkaProducer(**broker.aiokafka_settings("SCRAM-SHA-256"))

The broker listens in plaintext on one port and *advertises the proxy's port*, so metadata
and FindCoordinator send every client back through the proxy: a client that is not
configured for TLS or SASL cannot reach the broker at all.

The proxy terminates TLS (`ssl.SSLContext`, optionally requiring client certificates) and,
with credentials, answers the start of the Kafka protocol itself: ApiVersions (forwarded to
the broker, with SaslHandshake v0-1 and SaslAuthenticate v0-2 ensured in the answer),
SaslHandshake and SaslAuthenticate. It refuses wrong credentials as Kafka does
(SASL_AUTHENTICATION_FAILED, 58, with Kafka's message, then closes), closes on any other
request before authentication, and after success pipes bytes to the broker unchanged.
Every refusal is one log line starting with `refused`, naming the client id of a plaintext
request where it can be read: `SecuredBroker.refusals()` lists them, so a test can show
that no client of an app bypassed its settings.

The proxy runs as its own process (`python -m tests.secure_kafka --config FILE`, from the
repository's root: this is test scaffolding, not part of the installed library),
started and stopped by pid like the broker: a test that crashes or hangs cannot leave a
thread with sockets behind in the test process. `KafkaFrontProxy` is the same proxy as an
asyncio object, for use inside a running loop.

Test certificates (a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate) are made with the `openssl` command: `cryptography` is not among Tandem's
dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tables.testing.broker import EmbeddedBroker, free_port

log = logging.getLogger("tandem.secure_proxy")

SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Kafka API keys this proxy reads, and names for the ones a log line may show.
PRODUCE, METADATA, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 0, 3, 17, 18, 36
API_NAMES: dict[int, str] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    22: "InitProducerId",
    32: "DescribeConfigs",
    36: "SaslAuthenticate",
    37: "CreatePartitions",
}
# The versions of the SASL requests this proxy implements, ensured in every ApiVersions answer.
SASL_API_VERSIONS: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
# First flexible version (KIP-482: compact fields, tagged fields, request header v2).
_FLEXIBLE_FROM: dict[int, int] = {API_VERSIONS: 3, SASL_AUTHENTICATE: 2}

# Kafka error codes and the messages its SaslServerAuthenticator sends.
UNSUPPORTED_SASL_MECHANISM = 33
TOPIC_AUTHORIZATION_FAILED = 29
CREATE_TOPICS = 19
SASL_AUTHENTICATION_FAILED = 58
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def scram_failed(mechanism: str) -> str:
    """Kafka's message for any SCRAM failure (it does not say whether the user exists)."""
    return (
        "Authentication failed during authentication due to invalid credentials with SASL mechanism "
        + mechanism
    )


# Kafka caps what a client may send before it is authenticated (sasl.server.max.receive.size).
MAX_UNAUTHENTICATED_FRAME = 524288
TLS_HANDSHAKE_RECORD = 0x16
SCRAM_ITERATIONS = 4096  # Kafka's minimum


# -- test certificates -----------------------------------------------------------------------


@dataclass(frozen=True)
class CertificateFiles:
    """PEM files of a test CA, a server certificate and a client certificate it signed."""

    directory: Path
    ca_file: Path
    cert_file: Path  # server, for 127.0.0.1 and localhost
    key_file: Path
    client_cert_file: Path
    client_key_file: Path
    client_key_encrypted_file: Path  # the same client key, encrypted with key_password
    key_password: str

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        """A TLS server context with the server certificate (and client verification)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca_file)
        return context

    def client_context(self, with_client_cert: bool = False) -> ssl.SSLContext:
        """A TLS client context that trusts the test CA (and presents the client certificate)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file))
        if with_client_cert:
            context.load_cert_chain(self.client_cert_file, self.client_key_file)
        return context


_CA_CONFIG = """[req]
distinguished_name = subject

[subject]

[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""

_LEAF_EXTENSIONS = """[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {alt_names}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer

[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def make_test_certificates(
    directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 2
) -> CertificateFiles:
    """Make a test CA, a server certificate for `hosts` and a client certificate in `directory`
    (EC P-256 keys, made with the `openssl` command)."""
    directory.mkdir(parents=True, exist_ok=True)
    alt_names = ", ".join(
        f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts
    )
    (directory / "ca.cnf").write_text(_CA_CONFIG)
    (directory / "leaf.cnf").write_text(_LEAF_EXTENSIONS.format(alt_names=alt_names))
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    valid = ["-days", str(days)]
    _openssl("req", "-x509", *new_key, "-keyout", "ca.key", "-out", "ca.pem", *valid,
             "-subj", "/CN=Tandem test CA", "-config", "ca.cnf", "-extensions", "ca",
             cwd=directory)  # fmt: skip
    for name, subject, section in (("server", hosts[0], "server"), ("client", "tandem-client", "client")):
        _openssl("req", "-new", *new_key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={subject}", "-config", "ca.cnf", cwd=directory)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", *valid, "-extfile", "leaf.cnf",
                 "-extensions", section, cwd=directory)  # fmt: skip
    password = secrets.token_urlsafe(12)
    _openssl("pkey", "-in", "client.key", "-aes256", "-passout", f"pass:{password}",
             "-out", "client-encrypted.key", cwd=directory)  # fmt: skip
    return CertificateFiles(
        directory=directory,
        ca_file=directory / "ca.pem",
        cert_file=directory / "server.pem",
        key_file=directory / "server.key",
        client_cert_file=directory / "client.pem",
        client_key_file=directory / "client.key",
        client_key_encrypted_file=directory / "client-encrypted.key",
        key_password=password,
    )


# -- the Kafka wire: just what the start of a connection needs --------------------------------


class _Cursor:
    """Reads Kafka primitive types from a bytes object."""

    def __init__(self, data: bytes, offset: int = 0) -> None:
        self.data = data
        self.offset = offset

    def _take(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise ValueError("truncated Kafka message")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")

    def string(self) -> str | None:
        size = self.int16()
        return None if size < 0 else self._take(size).decode("utf-8", "replace")

    def bytes32(self) -> bytes:
        return self._take(self.int32())

    def compact_bytes(self) -> bytes:
        size = self.uvarint() - 1
        return b"" if size < 0 else self._take(size)

    def tagged_fields(self) -> bytes:
        """Skip a tagged-field section; return its raw bytes."""
        start = self.offset
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())
        return self.data[start : self.offset]

    def rest(self) -> bytes:
        return self.data[self.offset :]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _compact_string(value: str | None) -> bytes:
    if value is None:
        return _uvarint(0)
    raw = value.encode()
    return _uvarint(len(raw) + 1) + raw


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether this request version uses KIP-482's compact encoding (of the keys read here)."""
    first = _FLEXIBLE_FROM.get(api_key)
    return first is not None and api_version >= first


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame

    @property
    def api_name(self) -> str:
        return API_NAMES.get(self.api_key, f"api {self.api_key}")

    def describe(self) -> str:
        return f"{self.api_name} v{self.api_version} from client id {self.client_id!r}"


def parse_request_header(frame: bytes) -> RequestHeader:
    """The header of one request (the frame without its size prefix)."""
    cursor = _Cursor(frame)
    api_key, api_version, correlation_id = cursor.int16(), cursor.int16(), cursor.int32()
    client_id = cursor.string()
    if is_flexible(api_key, api_version):
        cursor.tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id, cursor.offset)


def response_frame(correlation_id: int, body: bytes, flexible_header: bool = False) -> bytes:
    """A size-prefixed response: header v0 (or v1, with an empty tagged-field section)."""
    payload = struct.pack(">i", correlation_id) + (b"\x00" if flexible_header else b"") + body
    return struct.pack(">i", len(payload)) + payload


def ensure_api_versions(
    response: bytes, request_version: int, wanted: Mapping[int, tuple[int, int]]
) -> bytes:
    """An ApiVersions response (without its size prefix) whose list of APIs has `wanted`'s
    key -> (min, max) versions, added or replaced; everything else is kept byte for byte.
    An error response is returned unchanged (the client retries with another version)."""
    cursor = _Cursor(response)
    correlation_id = cursor.int32()  # ApiVersions responses always use header v0
    error_code = cursor.int16()
    if error_code != 0:
        return response
    flexible = request_version >= _FLEXIBLE_FROM[API_VERSIONS]
    count = cursor.uvarint() - 1 if flexible else cursor.int32()
    entries: dict[int, tuple[int, int, bytes]] = {}
    for _ in range(max(count, 0)):
        key, low, high = cursor.int16(), cursor.int16(), cursor.int16()
        entries[key] = (low, high, cursor.tagged_fields() if flexible else b"")
    for key, (low, high) in wanted.items():
        tags = entries.get(key, (0, 0, b"\x00" if flexible else b""))[2]
        entries[key] = (low, high, tags)
    body = [struct.pack(">ih", correlation_id, 0)]
    body.append(_uvarint(len(entries) + 1) if flexible else struct.pack(">i", len(entries)))
    for key in sorted(entries):
        low, high, tags = entries[key]
        body.append(struct.pack(">hhh", key, low, high) + tags)
    body.append(cursor.rest())  # throttle time and the tagged fields (features), unchanged
    return b"".join(body)


def sasl_handshake_response(error_code: int, mechanisms: Sequence[str]) -> bytes:
    return struct.pack(">hi", error_code, len(mechanisms)) + b"".join(_string(m) for m in mechanisms)


def sasl_authenticate_response(
    version: int, error_code: int, message: str | None, auth_bytes: bytes
) -> bytes:
    """The SaslAuthenticate response body, v0-2 (session lifetime 0: no re-authentication)."""
    if version >= 2:
        return (
            struct.pack(">h", error_code)
            + _compact_string(message)
            + _uvarint(len(auth_bytes) + 1)
            + auth_bytes
            + struct.pack(">q", 0)
            + b"\x00"
        )
    body = struct.pack(">h", error_code) + _string(message) + struct.pack(">i", len(auth_bytes)) + auth_bytes
    return body + struct.pack(">q", 0) if version >= 1 else body


def sasl_authenticate_token(frame: bytes, header: RequestHeader) -> bytes:
    cursor = _Cursor(frame, header.body_offset)
    return cursor.compact_bytes() if header.api_version >= 2 else cursor.bytes32()


# -- SASL servers ---------------------------------------------------------------------------


class SaslFailed(Exception):
    """Authentication failed; the message is what Kafka would send the client."""


class SaslServer:
    """One authentication exchange: `step(token)` -> (reply, done), or raises SaslFailed."""

    username: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        raise NotImplementedError


class PlainServer(SaslServer):
    """RFC 4616 PLAIN: one token, authzid NUL authcid NUL password."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.decode("utf-8", "replace").split("\x00")
        if len(parts) != 3:
            raise SaslFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        authzid, username, password = parts
        self.username = username
        if authzid and authzid != username:
            raise SaslFailed(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        expected = self._users.get(username)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise SaslFailed(PLAIN_FAILED)
        return b"", True


@dataclass(frozen=True)
class ScramCredential:
    """What a Kafka broker stores for a SCRAM user: never the password itself."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(
        cls, mechanism: str, password: str, iterations: int = SCRAM_ITERATIONS
    ) -> ScramCredential:
        algorithm = _scram_hash(mechanism)
        salt = os.urandom(16)
        salted = hashlib.pbkdf2_hmac(algorithm, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", algorithm).digest()
        server_key = hmac.new(salted, b"Server Key", algorithm).digest()
        return cls(salt, iterations, hashlib.new(algorithm, client_key).digest(), server_key)


def _scram_hash(mechanism: str) -> str:
    return {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]


def _scram_attributes(message: str) -> dict[str, str]:
    pairs = [part.split("=", 1) for part in message.split(",")]
    if any(len(pair) != 2 or len(pair[0]) != 1 for pair in pairs):
        raise ValueError(f"malformed SCRAM message {message!r}")
    return {name: value for name, value in pairs}


class ScramServer(SaslServer):
    """RFC 5802 SCRAM without channel binding, as Kafka implements it."""

    def __init__(self, mechanism: str, credentials: Mapping[str, ScramCredential]) -> None:
        self.mechanism = mechanism
        self._algorithm = _scram_hash(mechanism)
        self._credentials = credentials
        self._expected: tuple[str, str, str, ScramCredential] | None = None  # gs2, nonce, bare+first

    def step(self, token: bytes) -> tuple[bytes, bool]:
        try:
            message = token.decode("utf-8")
            return (self._first(message), False) if self._expected is None else (self._final(message), True)
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            log.debug("SCRAM exchange failed: %s", exc)
            raise SaslFailed(scram_failed(self.mechanism)) from None

    def _first(self, message: str) -> bytes:
        gs2_flag, authzid, bare = message.split(",", 2)
        if gs2_flag not in ("n", "y"):
            raise ValueError("channel binding is not supported")
        attributes = _scram_attributes(bare)
        username = attributes["n"].replace("=2C", ",").replace("=3D", "=")
        self.username = username
        credential = self._credentials.get(username)
        if credential is None or (authzid and authzid[2:] != username):
            raise ValueError("unknown user or different authorization id")
        nonce = attributes["r"] + secrets.token_urlsafe(18)
        salt = base64.b64encode(credential.salt).decode()
        server_first = f"r={nonce},s={salt},i={credential.iterations}"
        self._expected = (f"{gs2_flag},{authzid},", nonce, f"{bare},{server_first}", credential)
        return server_first.encode()

    def _final(self, message: str) -> bytes:
        assert self._expected is not None
        gs2_header, nonce, first_messages, credential = self._expected
        without_proof, _, proof_part = message.rpartition(",p=")
        attributes = _scram_attributes(without_proof)
        if attributes["r"] != nonce or base64.b64decode(attributes["c"]) != gs2_header.encode():
            raise ValueError("nonce or channel binding mismatch")
        auth_message = f"{first_messages},{without_proof}".encode()
        signature = hmac.new(credential.stored_key, auth_message, self._algorithm).digest()
        proof = base64.b64decode(proof_part)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._algorithm, client_key).digest(), credential.stored_key):
            raise ValueError("wrong proof")
        server_signature = hmac.new(credential.server_key, auth_message, self._algorithm).digest()
        return b"v=" + base64.b64encode(server_signature)


# -- the proxy ---------------------------------------------------------------------------------


class _Refused(Exception):
    """End this connection; the message is the log line's reason."""


class KafkaFrontProxy:
    """TLS and/or SASL in front of a plaintext Kafka broker, in the running event loop.

    `ssl_context` (a server context) makes the listener TLS-only; `users` (name ->
    password) makes it require SASL with one of `mechanisms`. With neither it is a plain
    pipe."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        ssl_context: ssl.SSLContext | None = None,
        users: Mapping[str, str] | None = None,
        mechanisms: Sequence[str] = SASL_MECHANISMS,
        deny_create_topics: str | None = None,
    ) -> None:
        unknown = set(mechanisms) - set(SASL_MECHANISMS)
        if unknown:
            raise ValueError(f"unsupported SASL mechanisms {sorted(unknown)}; known: {SASL_MECHANISMS}")
        self.upstream = upstream
        self.listen = listen
        self.ssl_context = ssl_context
        self.users = dict(users) if users is not None else None
        self.mechanisms = list(mechanisms)
        # As an ACL without Create would: a CreateTopics of a topic whose name starts with this
        # prefix ("" for every topic) is answered TOPIC_AUTHORIZATION_FAILED (all its topics).
        self.deny_create_topics = deny_create_topics
        self._scram = {
            mechanism: {
                name: ScramCredential.from_password(mechanism, pw) for name, pw in (users or {}).items()
            }
            for mechanism in self.mechanisms
            if mechanism.startswith("SCRAM-")
        }
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._socket is not None, "not started"
        return int(self._socket.getsockname()[1])

    async def start(self) -> KafkaFrontProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self.listen)
        listener.listen(128)
        listener.setblocking(False)
        self._socket = listener
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())
        log.info(
            "listening on %s:%d for %s, upstream %s:%d",
            self.listen[0], self.port, self.security_protocol, *self.upstream,
        )  # fmt: skip
        return self

    @property
    def security_protocol(self) -> str:
        """The Kafka name of what this listener requires."""
        sasl, tls = self.users is not None, self.ssl_context is not None
        return {(False, False): "PLAINTEXT", (False, True): "SSL", (True, False): "SASL_PLAINTEXT"}.get(
            (sasl, tls), "SASL_SSL"
        )

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._socket is not None:
            self._socket.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._socket is not None
        while True:
            client, peer = await loop.sock_accept(self._socket)
            task = loop.create_task(self._serve(client, f"{peer[0]}:{peer[1]}"))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve(self, client: socket.socket, peer: str) -> None:
        streams: list[asyncio.StreamWriter] = []
        try:
            reader, writer = await self._client_streams(client, peer)
            streams.append(writer)
            upstream: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

            async def connect_upstream() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                if not upstream:
                    upstream.append(await asyncio.open_connection(*self.upstream))
                    streams.append(upstream[0][1])
                return upstream[0]

            if self.users is not None:
                await self._authenticate(reader, writer, peer, connect_upstream)
            up_reader, up_writer = await connect_upstream()
            if self.deny_create_topics is not None:
                await _relay_denying_create_topics(
                    reader, writer, up_reader, up_writer, peer, self.deny_create_topics
                )
            else:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except _Refused as refusal:
            log.warning("refused %s: %s", peer, refusal)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.debug("connection %s ended: %r", peer, exc)
        finally:
            for writer in streams:
                writer.close()
            if not streams:
                client.close()

    async def _client_streams(
        self, client: socket.socket, peer: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams for an accepted socket; TLS when required, after a look at its first byte
        (a TLS handshake record, or the size of a plaintext Kafka request)."""
        loop = asyncio.get_running_loop()
        first = await _peek(client, timeout=30.0)
        if not first:
            raise ConnectionResetError("closed before sending anything")
        tls_hello = first[0] == TLS_HANDSHAKE_RECORD
        if self.ssl_context is not None and not tls_hello:
            reader, writer = await _streams(loop, client, None)
            try:
                header = parse_request_header(await _read_frame(reader, MAX_UNAUTHENTICATED_FRAME, 5.0))
                raise _Refused(f"plaintext {header.describe()} on a TLS listener")
            finally:
                writer.close()
        if self.ssl_context is None and tls_hello and self.users is not None:
            raise _Refused("a TLS handshake on a plaintext SASL listener (client uses SSL or SASL_SSL)")
        try:
            return await _streams(loop, client, self.ssl_context)
        except ssl.SSLError as exc:
            raise _Refused(f"TLS handshake failed: {exc.reason or exc}") from None

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        connect_upstream: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
    ) -> None:
        """Kafka's server side of SASL (KIP-43, KIP-152) until the client is authenticated;
        raises _Refused (after answering as Kafka would) otherwise."""
        assert self.users is not None
        server: SaslServer | None = None
        mechanism, legacy = "", False
        while True:
            frame = await _read_frame(reader, MAX_UNAUTHENTICATED_FRAME, 60.0)
            if server is not None and legacy:  # SaslHandshake v0: bare tokens, no Kafka header
                reply, done = self._step(server, frame, mechanism, None, writer)
                writer.write(struct.pack(">i", len(reply)) + reply)
            else:
                header = parse_request_header(frame)
                if header.api_key == API_VERSIONS and server is None:
                    up_reader, up_writer = await connect_upstream()
                    up_writer.write(struct.pack(">i", len(frame)) + frame)
                    answer = await _read_frame(up_reader, 1 << 24, 30.0)
                    fixed = ensure_api_versions(answer, header.api_version, SASL_API_VERSIONS)
                    writer.write(struct.pack(">i", len(fixed)) + fixed)
                    await writer.drain()
                    continue
                if header.api_key == SASL_HANDSHAKE and server is None:
                    mechanism = _Cursor(frame, header.body_offset).string() or ""
                    legacy = header.api_version == 0
                    server = self._handshake(header, mechanism, writer)
                    await writer.drain()
                    continue
                if header.api_key != SASL_AUTHENTICATE or server is None or legacy:
                    raise _Refused(f"{header.describe()} before SASL authentication")
                reply, done = self._step(
                    server, sasl_authenticate_token(frame, header), mechanism, header, writer
                )
                body = sasl_authenticate_response(header.api_version, 0, None, reply)
                writer.write(response_frame(header.correlation_id, body, header.api_version >= 2))
            await writer.drain()
            if done:
                log.info("authenticated %s: user %r with %s", peer, server.username, mechanism)
                return

    def _handshake(self, header: RequestHeader, mechanism: str, writer: asyncio.StreamWriter) -> SaslServer:
        if mechanism not in self.mechanisms:
            body = sasl_handshake_response(UNSUPPORTED_SASL_MECHANISM, self.mechanisms)
            writer.write(response_frame(header.correlation_id, body))
            raise _Refused(f"SASL mechanism {mechanism!r} not enabled ({header.describe()})")
        writer.write(response_frame(header.correlation_id, sasl_handshake_response(0, self.mechanisms)))
        if mechanism == "PLAIN":
            return PlainServer(self.users or {})
        return ScramServer(mechanism, self._scram[mechanism])

    @staticmethod
    def _step(
        server: SaslServer,
        token: bytes,
        mechanism: str,
        header: RequestHeader | None,
        writer: asyncio.StreamWriter,
    ) -> tuple[bytes, bool]:
        try:
            return server.step(token)
        except SaslFailed as failure:
            if header is not None:  # with SaslAuthenticate, Kafka says why; with v0 it just closes
                body = sasl_authenticate_response(
                    header.api_version, SASL_AUTHENTICATION_FAILED, str(failure), b""
                )
                writer.write(response_frame(header.correlation_id, body, header.api_version >= 2))
            raise _Refused(f"user {server.username!r} with {mechanism}: {failure}") from None


async def _peek(client: socket.socket, timeout: float) -> bytes:
    """The first byte the client sent, left unread (MSG_PEEK); b'' if it closed."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(client.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, timeout)
    finally:
        loop.remove_reader(client.fileno())
    try:
        return client.recv(1, socket.MSG_PEEK)
    except ConnectionError:
        return b""


async def _streams(
    loop: asyncio.AbstractEventLoop, client: socket.socket, context: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader = asyncio.StreamReader(limit=1 << 20)
    protocol = asyncio.StreamReaderProtocol(reader)
    extra = {"ssl_handshake_timeout": 15.0} if context is not None else {}
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, client, ssl=context, **extra)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _read_frame(reader: asyncio.StreamReader, limit: int, timeout: float) -> bytes:
    async with asyncio.timeout(timeout):
        size = int(struct.unpack(">i", await reader.readexactly(4))[0])
        if not 0 < size <= limit:
            raise _Refused(f"a frame of {size} bytes before authentication (not a Kafka client?)")
        return await reader.readexactly(size)


async def _relay_denying_create_topics(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    peer: str,
    prefix: str,
) -> None:
    """Requests forwarded frame by frame, except a CreateTopics of a topic named with
    `prefix`, answered here with TOPIC_AUTHORIZATION_FAILED for every topic in it; responses
    go back in request order (Kafka's promise on one connection), those made here in turn."""
    order: asyncio.Queue[bytes | None] = asyncio.Queue()  # None: the upstream's next response

    async def requests() -> None:
        while True:
            frame = await _read_any_frame(reader)
            header = parse_request_header(frame)
            names = create_topics_names(frame, header) if header.api_key == CREATE_TOPICS else []
            if any(name.startswith(prefix) for name in names):
                log.warning("refused %s: CreateTopics of %s (not authorized)", peer, ", ".join(names))
                await order.put(create_topics_denied(header, names))
                continue
            await order.put(None)
            up_writer.write(struct.pack(">i", len(frame)) + frame)
            await up_writer.drain()

    async def responses() -> None:
        while True:
            local = await order.get()
            if local is None:
                frame = await _read_any_frame(up_reader)
                writer.write(struct.pack(">i", len(frame)) + frame)
            else:
                writer.write(local)
            await writer.drain()

    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        await asyncio.gather(requests(), responses())


async def _read_any_frame(reader: asyncio.StreamReader) -> bytes:
    size = int(struct.unpack(">i", await reader.readexactly(4))[0])
    return await reader.readexactly(size)


def create_topics_names(frame: bytes, header: RequestHeader) -> list[str]:
    """The topic names of a CreateTopics request, v0-v4 (not flexible; aiokafka sends v3)."""
    if header.api_version > 4:
        raise _Refused(f"{header.describe()}: only CreateTopics v0-v4 are read here")
    cursor = _Cursor(frame, header.body_offset)
    names = []
    for _ in range(cursor.int32()):
        names.append(cursor.string() or "")
        cursor.int32(), cursor.int16()  # partitions, replication factor
        for _ in range(cursor.int32()):  # replica assignments
            cursor.int32()
            for _ in range(cursor.int32()):
                cursor.int32()
        for _ in range(cursor.int32()):  # configs
            cursor.string(), cursor.string()
    return names


def create_topics_denied(header: RequestHeader, names: Sequence[str]) -> bytes:
    """A CreateTopics response (v0-v4) refusing every topic as Kafka's authorizer does."""
    version = header.api_version
    body = struct.pack(">i", 0) if version >= 2 else b""  # throttle_time_ms
    body += struct.pack(">i", len(names))
    for name in names:
        body += _string(name) + struct.pack(">h", TOPIC_AUTHORIZATION_FAILED)
        if version >= 1:
            body += _string("Authorization failed.")
    return response_frame(header.correlation_id, body)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        sink.close()


# -- the proxy as a process -------------------------------------------------------------------

_MODULE = __spec__.name if __spec__ is not None else "tests.secure_kafka"
# The repository's root: `python -m tests.secure_kafka` finds the module from any cwd.
_ROOT = Path(__file__).resolve().parent.parent


def _with_root_on_path(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with the repository's root first on PYTHONPATH (the module is not installed)."""
    path = [str(_ROOT), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environ, "PYTHONPATH": os.pathsep.join(path)}


@dataclass
class ProxyProcess:
    """`KafkaFrontProxy` in its own process (`python -m tests.secure_kafka`), stopped by pid.

    Its settings, passwords included, go in a JSON file readable only by this user, never on
    the command line; its log (one `refused ...` line per refusal) is at `log_path`."""

    upstream_port: int
    port: int
    work_dir: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None  # set: clients must present a certificate it signed
    users: Mapping[str, str] | None = None
    mechanisms: Sequence[str] = SASL_MECHANISMS
    deny_create_topics: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log_path(self) -> Path:
        return self.work_dir / f"proxy-{self.port}.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 15.0) -> ProxyProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.work_dir / f"proxy-{self.port}.json"
        ready = self.work_dir / f"proxy-{self.port}.ready"
        ready.unlink(missing_ok=True)
        settings = {
            "listen_port": self.port,
            "upstream_port": self.upstream_port,
            "cert_file": str(self.cert_file) if self.cert_file else None,
            "key_file": str(self.key_file) if self.key_file else None,
            "client_ca_file": str(self.client_ca_file) if self.client_ca_file else None,
            "users": dict(self.users) if self.users is not None else None,
            "mechanisms": list(self.mechanisms),
            "deny_create_topics": self.deny_create_topics,
            "ready_file": str(ready),
        }
        descriptor = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(settings, out)
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", _MODULE, "--config", str(config_path)],
                env=_with_root_on_path(os.environ),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the proxy did not start; see {self.log_path}:\n{self.log_text()[-2000:]}"
                )
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process we started, by its id; SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _context_from_settings(settings: Mapping[str, Any]) -> ssl.SSLContext | None:
    if not settings.get("cert_file"):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings["cert_file"], settings["key_file"])
    if settings.get("client_ca_file"):
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=settings["client_ca_file"])
    return context


async def _run(settings: Mapping[str, Any]) -> None:
    proxy = KafkaFrontProxy(
        ("127.0.0.1", int(settings["upstream_port"])),
        listen=("127.0.0.1", int(settings["listen_port"])),
        ssl_context=_context_from_settings(settings),
        users=settings.get("users"),
        mechanisms=settings.get("mechanisms") or SASL_MECHANISMS,
        deny_create_topics=settings.get("deny_create_topics"),
    )
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    Path(settings["ready_file"]).write_text(str(os.getpid()))
    await stop.wait()
    await proxy.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="JSON settings written by ProxyProcess")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    asyncio.run(_run(json.loads(args.config.read_text())))


# -- the broker behind the proxy ---------------------------------------------------------------


class SecuredBroker:
    """The embedded broker reachable only through a TLS and/or SASL proxy.

    `bootstrap` is the proxy's address; the broker advertises it, so every connection a
    client makes goes through the proxy. `aiokafka_settings(...)` gives aiokafka keyword arguments
    and `client_properties(...)` the librdkafka/Java names (confluent-kafka, `--client-config`).
    """

    def __init__(
        self,
        *,
        tls: bool = True,
        sasl: bool = True,
        mechanisms: Sequence[str] = SASL_MECHANISMS,
        users: Mapping[str, str] | None = None,
        client_auth: bool = False,
        work_dir: Path | None = None,
        deny_create_topics: str | None = None,
    ) -> None:
        self.tls, self.sasl, self.client_auth = tls, sasl, client_auth
        if client_auth and not tls:
            raise ValueError("client certificates need tls=True")
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="tandem-secured-"))
        self.users: dict[str, str] = (
            dict(users) if users is not None else {"tandem": secrets.token_urlsafe(12)} if sasl else {}
        )
        self.mechanisms = list(mechanisms)
        self.certificates = make_test_certificates(self.work_dir / "tls") if tls else None
        self.proxy_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.proxy_port}"
        self.broker = EmbeddedBroker(log_dir=self.work_dir, advertised_port=self.proxy_port)
        self.proxy = ProxyProcess(
            upstream_port=self.broker.port,
            port=self.proxy_port,
            work_dir=self.work_dir,
            cert_file=self.certificates.cert_file if self.certificates else None,
            key_file=self.certificates.key_file if self.certificates else None,
            client_ca_file=self.certificates.ca_file if self.certificates and client_auth else None,
            users=self.users if sasl else None,
            mechanisms=self.mechanisms,
            deny_create_topics=deny_create_topics,
        )

    @property
    def security_protocol(self) -> str:
        return {(False, False): "PLAINTEXT", (True, False): "SSL", (False, True): "SASL_PLAINTEXT"}.get(
            (self.tls, self.sasl), "SASL_SSL"
        )

    @property
    def ca_file(self) -> Path | None:
        return self.certificates.ca_file if self.certificates else None

    @property
    def username(self) -> str:
        return next(iter(self.users))

    @property
    def password(self) -> str:
        return self.users[self.username]

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context trusting the test CA (with the client certificate if required)."""
        return self.certificates.client_context(self.client_auth) if self.certificates else None

    def aiokafka_settings(
        self, mechanism: str = "PLAIN", username: str | None = None, password: str | None = None
    ) -> dict[str, Any]:
        """aiokafka keyword arguments (bootstrap servers included) for this broker."""
        found: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.tls:
            found["ssl_context"] = self.ssl_context()
        if self.sasl:
            found.update(
                sasl_mechanism=mechanism,
                sasl_plain_username=username if username is not None else self.username,
                sasl_plain_password=password if password is not None else self.password,
            )
        return found

    def client_properties(self, mechanism: str = "PLAIN") -> dict[str, str]:
        """The same as librdkafka/Java client properties (confluent-kafka, `--client-config`)."""
        found = {"bootstrap.servers": self.bootstrap, "security.protocol": self.security_protocol}
        if self.certificates is not None:
            found["ssl.ca.location"] = str(self.certificates.ca_file)
            if self.client_auth:
                found["ssl.certificate.location"] = str(self.certificates.client_cert_file)
                found["ssl.key.location"] = str(self.certificates.client_key_file)
        if self.sasl:
            found.update(
                {"sasl.mechanism": mechanism, "sasl.username": self.username, "sasl.password": self.password}
            )
        return found

    def write_client_config(self, path: Path, mechanism: str = "PLAIN") -> Path:
        """`client_properties` as a properties file (mode 600), for `--client-config`."""
        lines = [f"{key}={value}" for key, value in self.client_properties(mechanism).items()]
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write("# written by tests.secure_kafka.SecuredBroker\n" + "\n".join(lines) + "\n")
        return path

    def refusals(self) -> list[str]:
        """The proxy's `refused ...` log lines: connections it turned away, and why."""
        return [line for line in self.proxy.log_text().splitlines() if " refused " in line]

    def authentications(self) -> list[str]:
        return [line for line in self.proxy.log_text().splitlines() if " authenticated " in line]

    def start(self) -> SecuredBroker:
        self.broker.start()
        try:
            self.proxy.start()
        except BaseException:
            self.broker.stop()
            raise
        return self

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.stop()

    def __enter__(self) -> SecuredBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


if __name__ == "__main__":
    main()
