"""Every Kafka client Tandem opens, and its connection settings, from the two places they
come from. No Kafka client is made anywhere else in Tandem (tests/test_clients.py walks the
code for constructors that bypass `consumer`, `producer`, `admin` and `metadata_client`).

- A client properties file, the convention of `kafka-console-consumer --consumer.config`
  and kcat `-F` (`--client-config FILE` of Tandem's command-line tools):

      security.protocol=SASL_SSL
      sasl.mechanism=SCRAM-SHA-512
      sasl.username=tandem
      sasl.password=...
      ssl.ca.location=/etc/kafka/ca.pem

  `parse_client_config(text)` checks it and names the bad key in any error;
  `aiokafka_kwargs(config)` gives `security_protocol`, `sasl_mechanism`,
  `sasl_plain_username`, `sasl_plain_password`, `ssl_context`, ...
- A Faust app (`app.conf`): `faust_client_kwargs(app.conf)` gives the same arguments its
  own clients get, from `broker_credentials` and `ssl_context` through Faust's own
  `credentials_to_aiokafka_auth`, with the app's bootstrap servers and client id.
  `faust_credentials(config)` goes the other way: the `broker_credentials` for an app
  configured by a properties file.

`redacted(...)` hides every secret, for logs and pages.

Nothing here reads or writes a file, except that building the `ssl.SSLContext` loads the
certificate files the configuration names.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import aiokafka
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth, server_list

from assignor import log_masking

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
REDACTED = "[redacted]"

# Key parts that mark a value as secret, in properties and in aiokafka arguments alike.
_SECRET_MARKERS = ("password", "secret", "jaas", "token", "user.info", "credential", "key.pem", "private")

# Security keys that are understood but change nothing for aiokafka: Python's ssl module
# negotiates TLS 1.2 or 1.3 by itself, and these name Java's key-store formats (see below).
_ACCEPTED_WITHOUT_EFFECT = frozenset({"ssl.protocol", "ssl.enabled.protocols", "ssl.keystore.type"})

_UNSUPPORTED: dict[str, str] = {
    "ssl.certificate.pem": "write the certificate to a file and set ssl.certificate.location",
    "ssl.key.pem": "write the key to a file and set ssl.key.location",
    "ssl.keystore.location": (
        "Java key stores cannot be read here: export the certificate and key as PEM files and set "
        "ssl.certificate.location and ssl.key.location"
    ),
    "ssl.keystore.password": "Java key stores cannot be read here (see ssl.keystore.location)",
    "ssl.truststore.password": "Java trust stores cannot be read here (see ssl.truststore.location)",
}

_KNOWN_SECURITY_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",  # librdkafka's older name
        "sasl.username",
        "sasl.password",
        "sasl.jaas.config",
        "sasl.kerberos.service.name",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "ssl.cipher.suites",
        "ssl.truststore.location",
        "ssl.truststore.type",
    }
)
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")


class ClientConfigError(ValueError):
    """A client configuration that cannot be used; the message names the key (and line)."""


# -- the properties format ----------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, line_number: int) -> str:
    """Java's properties escapes (\\t \\n \\r \\f \\uXXXX; a backslash before any other
    character stands for that character, so a literal backslash is written \\\\), and
    whitespace at either end dropped unless escaped."""
    chars: list[tuple[str, bool]] = []  # (character, was escaped)
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            chars.append((char, False))
            i += 1
            continue
        following = text[i + 1]
        if following == "u":
            digits = text[i + 2 : i + 6]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                raise ClientConfigError(f"line {line_number}: malformed \\uXXXX escape")
            chars.append((chr(int(digits, 16)), True))
            i += 6
        else:
            chars.append((_ESCAPES.get(following, following), True))
            i += 2
    start, end = 0, len(chars)
    while start < end and chars[start][0].isspace() and not chars[start][1]:
        start += 1
    while end > start and chars[end - 1][0].isspace() and not chars[end - 1][1]:
        end -= 1
    return "".join(char for char, _ in chars[start:end])


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line: a line ending in an odd number of
    backslashes continues on the next one, whose leading whitespace is dropped."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(re.split(r"\r\n|\r|\n", text), start=1):  # Java's line ends only
        line = raw.lstrip() if pending is not None else raw
        if pending is None and line.strip()[:1] in ("#", "!", ""):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        continues = trailing % 2 == 1
        body = line[:-1] if continues else line
        start, so_far = pending if pending is not None else (number, "")
        if continues:
            pending = (start, so_far + body)
        else:
            pending = None
            found.append((start, so_far + body))
    if pending is not None:
        found.append(pending)
    return found


def parse_properties(text: str) -> dict[str, str]:
    """java.util.Properties lines: the key ends at its first unescaped `=`, `:` or whitespace
    (`key=value`, `key: value`, `key value`); `#` and `!` comments, Java's escapes and
    continuation lines. A key without a value, or a key given twice, is an error; an error
    names the line and at most the key, never a value (the line may hold a password)."""
    found: dict[str, str] = {}
    where: dict[str, int] = {}
    for number, line in _logical_lines(text):
        raw_key, raw_value, explicit = _split_property(line)
        key = _unescape(raw_key, number)
        value = _unescape(raw_value, number)
        if not key:
            raise ClientConfigError(f"line {number}: a value without a key")
        if not explicit and not value:
            raise ClientConfigError(
                f"line {number}: a key without a value (expected key=value, key: value or key value)"
            )
        if key in found:
            raise ClientConfigError(f"line {number}: {key} is set twice (first on line {where[key]})")
        found[key], where[key] = value, number
    return found


_KEY_ENDS = "=: \t\f"  # Java's separators; whitespace is space, tab and form feed only


def _split_property(line: str) -> tuple[str, str, bool]:
    """(raw key, raw value, whether an `=` or `:` separated them), by Java's rules: the key
    runs from the first non-whitespace character to the first unescaped `=`, `:` or
    whitespace; whitespace after it, then one `=` or `:`, then whitespace, are skipped."""
    start = len(line) - len(line.lstrip(" \t\f"))
    end = start
    while end < len(line) and line[end] not in _KEY_ENDS:
        end += 2 if line[end] == "\\" else 1
    end = min(end, len(line))
    rest = end
    while rest < len(line) and line[rest] in " \t\f":
        rest += 1
    explicit = rest < len(line) and line[rest] in "=:"
    if explicit:
        rest += 1
    return line[start:end], line[rest:], explicit


_ESCAPE_OUT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}


def _escape(text: str, is_key: bool) -> str:
    out: list[str] = []
    last = len(text) - 1
    for i, char in enumerate(text):
        if char in _ESCAPE_OUT:
            out.append(_ESCAPE_OUT[char])
        elif (
            (is_key and char in "=: ")
            or (char.isspace() and i in (0, last))  # the parser drops unescaped end whitespace
            or (i == 0 and char in "#!")
        ):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def format_properties(properties: Mapping[str, str]) -> str:
    """The text `parse_properties` reads back as `properties`."""
    return "".join(f"{_escape(k, True)}={_escape(v, False)}\n" for k, v in properties.items())


# -- the checked configuration ------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    """A client properties file, checked. Secrets stay out of its repr."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    kerberos_service_name: str | None = None
    ssl_ca_location: str | None = None
    ssl_ca_pem: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_cipher_suites: str | None = None
    check_hostname: bool = True
    verify_certificates: bool = True
    bootstrap_servers: str | None = None
    client_id: str | None = None
    # Keys that are not connection settings (acks, session.timeout.ms, schema.registry.url ...):
    # the caller may log them (with `redacted`); they are not errors.
    ignored: tuple[str, ...] = ()

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


_JAAS = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);?\s*$"
)
# Kafka's JaasConfig accepts option values in double or single quotes.
_JAAS_OPTION = re.compile(r"""(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")
_JAAS_MODULES = {
    "PlainLoginModule": ("PLAIN",),
    "ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}


def _jaas_credentials(value: str, mechanism: str | None) -> tuple[str | None, str | None]:
    """username and password of a Java `sasl.jaas.config` for PLAIN or SCRAM."""
    match = _JAAS.match(value)
    if match is None:
        raise ClientConfigError(
            "sasl.jaas.config: expected '<LoginModule class> required username=\"...\" ...;'"
        )
    module = match.group("module").rsplit(".", 1)[-1]
    if module not in _JAAS_MODULES:
        raise ClientConfigError(
            f"sasl.jaas.config: {module} is not supported here; use PlainLoginModule or ScramLoginModule "
            "(or sasl.username and sasl.password)"
        )
    if mechanism is not None and mechanism not in _JAAS_MODULES[module]:
        raise ClientConfigError(f"sasl.jaas.config: {module} does not go with sasl.mechanism={mechanism}")
    options = {
        name: re.sub(r"\\(.)", r"\1", double or single)
        for name, double, single in _JAAS_OPTION.findall(match.group("options"))
    }
    return options.get("username"), options.get("password")


def _choice(
    properties: Mapping[str, str], key: str, choices: tuple[str, ...], default: str | None
) -> str | None:
    value = properties.get(key)
    if value is None:
        return default
    upper = value.strip().upper()
    if upper not in choices:
        raise ClientConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    return upper


def _boolean(properties: Mapping[str, str], key: str, default: bool) -> bool:
    value = properties.get(key)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ClientConfigError(f"{key}={value!r} is not true or false")
    return lowered == "true"


def _check_keys(properties: Mapping[str, str]) -> tuple[str, ...]:
    """Refuse unknown or unsupported security keys (a typo there must not pass silently);
    return the other keys, which are not connection settings."""
    ignored: list[str] = []
    for key in properties:
        if key in _UNSUPPORTED:
            raise ClientConfigError(f"{key} is not supported: {_UNSUPPORTED[key]}")
        if key in _KNOWN_SECURITY_KEYS or key in _ACCEPTED_WITHOUT_EFFECT:
            continue
        if key.startswith(_SECURITY_PREFIXES):
            raise ClientConfigError(
                f"{key} is not a connection setting Tandem knows; the known ones are "
                + ", ".join(sorted(_KNOWN_SECURITY_KEYS))
            )
        if key not in ("bootstrap.servers", "client.id"):
            ignored.append(key)
    return tuple(ignored)


def client_config(properties: Mapping[str, str]) -> ClientConfig:
    """Check client properties (librdkafka and Java names) and keep what a connection needs."""
    ignored = _check_keys(properties)
    protocol = _choice(properties, "security.protocol", SECURITY_PROTOCOLS, "PLAINTEXT") or "PLAINTEXT"
    mechanism_key = "sasl.mechanism" if "sasl.mechanism" in properties else "sasl.mechanisms"
    if mechanism_key in properties and properties[mechanism_key].strip().upper() == "OAUTHBEARER":
        raise ClientConfigError(
            f"{mechanism_key}=OAUTHBEARER is not supported in a properties file: a token provider is code; "
            "configure the app with faust.OAuthCredentials"
        )
    mechanism = _choice(properties, mechanism_key, SASL_MECHANISMS, None)
    username, password = properties.get("sasl.username"), properties.get("sasl.password")
    if "sasl.jaas.config" in properties:
        jaas_user, jaas_password = _jaas_credentials(properties["sasl.jaas.config"], mechanism)
        for key, given, from_jaas in (
            ("sasl.username", username, jaas_user),
            ("sasl.password", password, jaas_password),
        ):
            if given is not None and from_jaas is not None and given != from_jaas:
                raise ClientConfigError(f"{key} and sasl.jaas.config disagree")
        username, password = username or jaas_user, password or jaas_password
    ca_location = properties.get("ssl.ca.location")
    if "ssl.truststore.location" in properties:
        if _choice(properties, "ssl.truststore.type", ("PEM", "JKS", "PKCS12"), "JKS") != "PEM":
            raise ClientConfigError(
                "ssl.truststore.location: Java trust stores cannot be read here; export the CA as PEM "
                "(keytool -exportcert -rfc) and set ssl.ca.location, or set ssl.truststore.type=PEM"
            )
        if ca_location is not None:
            raise ClientConfigError("ssl.truststore.location and ssl.ca.location both name the CA; keep one")
        ca_location = properties["ssl.truststore.location"]
    algorithm = properties.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none", ""):
        raise ClientConfigError(f"ssl.endpoint.identification.algorithm={algorithm!r} is not https or none")
    config = ClientConfig(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=password,
        kerberos_service_name=properties.get("sasl.kerberos.service.name"),
        ssl_ca_location=ca_location,
        ssl_ca_pem=properties.get("ssl.ca.pem"),
        ssl_certificate_location=properties.get("ssl.certificate.location"),
        ssl_key_location=properties.get("ssl.key.location"),
        ssl_key_password=properties.get("ssl.key.password"),
        ssl_cipher_suites=properties.get("ssl.cipher.suites"),
        check_hostname=algorithm == "https",
        verify_certificates=_boolean(properties, "enable.ssl.certificate.verification", True),
        bootstrap_servers=properties.get("bootstrap.servers"),
        client_id=properties.get("client.id"),
        ignored=ignored,
    )
    _check_consistency(config, properties)
    return config


def _check_consistency(config: ClientConfig, properties: Mapping[str, str]) -> None:
    protocol = config.security_protocol
    if not config.uses_sasl:
        stray = [k for k in properties if k.startswith("sasl.")]
        if stray:
            raise ClientConfigError(
                f"{stray[0]} is set but security.protocol={protocol} does not use SASL "
                f"(did you mean {'SASL_SSL' if config.uses_tls else 'SASL_PLAINTEXT'}?)"
            )
    if not config.uses_tls:
        material = [
            k for k in properties if k.startswith("ssl.") and k != "ssl.endpoint.identification.algorithm"
        ]
        if material:
            raise ClientConfigError(
                f"{material[0]} is set but security.protocol={protocol} does not use TLS "
                f"(did you mean {'SASL_SSL' if config.uses_sasl else 'SSL'}?)"
            )
    if config.uses_sasl:
        if config.sasl_mechanism is None:
            raise ClientConfigError(f"sasl.mechanism is required with security.protocol={protocol}")
        if config.sasl_mechanism != "GSSAPI":
            for key, value in (
                ("sasl.username", config.sasl_username),
                ("sasl.password", config.sasl_password),
            ):
                if not value:
                    raise ClientConfigError(f"{key} is required with sasl.mechanism={config.sasl_mechanism}")
    if (config.ssl_certificate_location is None) != (config.ssl_key_location is None):
        missing = "ssl.key.location" if config.ssl_key_location is None else "ssl.certificate.location"
        raise ClientConfigError(f"{missing} is required with the other one (a client certificate needs both)")
    if config.ssl_key_password is not None and config.ssl_key_location is None:
        raise ClientConfigError("ssl.key.password is set without ssl.key.location")


def parse_client_config(text: str) -> ClientConfig:
    """`client_config(parse_properties(text))`: the text of a `--client-config` file."""
    return client_config(parse_properties(text))


# -- aiokafka ------------------------------------------------------------------------------------


def ssl_context_for(config: ClientConfig) -> ssl.SSLContext | None:
    """The client TLS context a configuration describes (None without TLS). Loads the files
    it names; a file that cannot be loaded is an error naming its key."""
    if not config.uses_tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if config.ssl_ca_location not in (None, "probe"):
            location = Path(str(config.ssl_ca_location))
            if location.is_dir():
                context.load_verify_locations(capath=str(location))
            else:
                context.load_verify_locations(cafile=str(location))
    except (OSError, ssl.SSLError) as exc:
        raise ClientConfigError(f"ssl.ca.location={config.ssl_ca_location!r}: {exc}") from None
    try:
        if config.ssl_ca_pem is not None:
            context.load_verify_locations(cadata=config.ssl_ca_pem)
    except (ValueError, ssl.SSLError) as exc:
        raise ClientConfigError(f"ssl.ca.pem: {exc}") from None
    if config.ssl_certificate_location is not None:
        try:
            context.load_cert_chain(
                config.ssl_certificate_location, config.ssl_key_location, password=config.ssl_key_password
            )
        except (OSError, ssl.SSLError) as exc:
            keys = "ssl.certificate.location, ssl.key.location" + (
                ", ssl.key.password" if config.ssl_key_password is not None else ""
            )
            raise ClientConfigError(f"{keys}: cannot load the client certificate and key ({exc})") from None
    if config.ssl_cipher_suites is not None:
        try:
            context.set_ciphers(config.ssl_cipher_suites)
        except ssl.SSLError as exc:
            raise ClientConfigError(f"ssl.cipher.suites={config.ssl_cipher_suites!r}: {exc}") from None
    context.check_hostname = config.check_hostname and config.verify_certificates
    if not config.verify_certificates:
        context.verify_mode = ssl.CERT_NONE
    return context


def aiokafka_kwargs(config: ClientConfig, *, include_endpoints: bool = True) -> dict[str, Any]:
    """aiokafka client keyword arguments for a configuration: its security settings, and
    `bootstrap_servers` / `client_id` when it names them and `include_endpoints`."""
    found: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.uses_tls:
        found["ssl_context"] = ssl_context_for(config)
    if config.uses_sasl:
        found["sasl_mechanism"] = config.sasl_mechanism
        if config.sasl_mechanism == "GSSAPI":
            found["sasl_kerberos_service_name"] = config.kerberos_service_name or "kafka"
        else:
            found["sasl_plain_username"] = config.sasl_username
            found["sasl_plain_password"] = config.sasl_password
    if include_endpoints:
        if config.bootstrap_servers:
            found["bootstrap_servers"] = [s.strip() for s in config.bootstrap_servers.split(",") if s.strip()]
        if config.client_id:
            found["client_id"] = config.client_id
    return found


def faust_client_kwargs(conf: Any, *, client_id_suffix: str | None = None) -> dict[str, Any]:
    """aiokafka keyword arguments for a client opened on behalf of a Faust app: the app's
    bootstrap servers, its client id (with `-suffix`), and the security settings Faust gives
    its own clients from `broker_credentials` and `ssl_context` (Faust's own function, so
    SSLCredentials, SASLCredentials, OAuthCredentials, GSSAPICredentials and a bare
    `ssl.SSLContext` all mean what they mean to Faust)."""
    client_id = str(conf.broker_client_id)
    found: dict[str, Any] = {
        "bootstrap_servers": server_list(list(conf.broker), 9092),
        "client_id": f"{client_id}-{client_id_suffix}" if client_id_suffix else client_id,
    }
    found.update(credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context))
    return found


def faust_credentials(config: ClientConfig) -> Any:
    """The Faust `broker_credentials` a configuration describes, so that an app configured
    by a client properties file connects as its settings say: `faust.SSLCredentials`,
    `faust.SASLCredentials` (PLAIN or SCRAM, with the TLS context under SASL_SSL) or
    `faust.GSSAPICredentials`; None for PLAINTEXT."""
    import faust

    context = ssl_context_for(config)
    if config.uses_sasl:
        if config.sasl_mechanism == "GSSAPI":
            service = config.kerberos_service_name or "kafka"
            return faust.GSSAPICredentials(kerberos_service_name=service, ssl_context=context)
        return faust.SASLCredentials(
            username=config.sasl_username,
            password=config.sasl_password,
            mechanism=config.sasl_mechanism,
            ssl_context=context,
        )
    return faust.SSLCredentials(context) if context is not None else None


# -- secrets out of logs ---------------------------------------------------------------------------


def is_secret(key: str) -> bool:
    """Whether a property or argument name holds a secret (password, JAAS config, token ...)."""
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def redacted(config: ClientConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A copy fit for logs: every secret value (properties, aiokafka arguments or a
    ClientConfig's fields) replaced by "[redacted]"; unset secrets stay None."""
    items = (
        {f.name: getattr(config, f.name) for f in fields(config)}
        if isinstance(config, ClientConfig)
        else dict(config)
    )
    return {key: REDACTED if is_secret(key) and value is not None else value for key, value in items.items()}


# -- the one place clients are made ------------------------------------------------------------

# aiokafka connection settings: bootstrap_servers, client_id, security_protocol, ssl_context,
# sasl_* (what `app_settings`, `aiokafka_kwargs` or `settings_of` give).
Settings = Mapping[str, Any]
# What a client can be made from: settings, or bootstrap servers alone ("host:port,..." or a
# list: plaintext, as tests and tools on the embedded broker use).
Connection = str | Sequence[str] | Settings
_CONNECTION = ("bootstrap_servers", "client_id", "security_protocol", "ssl_context", "sasl_mechanism",
               "sasl_plain_username", "sasl_plain_password", "sasl_kerberos_service_name",
               "sasl_kerberos_domain_name", "sasl_oauth_token_provider")  # fmt: skip


def app_settings(app: Any, role: str) -> dict[str, Any]:
    """The connection settings of a client Tandem opens for `app` (role: "restore", "admin",
    "probe", ...): the app's bootstrap servers and credentials, as Faust's own clients get
    them, and a client id `{app's client id}-tandem-{role}` that names it in broker logs."""
    return faust_client_kwargs(app.conf, client_id_suffix=f"tandem-{role}")


def settings_of(connection: Connection) -> dict[str, Any]:
    """Settings from bootstrap servers alone ("host:port,host:port" or a list of them:
    plaintext, as tests and tools on the embedded broker use) or from settings already made."""
    if isinstance(connection, str):
        connection = connection.split(",")
    if not isinstance(connection, Mapping):
        return {"bootstrap_servers": [s.strip() for s in connection if s.strip()]}
    return dict(connection)


def bootstrap_of(connection: Connection) -> str:
    """The bootstrap servers as one string (for messages and command lines)."""
    servers = settings_of(connection).get("bootstrap_servers") or []
    return servers if isinstance(servers, str) else ",".join(servers)


def _connection(connection: Connection) -> dict[str, Any]:
    settings = settings_of(connection)
    found = {k: v for k, v in settings.items() if k in _CONNECTION}
    found["bootstrap_servers"] = settings_of(bootstrap_of(settings))["bootstrap_servers"]
    # Every client Tandem builds comes through here: its password never shows in a log line.
    log_masking.install()
    log_masking.remember(found.get("sasl_plain_password"))
    return found


def consumer(settings: Connection, **options: Any) -> Any:
    """An aiokafka consumer (not started) with these connection settings and `options`."""
    return aiokafka.AIOKafkaConsumer(**_connection(settings), **options)


def producer(settings: Connection, **options: Any) -> Any:
    """An aiokafka producer (not started) with these connection settings and `options`."""
    return aiokafka.AIOKafkaProducer(**_connection(settings), **options)


def admin(settings: Connection, **options: Any) -> Any:
    """An aiokafka admin client (not started) with these connection settings and `options`."""
    return AIOKafkaAdminClient(**_connection(settings), **options)


def metadata_client(settings: Connection, **options: Any) -> Any:
    """aiokafka's bare client (metadata only; not bootstrapped) with these settings."""
    return AIOKafkaClient(**_connection(settings), **options)


# -- a clear answer when the connection itself is wrong ----------------------------------------


class ConnectionFailed(Exception):
    """Tandem cannot talk to Kafka with these settings; the message says why (never a secret)."""


def describe(settings: Settings) -> str:
    """Where and how a client connects, for messages: servers, protocol, mechanism and user."""
    protocol = settings.get("security_protocol") or "PLAINTEXT"
    text = f"{bootstrap_of(settings)} ({protocol}"
    if settings.get("sasl_mechanism"):
        text += f", {settings['sasl_mechanism']}"
        if settings.get("sasl_plain_username"):
            text += f" as {settings['sasl_plain_username']!r}"
    return text + ")"


async def check_connection(connection: Connection, timeout_s: float = 30.0) -> None:
    """Connect to each bootstrap server in turn as these settings say (TLS, SASL) and ask for
    metadata; return at the first that answers. Raises `ConnectionFailed` with a one-line
    reason: refused credentials, a failed TLS handshake, a listener that closes the
    connection (it needs TLS or SASL), or no server reachable. Kafka's clients would otherwise
    retry for ever, or say only "Unable to bootstrap"."""
    settings = settings_of(connection)
    security = {k: v for k, v in settings.items() if k in _CONNECTION and k != "bootstrap_servers"}
    client_id = str(security.pop("client_id", None) or "tandem")
    last: BaseException | None = None
    for server in settings_of(bootstrap_of(settings))["bootstrap_servers"]:
        host, _, port = server.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), client_id=client_id, **security),
                timeout_s,
            )
            try:
                await asyncio.wait_for(conn.send(MetadataRequest([])), timeout_s)
            finally:
                conn.close()
            return
        except (SaslAuthenticationFailed, UnsupportedSaslMechanismError, IllegalSaslStateError) as exc:
            raise ConnectionFailed(f"Kafka refused the credentials at {describe(settings)}: {exc}") from None
        except ssl.SSLError as exc:
            raise ConnectionFailed(
                f"TLS handshake with {server} failed ({describe(settings)}): {exc}"
            ) from None
        except (KafkaConnectionError, ConnectionError) as exc:
            last = exc  # closed by the server: it may need TLS or SASL this client does not speak
        except (OSError, TimeoutError) as exc:
            last = exc
    hint = (
        ": the listener may require TLS or SASL (security.protocol); "
        if isinstance(last, KafkaConnectionError | ConnectionError)
        else ": "
    )
    raise ConnectionFailed(f"cannot talk to Kafka at {describe(settings)}{hint}{last!r}")


async def ask_any(connection: Connection, request: Any, timeout_s: float = 30.0) -> Any:
    """Send one request (an aiokafka `Request`, its version chosen by what the broker supports)
    to the first bootstrap server that answers, with the connection's TLS and SASL settings;
    its response. Raises the last error when none answers."""
    settings = settings_of(connection)
    security = {k: v for k, v in settings.items() if k in _CONNECTION and k != "bootstrap_servers"}
    client_id = str(security.pop("client_id", None) or "tandem")
    last: BaseException = ConnectionFailed(f"no bootstrap server in {describe(settings)}")
    for server in settings_of(bootstrap_of(settings))["bootstrap_servers"]:
        host, _, port = server.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), client_id=client_id, **security), timeout_s
            )
        except (OSError, TimeoutError, KafkaConnectionError) as exc:
            last = exc
            continue
        try:
            return await asyncio.wait_for(conn.send(request), timeout_s)
        except (OSError, TimeoutError, KafkaConnectionError) as exc:
            last = exc
        finally:
            conn.close()
    raise last
