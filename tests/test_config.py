"""kcore.config: keys, defaults, value parsing and the checks across keys, against the Java
client's own rules.

Most tests are plain Python. Two run the kafka-clients jar of ``PROTOCOL_SOURCE_VERSION``
(single-file Java, no broker): every default and role of kcore's key table must equal Java's
``ProducerConfig`` / ``ConsumerConfig`` / ``AdminClientConfig`` ones (bar the deviations listed
below), and a table of configs must be accepted or refused by kcore exactly as Java's config
classes accept or refuse them, with the same resulting values.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kcore.config import (
    ALIASES,
    CONFIG_DEFS,
    ROLES,
    STRICT_KEY,
    ClientConfig,
    ConfigDef,
    OneOf,
    markdown_table,
    parse_iso_duration,
    parse_jaas_config,
)
from kcore.errors import ConfigError
from kcore.testing import jars
from kcore.testing.versions import PROTOCOL_SOURCE_VERSION, SLF4J_VERSION

REPO = Path(__file__).resolve().parent.parent
BOOT = {"bootstrap.servers": "localhost:9092"}
PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="alice" password="s3cr3t-Pa55";'
)
SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="bob" password="sc/ram;pw=1";'
)
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
_DEFS = {d.name: d for d in CONFIG_DEFS}


def cfg(role: str = "common", **settings: Any) -> ClientConfig:
    """A config from keyword arguments with dots spelled as double underscores."""
    given = {**BOOT, **{k.replace("__", "."): v for k, v in settings.items()}}
    return ClientConfig(given, role=role)  # type: ignore[arg-type]


def error(config: Mapping[str, Any], role: str = "common") -> str:
    with pytest.raises(ConfigError) as info:
        ClientConfig({**BOOT, **config}, role=role)  # type: ignore[arg-type]
    return str(info.value)


# -- defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "key", "expected"),
    [
        ("producer", "acks", -1),
        ("producer", "linger.ms", 5),
        ("producer", "batch.size", 16384),
        ("producer", "buffer.memory", 33554432),
        ("producer", "enable.idempotence", True),
        ("producer", "max.in.flight.requests.per.connection", 5),
        ("producer", "retries", 2147483647),
        ("producer", "delivery.timeout.ms", 120000),
        ("producer", "max.block.ms", 60000),
        ("producer", "max.request.size", 1048576),
        ("producer", "compression.type", "none"),
        ("producer", "compression.zstd.level", 3),
        ("producer", "receive.buffer.bytes", 32768),
        ("producer", "connections.max.idle.ms", 540000),
        ("producer", "partitioner.class", None),
        ("producer", "partitioner.adaptive.partitioning.enable", True),
        ("producer", "transaction.timeout.ms", 60000),
        ("consumer", "group.id", None),
        ("consumer", "group.protocol", "classic"),
        ("consumer", "auto.offset.reset", "latest"),
        ("consumer", "max.poll.records", 500),
        ("consumer", "max.poll.interval.ms", 300000),
        ("consumer", "session.timeout.ms", 45000),
        ("consumer", "heartbeat.interval.ms", 3000),
        ("consumer", "fetch.min.bytes", 1),
        ("consumer", "fetch.max.bytes", 52428800),
        ("consumer", "fetch.max.wait.ms", 500),
        ("consumer", "max.partition.fetch.bytes", 1048576),
        ("consumer", "isolation.level", "read_uncommitted"),
        ("consumer", "partition.assignment.strategy", ["range", "cooperative-sticky"]),
        ("consumer", "receive.buffer.bytes", -1),  # not Java's 65536: the OS default
        ("consumer", "default.api.timeout.ms", 60000),
        ("consumer", "check.crcs", True),
        ("consumer", "client.rack", ""),
        ("admin", "connections.max.idle.ms", 300000),
        ("admin", "default.api.timeout.ms", 60000),
        ("admin", "retries", 2147483647),
        ("admin", "receive.buffer.bytes", 65536),
        ("common", "request.timeout.ms", 30000),
        ("common", "metadata.max.age.ms", 300000),
        ("common", "metadata.recovery.strategy", "rebootstrap"),
        ("common", "metadata.recovery.rebootstrap.trigger.ms", 300000),
        ("common", "client.dns.lookup", "use_all_dns_ips"),
        ("common", "reconnect.backoff.ms", 50),
        ("common", "reconnect.backoff.max.ms", 1000),
        ("common", "retry.backoff.ms", 100),
        ("common", "retry.backoff.max.ms", 1000),
        ("common", "socket.connection.setup.timeout.ms", 10000),
        ("common", "socket.connection.setup.timeout.max.ms", 30000),
        ("common", "send.buffer.bytes", -1),  # not Java's 131072: the OS default
        ("common", "security.protocol", "PLAINTEXT"),
        ("common", "sasl.mechanism", "GSSAPI"),
        ("common", "ssl.protocol", "TLSv1.3"),
        ("common", "ssl.enabled.protocols", ["TLSv1.2", "TLSv1.3"]),
        ("common", "ssl.endpoint.identification.algorithm", "https"),
        ("common", "ssl.truststore.type", "PEM"),
        ("common", "client.id", ""),
    ],
)
def test_defaults_are_javas(role: str, key: str, expected: Any) -> None:
    assert cfg(role)[key] == expected


def test_every_key_of_the_role_has_a_value_and_no_other() -> None:
    for role in (*ROLES, "common"):
        c = cfg(role)
        expected = {
            d.name
            for d in CONFIG_DEFS
            if (role in d.roles if role != "common" else d.roles == frozenset(ROLES))
        }
        assert set(c) == expected and len(c) == len(expected)
    assert "linger.ms" in cfg("producer") and "linger.ms" not in cfg("consumer")
    assert "max.in.flight.requests.per.connection" not in cfg("consumer")  # producer-only in Java
    assert "client.rack" not in cfg("producer")  # consumer-only in Java
    assert "default.api.timeout.ms" not in cfg("common")


def test_defaults_that_follow_other_keys() -> None:
    # Java turns auto-commit off without a group, and idempotence off for a conflicting acks.
    assert cfg("consumer")["enable.auto.commit"] is False
    assert cfg("consumer", group__id="g")["enable.auto.commit"] is True
    assert cfg("producer", acks="1")["enable.idempotence"] is False
    # The producer's delivery timeout grows to cover one linger and one request.
    assert cfg("producer", linger__ms=100000)["delivery.timeout.ms"] == 130000
    # The admin client's call timeout grows to cover one request.
    assert cfg("admin", request__timeout__ms=70000)["default.api.timeout.ms"] == 70000


def test_config_is_a_read_only_mapping() -> None:
    c = cfg("producer", linger__ms=7)
    assert isinstance(c, Mapping)
    with pytest.raises(TypeError):
        c["linger.ms"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        c.foo = 1  # type: ignore[attr-defined]
    c["bootstrap.servers"].append("evil:1")
    assert c["bootstrap.servers"] == ["localhost:9092"]
    with pytest.raises(KeyError):
        c["no.such.key"]
    assert c.get("no.such.key") is None
    assert dict(c)["linger.ms"] == 7
    assert c.role == "producer"


# -- keys -------------------------------------------------------------------------------------


def test_unknown_key_with_a_typo_names_the_key_meant() -> None:
    assert error({"linger.m": 5}, "producer") == (
        "linger.m: unknown config; did you mean 'linger.ms'?"
    )
    assert "did you mean 'bootstrap.servers'?" in error({"bootstrap.server": "a:1"})
    assert "did you mean 'group.id'?" in error({"group.idd": "g"}, "consumer")
    assert error({"completely.unknown": 1}) == "completely.unknown: unknown config"


def test_typo_of_a_key_of_another_role_says_whose_it_is() -> None:
    assert error({"lnger.ms": 5}, "consumer") == (
        "lnger.ms: unknown config; did you mean 'linger.ms' (a producer setting)?"
    )


STRICT = {STRICT_KEY: "true"}


def test_key_of_another_role_is_refused_in_strict_mode() -> None:
    assert error({"linger.ms": 5, **STRICT}, "consumer") == (
        "linger.ms: a producer setting, not a consumer one"
    )
    assert error({"group.id": "g", **STRICT}, "producer") == (
        "group.id: a consumer setting, not a producer one"
    )
    assert error({"default.api.timeout.ms": 1, **STRICT}, "producer") == (
        "default.api.timeout.ms: an admin and consumer setting, not a producer one"
    )
    assert error({"retries": 1, STRICT_KEY: True}, "consumer") == (
        "retries: an admin and producer setting, not a consumer one"
    )
    # "common" (the shared layers' view) is always strict.
    assert error({"linger.ms": 5}, "common") == "linger.ms: a producer setting, not a common one"
    # A librdkafka alias of a producer key is a producer setting too.
    assert "a producer setting" in error({"queue.buffering.max.ms": 5, **STRICT}, "admin")
    assert error({STRICT_KEY: "yes"}, "admin") == (
        "kcore.config.strict: must be true or false, got 'yes'"
    )


def test_one_dict_serves_every_role(caplog: pytest.LogCaptureFixture) -> None:
    shared = {
        **BOOT,
        "security.protocol": "PLAINTEXT",
        "request.timeout.ms": "20000",
        "linger.ms": "7",
        "acks": "all",
        "group.id": "g",
        "auto.offset.reset": "earliest",
        "default.api.timeout.ms": "25000",
        "session.timeout.ms": None,  # not set: nothing to ignore, nothing logged
    }
    config_module = sys.modules[ClientConfig.__module__]
    config_module._LOGGED_IGNORED.clear()  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="kcore.config"):
        producer = ClientConfig(shared, role="producer")
        consumer = ClientConfig(shared, role="consumer")
        admin = ClientConfig(shared, role="admin")
        ClientConfig(shared, role="producer")  # logged once per key and role
    assert (producer["linger.ms"], producer["acks"], producer["request.timeout.ms"]) == (
        7,
        -1,
        20000,
    )
    assert producer.ignored_keys == {"group.id", "auto.offset.reset", "default.api.timeout.ms"}
    assert "group.id" not in producer.user_keys
    assert consumer["group.id"] == "g" and consumer["default.api.timeout.ms"] == 25000
    assert consumer.ignored_keys == {"linger.ms", "acks"}
    assert admin["default.api.timeout.ms"] == 25000
    assert admin.ignored_keys == {"linger.ms", "acks", "group.id", "auto.offset.reset"}
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "group.id: a consumer setting, ignored by this producer "
        "(set kcore.config.strict=true to refuse it)"
    ) in messages
    assert (
        "default.api.timeout.ms: an admin and consumer setting, ignored by this producer "
        "(set kcore.config.strict=true to refuse it)"
    ) in messages
    assert len(messages) == len(set(messages)) == 3 + 2 + 4


def test_another_roles_key_is_still_checked() -> None:
    # A bad value or a typo is refused whichever client the key is for.
    assert error({"session.timeout.ms": "soon"}, "producer") == (
        "session.timeout.ms: must be an int, got 'soon'"
    )
    assert error({"acks": "2"}, "consumer") == "acks: must be one of all, -1, 0, 1, got '2'"
    assert error({"linger.msec": 5}, "consumer") == (
        "linger.msec: unknown config; did you mean 'linger.ms' (a producer setting)?"
    )
    assert error({"linger.msec": 5}, "producer") == (
        "linger.msec: unknown config; did you mean 'linger.ms'?"
    )


def test_java_keys_kcore_does_not_take_say_so() -> None:
    for key in (
        "sasl.kerberos.service.name",
        "interceptor.classes",
        "metric.reporters",
        "sasl.oauthbearer.jwks.endpoint.url",
        "ssl.keymanager.algorithm",
    ):
        assert "a Java client setting kcore does not take" in error({key: "x"}, "producer")


def test_librdkafka_aliases_map_to_the_java_key() -> None:
    c = ClientConfig(
        {
            "metadata.broker.list": "a:1,b:2",
            "queue.buffering.max.ms": "20",
            "request.required.acks": "all",
            "compression.codec": "lz4",
            "max.in.flight": 3,
            "sasl.mechanisms": "SCRAM-SHA-512",
        },
        role="producer",
    )
    assert c.bootstrap_servers == ["a:1", "b:2"]
    assert (c["linger.ms"], c["acks"], c["compression.type"]) == (20, -1, "lz4")
    assert c["max.in.flight.requests.per.connection"] == 3
    assert c["sasl.mechanism"] == "SCRAM-SHA-512"
    assert "linger.ms" in c.user_keys and "queue.buffering.max.ms" not in c.user_keys
    assert set(ALIASES.values()) <= {d.name for d in CONFIG_DEFS}
    assert "set both as 'linger.ms' and 'queue.buffering.max.ms'" in error(
        {"linger.ms": 1, "queue.buffering.max.ms": 1}, "producer"
    )


def test_user_keys_are_the_keys_set() -> None:
    c = cfg("producer", linger__ms=1, transactional__id=None)
    assert c.user_keys == frozenset({"bootstrap.servers", "linger.ms"})
    assert c["transactional.id"] is None  # None means "not set"


def test_non_string_key_and_bad_role() -> None:
    with pytest.raises(ConfigError, match="config keys must be strings"):
        ClientConfig({**BOOT, 5: 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="role: must be one of admin, producer, consumer"):
        ClientConfig(BOOT, role="broker")  # type: ignore[arg-type]


def test_a_config_can_be_rechecked_for_another_role() -> None:
    common = cfg("common", client__id="app", security__protocol="ssl")
    producer = ClientConfig(common, role="producer")
    assert producer["client.id"] == "app" and producer["security.protocol"] == "SSL"
    assert producer.user_keys == common.user_keys
    again = ClientConfig(cfg("producer", acks=0, partitioner__class=len), role="producer")
    assert again["acks"] == 0 and again["partitioner.class"] is len
    assert ClientConfig(cfg("producer", linger__ms=1), role="consumer").ignored_keys == {
        "linger.ms"
    }
    with pytest.raises(ConfigError, match="linger.ms: a producer setting, not a consumer one"):
        ClientConfig(cfg("producer", linger__ms=1, kcore__config__strict=True), role="consumer")


# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "as_string", "as_python", "expected"),
    [
        ("linger.ms", "100", 100, 100),
        ("linger.ms", " 7 ", 7, 7),
        ("enable.idempotence", "TRUE", True, True),
        ("enable.idempotence", "false", False, False),
        ("acks", "1", 1, 1),
        ("acks", "all", -1, -1),
        ("acks", "0", 0, 0),
        ("bootstrap.servers", "a:1, b:2", ["a:1", "b:2"], ["a:1", "b:2"]),
        ("ssl.enabled.protocols", "TLSv1.3", ("TLSv1.3",), ["TLSv1.3"]),
        ("compression.gzip.level", "-1", -1, -1),
        ("security.protocol", "ssl", "SSL", "SSL"),
        ("client.id", "  app  ", "app", "app"),
        ("buffer.memory", "4294967296", 2**32, 2**32),
    ],
)
def test_strings_and_python_values_give_the_same_result(
    key: str, as_string: str, as_python: Any, expected: Any
) -> None:
    base = {"bootstrap.servers": "x:1"}
    if key == "enable.idempotence":
        base["acks"] = "all"
    for value in (as_string, as_python):
        c = ClientConfig({**base, key: value}, role="producer")
        assert c[key] == expected


@pytest.mark.parametrize(
    ("role", "config", "message"),
    [
        (
            "producer",
            {"request.timeout.ms": "abc"},
            "request.timeout.ms: must be an int >= 0, got 'abc'",
        ),
        ("producer", {"request.timeout.ms": -1}, "request.timeout.ms: must be an int >= 0, got -1"),
        (
            "producer",
            {"request.timeout.ms": 2**31},
            "request.timeout.ms: must be an int >= 0, got 2147483648",
        ),
        ("producer", {"linger.ms": True}, "linger.ms: must be an int >= 0, got True"),
        ("producer", {"linger.ms": 1.5}, "linger.ms: must be an int >= 0, got 1.5"),
        ("producer", {"linger.ms": "1_000"}, "linger.ms: must be an int >= 0, got '1_000'"),
        ("producer", {"acks": "2"}, "acks: must be one of all, -1, 0, 1, got '2'"),
        ("producer", {"acks": "ALL"}, "acks: must be one of all, -1, 0, 1, got 'ALL'"),
        ("producer", {"acks": True}, "acks: must be one of all, -1, 0, 1, got True"),
        ("producer", {"enable.idempotence": 1}, "enable.idempotence: must be true or false, got 1"),
        (
            "producer",
            {"enable.idempotence": "yes"},
            "enable.idempotence: must be true or false, got 'yes'",
        ),
        (
            "producer",
            {"compression.type": "GZIP"},
            "compression.type: must be one of none, gzip, snappy, lz4, zstd, got 'GZIP'",
        ),
        (
            "producer",
            {"compression.gzip.level": 0},
            "compression.gzip.level: must be an int between 1 and 9, or -1, got 0",
        ),
        (
            "producer",
            {"max.in.flight.requests.per.connection": 0},
            "max.in.flight.requests.per.connection: must be an int >= 1, got 0",
        ),
        (
            "producer",
            {"metadata.max.idle.ms": 4999},
            "metadata.max.idle.ms: must be an int >= 5000, got 4999",
        ),
        (
            "producer",
            {"transactional.id": ""},
            "transactional.id: must be a non-empty string, got ''",
        ),
        (
            "producer",
            {"partitioner.class": "org.apache.kafka.clients.producer.RoundRobinPartitioner"},
            "partitioner.class: must be a Python callable or None (Java class names are not "
            "supported), got 'org.apache.kafka.clients.producer.RoundRobinPartitioner'",
        ),
        (
            "producer",
            {"key.serializer": 5},
            "key.serializer: must be a Python callable or None, got 5",
        ),
        (
            "consumer",
            {"isolation.level": "READ_COMMITTED"},
            "isolation.level: must be one of read_uncommitted, read_committed, "
            "got 'READ_COMMITTED'",
        ),
        (
            "consumer",
            {"auto.offset.reset": "smallest"},
            "auto.offset.reset: must be one of earliest, latest, none, by_duration:<ISO-8601 "
            "duration such as PT1H>, got 'smallest'",
        ),
        (
            "consumer",
            {"partition.assignment.strategy": "range,fair"},
            "partition.assignment.strategy: must be a comma-separated list, each one of range, "
            "roundrobin, sticky, cooperative-sticky, got 'fair'",
        ),
        (
            "common",
            {"client.dns.lookup": "default"},
            "client.dns.lookup: must be one of use_all_dns_ips, "
            "resolve_canonical_bootstrap_servers_only, got 'default'",
        ),
        (
            "common",
            {"ssl.enabled.protocols": "TLSv1.1,TLSv1.2"},
            "ssl.enabled.protocols: must be a comma-separated list, each one of TLSv1.2, TLSv1.3, "
            "got 'TLSv1.1'",
        ),
        (
            "common",
            {"ssl.enabled.protocols": 5},
            "ssl.enabled.protocols: must be a comma-separated list, each one of TLSv1.2, "
            "TLSv1.3, got 5",
        ),
        (
            "common",
            {"ssl.endpoint.identification.algorithm": "ldaps"},
            "ssl.endpoint.identification.algorithm: must be https (verify the broker host name) or "
            "\"\" (do not), got 'ldaps'",
        ),
        ("common", {"client.id": 5}, "client.id: must be a string, got 5"),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(
    role: str, config: dict[str, Any], message: str
) -> None:
    assert error(config, role) == message


def test_callables() -> None:
    def part(key: bytes | None, n: int) -> int:
        return 0

    c = cfg("producer", partitioner__class=part, key__serializer=str.encode)
    assert c["partitioner.class"] is part and c["key.serializer"] is str.encode
    assert c["value.serializer"] is None
    assert cfg("consumer", value__deserializer=bytes.decode)["value.deserializer"] is bytes.decode


def test_ssl_endpoint_identification_can_be_turned_off() -> None:
    assert (
        cfg(ssl__endpoint__identification__algorithm="")["ssl.endpoint.identification.algorithm"]
        == ""
    )
    assert (
        cfg(ssl__endpoint__identification__algorithm="HTTPS")[
            "ssl.endpoint.identification.algorithm"
        ]
        == "https"
    )


def test_case_insensitive_choices_are_normalized() -> None:
    assert (
        cfg(security__protocol="sasl_ssl", sasl__mechanism="PLAIN", sasl__jaas__config=PLAIN_JAAS)[
            "security.protocol"
        ]
        == "SASL_SSL"
    )
    assert cfg(metadata__recovery__strategy="NONE")["metadata.recovery.strategy"] == "none"
    assert cfg("consumer", group__protocol="Consumer")["group.protocol"] == "consumer"


def test_seconds_and_backoff() -> None:
    c = cfg("producer", linger__ms=5, retry__backoff__ms=2000)
    assert c.seconds("request.timeout.ms") == 30.0
    assert c.seconds("linger.ms") == 0.005
    with pytest.raises(KeyError):
        c.seconds("batch.size")
    with pytest.raises(KeyError):
        c.seconds("group.id.ms")
    assert cfg().backoff("reconnect") == (0.05, 1.0)
    # Java: a first backoff above the max gives a constant backoff at the max.
    assert c.backoff("retry") == (1.0, 1.0)
    assert cfg().backoff("connection.setup") == (10.0, 30.0)


def test_reconnect_backoff_set_alone_is_also_the_max() -> None:
    assert cfg(reconnect__backoff__ms=2000)["reconnect.backoff.max.ms"] == 2000
    assert cfg(reconnect__backoff__ms=20)["reconnect.backoff.max.ms"] == 20
    both = cfg(reconnect__backoff__ms=2000, reconnect__backoff__max__ms=1000)
    assert (both["reconnect.backoff.ms"], both["reconnect.backoff.max.ms"]) == (2000, 1000)
    assert both.backoff("reconnect") == (1.0, 1.0)
    assert cfg(reconnect__backoff__max__ms=10)["reconnect.backoff.ms"] == 50


# -- bootstrap.servers ------------------------------------------------------------------------


def test_bootstrap_servers_parsing() -> None:
    c = ClientConfig({"bootstrap.servers": " a:9092 ,, b.example.com:19092 , [::1]:9093,"})
    assert c.bootstrap_servers == ["a:9092", "b.example.com:19092", "[::1]:9093"]
    assert c.bootstrap_addresses == [("a", 9092), ("b.example.com", 19092), ("::1", 9093)]
    assert ClientConfig({"bootstrap.servers": ["10.0.0.1:1", " h_1:65535 "]}).bootstrap_servers == [
        "10.0.0.1:1",
        "h_1:65535",
    ]
    # A listener string's scheme is ignored, as Java does.
    assert ClientConfig({"bootstrap.servers": "SASL_SSL://k:9093"}).bootstrap_servers == ["k:9093"]
    assert ClientConfig({"bootstrap.servers": "[fe80::1%eth0]:9092"}).bootstrap_addresses == [
        ("fe80::1%eth0", 9092)
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a:1,foo", "must be host:port entries (a port is required), got 'foo'"),
        (":9092", "must be host:port entries (a port is required), got ':9092'"),
        ("a:0", "must be host:port entries with a port between 1 and 65535, got 'a:0'"),
        ("a:65536", "must be host:port entries with a port between 1 and 65535, got 'a:65536'"),
        ("a:x", "must be host:port entries with a port between 1 and 65535, got 'a:x'"),
        ("::1:9092", "write an IPv6 address in brackets: [::1]:9092, got '::1:9092'"),
        ("[::1]9092", "an IPv6 address is written [::1]:9092, got '[::1]9092'"),
        ("[nope]:1", "[...] must hold an IPv6 address, got '[nope]:1'"),
        ("bad host:1", "a valid host name or IPv4 address, got 'bad host:1'"),
    ],
)
def test_bad_bootstrap_entries(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig({"bootstrap.servers": value}, role="admin")
    assert str(info.value).startswith("bootstrap.servers: ")
    assert message in str(info.value)


@pytest.mark.parametrize("role", [*ROLES, "common"])
@pytest.mark.parametrize("value", [None, "", " , ", []])
def test_bootstrap_servers_is_required_for_every_role(role: str, value: Any) -> None:
    config = {} if value is None else {"bootstrap.servers": value}
    with pytest.raises(ConfigError, match=r"^bootstrap.servers: is required"):
        ClientConfig(config, role=role)  # type: ignore[arg-type]


# -- SASL -------------------------------------------------------------------------------------


def test_jaas_parsing() -> None:
    module, options = parse_jaas_config(PLAIN_JAAS)
    assert module.endswith(".PlainLoginModule")
    assert options == {"username": "alice", "password": "s3cr3t-Pa55"}
    module, options = parse_jaas_config(SCRAM_JAAS)
    assert module.endswith(".ScramLoginModule")
    assert options["password"] == "sc/ram;pw=1"  # quoted values hold ; = and /
    _, options = parse_jaas_config(
        "org.apache.kafka.common.security.scram.ScramLoginModule  Required\n"
        "  username=bob password='it\\'s \"q\"' tokenauth=true ;  "
    )
    assert options == {"username": "bob", "password": 'it\'s "q"', "tokenauth": "true"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PLAIN_JAAS[:-1], "ending with a semicolon"),
        (PLAIN_JAAS + " " + PLAIN_JAAS, "exactly one JAAS login module entry"),
        (PLAIN_JAAS.replace("required", "mandatory"), "flag is required, requisite"),
        (
            PLAIN_JAAS.replace('password="s3cr3t-Pa55"', 'password "s3cr3t-Pa55"'),
            'options are name="value" pairs',
        ),
        (PLAIN_JAAS.replace('"s3cr3t-Pa55";', '"s3cr3t-Pa55;'), "quoted values are closed"),
        ("s3cr3t-Pa55", "a JAAS entry: <LoginModule> <flag>"),
        (
            "com.example.S3cr3tModule required username=a password=s3cr3t-Pa55;",
            "PlainLoginModule, org.apache.kafka.common.security.scram.ScramLoginModule or "
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
        ),
        (
            'com.sun.security.auth.module.Krb5LoginModule required keyTab="s3cr3t-Pa55";',
            "Kerberos (GSSAPI) is not supported by kcore",
        ),
    ],
)
def test_bad_jaas_is_refused_without_echoing_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_jaas_config(text)
    assert message in str(info.value) and "s3cr3t" not in str(info.value)
    text_error = error({"sasl.jaas.config": text})
    assert text_error.startswith("sasl.jaas.config: must be ") and message in text_error
    assert "s3cr3t" not in text_error


def test_sasl_credentials() -> None:
    sasl = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    assert cfg().sasl_credentials() is None
    c = ClientConfig({**BOOT, **sasl, "sasl.username": "u", "sasl.password": "p"})
    assert c.sasl_credentials() == ("u", "p")
    c = ClientConfig({**BOOT, **sasl, "sasl.jaas.config": PLAIN_JAAS})
    assert c.sasl_credentials() == ("alice", "s3cr3t-Pa55")
    sasl["sasl.mechanism"] = "SCRAM-SHA-256"
    assert ClientConfig({**BOOT, **sasl, "sasl.jaas.config": SCRAM_JAAS}).sasl_credentials() == (
        "bob",
        "sc/ram;pw=1",
    )
    # Credentials without SASL are kept (and unused), as in Java.
    assert cfg(sasl__jaas__config=PLAIN_JAAS).sasl_credentials() == ("alice", "s3cr3t-Pa55")


def test_sasl_needs_a_supported_mechanism_and_credentials() -> None:
    creds = {"sasl.username": "u", "sasl.password": "p"}
    assert error({"security.protocol": "SASL_SSL", **creds}) == (
        "sasl.mechanism: is required with security.protocol=SASL_SSL: Java's default GSSAPI "
        "is not supported by kcore; set one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"
    )
    assert error({"sasl.mechanism": "GSSAPI"}) == (
        "sasl.mechanism: must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER: "
        "GSSAPI is not supported by kcore, got 'GSSAPI'"
    )
    assert "(upper case)" in error({"sasl.mechanism": "plain"})
    assert error({"sasl.mechanism": "FOO"}) == (
        "sasl.mechanism: must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, got 'FOO'"
    )
    # OAUTHBEARER takes a token source, not a username and password (tests/test_oauthbearer.py).
    assert error({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}).startswith(
        "sasl.mechanism: OAUTHBEARER needs a token source"
    )
    assert error({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}) == (
        "sasl.username: security.protocol=SASL_PLAINTEXT needs credentials: sasl.username and "
        "sasl.password, or sasl.jaas.config with username and password options"
    )
    no_password = "org.apache.kafka.common.security.plain.PlainLoginModule required username=a;"
    assert error(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": no_password,
        }
    ).startswith("sasl.jaas.config: security.protocol=SASL_SSL needs credentials")
    assert error({"sasl.username": "u"}) == "sasl.password: is required when sasl.username is set"
    assert error({"sasl.password": "p"}) == "sasl.username: is required when sasl.password is set"
    assert error({**creds, "sasl.jaas.config": PLAIN_JAAS}) == (
        "sasl.jaas.config: set either sasl.jaas.config or sasl.username and sasl.password, not both"
    )


# -- secrets ----------------------------------------------------------------------------------

SECRETS = {
    "sasl.jaas.config": PLAIN_JAAS,
    "ssl.key.password": "s3cr3t-3",
    "ssl.keystore.key": KEY.replace("MIIE", "s3cr3t4"),
    "ssl.keystore.certificate.chain": CERT.replace("MIIB", "s3cr3t5"),
}


def test_secrets_never_appear_in_repr_or_str() -> None:
    c = ClientConfig({**BOOT, **SECRETS, "client.id": "app"})
    librdkafka_style = ClientConfig({**BOOT, "sasl.username": "u", "sasl.password": "s3cr3t-1"})
    for text in (repr(c), str(c), repr(librdkafka_style), str(librdkafka_style)):
        assert "s3cr3t" not in text
    assert "'sasl.jaas.config': '[hidden]'" in repr(c) and "'client.id': 'app'" in repr(c)
    assert "'sasl.password': '[hidden]'" in repr(librdkafka_style)
    assert "'sasl.username': 'u'" in repr(librdkafka_style)
    # The values themselves are there for the client.
    assert librdkafka_style["sasl.password"] == "s3cr3t-1"
    assert c["ssl.key.password"] == "s3cr3t-3"
    secret_keys = {d.name for d in CONFIG_DEFS if d.secret}
    assert secret_keys == {
        "sasl.password",
        "sasl.jaas.config",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.truststore.certificates",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.config",
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"ssl.keystore.key": "s3cr3t-not-pem"},
            "ssl.keystore.key: must be inline PEM text with a PRIVATE KEY block",
        ),
        (
            {"ssl.truststore.certificates": "s3cr3t"},
            "ssl.truststore.certificates: must be inline PEM text with a CERTIFICATE block",
        ),
        (
            {"ssl.keystore.password": "s3cr3t"},
            "ssl.keystore.password: must be unset: PEM files take no store password (an encrypted "
            "PEM key's password goes in ssl.key.password)",
        ),
        (
            {"ssl.truststore.password": "s3cr3t"},
            "ssl.truststore.password: must be unset: PEM files take no store password (PEM "
            "certificates need none)",
        ),
        ({"sasl.password": 12345}, "sasl.password: must be a string"),
        ({"sasl.jaas.config": "s3cr3t"}, "sasl.jaas.config: must be a JAAS entry"),
    ],
)
def test_bad_secret_values_are_not_echoed(config: dict[str, Any], message: str) -> None:
    text = error(config)
    assert text == message or text.startswith(message)
    assert "s3cr3t" not in text and "12345" not in text


# -- SSL --------------------------------------------------------------------------------------


def test_ssl_stores_are_pem_only() -> None:
    for key in ("ssl.truststore.type", "ssl.keystore.type"):
        for kind in ("JKS", "pkcs12"):
            text = error({key: kind})
            assert text.startswith(f"{key}: must be PEM: {kind.upper()} stores are not supported")
            assert "convert the store to PEM" in text
        assert cfg(**{key.replace(".", "__"): "pem"})[key] == "PEM"


def test_ssl_settings() -> None:
    c = cfg(
        security__protocol="SSL",
        ssl__truststore__location="/etc/ca.pem",
        ssl__keystore__location="/etc/client.pem",
        ssl__key__password="pw",
        ssl__cipher__suites="ECDHE-RSA-AES128-GCM-SHA256, ECDHE-RSA-AES256-GCM-SHA384",
    )
    assert c["ssl.cipher.suites"] == ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"]
    c = cfg(ssl__ca__location="/ca", ssl__certificate__location="/c", ssl__key__location="/k")
    assert (c["ssl.ca.location"], c["ssl.key.location"]) == ("/ca", "/k")
    c = cfg(
        ssl__truststore__certificates=CERT,
        ssl__keystore__key=KEY,
        ssl__keystore__certificate__chain=CERT,
    )
    assert c["ssl.keystore.key"] == KEY


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"ssl.truststore.location": "/a", "ssl.ca.location": "/b"},
            "ssl.ca.location: set only one of ssl.truststore.location, ssl.ca.location",
        ),
        (
            {"ssl.truststore.location": "/a", "ssl.truststore.certificates": CERT},
            "ssl.truststore.certificates: set only one of ssl.truststore.location, "
            "ssl.truststore.certificates",
        ),
        (
            {"ssl.keystore.location": "/a", "ssl.certificate.location": "/b"},
            "ssl.certificate.location: set only one of ssl.keystore.location, "
            "ssl.certificate.location",
        ),
        (
            {"ssl.keystore.key": KEY},
            "ssl.keystore.key: and ssl.keystore.certificate.chain must be set together",
        ),
        ({"ssl.key.location": "/k"}, "ssl.key.location: needs ssl.certificate.location"),
    ],
)
def test_ssl_conflicts(config: dict[str, Any], message: str) -> None:
    assert error(config) == message


# -- producer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "idempotent"),
    [
        ({}, True),
        ({"acks": "all"}, True),
        ({"acks": "1"}, False),  # not set by the caller: silently off, as in Java
        ({"acks": 0}, False),
        ({"retries": 0}, False),
        ({"enable.idempotence": "false", "acks": "1"}, False),
        ({"enable.idempotence": False, "max.in.flight.requests.per.connection": 6}, False),
        ({"enable.idempotence": True, "max.in.flight.requests.per.connection": 5}, True),
        ({"transactional.id": "tx"}, True),
    ],
)
def test_idempotence(config: dict[str, Any], idempotent: bool) -> None:
    assert ClientConfig({**BOOT, **config}, role="producer")["enable.idempotence"] is idempotent


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"enable.idempotence": "true", "acks": "1"},
            "acks: must be all (-1) when enable.idempotence is true, got 1",
        ),
        (
            {"enable.idempotence": True, "retries": 0},
            "retries: must not be 0 when enable.idempotence is true",
        ),
        (
            {"max.in.flight.requests.per.connection": 6},
            "max.in.flight.requests.per.connection: must be at most 5 with the idempotent producer "
            "(on by default; set enable.idempotence=false for more), got 6",
        ),
        # Kafka 4.x fails here even though acks=1 would turn idempotence off.
        (
            {"max.in.flight.requests.per.connection": 6, "acks": "1"},
            "max.in.flight.requests.per.connection: must be at most 5",
        ),
        (
            {"transactional.id": "tx", "acks": "1"},
            "transactional.id: needs enable.idempotence=true (it is off because acks=1)",
        ),
        (
            {"transactional.id": "tx", "enable.idempotence": False},
            "transactional.id: needs enable.idempotence=true",
        ),
        (
            {"delivery.timeout.ms": 1000},
            "delivery.timeout.ms: must be >= linger.ms + request.timeout.ms (30005), got 1000",
        ),
    ],
)
def test_producer_conflicts(config: dict[str, Any], message: str) -> None:
    text = error(config, "producer")
    assert text == message or text.startswith(message)


# -- consumer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"enable.auto.commit": "true"},
            "enable.auto.commit: cannot be true when group.id is not set",
        ),
        (
            {"group.id": "g", "group.protocol": "consumer", "session.timeout.ms": 10000},
            "session.timeout.ms: cannot be set when group.protocol=consumer",
        ),
        (
            {"group.id": "g", "group.protocol": "CONSUMER", "heartbeat.interval.ms": 1000},
            "heartbeat.interval.ms: cannot be set when group.protocol=consumer",
        ),
        (
            {"group.protocol": "consumer", "partition.assignment.strategy": "range"},
            "partition.assignment.strategy: cannot be set when group.protocol=consumer",
        ),
        (
            {"group.remote.assignor": "uniform"},
            "group.remote.assignor: cannot be set when group.protocol=classic",
        ),
        (
            {"group.id": "g", "heartbeat.interval.ms": 45000},
            "heartbeat.interval.ms: must be lower than session.timeout.ms (45000), got 45000",
        ),
        ({"group.instance.id": ""}, "group.instance.id: must be a non-empty string, got ''"),
        ({"group.id": "  "}, "group.id: must be a non-empty string, got '  '"),
    ],
)
def test_consumer_conflicts(config: dict[str, Any], message: str) -> None:
    assert error(config, "consumer") == message


def test_consumer_settings() -> None:
    c = cfg(
        "consumer",
        group__id="g",
        group__protocol="consumer",
        group__remote__assignor="uniform",
        max__poll__records="10",
    )
    assert (c["group.protocol"], c["group.remote.assignor"], c["max.poll.records"]) == (
        "consumer",
        "uniform",
        10,
    )
    c = cfg(
        "consumer",
        partition__assignment__strategy=(
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor,roundrobin"
        ),
    )
    assert c["partition.assignment.strategy"] == ["cooperative-sticky", "roundrobin"]
    assert (
        cfg("consumer", heartbeat__interval__ms=50000)["heartbeat.interval.ms"] == 50000
    )  # no group


def test_auto_offset_reset() -> None:
    assert cfg("consumer").auto_offset_reset() == ("latest", None)
    assert cfg("consumer", auto__offset__reset="earliest").auto_offset_reset() == ("earliest", None)
    c = cfg("consumer", auto__offset__reset="by_duration:P1DT2H3M4.5S")
    assert c["auto.offset.reset"] == "by_duration:P1DT2H3M4.5S"
    assert c.auto_offset_reset() == ("by_duration", 86400 + 7200 + 180 + 4.5)
    assert "auto.offset.reset: must be one of" in error(
        {"auto.offset.reset": "by_duration:-PT1H"}, "consumer"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT1H", 3600.0),
        ("pt1h", 3600.0),
        ("P1D", 86400.0),
        ("PT0S", 0.0),
        ("PT1.5S", 1.5),
        ("PT1,5S", 1.5),
        ("+PT1M", 60.0),
        ("P-1DT25H", 3600.0),
        ("PT1H-30M", 1800.0),
        ("PT10.000000001S", 10.000000001),
    ],
)
def test_iso_durations(text: str, seconds: float) -> None:
    assert parse_iso_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "P", "PT", "P1W", "P1Y", "1H", "PT-1H", "-PT1H", "PT-0.5S", "PT0.0000000001S"]
)
def test_bad_iso_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso_duration(text)


# -- admin ------------------------------------------------------------------------------------


def test_admin_call_timeout_must_cover_a_request() -> None:
    assert error({"default.api.timeout.ms": 1000}, "admin") == (
        "default.api.timeout.ms: must be >= request.timeout.ms (30000), got 1000"
    )
    # The consumer has no such rule in Java.
    assert cfg("consumer", default__api__timeout__ms=1000)["default.api.timeout.ms"] == 1000


# -- the table and its doc --------------------------------------------------------------------


def test_key_table_is_consistent() -> None:
    names = [d.name for d in CONFIG_DEFS]
    assert len(names) == len(set(names))
    for d in CONFIG_DEFS:
        assert isinstance(d, ConfigDef)
        assert d.roles and d.roles <= set(ROLES), d.name
        assert d.doc.endswith((".", ")")), d.name
        for role in d.roles:
            # Every default passes its own validator (a wrong default would hide a bug).
            default = d.default_for(role)
            # sasl.mechanism keeps Java's default GSSAPI, which kcore refuses once SASL is on.
            if default is None or d.required or d.validator is None or d.name == "sasl.mechanism":
                continue
            if isinstance(default, tuple):
                assert tuple(d.validator(x) for x in default) == default, d.name
            elif not isinstance(d.validator, OneOf):
                assert d.validator(default) == default, d.name
    assert pickle.loads(pickle.dumps(CONFIG_DEFS)) == CONFIG_DEFS


def test_doc_table_is_up_to_date() -> None:
    doc = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- keys:start -->\n(.*?)<!-- keys:end -->", doc, re.S)
    assert match, "docs/config.md lost its <!-- keys:start --> / <!-- keys:end --> markers"
    assert match.group(1) == markdown_table(), (
        "docs/config.md's key table is stale: paste the output of `python -m kcore.config`"
    )
    result = subprocess.run(
        [sys.executable, "-m", "kcore.config"], capture_output=True, text=True, check=True
    )
    assert result.stdout == markdown_table()


# -- against the Java client ------------------------------------------------------------------

ORACLE = r"""
import java.io.*;
import java.util.*;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;

// Prints every key of the three client ConfigDefs (KEY role name type default), then builds one
// config per stdin line ("role<TAB>key=value<TAB>...") and prints its values or its error.
public class ConfigOracle {
    static ConfigDef def(String role) {
        if (role.equals("producer")) return ProducerConfig.configDef();
        if (role.equals("consumer")) return ConsumerConfig.configDef();
        return AdminClientConfig.configDef();
    }

    // ShareConsumerConfig is package-private: built by reflection, its own error unwrapped.
    static AbstractConfig shareConsumerConfig(Map<String, Object> m) throws Exception {
        Class<?> k = Class.forName("org.apache.kafka.clients.consumer.ShareConsumerConfig");
        java.lang.reflect.Constructor<?> c = k.getDeclaredConstructor(Map.class);
        c.setAccessible(true);
        try {
            return (AbstractConfig) c.newInstance(m);
        } catch (java.lang.reflect.InvocationTargetException e) {
            throw (Exception) e.getCause();
        }
    }

    static String text(Object v) {
        if (v instanceof Class) return ((Class<?>) v).getName();
        if (v instanceof List) {
            List<String> out = new ArrayList<>();
            for (Object o : (List<?>) v) out.add(text(o));
            return String.join(",", out);
        }
        return String.valueOf(v);
    }

    public static void main(String[] args) throws Exception {
        for (String role : new String[] {"admin", "producer", "consumer"}) {
            for (ConfigDef.ConfigKey k : def(role).configKeys().values()) {
                Object v = k.defaultValue;
                String d = v == ConfigDef.NO_DEFAULT_VALUE ? "<required>" : text(v);
                System.out.println("KEY\t" + role + "\t" + k.name + "\t" + k.type + "\t" + d);
            }
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        for (String line; (line = in.readLine()) != null; ) {
            String[] f = line.split("\t", -1);
            String role = f[0];
            Map<String, Object> m = new HashMap<>();
            String ser = "org.apache.kafka.common.serialization.ByteArray";
            if (role.equals("producer")) {
                m.put("key.serializer", ser + "Serializer");
                m.put("value.serializer", ser + "Serializer");
            } else if (role.equals("consumer") || role.equals("share_consumer")) {
                m.put("key.deserializer", ser + "Deserializer");
                m.put("value.deserializer", ser + "Deserializer");
            }
            for (int i = 1; i < f.length; i++) {
                int eq = f[i].indexOf('=');
                m.put(f[i].substring(0, eq), f[i].substring(eq + 1));
            }
            try {
                AbstractConfig c = role.equals("producer") ? new ProducerConfig(m)
                    : role.equals("consumer") ? new ConsumerConfig(m)
                    : role.equals("share_consumer") ? shareConsumerConfig(m)
                    : new AdminClientConfig(m);
                StringBuilder out = new StringBuilder("CASE\tOK");
                for (Map.Entry<String, ?> e : new TreeMap<>(c.values()).entrySet())
                    out.append("\t").append(e.getKey()).append("=").append(text(e.getValue()));
                System.out.println(out);
            } catch (Exception e) {
                System.out.println("CASE\tERR\t" + e.getMessage().replace('\n', ' '));
            }
        }
    }
}
"""

# Where kcore's table differs from Java's on purpose.
DEFAULT_DEVIATIONS = {
    # Java's admin client may use bootstrap.controllers instead; kcore's never does.
    "bootstrap.servers": "required by every kcore client",
    # Python's ssl module reads PEM only.
    "ssl.truststore.type": "PEM, not JKS",
    "ssl.keystore.type": "PEM, not JKS",
    # Java requires serializer classes; kcore's default is bytes in, bytes out.
    "key.serializer": "None",
    "value.serializer": "None",
    "key.deserializer": "None",
    "value.deserializer": "None",
    # The OS default (autotuned), as librdkafka: a fixed 128 KiB slowed large Produce requests.
    "send.buffer.bytes": "-1",
    # A consumer's is the OS default too (a fixed 64 KiB window slowed large fetch responses);
    # producers and admin clients keep Java's (checked in the defaults table above).
    "receive.buffer.bytes": "-1 for consumers",
}
# A Java CLASS key kcore takes as a string: the names of Java's own OAUTHBEARER login handlers
# (kcore does what they do); any other class is Java code and refused.
TYPE_DEVIATIONS = {"sasl.login.callback.handler.class"}
LIBRDKAFKA_KEYS = {
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    # OAUTHBEARER as librdkafka and confluent-kafka configure it
    "oauth_cb",
    "sasl.oauthbearer.config",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.extensions",
    # librdkafka's statistics (docs/observability.md)
    "statistics.interval.ms",
    "stats_cb",
}
JAVA_TYPES = {
    "INT": "int",
    "LONG": "long",
    "BOOLEAN": "bool",
    "STRING": "string",
    "PASSWORD": "string",
    "LIST": "list",
    "CLASS": "callable",
    "DOUBLE": "double",
    "SHORT": "int",
}

# (role, settings) that kcore must accept or refuse exactly as Java's config classes do. Checks
# that Java makes only when it builds a client (delivery timeout, heartbeat, bootstrap syntax,
# JAAS) and kcore's deliberate extra strictness are tested above instead.
ORACLE_CASES: list[tuple[str, dict[str, str]]] = [
    ("producer", {}),
    ("producer", {"acks": "1"}),
    ("producer", {"acks": "0"}),
    ("producer", {"acks": "all"}),
    ("producer", {"acks": "-1"}),
    ("producer", {"acks": "2"}),
    ("producer", {"acks": "ALL"}),
    ("producer", {"acks": "1", "enable.idempotence": "true"}),
    ("producer", {"acks": "1", "enable.idempotence": "false"}),
    ("producer", {"retries": "0"}),
    ("producer", {"retries": "0", "enable.idempotence": "true"}),
    ("producer", {"retries": "-1"}),
    ("producer", {"max.in.flight.requests.per.connection": "6"}),
    ("producer", {"max.in.flight.requests.per.connection": "6", "enable.idempotence": "false"}),
    ("producer", {"max.in.flight.requests.per.connection": "6", "acks": "1"}),
    ("producer", {"max.in.flight.requests.per.connection": "6", "retries": "0"}),
    ("producer", {"max.in.flight.requests.per.connection": "5", "enable.idempotence": "true"}),
    ("producer", {"max.in.flight.requests.per.connection": "0"}),
    ("producer", {"transactional.id": "t"}),
    ("producer", {"transactional.id": "t", "acks": "1"}),
    ("producer", {"transactional.id": "t", "enable.idempotence": "false"}),
    ("producer", {"transactional.id": ""}),
    ("producer", {"reconnect.backoff.ms": "2000"}),
    ("producer", {"reconnect.backoff.ms": "2000", "reconnect.backoff.max.ms": "1000"}),
    ("producer", {"reconnect.backoff.max.ms": "10"}),
    ("producer", {"retry.backoff.ms": "2000"}),
    ("producer", {"linger.ms": "abc"}),
    ("producer", {"linger.ms": " 5 "}),
    ("producer", {"linger.ms": "-1"}),
    ("producer", {"batch.size": "1.5"}),
    ("producer", {"request.timeout.ms": "2147483648"}),
    ("producer", {"buffer.memory": "2147483648"}),
    ("producer", {"compression.type": "GZIP"}),
    ("producer", {"compression.type": "zstd"}),
    ("producer", {"compression.gzip.level": "0"}),
    ("producer", {"compression.gzip.level": "-1"}),
    ("producer", {"compression.zstd.level": "-131072"}),
    ("producer", {"compression.zstd.level": "23"}),
    ("producer", {"compression.lz4.level": "18"}),
    ("producer", {"partitioner.ignore.keys": "TRUE"}),
    ("producer", {"partitioner.ignore.keys": "yes"}),
    ("producer", {"metadata.max.idle.ms": "4999"}),
    ("producer", {"send.buffer.bytes": "-1"}),
    ("producer", {"send.buffer.bytes": "-2"}),
    ("producer", {"client.dns.lookup": "default"}),
    ("producer", {"metadata.recovery.strategy": "NONE"}),
    ("producer", {"metadata.recovery.strategy": "sometimes"}),
    ("producer", {"ssl.enabled.protocols": "TLSv1.2, TLSv1.3"}),
    ("producer", {"security.protocol": "ssl"}),
    ("producer", {"security.protocol": "TLS"}),
    ("producer", {"security.protocol": "SASL_SSL", "sasl.mechanism": ""}),
    (
        "producer",
        {
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": PLAIN_JAAS,
        },
    ),
    (
        "producer",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": SCRAM_JAAS,
        },
    ),
    ("consumer", {}),
    ("consumer", {"group.id": "g"}),
    ("consumer", {"enable.auto.commit": "true"}),
    ("consumer", {"enable.auto.commit": "false"}),
    ("consumer", {"group.id": "g", "enable.auto.commit": "false"}),
    (
        "consumer",
        {
            "group.id": "g",
            "group.protocol": "CONSUMER",
            "partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
        },
    ),
    ("consumer", {"group.id": "g", "group.protocol": "consumer", "session.timeout.ms": "10000"}),
    ("consumer", {"group.id": "g", "group.protocol": "consumer", "heartbeat.interval.ms": "100"}),
    (
        "consumer",
        {"group.id": "g", "group.protocol": "classic", "group.remote.assignor": "uniform"},
    ),
    (
        "consumer",
        {"group.id": "g", "group.protocol": "consumer", "group.remote.assignor": "uniform"},
    ),
    ("consumer", {"group.protocol": "Consumer"}),
    ("consumer", {"group.protocol": "share"}),
    ("consumer", {"share.acknowledgement.mode": "explicit"}),
    ("consumer", {"share.acknowledgement.mode": "EXPLICIT"}),
    ("consumer", {"share.acknowledgement.mode": "manual"}),
    ("consumer", {"share.acquire.mode": "record_limit"}),
    ("consumer", {"share.acquire.mode": "RECORD_LIMIT"}),
    ("consumer", {"share.acquire.mode": "batch"}),
    # A share consumer (kcore also requires group.id, as Java's ShareConsumer does when built).
    ("share_consumer", {"group.id": "g"}),
    ("share_consumer", {"group.id": "g", "share.acknowledgement.mode": "explicit"}),
    ("share_consumer", {"group.id": "g", "share.acknowledgement.mode": "EXPLICIT"}),
    ("share_consumer", {"group.id": "g", "share.acquire.mode": "record_limit"}),
    ("share_consumer", {"group.id": "g", "share.acquire.mode": "Record_Limit"}),
    ("share_consumer", {"group.id": "g", "max.poll.records": "10"}),
    *[
        ("share_consumer", {"group.id": "g", key: value})
        for key, value in [
            ("auto.offset.reset", "earliest"),
            ("enable.auto.commit", "false"),
            ("group.instance.id", "i-1"),
            ("isolation.level", "read_committed"),
            ("partition.assignment.strategy", "range"),
            ("session.timeout.ms", "10000"),
            ("heartbeat.interval.ms", "1000"),
            ("group.protocol", "consumer"),
            ("group.remote.assignor", "uniform"),
        ]
    ],
    ("consumer", {"group.instance.id": ""}),
    ("consumer", {"group.instance.id": "i-1"}),
    ("consumer", {"isolation.level": "read_committed"}),
    ("consumer", {"isolation.level": "READ_COMMITTED"}),
    ("consumer", {"fetch.max.wait.ms": "-1"}),
    ("consumer", {"max.poll.records": "0"}),
    ("consumer", {"max.poll.interval.ms": "0"}),
    ("consumer", {"partition.assignment.strategy": "range,cooperative-sticky"}),
    ("consumer", {"check.crcs": "False"}),
    ("consumer", {"auto.offset.reset": "EARLIEST"}),
    ("consumer", {"auto.offset.reset": "none"}),
    *[
        ("consumer", {"auto.offset.reset": "by_duration:" + d})
        for d in [
            "PT1H",
            "P1D",
            "-PT1H",
            "abc",
            "P1DT2H3M4.5S",
            "pt1h",
            "PT0S",
            "P1W",
            "PT-1H",
            "PT1,5S",
            "PT",
            " PT1H",
            "+PT1H",
            "P-1DT25H",
            "P1DT-1H",
            "PT0.0000000001S",
            "PT-0.5S",
            "PT1H30M",
            "PT1.123456789S",
        ]
    ],
    ("consumer", {"auto.offset.reset": "BY_DURATION:PT1H"}),
    ("admin", {}),
    ("admin", {"connections.max.idle.ms": "-5"}),
    ("admin", {"retries": "-1"}),
    ("admin", {"retries": "0"}),
    ("admin", {"socket.connection.setup.timeout.ms": "60000"}),
    ("admin", {"metadata.max.age.ms": "-1"}),
]


@pytest.fixture(scope="module")
def java_oracle(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[str]], list[str]]:
    sys.path.insert(0, str(REPO))
    from tools.kafka_jar import kafka_clients_jar, maven_jar

    # The jar and Java are required, as for the other Java tests: missing ones fail, never skip.
    classpath = [
        str(kafka_clients_jar(PROTOCOL_SOURCE_VERSION)),
        str(maven_jar("org.slf4j", "slf4j-api", SLF4J_VERSION)),
    ]
    src = tmp_path_factory.mktemp("oracle") / "ConfigOracle.java"
    src.write_text(ORACLE, encoding="utf-8")
    lines = "".join(
        "\t".join([role, *(f"{k}={v}" for k, v in {**BOOT, **case}.items())]) + "\n"
        for role, case in ORACLE_CASES
    )
    res = subprocess.run(
        [jars.java_executable(), "-cp", ":".join(classpath), str(src)],
        input=lines,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    keys = [r[1:] for r in rows if r[0] == "KEY"]
    cases = ["\t".join(r[1:]) for r in rows if r[0] == "CASE"]
    assert len(cases) == len(ORACLE_CASES)
    return keys, cases


def _as_java(d: ConfigDef, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return ",".join(value)
    return "null" if value is None else str(value)


def test_key_table_matches_java(java_oracle: tuple[list[list[str]], list[str]]) -> None:
    keys, _ = java_oracle
    java_roles: dict[str, set[str]] = {}
    problems = []
    for role, name, java_type, java_default in keys:
        java_roles.setdefault(name, set()).add(role)
        d = next((d for d in CONFIG_DEFS if d.name == name), None)
        if d is None or role not in d.roles:
            # A Java key kcore does not take must say so rather than look like a typo.
            try:
                ClientConfig({**BOOT, name: "x", **STRICT}, role=role)  # type: ignore[arg-type]
                problems.append(f"{role} {name}: accepted but not in the table")
            except ConfigError as e:
                if d is None and "kcore does not take" not in str(e):
                    problems.append(f"{role} {name}: not listed as unsupported: {e}")
            continue
        if (
            JAVA_TYPES[java_type] != d.type
            and not (java_type == "LONG" and d.type == "int")
            and name not in TYPE_DEVIATIONS
        ):
            problems.append(f"{name}: type {d.type}, Java {java_type}")
        if (java_type == "PASSWORD") != d.secret:
            problems.append(f"{name}: secret={d.secret}, Java type {java_type}")
        if name in DEFAULT_DEVIATIONS:
            continue
        ours = d.default_for(role)
        if isinstance(d.validator, OneOf) and java_default not in ("null", ""):
            # Java's spelling through kcore's normalization ("all" -> -1, class -> short name).
            theirs: Any = (
                tuple(d.validator(x) for x in java_default.split(","))
                if d.type == "list"
                else d.validator(java_default)
            )
            if theirs != ours:
                problems.append(f"{role} {name}: default {ours!r}, Java {java_default!r}")
        elif _as_java(d, ours) != java_default:
            problems.append(f"{role} {name}: default {_as_java(d, ours)!r}, Java {java_default!r}")
    for d in CONFIG_DEFS:
        if d.name == STRICT_KEY or d.name.startswith("otel."):  # kcore's own
            continue
        if d.name not in LIBRDKAFKA_KEYS and java_roles.get(d.name) != set(d.roles):
            problems.append(f"{d.name}: roles {sorted(d.roles)}, Java {java_roles.get(d.name)}")
    assert not problems, "\n".join(problems)


def test_configs_are_accepted_and_refused_as_java_does(
    java_oracle: tuple[list[list[str]], list[str]],
) -> None:
    _, cases = java_oracle
    problems = []
    for (role, case), java in zip(ORACLE_CASES, cases, strict=True):
        try:
            ours = ClientConfig({**BOOT, **case}, role=role)  # type: ignore[arg-type]
        except ConfigError as e:
            if not java.startswith("ERR"):
                problems.append(f"{role} {case}: kcore refused ({e}), Java accepted")
            continue
        if java.startswith("ERR"):
            problems.append(f"{role} {case}: kcore accepted, Java refused ({java})")
            continue
        theirs = dict(item.split("=", 1) for item in java.split("\t")[1:])
        for key in {
            *case,
            "enable.idempotence",
            "enable.auto.commit",
            "reconnect.backoff.max.ms",
            "retry.backoff.max.ms",
            "acks",
        }:
            if key not in ours or _DEFS[key].secret:
                continue
            value = _as_java(_DEFS[key], ours[key])
            # kcore stores case-insensitive choices in one spelling; Java keeps the caller's.
            if value.lower() != theirs[key].lower() and not (
                key == "partition.assignment.strategy"
            ):
                problems.append(f"{role} {case}: {key}={value}, Java {theirs[key]}")
    assert not problems, "\n".join(problems)


# -- statistics.interval.ms and stats_cb (librdkafka's keys) --------------------------------------


@pytest.mark.parametrize("role", ["producer", "consumer", "admin"])
def test_statistics_keys_on_every_client(role: str) -> None:
    def stats_cb(document: str) -> None:
        pass

    settings = {**BOOT, "statistics.interval.ms": "1000", "stats_cb": stats_cb}
    cfg = ClientConfig(settings, role=role)  # type: ignore[arg-type]
    assert cfg["statistics.interval.ms"] == 1000 and cfg["stats_cb"] is stats_cb
    off = ClientConfig(BOOT, role=role)  # type: ignore[arg-type]
    assert off["statistics.interval.ms"] == 0 and off["stats_cb"] is None


@pytest.mark.parametrize(
    ("settings", "key", "text"),
    [
        ({"statistics.interval.ms": -1, "stats_cb": print}, "statistics.interval.ms", ">= 0"),
        ({"statistics.interval.ms": "often", "stats_cb": print}, "statistics.interval.ms", "int"),
        ({"statistics.interval.ms": True, "stats_cb": print}, "statistics.interval.ms", "int"),
        ({"statistics.interval.ms": 1000, "stats_cb": 42}, "stats_cb", "callable"),
        ({"statistics.interval.ms": 1000, "stats_cb": "my.module.cb"}, "stats_cb", "callable"),
        ({"statistics.interval.ms": 1000}, "statistics.interval.ms", "needs stats_cb"),
    ],
)
def test_statistics_keys_refused(settings: dict[str, Any], key: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig({**BOOT, **settings}, role="producer")
    assert info.value.key == key and text in info.value.message
