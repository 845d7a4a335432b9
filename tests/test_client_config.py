"""assignor/clients.py: client properties files and Faust apps as aiokafka arguments.

The format and the checks are tested on text; the resulting arguments are tested by
connecting with them, through the secured front of the embedded broker
(tests/secure_kafka.py), with certificates made in the test.
"""

from __future__ import annotations

import re
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from hypothesis import given
from hypothesis import strategies as st

from assignor.clients import (
    REDACTED,
    ClientConfig,
    ClientConfigError,
    aiokafka_kwargs,
    client_config,
    faust_client_kwargs,
    faust_credentials,
    format_properties,
    is_secret,
    parse_client_config,
    parse_properties,
    redacted,
    ssl_context_for,
)
from tables.testing import read_records
from tests.secure_kafka import CertificateFiles, SecuredBroker, make_test_certificates

SECRET = "s3cr3t-Pa55word"

# -- the properties format -----------------------------------------------------------------------


def test_properties_comments_separators_continuations_and_escapes() -> None:
    text = (
        "# a librdkafka / Java client config\n"
        "! also a comment\n"
        "\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-512\n"
        "  sasl.username=tandem  \n"
        "sasl.password=pa=ss:wo#rd\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="tandem" \\\n'
        '    password="x";\n'
        "path.with\\=equals=C\\:\\\\certs\\\\ca.pem\n"
        "unicode=caf\\u00e9\n"
        "trailing.space=value\\ \n"
        "empty=\n"
    )
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "tandem",
        "sasl.password": "pa=ss:wo#rd",
        "sasl.jaas.config": (
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="tandem" password="x";'
        ),
        "path.with=equals": "C:\\certs\\ca.pem",
        "unicode": "café",
        "trailing.space": "value ",
        "empty": "",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("security.protocol=SSL\njust\n", "line 2: a key without a value"),
        ("a=1\nb=2\na=3\n", "line 3: a is set twice (first on line 1)"),
        ("=value\n", "line 1: a value without a key"),
        ("k=\\u12\n", "line 1: malformed"),
    ],
)
def test_properties_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ClientConfigError, match=re.escape(message)):
        parse_properties(text)


def test_properties_take_java_separators_whitespace_colon_and_equals() -> None:
    """java.util.Properties: the key ends at the first unescaped `=`, `:` or whitespace."""
    text = (
        f"sasl.password {SECRET}\n"
        "sasl.username:tandem\n"
        "security.protocol \t = SASL_SSL\n"
        "sasl.mechanism\tPLAIN\n"
        "client.id  :  tools\n"
        "with\\ space value\n"
        "url http://registry:8081/a=b\n"
        "spaced = a value with spaces\n"
    )
    assert parse_properties(text) == {
        "sasl.password": SECRET,
        "sasl.username": "tandem",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "client.id": "tools",
        "with space": "value",
        "url": "http://registry:8081/a=b",
        "spaced": "a value with spaces",
    }
    config = parse_client_config(
        f"security.protocol SASL_PLAINTEXT\nsasl.mechanism PLAIN\nsasl.username u\nsasl.password {SECRET}\n"
    )
    assert config.sasl_password == SECRET


@pytest.mark.parametrize(
    "text",
    [
        f"security.protocol=SASL_PLAINTEXT\n{SECRET}\n",  # a value wrapped onto its own line
        f"sasl.password={SECRET}\\u12\n",  # a malformed escape in the value
        f"sasl.password={SECRET}\nsasl.password={SECRET}\n",  # a key twice
    ],
)
def test_a_malformed_properties_line_is_never_echoed(text: str) -> None:
    with pytest.raises(ClientConfigError) as raised:
        parse_client_config(text)
    message = str(raised.value)
    assert message.startswith("line ") and SECRET not in message


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=40), max_size=8))
def test_format_then_parse_gives_back_every_mapping(properties: dict[str, str]) -> None:
    """Any keys and values, whitespace, separators, backslashes and line breaks included."""
    assert parse_properties(format_properties(properties)) == properties


# -- checking a configuration ------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_test_certificates(tmp_path_factory.mktemp("tls"))


def test_a_librdkafka_sasl_ssl_file_becomes_aiokafka_arguments(certificates: CertificateFiles) -> None:
    config = parse_client_config(
        f"""bootstrap.servers=kafka-1:9093, kafka-2:9093
client.id=tandem-tools
security.protocol=sasl_ssl
sasl.mechanism=SCRAM-SHA-256
sasl.username=tandem
sasl.password={SECRET}
ssl.ca.location={certificates.ca_file}
acks=all
schema.registry.url=https://registry:8081
basic.auth.user.info=key:{SECRET}
"""
    )
    assert config.security_protocol == "SASL_SSL" and config.uses_sasl and config.uses_tls
    assert config.ignored == ("acks", "schema.registry.url", "basic.auth.user.info")
    kwargs = aiokafka_kwargs(config)
    context = kwargs.pop("ssl_context")
    assert kwargs == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "tandem",
        "sasl_plain_password": SECRET,
        "bootstrap_servers": ["kafka-1:9093", "kafka-2:9093"],
        "client_id": "tandem-tools",
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert any(ca["subject"] == ((("commonName", "Tandem test CA"),),) for ca in context.get_ca_certs())
    assert "bootstrap_servers" not in aiokafka_kwargs(config, include_endpoints=False)


def test_java_jaas_config_gives_the_credentials() -> None:
    for quote in ('"', "'"):
        config = parse_client_config(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f"username={quote}api-key{quote} password={quote}{SECRET}{quote};\n"
        )
        assert (config.sasl_username, config.sasl_password) == ("api-key", SECRET)
    scram = parse_client_config(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="u" '
        'password="p\\\\\\"q";\n'  # the file says p\\\"q: the properties layer, then JAAS, unescape
    )
    assert (scram.sasl_username, scram.sasl_password) == ("u", 'p"q')


def test_client_certificate_with_an_encrypted_key(certificates: CertificateFiles) -> None:
    config = client_config(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(certificates.ca_file),
            "ssl.certificate.location": str(certificates.client_cert_file),
            "ssl.key.location": str(certificates.client_key_encrypted_file),
            "ssl.key.password": certificates.key_password,
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    context = ssl_context_for(config)
    assert context is not None and not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    wrong = client_config(
        {
            "security.protocol": "SSL",
            "ssl.certificate.location": str(certificates.client_cert_file),
            "ssl.key.location": str(certificates.client_key_encrypted_file),
            "ssl.key.password": SECRET,
        }
    )
    with pytest.raises(ClientConfigError, match="ssl.key.password") as failure:
        ssl_context_for(wrong)
    assert SECRET not in str(failure.value)


def test_verification_off_and_java_pem_truststore(certificates: CertificateFiles) -> None:
    unverified = ssl_context_for(
        client_config({"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"})
    )
    assert (
        unverified is not None and unverified.verify_mode == ssl.CERT_NONE and not unverified.check_hostname
    )
    java = client_config(
        {
            "security.protocol": "SSL",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certificates.ca_file),
            "ssl.protocol": "TLSv1.3",
        }
    )
    assert java.ssl_ca_location == str(certificates.ca_file)
    assert aiokafka_kwargs(java)["ssl_context"].get_ca_certs()
    assert aiokafka_kwargs(client_config({})) == {"security_protocol": "PLAINTEXT"}


BAD_CONFIGS: list[tuple[dict[str, str], str]] = [
    ({"security.protocol": "SASL_SSLX"}, "security.protocol='SASL_SSLX' is not one of"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism=OAUTHBEARER"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "DIGEST-MD5"}, "sasl.mechanism='DIGEST-MD5'"),
    ({"security.protocol": "SASL_SSL", "sasl.usernme": "x"}, "sasl.usernme is not a connection setting"),
    ({"security.protocol": "SASL_SSL"}, "sasl.mechanism is required with security.protocol=SASL_SSL"),
    (
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
        "sasl.password is required with sasl.mechanism=PLAIN",
    ),
    ({"sasl.username": "u", "sasl.password": SECRET}, "sasl.username is set but security.protocol=PLAINTEXT"),
    (
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": SECRET,
            "ssl.ca.location": "/ca.pem",
        },
        "ssl.ca.location is set but security.protocol=SASL_PLAINTEXT does not use TLS .did you mean SASL_SSL",
    ),  # fmt: skip
    ({"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"}, "ssl.key.location is required"),
    (
        {"security.protocol": "SSL", "ssl.key.password": SECRET},
        "ssl.key.password is set without ssl.key.location",
    ),
    (
        {"security.protocol": "SSL", "ssl.keystore.location": "/k.jks"},
        "ssl.keystore.location is not supported",
    ),
    ({"security.protocol": "SSL", "ssl.key.pem": SECRET}, "ssl.key.pem is not supported"),
    (
        {"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"},
        "ssl.truststore.location: Java trust",
    ),
    (
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldaps"},
        "ssl.endpoint.identification",
    ),
    ({"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"}, "enable.ssl.certificate"),
    (
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": 'o.a.k.PlainLoginModule required username="u";',
        },
        "sasl.jaas.config: PlainLoginModule does not go with sasl.mechanism=SCRAM-SHA-256",
    ),  # fmt: skip
    (
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "other",
            "sasl.jaas.config": f'x.PlainLoginModule required username="u" password="{SECRET}";',
        },
        "sasl.username and sasl.jaas.config disagree",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("properties", "message"), BAD_CONFIGS)
def test_bad_configurations_name_the_key_and_never_the_secret(
    properties: dict[str, str], message: str
) -> None:
    with pytest.raises(ClientConfigError, match=message) as failure:
        client_config(properties)
    assert SECRET not in str(failure.value)


def test_a_missing_ca_file_names_its_key(tmp_path: Path) -> None:
    config = client_config({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "absent.pem")})
    with pytest.raises(ClientConfigError, match="ssl.ca.location="):
        aiokafka_kwargs(config)


# -- secrets out of logs -------------------------------------------------------------------------


def test_redacted_hides_every_secret_in_every_form(certificates: CertificateFiles) -> None:
    properties = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "tandem",
        "sasl.password": SECRET,
        "sasl.jaas.config": f'x.PlainLoginModule required username="tandem" password="{SECRET}";',
        "ssl.ca.location": str(certificates.ca_file),
        "basic.auth.user.info": f"key:{SECRET}",
    }
    config = client_config(properties)
    kwargs = aiokafka_kwargs(config)
    for shown in (redacted(properties), redacted(config), redacted(kwargs)):
        assert SECRET not in repr(shown) and REDACTED in shown.values()
    assert redacted(properties)["sasl.username"] == "tandem"
    assert redacted(kwargs)["sasl_plain_username"] == "tandem"
    assert redacted(config)["ssl_ca_location"] == str(certificates.ca_file)
    assert SECRET not in repr(config) and SECRET not in str(config)
    assert redacted(ClientConfig())["sasl_password"] is None  # unset stays visible as unset
    assert all(map(is_secret, ["ssl.key.password", "sasl_oauth_token_provider", "broker_credentials"]))
    assert not any(map(is_secret, ["ssl.key.location", "sasl.username", "security.protocol"]))


# -- a Faust app's own settings -------------------------------------------------------------------


def _app(**settings: Any) -> faust.App:
    return faust.App(f"cc-{uuid.uuid4().hex[:8]}", broker="kafka://k1:9093;kafka://k2", **settings)


def test_faust_settings_become_the_same_arguments_its_clients_get(certificates: CertificateFiles) -> None:
    context = certificates.client_context()
    plain = faust_client_kwargs(_app().conf, client_id_suffix="tandem-restore")
    assert plain == {
        "bootstrap_servers": ["k1:9093", "k2:9092"],
        "client_id": f"faust-{faust.__version__}-tandem-restore",
        "security_protocol": "PLAINTEXT",
    }
    assert faust_client_kwargs(_app(ssl_context=context).conf)["security_protocol"] == "SSL"
    for credentials in (faust.SSLCredentials(context), context):
        found = faust_client_kwargs(_app(broker_credentials=credentials).conf)
        assert found["security_protocol"] == "SSL" and found["ssl_context"] is context
    sasl = faust.SASLCredentials(
        username="u", password=SECRET, mechanism="SCRAM-SHA-512", ssl_context=context
    )
    found = faust_client_kwargs(
        _app(broker_credentials=sasl, broker_client_id="orders").conf, client_id_suffix="x"
    )
    assert found == {
        "bootstrap_servers": ["k1:9093", "k2:9092"],
        "client_id": "orders-x",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
        "sasl_plain_password": SECRET,
        "ssl_context": context,
    }
    assert SECRET not in repr(redacted(found))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "security.protocol=SSL\n",
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n",
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\nsasl.password=p\n",
    ],
)
def test_faust_credentials_give_the_app_what_the_file_says(text: str) -> None:
    """A properties file -> Faust's broker_credentials -> what Faust's clients then use:
    the same security arguments as the file read directly."""
    config = parse_client_config(text)
    through_faust = faust_client_kwargs(_app(broker_credentials=faust_credentials(config)).conf)
    direct = aiokafka_kwargs(config, include_endpoints=False)
    contexts = [found.pop("ssl_context", None) for found in (through_faust, direct)]
    assert [isinstance(c, ssl.SSLContext) for c in contexts] == [config.uses_tls] * 2
    del through_faust["bootstrap_servers"], through_faust["client_id"]
    assert through_faust == direct


# -- the arguments connect: through the secured broker -----------------------------------------------

MODES = {"ssl": (True, False), "sasl_plaintext": (False, True), "sasl_ssl": (True, True)}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SecuredBroker]]:
    brokers: dict[str, SecuredBroker] = {}
    try:
        for name, (tls, sasl) in MODES.items():
            brokers[name] = SecuredBroker(tls=tls, sasl=sasl, work_dir=tmp_path_factory.mktemp(name)).start()
        yield brokers
    finally:
        for broker in brokers.values():
            broker.stop()


async def _produce_and_read(kwargs: dict[str, Any], count: int = 8) -> list[bytes]:
    """Create a topic, produce `count` records and read them back, all with `kwargs`."""
    topic = f"cc-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(**kwargs)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**kwargs)
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode())
    finally:
        await producer.stop()
    options = {k: v for k, v in kwargs.items() if k != "bootstrap_servers"}
    records = await read_records(kwargs["bootstrap_servers"], topic, 2, timeout=30, **options)
    return sorted(r.value for r in records)


CONNECT_CASES = [
    ("ssl", "PLAIN"),
    ("sasl_plaintext", "SCRAM-SHA-256"),
    ("sasl_ssl", "PLAIN"),
    ("sasl_ssl", "SCRAM-SHA-512"),
]


@pytest.mark.broker
@pytest.mark.parametrize(("mode", "mechanism"), CONNECT_CASES)
async def test_a_client_config_file_connects(
    secured: dict[str, SecuredBroker], tmp_path: Path, mode: str, mechanism: str
) -> None:
    broker = secured[mode]
    path = broker.write_client_config(tmp_path / "client.properties", mechanism)
    kwargs = aiokafka_kwargs(parse_client_config(path.read_text()))
    refused = len(broker.refusals())
    assert await _produce_and_read(kwargs) == sorted(f"v{i}".encode() for i in range(8))
    assert broker.refusals()[refused:] == []


@pytest.mark.broker
async def test_a_client_config_with_an_encrypted_client_key_connects(tmp_path: Path) -> None:
    with SecuredBroker(tls=True, sasl=True, client_auth=True, work_dir=tmp_path) as broker:
        assert broker.certificates is not None
        properties = broker.client_properties("SCRAM-SHA-256")
        properties["ssl.key.location"] = str(broker.certificates.client_key_encrypted_file)
        properties["ssl.key.password"] = broker.certificates.key_password
        kwargs = aiokafka_kwargs(parse_client_config(format_properties(properties)))
        assert len(await _produce_and_read(kwargs)) == 8


@pytest.mark.broker
@pytest.mark.parametrize("mode", ["ssl", "sasl_ssl", "sasl_plaintext"])
async def test_a_faust_apps_settings_connect(secured: dict[str, SecuredBroker], mode: str) -> None:
    broker = secured[mode]
    context = broker.ssl_context()
    credentials: Any = (
        faust.SASLCredentials(
            username=broker.username, password=broker.password, mechanism="SCRAM-SHA-256", ssl_context=context
        )
        if broker.sasl
        else faust.SSLCredentials(context)
    )
    app = faust.App(
        f"cc-{uuid.uuid4().hex[:8]}", broker=f"kafka://{broker.bootstrap}", broker_credentials=credentials
    )
    kwargs = faust_client_kwargs(app.conf, client_id_suffix="tandem-probe")
    assert await _produce_and_read(kwargs) == sorted(f"v{i}".encode() for i in range(8))
