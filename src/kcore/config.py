"""Client configuration with the Java Kafka client's names, defaults and checks.

Every kcore client (admin, producer, consumer) takes its settings as one flat mapping of Java
client keys, exactly as a ``.properties`` file or a Java ``Properties`` object would hold them::

    cfg = ClientConfig({"bootstrap.servers": "a:9092,b:9092", "linger.ms": "5"}, role="producer")
    cfg["linger.ms"]         # 5: typed, and every key of the role has a value (Java's default)
    cfg.bootstrap_servers    # ["a:9092", "b:9092"]
    cfg.seconds("request.timeout.ms")  # 30.0

The key table is data (:data:`CONFIG_DEFS`); its defaults are those of Apache Kafka 4.3's
``ProducerConfig``, ``ConsumerConfig`` and ``AdminClientConfig`` per role. The checks across keys
(idempotence, SASL, group protocol, timeouts) follow what the Java client does when it builds its
config and its client. ``docs/config.md`` lists every key; ``python -m kcore.config`` prints that
table.
"""

from __future__ import annotations

import difflib
import importlib.util
import ipaddress
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, Protocol

from kcore.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "ALIASES",
    "CONFIG_DEFS",
    "ROLES",
    "SHARE_ONLY",
    "SHARE_UNSUPPORTED",
    "STRICT_KEY",
    "SUPPORTED_SASL_MECHANISMS",
    "ClientConfig",
    "ConfigDef",
    "HostPort",
    "OneOf",
    "Range",
    "Role",
    "default_of",
    "markdown_table",
    "other_client_setting",
    "parse_iso_duration",
    "parse_jaas_config",
]

Role = Literal["admin", "producer", "consumer", "share_consumer", "common"]
# "common" is not a client: it takes only the keys every client has (for shared layers).
# "share_consumer" (KIP-932's ShareConsumer) is the consumer's keys minus SHARE_UNSUPPORTED, as
# Java's ShareConsumerConfig is its ConsumerConfig minus those; the key table names it
# "consumer".
ROLES: tuple[str, ...] = ("admin", "producer", "consumer")
# Consumer keys a share consumer refuses (Java's ShareConsumerConfig): the broker assigns,
# acquires and tracks delivery, so there is no offset reset, commit, isolation or assignor here.
SHARE_UNSUPPORTED: tuple[str, ...] = (
    "auto.offset.reset",
    "enable.auto.commit",
    "group.instance.id",
    "isolation.level",
    "partition.assignment.strategy",
    "interceptor.classes",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol",
    "group.remote.assignor",
)
# Consumer keys only a share consumer takes (Java's ConsumerConfig refuses them set).
SHARE_ONLY: tuple[str, ...] = ("share.acknowledgement.mode", "share.acquire.mode")
ConfigType = Literal["int", "long", "double", "bool", "string", "list", "callable", "object"]

HIDDEN = "[hidden]"
# kcore's own key (every role): other roles' keys are refused, not logged and ignored.
STRICT_KEY = "kcore.config.strict"
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
SUPPORTED_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
# Java's ConfigDef ranges for its INT and LONG types: a value outside them is a type error there.
_TYPE_BOUNDS = {"int": (-(2**31), INT_MAX), "long": (-(2**63), LONG_MAX)}


class _Invalid(Exception):
    """A validator's verdict. ``allowed`` replaces the validator's own description when the
    problem is more specific (e.g. a bad port); the caller adds the key and the value."""

    def __init__(self, allowed: str = "") -> None:
        super().__init__(allowed)
        self.allowed = allowed
        self.item: Any = None  # the bad item of a list value, to show instead of the whole list


class Validator(Protocol):
    """Checks one parsed value (one item, for list keys) and returns it, normalized."""

    def __call__(self, value: Any) -> Any: ...

    def describe(self) -> str: ...


# -- validators -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """An int within [min, max]; ``also`` is one extra value allowed outside it."""

    min: int | None = None
    max: int | None = None
    also: int | None = None

    def __call__(self, value: int) -> int:
        if value == self.also:
            return value
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            raise _Invalid()
        return value

    def describe(self) -> str:
        if self.min is not None and self.max is not None:
            text = f"between {self.min} and {self.max}"
        elif self.min is not None:
            text = f">= {self.min}"
        else:
            text = f"<= {self.max}"
        return text if self.also is None else f"{text}, or {self.also}"


@dataclass(frozen=True)
class FloatRange:
    """A number within [min, max] (Java's ``Range.between`` on a DOUBLE key)."""

    min: float
    max: float

    def __call__(self, value: float) -> float:
        if not self.min <= value <= self.max:
            raise _Invalid()
        return value

    def describe(self) -> str:
        return f"between {self.min} and {self.max}"


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of spellings. ``values`` maps each listed spelling to the value stored
    (acks: "all" -> -1); ``aliases`` are accepted but not listed (Java class names)."""

    values: tuple[tuple[str, Any], ...]
    ignore_case: bool = False
    aliases: tuple[tuple[str, str], ...] = ()

    def __call__(self, value: str) -> Any:
        table = dict(self.values)
        spelling = dict(self.aliases).get(value, value)
        if spelling in table:
            return table[spelling]
        if self.ignore_case:
            for name, stored in self.values:
                if name.lower() == spelling.lower():
                    return stored
        raise _Invalid()

    def describe(self) -> str:
        return "one of " + ", ".join(name for name, _ in self.values)


def _one_of(*names: str, ignore_case: bool = False) -> OneOf:
    return OneOf(tuple((n, n) for n in names), ignore_case=ignore_case)


@dataclass(frozen=True)
class NonEmpty:
    """A string that is not empty (Java's ``NonEmptyString``)."""

    def __call__(self, value: str) -> str:
        if not value:
            raise _Invalid()
        return value

    def describe(self) -> str:
        return "a non-empty string"


_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?\.?")


@dataclass(frozen=True)
class HostPort:
    """``host:port`` with a port in 1..65535; IPv6 in brackets (``[::1]:9092``). A leading
    ``SCHEME://`` (a broker listener string) is dropped, as the Java client ignores it too."""

    def __call__(self, value: str) -> str:
        value = re.sub(r"^[A-Za-z][A-Za-z0-9_+.\-]*://", "", value)
        host, port = _split_host_port(value)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def describe(self) -> str:
        return "host:port entries (IPv6 as [::1]:9092)"


def _split_host_port(value: str) -> tuple[str, int]:
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[1:end], value[end + 1 :] if end > 0 else ""
        if end < 0 or not rest.startswith(":"):
            raise _Invalid("host:port entries; an IPv6 address is written [::1]:9092")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Invalid("host:port entries; [...] must hold an IPv6 address") from None
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise _Invalid("host:port entries (a port is required)")
        if ":" in host:
            raise _Invalid("host:port entries; write an IPv6 address in brackets: [::1]:9092")
        if not _HOSTNAME.fullmatch(host):
            raise _Invalid("host:port entries with a valid host name or IPv4 address")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _Invalid("host:port entries with a port between 1 and 65535")
    return host, int(port_text)


@dataclass(frozen=True)
class OffsetReset:
    """auto.offset.reset: earliest, latest, none, or ``by_duration:<ISO-8601 duration>``
    (Kafka 4.0+, KIP-1106), the duration not negative."""

    def __call__(self, value: str) -> str:
        if value in ("earliest", "latest", "none"):
            return value
        if value.startswith("by_duration:"):
            try:
                parse_iso_duration(value[len("by_duration:") :])
            except ValueError:
                raise _Invalid() from None
            return value
        raise _Invalid()

    def describe(self) -> str:
        return "one of earliest, latest, none, by_duration:<ISO-8601 duration such as PT1H>"


@dataclass(frozen=True)
class SaslMechanism:
    """A mechanism kcore implements; Java's other two get their own message."""

    def __call__(self, value: str) -> str:
        if value in SUPPORTED_SASL_MECHANISMS:
            return value
        if value.upper() == "GSSAPI":
            supported = ", ".join(SUPPORTED_SASL_MECHANISMS)
            raise _Invalid(f"one of {supported}: {value.upper()} is not supported by kcore")
        if value.upper() in SUPPORTED_SASL_MECHANISMS:
            # Brokers match mechanism names exactly, so a lower-case name would fail later.
            raise _Invalid(f"one of {', '.join(SUPPORTED_SASL_MECHANISMS)} (upper case)")
        raise _Invalid()

    def describe(self) -> str:
        return "one of " + ", ".join(SUPPORTED_SASL_MECHANISMS)


@dataclass(frozen=True)
class PemOnly:
    """A key/trust store type: kcore reads PEM only (Python's ssl module has no JKS/PKCS12)."""

    def __call__(self, value: str) -> str:
        if value.upper() == "PEM":
            return "PEM"
        if value.upper() in ("JKS", "PKCS12"):
            raise _Invalid(
                f"PEM: {value.upper()} stores are not supported by kcore; convert the store to "
                "PEM (keytool -importkeystore to PKCS12, then openssl pkcs12) and use PEM"
            )
        raise _Invalid()

    def describe(self) -> str:
        return "PEM (JKS and PKCS12 are not supported)"


@dataclass(frozen=True)
class PemText:
    """Inline PEM text holding at least one block of the given kind."""

    kind: str  # "CERTIFICATE" or "PRIVATE KEY"

    def __call__(self, value: str) -> str:
        if not re.search(r"-----BEGIN [A-Z ]*" + self.kind + "-----", value):
            raise _Invalid()
        return value

    def describe(self) -> str:
        return f"inline PEM text with a {self.kind} block"


@dataclass(frozen=True)
class NotWithPem:
    """Java's store passwords, which its PEM stores refuse; kcore reads PEM only."""

    hint: str

    def __call__(self, value: str) -> str:
        raise _Invalid()

    def describe(self) -> str:
        return f"unset: PEM files take no store password ({self.hint})"


@dataclass(frozen=True)
class JaasConfig:
    """A JAAS line with one PLAIN, SCRAM or OAUTHBEARER login module (parsed by
    :func:`parse_jaas_config`)."""

    def __call__(self, value: str) -> str:
        _parse_jaas(value)
        return value

    def describe(self) -> str:
        return (
            'one JAAS entry: <LoginModule> required username="..." password="..."; with '
            "PlainLoginModule or ScramLoginModule, or OAuthBearerLoginModule with its options"
        )


# Java's OAUTHBEARER login handlers: the token endpoint's (KIP-768; its 3.x package too) and
# the unsecured default. kcore does what each does; any other class is Java code.
OAUTHBEARER_LOGIN_HANDLERS = {
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler": "endpoint",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler": (
        "endpoint"
    ),
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured."
    "OAuthBearerUnsecuredLoginCallbackHandler": "unsecured",
}


@dataclass(frozen=True)
class LoginCallbackHandler:
    """``sasl.login.callback.handler.class``: one of Java's OAUTHBEARER login handlers."""

    def __call__(self, value: str) -> str:
        if value in OAUTHBEARER_LOGIN_HANDLERS:
            return value
        raise _Invalid(
            "one of Java's OAUTHBEARER login handlers (OAuthBearerLoginCallbackHandler, "
            "OAuthBearerUnsecuredLoginCallbackHandler); other Java classes cannot run in kcore"
        )

    def describe(self) -> str:
        return "Java's OAuthBearerLoginCallbackHandler or OAuthBearerUnsecuredLoginCallbackHandler"


@dataclass(frozen=True)
class EndpointIdentification:
    """``https`` turns hostname verification on; an empty string turns it off (as in Java)."""

    def __call__(self, value: str) -> str:
        if value.lower() in ("https", ""):
            return value.lower()
        raise _Invalid()

    def describe(self) -> str:
        return 'https (verify the broker host name) or "" (do not)'


@dataclass(frozen=True)
class HasMethod:
    """A Python object with a method of this name (an OpenTelemetry provider, say)."""

    method: str

    def __call__(self, value: Any) -> Any:
        if not callable(getattr(value, self.method, None)):
            raise _Invalid()
        return value

    def describe(self) -> str:
        return f"with a {self.method}() method"


# -- the key table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigDef:
    """One configuration key. ``validator`` checks a parsed value (each item, for list keys);
    ``roles`` are the clients that take the key; ``secret`` values never appear in repr or error
    text; ``role_defaults`` overrides ``default`` for some roles, as Java's per-client tables
    do."""

    name: str
    type: ConfigType
    default: Any
    validator: Validator | None
    roles: frozenset[str]
    doc: str
    secret: bool = False
    role_defaults: tuple[tuple[str, Any], ...] = ()
    required: bool = False

    def default_for(self, role: str) -> Any:
        return dict(self.role_defaults).get(role, self.default)

    def allowed(self) -> str:
        """What a value must be, as error messages and docs say it."""
        v = self.validator.describe() if self.validator is not None else ""
        if self.type in ("int", "long"):
            return f"an int {v}" if v else "an int"
        if self.type == "double":
            return f"a number {v}" if v else "a number"
        if self.type == "bool":
            return "true or false"
        if self.type == "list":
            if v.startswith("one of"):
                return f"a comma-separated list, each {v}"
            return f"a comma-separated list of {v}" if v else "a comma-separated list"
        if self.type == "callable":
            return "a Python callable or None"
        if self.type == "object":
            return f"a Python object {v}" if v else "a Python object"
        return v or "a string"


_ALL = frozenset(ROLES)
_ADMIN = frozenset({"admin"})
_PRODUCER = frozenset({"producer"})
_CONSUMER = frozenset({"consumer"})
_ADMIN_CONSUMER = frozenset({"admin", "consumer"})
_ADMIN_PRODUCER = frozenset({"admin", "producer"})
_PRODUCER_CONSUMER = frozenset({"producer", "consumer"})
_GE0 = Range(0)
_GE_MINUS1 = Range(-1)
_ASSIGNORS = "org.apache.kafka.clients.consumer."

# One entry a key; aligned by hand, so the formatter leaves the table alone.
# fmt: off
CONFIG_DEFS: tuple[ConfigDef, ...] = (
    # -- every client: connection and metadata -----------------------------------------------
    ConfigDef("bootstrap.servers", "list", (), HostPort(), _ALL,
              "Brokers to fetch cluster metadata from first.", required=True),
    ConfigDef(STRICT_KEY, "bool", False, None, _ALL,
              "kcore's own: refuse a key that only another kind of client takes, instead of "
              "logging it once and ignoring it."),
    ConfigDef("client.id", "string", "", None, _ALL,
              "Name sent with every request (logs, quotas); empty: the client picks one."),
    ConfigDef("client.dns.lookup", "string", "use_all_dns_ips",
              _one_of("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only"), _ALL,
              "Try every IP a host name resolves to, or canonicalize bootstrap names first."),
    ConfigDef("request.timeout.ms", "int", 30000, _GE0, _ALL,
              "How long to wait for a response before retrying or failing the request."),
    ConfigDef("metadata.max.age.ms", "long", 300000, _GE0, _ALL,
              "Refresh cluster metadata at least this often."),
    ConfigDef("metrics.sample.window.ms", "long", 30000, _GE0, _ALL,
              "The window of metrics()' rates, averages and maximums (kept for num.samples)."),
    ConfigDef("metrics.num.samples", "int", 2, Range(1), _ALL,
              "How many metrics sample windows are kept."),
    ConfigDef("statistics.interval.ms", "int", 0, _GE0, _ALL,
              "librdkafka's: call stats_cb with the statistics JSON this often; 0: never."),
    ConfigDef("stats_cb", "callable", None, None, _ALL,
              "librdkafka's (confluent-kafka's key): callable(json_str) given the statistics "
              "every statistics.interval.ms, on a thread of its own (docs/observability.md)."),
    ConfigDef("enable.metrics.push", "bool", True, None, _ALL,
              "Push the client's metrics to the cluster when a client-metrics subscription "
              "asks for them (KIP-714; brokers without a telemetry receiver are not asked). "
              "Off by default for the admin client, as Java's.",
              role_defaults=(("admin", False),)),
    ConfigDef("otel.metrics.enable", "bool", False, None, _PRODUCER_CONSUMER,
              "kcore's own (the kcore[otel] extra): record OpenTelemetry metrics, the "
              "messaging semantic conventions' and the Java metric set (docs/observability.md)."),
    ConfigDef("otel.traces.enable", "bool", False, None, _PRODUCER_CONSUMER,
              "kcore's own (the kcore[otel] extra): a span per send and per poll, with W3C "
              "trace context in record headers (docs/observability.md)."),
    ConfigDef("otel.meter.provider", "object", None, HasMethod("get_meter"), _PRODUCER_CONSUMER,
              "kcore's own: the OpenTelemetry MeterProvider to use; None: the global one."),
    ConfigDef("otel.tracer.provider", "object", None, HasMethod("get_tracer"),
              _PRODUCER_CONSUMER,
              "kcore's own: the OpenTelemetry TracerProvider to use; None: the global one."),
    ConfigDef("metrics.recording.level", "string", "INFO",
              _one_of("INFO", "DEBUG", "TRACE"), _ALL,
              "Accepted as Java's; kcore records the same metrics at every level."),
    ConfigDef("metadata.recovery.strategy", "string", "rebootstrap",
              _one_of("none", "rebootstrap", ignore_case=True), _ALL,
              "When no known broker is reachable: go back to bootstrap.servers, or give up."),
    ConfigDef("metadata.recovery.rebootstrap.trigger.ms", "long", 300000, _GE0, _ALL,
              "Rebootstrap after this long without reaching any broker."),
    ConfigDef("reconnect.backoff.ms", "long", 50, _GE0, _ALL,
              "First wait before reconnecting to a broker; doubles up to the max."),
    ConfigDef("reconnect.backoff.max.ms", "long", 1000, _GE0, _ALL,
              "Longest wait between reconnects (defaults to reconnect.backoff.ms if only that "
              "is set)."),
    ConfigDef("retry.backoff.ms", "long", 100, _GE0, _ALL,
              "First wait before retrying a failed request; doubles up to the max."),
    ConfigDef("retry.backoff.max.ms", "long", 1000, _GE0, _ALL,
              "Longest wait between retries of a failed request."),
    ConfigDef("socket.connection.setup.timeout.ms", "long", 10000, None, _ALL,
              "Time allowed to set up a connection; grows per failure up to the max."),
    ConfigDef("socket.connection.setup.timeout.max.ms", "long", 30000, None, _ALL,
              "Longest time allowed to set up a connection."),
    ConfigDef("connections.max.idle.ms", "long", 540000, None, _ALL,
              "Close connections idle this long.", role_defaults=(("admin", 300000),)),
    # Not Java's 131072: with -1 (librdkafka's choice) Linux sizes the buffer itself, and a
    # fixed 128 KiB made a producer's large requests take ~1.8x as long (docs/config.md).
    ConfigDef("send.buffer.bytes", "int", -1, _GE_MINUS1, _ALL,
              "Socket send buffer (SO_SNDBUF); -1 (the default, unlike Java's 131072): the OS "
              "default, which the kernel grows as needed."),
    # A consumer's is not Java's 65536: with -1 Linux grows the buffer with the fetches, and a
    # fixed 64 KiB window made every fetch response arrive in small steps (docs/config.md).
    ConfigDef("receive.buffer.bytes", "int", 65536, _GE_MINUS1, _ALL,
              "Socket receive buffer (SO_RCVBUF); -1: the OS default (a consumer's default, "
              "unlike Java's 65536), which the kernel grows as needed.",
              role_defaults=(("producer", 32768), ("consumer", -1))),
    # -- every client: security ---------------------------------------------------------------
    ConfigDef("security.protocol", "string", "PLAINTEXT",
              _one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL", ignore_case=True), _ALL,
              "Transport to the brokers: TLS or not, SASL or not."),
    ConfigDef("sasl.mechanism", "string", "GSSAPI", SaslMechanism(), _ALL,
              "SASL mechanism; Java's default GSSAPI is not supported, so SASL needs this set."),
    ConfigDef("sasl.jaas.config", "string", None, JaasConfig(), _ALL,
              "Java-style credentials: a PlainLoginModule, ScramLoginModule or "
              "OAuthBearerLoginModule JAAS entry.",
              secret=True),
    ConfigDef("sasl.username", "string", None, None, _ALL,
              "librdkafka-style SASL user name (instead of sasl.jaas.config)."),
    ConfigDef("sasl.password", "string", None, None, _ALL,
              "librdkafka-style SASL password (instead of sasl.jaas.config).", secret=True),
    # OAUTHBEARER (docs/security.md): where the token comes from, and when it is refreshed.
    ConfigDef("oauth_cb", "callable", None, None, _ALL,
              "OAUTHBEARER (confluent-kafka's key): callable(sasl.oauthbearer.config) returning "
              "(token, expiry_seconds[, principal[, extensions]])."),
    ConfigDef("sasl.oauthbearer.config", "string", None, None, _ALL,
              "librdkafka: the string oauth_cb is called with; with "
              "enable.sasl.oauthbearer.unsecure.jwt, principal=... [scope=...] [lifeSeconds=...] "
              "[extension_<name>=...].", secret=True),
    ConfigDef("enable.sasl.oauthbearer.unsecure.jwt", "bool", False, None, _ALL,
              "librdkafka: make an unsigned JWT from sasl.oauthbearer.config (development "
              "only)."),
    ConfigDef("sasl.oauthbearer.method", "string", "default", _one_of("default", "oidc"), _ALL,
              "librdkafka: oidc fetches tokens from sasl.oauthbearer.token.endpoint.url."),
    ConfigDef("sasl.oauthbearer.extensions", "string", None, None, _ALL,
              "librdkafka: SASL extensions sent with the token, key=value,key=value."),
    ConfigDef("sasl.oauthbearer.token.endpoint.url", "string", None, None, _ALL,
              "OAUTHBEARER: OAuth 2 token endpoint for client credentials (KIP-768), or a "
              "file: URL of a file holding the token."),
    ConfigDef("sasl.oauthbearer.client.credentials.client.id", "string", None, None, _ALL,
              "OAUTHBEARER client id for the token endpoint (or clientId in sasl.jaas.config)."),
    ConfigDef("sasl.oauthbearer.client.credentials.client.secret", "string", None, None, _ALL,
              "OAUTHBEARER client secret (or clientSecret in sasl.jaas.config).", secret=True),
    ConfigDef("sasl.oauthbearer.scope", "string", None, None, _ALL,
              "OAUTHBEARER scope asked of the token endpoint (or scope in sasl.jaas.config)."),
    ConfigDef("sasl.oauthbearer.header.urlencode", "bool", False, None, _ALL,
              "Form-encode the client id and secret before the token endpoint's Basic auth "
              "(RFC 6749 2.3.1)."),
    ConfigDef("sasl.oauthbearer.sub.claim.name", "string", "sub", None, _ALL,
              "The token claim naming its principal."),
    ConfigDef("sasl.oauthbearer.scope.claim.name", "string", "scope", None, _ALL,
              "The token claim holding its scope (taken for Java configs; kcore does not read "
              "the scope)."),
    ConfigDef("sasl.login.callback.handler.class", "string", None, LoginCallbackHandler(), _ALL,
              "Java's OAUTHBEARER login handler class names are taken (the token endpoint's "
              "or the unsecured one); other classes are Java-only."),
    ConfigDef("sasl.login.refresh.window.factor", "double", 0.8, FloatRange(0.5, 1.0), _ALL,
              "Refresh an OAUTHBEARER token at this fraction of its lifetime."),
    ConfigDef("sasl.login.refresh.window.jitter", "double", 0.05, FloatRange(0.0, 0.25), _ALL,
              "Random fraction of the lifetime added to the refresh point."),
    ConfigDef("sasl.login.refresh.min.period.seconds", "int", 60, Range(0, 900), _ALL,
              "Refresh a token no sooner than this after fetching it."),
    ConfigDef("sasl.login.refresh.buffer.seconds", "int", 300, Range(0, 3600), _ALL,
              "Refresh a token at least this long before it expires."),
    ConfigDef("sasl.login.connect.timeout.ms", "int", None, Range(1), _ALL,
              "Token endpoint connect timeout; unset: 30 s."),
    ConfigDef("sasl.login.read.timeout.ms", "int", None, Range(1), _ALL,
              "Token endpoint read timeout; unset: 30 s."),
    ConfigDef("sasl.login.retry.backoff.ms", "long", 100, _GE0, _ALL,
              "First wait before asking the token endpoint again after a failure."),
    ConfigDef("sasl.login.retry.backoff.max.ms", "long", 10000, _GE0, _ALL,
              "How long token endpoint failures are retried (the backoff doubles up to it)."),
    ConfigDef("ssl.protocol", "string", "TLSv1.3", _one_of("TLSv1.3", "TLSv1.2", "TLS"), _ALL,
              "TLS protocol of the SSL context."),
    ConfigDef("ssl.enabled.protocols", "list", ("TLSv1.2", "TLSv1.3"),
              _one_of("TLSv1.2", "TLSv1.3"), _ALL, "TLS versions the client may negotiate."),
    ConfigDef("ssl.cipher.suites", "list", (), None, _ALL,
              "Cipher suites to allow, as OpenSSL names; empty: Python's defaults."),
    ConfigDef("ssl.endpoint.identification.algorithm", "string", "https",
              EndpointIdentification(), _ALL,
              "https: check the broker's certificate matches its host name; empty: don't."),
    ConfigDef("ssl.truststore.type", "string", "PEM", PemOnly(), _ALL,
              "Format of the trust store: PEM only (Java's default is JKS)."),
    ConfigDef("ssl.truststore.location", "string", None, None, _ALL,
              "PEM file of CA certificates to trust; unset: the system's CAs."),
    ConfigDef("ssl.truststore.certificates", "string", None, PemText("CERTIFICATE"), _ALL,
              "CA certificates to trust, as inline PEM text.", secret=True),
    ConfigDef("ssl.truststore.password", "string", None,
              NotWithPem("PEM certificates need none"), _ALL,
              "Java trust store password: not used with PEM.", secret=True),
    ConfigDef("ssl.keystore.type", "string", "PEM", PemOnly(), _ALL,
              "Format of the client key store: PEM only (Java's default is JKS)."),
    ConfigDef("ssl.keystore.location", "string", None, None, _ALL,
              "PEM file with the client's private key and certificate chain (mutual TLS)."),
    ConfigDef("ssl.keystore.key", "string", None, PemText("PRIVATE KEY"), _ALL,
              "The client's private key as inline PEM text.", secret=True),
    ConfigDef("ssl.keystore.certificate.chain", "string", None, PemText("CERTIFICATE"), _ALL,
              "The client's certificate chain as inline PEM text.", secret=True),
    ConfigDef("ssl.keystore.password", "string", None,
              NotWithPem("an encrypted PEM key's password goes in ssl.key.password"), _ALL,
              "Java key store password: not used with PEM (see ssl.key.password).", secret=True),
    ConfigDef("ssl.key.password", "string", None, None, _ALL,
              "Password of an encrypted PEM private key.", secret=True),
    ConfigDef("ssl.ca.location", "string", None, None, _ALL,
              "librdkafka style: PEM file (or directory) of CA certificates to trust."),
    ConfigDef("ssl.certificate.location", "string", None, None, _ALL,
              "librdkafka style: PEM file of the client certificate (may hold the key too)."),
    ConfigDef("ssl.key.location", "string", None, None, _ALL,
              "librdkafka style: PEM file of the client's private key."),
    # -- admin and consumer -------------------------------------------------------------------
    ConfigDef("default.api.timeout.ms", "int", 60000, _GE0, _ADMIN_CONSUMER,
              "Timeout of API calls that take no timeout argument."),
    # -- admin and producer -------------------------------------------------------------------
    ConfigDef("retries", "int", INT_MAX, Range(0, INT_MAX), _ADMIN_PRODUCER,
              "How often to retry a failed request (bounded in time by the timeouts)."),
    # -- producer -----------------------------------------------------------------------------
    ConfigDef("acks", "string", -1,
              OneOf((("all", -1), ("-1", -1), ("0", 0), ("1", 1))),
              _PRODUCER,
              "Replicas that must have a record before it counts as sent: 0, 1 or all (-1); "
              "read back as an int."),
    ConfigDef("enable.idempotence", "bool", True, None, _PRODUCER,
              "Write each record exactly once per partition; turned off silently when acks or "
              "retries conflict and it was not set."),
    ConfigDef("max.in.flight.requests.per.connection", "int", 5, Range(1), _PRODUCER,
              "Unanswered requests allowed per connection (at most 5 with idempotence)."),
    ConfigDef("linger.ms", "long", 5, _GE0, _PRODUCER,
              "Wait this long for more records before sending a batch that is not full."),
    ConfigDef("batch.size", "int", 16384, _GE0, _PRODUCER,
              "Bytes a batch for one partition may hold before it is sent."),
    ConfigDef("buffer.memory", "long", 33554432, _GE0, _PRODUCER,
              "Bytes of records waiting to be sent before send() blocks."),
    ConfigDef("max.block.ms", "long", 60000, _GE0, _PRODUCER,
              "How long send() may block waiting for metadata or buffer space."),
    ConfigDef("delivery.timeout.ms", "int", 120000, _GE0, _PRODUCER,
              "Upper bound on reporting a send's outcome; at least linger.ms + "
              "request.timeout.ms."),
    ConfigDef("max.request.size", "int", 1048576, _GE0, _PRODUCER,
              "Largest produce request (and so record) in bytes."),
    ConfigDef("compression.type", "string", "none",
              _one_of("none", "gzip", "snappy", "lz4", "zstd"), _PRODUCER,
              "Codec of produced batches."),
    ConfigDef("compression.gzip.level", "int", -1, Range(1, 9, also=-1), _PRODUCER,
              "gzip level; -1: the codec's default."),
    ConfigDef("compression.lz4.level", "int", 9, Range(1, 17), _PRODUCER,
              "lz4 level: 9, the default, is LZ4's fast compressor (as Java's); any other is "
              "LZ4 HC, which needs the lz4 package (pip install kcore[lz4])."),
    ConfigDef("compression.zstd.level", "int", 3, Range(-131072, 22), _PRODUCER,
              "zstd level (negative levels are faster ones); with the zstandard package "
              "(pip install kcore[zstd]) levels 1-22 reuse a context per thread "
              "(docs/codec.md)."),
    ConfigDef("metadata.max.idle.ms", "long", 300000, Range(5000), _PRODUCER,
              "Forget metadata of a topic not produced to for this long."),
    ConfigDef("partitioner.class", "callable", None, None, _PRODUCER,
              "Python callable choosing a record's partition; None: the built-in partitioner."),
    ConfigDef("partitioner.ignore.keys", "bool", False, None, _PRODUCER,
              "Spread keyed records like unkeyed ones instead of hashing the key."),
    ConfigDef("partitioner.adaptive.partitioning.enable", "bool", True, None, _PRODUCER,
              "Send more unkeyed records to faster brokers."),
    ConfigDef("partitioner.availability.timeout.ms", "long", 0, _GE0, _PRODUCER,
              "Skip a partition whose broker has not taken a batch for this long; 0: never."),
    ConfigDef("transactional.id", "string", None, NonEmpty(), _PRODUCER,
              "Enables transactions under this id (needs idempotence)."),
    ConfigDef("transaction.timeout.ms", "int", 60000, None, _PRODUCER,
              "How long the coordinator waits for a transaction before aborting it."),
    ConfigDef("key.serializer", "callable", None, None, _PRODUCER,
              "Python callable turning a key into bytes; None: keys are bytes already."),
    ConfigDef("value.serializer", "callable", None, None, _PRODUCER,
              "Python callable turning a value into bytes; None: values are bytes already."),
    # -- consumer -----------------------------------------------------------------------------
    # Java's ConfigDef takes "" but its consumer then refuses it; kcore refuses it up front.
    ConfigDef("group.id", "string", None, NonEmpty(), _CONSUMER,
              "Consumer group to join; None: no group (no subscribe, no commits)."),
    ConfigDef("group.instance.id", "string", None, NonEmpty(), _CONSUMER,
              "Static membership id: survives restarts without a rebalance."),
    ConfigDef("group.protocol", "string", "classic",
              _one_of("classic", "consumer", ignore_case=True), _CONSUMER,
              "Group protocol: classic (client-side assignment) or consumer (KIP-848)."),
    ConfigDef("group.remote.assignor", "string", None, None, _CONSUMER,
              "Server-side assignor for group.protocol=consumer; None: the broker's default."),
    ConfigDef("partition.assignment.strategy", "list", ("range", "cooperative-sticky"),
              OneOf(tuple((n, n) for n in ("range", "roundrobin", "sticky",
                                           "cooperative-sticky")),
                    aliases=((_ASSIGNORS + "RangeAssignor", "range"),
                             (_ASSIGNORS + "RoundRobinAssignor", "roundrobin"),
                             (_ASSIGNORS + "StickyAssignor", "sticky"),
                             (_ASSIGNORS + "CooperativeStickyAssignor", "cooperative-sticky"))),
              _CONSUMER,
              "Client-side assignors in order of preference (Java class names accepted)."),
    ConfigDef("session.timeout.ms", "int", 45000, None, _CONSUMER,
              "Classic protocol: the broker drops a member silent for this long."),
    ConfigDef("heartbeat.interval.ms", "int", 3000, None, _CONSUMER,
              "Classic protocol: heartbeat period; below session.timeout.ms."),
    ConfigDef("max.poll.interval.ms", "int", 300000, Range(1), _CONSUMER,
              "Longest time between polls before the member leaves the group."),
    ConfigDef("max.poll.records", "int", 500, Range(1), _CONSUMER,
              "Most records one poll returns."),
    ConfigDef("enable.auto.commit", "bool", True, None, _CONSUMER,
              "Commit offsets in the background (false when group.id is not set)."),
    ConfigDef("auto.commit.interval.ms", "int", 5000, _GE0, _CONSUMER,
              "How often offsets are auto-committed."),
    ConfigDef("auto.offset.reset", "string", "latest", OffsetReset(), _CONSUMER,
              "Where to start without a valid committed offset."),
    ConfigDef("fetch.min.bytes", "int", 1, _GE0, _CONSUMER,
              "Bytes a fetch waits for (up to fetch.max.wait.ms)."),
    ConfigDef("fetch.max.bytes", "int", 52428800, _GE0, _CONSUMER,
              "Most bytes one fetch response may carry (soft limit)."),
    ConfigDef("fetch.max.wait.ms", "int", 500, _GE0, _CONSUMER,
              "Longest time a broker holds a fetch waiting for fetch.min.bytes."),
    ConfigDef("max.partition.fetch.bytes", "int", 1048576, _GE0, _CONSUMER,
              "Most bytes per partition in one fetch (soft limit)."),
    # -- share consumer (KIP-932): Java keeps these in ConsumerConfig ---------------------------
    ConfigDef("share.acknowledgement.mode", "string", "implicit",
              _one_of("implicit", "explicit"), _CONSUMER,
              "Share consumer: implicit (a poll's records are accepted at the next poll or "
              "commit) or explicit (acknowledge() every record)."),
    ConfigDef("share.acquire.mode", "string", "batch_optimized",
              _one_of("batch_optimized", "record_limit", ignore_case=True), _CONSUMER,
              "Share consumer: record_limit caps a poll at max.poll.records (KIP-1206); "
              "batch_optimized may exceed it to keep whole batches."),
    ConfigDef("isolation.level", "string", "read_uncommitted",
              _one_of("read_uncommitted", "read_committed"), _CONSUMER,
              "read_committed hides records of open and aborted transactions."),
    ConfigDef("check.crcs", "bool", True, None, _CONSUMER,
              "Verify the CRC of fetched batches."),
    ConfigDef("client.rack", "string", "", None, _CONSUMER,
              "Rack of this consumer, for fetching from the closest replica."),
    ConfigDef("allow.auto.create.topics", "bool", True, None, _CONSUMER,
              "Let the consumer's metadata requests create missing topics (if the broker "
              "allows it), as Java's; `kcore consume` and the Spark source set it to false."),
    ConfigDef("exclude.internal.topics", "bool", True, None, _CONSUMER,
              "Pattern subscriptions skip internal topics."),
    ConfigDef("key.deserializer", "callable", None, None, _CONSUMER,
              "Python callable turning key bytes into a key; None: keep bytes."),
    ConfigDef("value.deserializer", "callable", None, None, _CONSUMER,
              "Python callable turning value bytes into a value; None: keep bytes."),
)
# fmt: on

# librdkafka names whose meaning is the Java key's, so librdkafka configs carry over.
ALIASES: Mapping[str, str] = {
    "metadata.broker.list": "bootstrap.servers",
    "queue.buffering.max.ms": "linger.ms",
    "request.required.acks": "acks",
    "compression.codec": "compression.type",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "sasl.mechanisms": "sasl.mechanism",
    "sasl.oauthbearer.client.id": "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.secret": "sasl.oauthbearer.client.credentials.client.secret",
}

# Java client keys kcore knows of but does not take (exact names, or prefixes ending in "."),
# so that a config ported from Java fails with a reason rather than as a typo.
_UNSUPPORTED_JAVA_KEYS: tuple[tuple[str, str], ...] = (
    ("sasl.kerberos.", "Kerberos (GSSAPI) is not supported"),
    (
        "sasl.oauthbearer.",
        "kcore's OAUTHBEARER takes tokens from oauth_cb, a token endpoint "
        "(client credentials) or unsecured JAAS options; JWT-bearer grants and broker-side keys "
        "are not supported",
    ),
    ("sasl.login.", "JAAS login classes are Java-only; credentials come from sasl.jaas.config"),
    ("sasl.client.callback.handler.class", "Java callback handlers are not supported"),
    ("metric.reporters", "Java metric reporters are not supported: read metrics()"),
    ("interceptor.classes", "Java interceptors are not supported"),
    ("config.providers", "Java config providers are not supported"),
    ("security.providers", "Java security providers are not supported"),
    ("ssl.engine.factory.class", "Java SSL engine factories are not supported"),
    ("ssl.keymanager.algorithm", "Python's ssl module has no key manager choice"),
    ("ssl.trustmanager.algorithm", "Python's ssl module has no trust manager choice"),
    ("ssl.provider", "Python's ssl module has no provider choice"),
    ("ssl.secure.random.implementation", "Python's ssl module has no random choice"),
    ("bootstrap.controllers", "kcore's admin client talks to brokers only"),
    ("transaction.two.phase.commit.enable", "two-phase commit (KIP-939) is not supported yet"),
    ("internal.", "Java-internal settings are not supported"),
)

_DEFS_BY_NAME: dict[str, ConfigDef] = {d.name: d for d in CONFIG_DEFS}


def default_of(key: str) -> Any:
    """``key``'s default in ``CONFIG_DEFS`` (the one place defaults are stated), for code that
    reads a plain mapping: ``config.get(key, default_of(key))``."""
    return _DEFS_BY_NAME[key].default


def _defs_for(role: str) -> dict[str, ConfigDef]:
    if role == "common":
        return {d.name: d for d in CONFIG_DEFS if d.roles == _ALL}
    return {d.name: d for d in CONFIG_DEFS if role in d.roles}


_ROLE_DEFS: dict[str, dict[str, ConfigDef]] = {r: _defs_for(r) for r in (*ROLES, "common")}
_ROLE_DEFS["share_consumer"] = {
    k: d for k, d in _ROLE_DEFS["consumer"].items() if k not in SHARE_UNSUPPORTED
}


# -- parsing ----------------------------------------------------------------------------------


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_int(value: Any, kind: str) -> int:
    # bool is an int subclass, but True for a timeout is a mistake, not 1 ms.
    if isinstance(value, bool):
        raise _Invalid()
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        number = int(value)
    else:
        raise _Invalid()
    low, high = _TYPE_BOUNDS[kind]
    if not low <= number <= high:
        raise _Invalid()
    return number


def _parse_value(d: ConfigDef, value: Any) -> Any:
    """A caller's value (Java-properties string or Python value) as the key's Python type;
    raises ``_Invalid``."""
    if d.type in ("int", "long"):
        parsed: Any = _parse_int(value, d.type)
    elif d.type == "double":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise _Invalid()
        try:
            parsed = float(value)
        except ValueError:
            raise _Invalid() from None
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            raise _Invalid()
    elif d.type == "bool":
        if isinstance(value, bool):
            parsed = value
        elif isinstance(value, str) and value.strip().lower() in ("true", "false"):
            parsed = value.strip().lower() == "true"
        else:
            raise _Invalid()
    elif d.type == "string":
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and isinstance(d.validator, OneOf)
        ):
            value = str(value)  # acks=1 given as a Python int
        if not isinstance(value, str):
            raise _Invalid()
        # Java trims string values, but not passwords.
        parsed = value if d.secret else value.strip()
    elif d.type == "list":
        if isinstance(value, str):
            items: list[Any] = value.split(",")
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise _Invalid()
        if not all(isinstance(i, str) for i in items):
            raise _Invalid()
        parsed = tuple(i.strip() for i in items if i.strip())
    elif d.type == "object":
        if value is None or isinstance(value, str):
            raise _Invalid()
        parsed = value
    else:  # callable
        if isinstance(value, str):
            raise _Invalid("a Python callable or None (Java class names are not supported)")
        if not callable(value):
            raise _Invalid()
        parsed = value
    if d.validator is None:
        return parsed
    if d.type == "list":
        checked = []
        for item in parsed:
            try:
                checked.append(d.validator(item))
            except _Invalid as e:
                e.item = item
                raise
        return tuple(checked)
    return d.validator(parsed)


def _bad_value(d: ConfigDef, value: Any, allowed: str = "") -> ConfigError:
    text = f"must be {allowed or d.allowed()}"
    # Secrets are never echoed, not even when they are malformed.
    return ConfigError(d.name, text if d.secret else f"{text}, got {_show(value)}")


def _article(role: str) -> str:
    return "an" if role == "admin" else "a"


def _role_phrase(roles: frozenset[str]) -> str:
    names = [r for r in ROLES if r in roles]
    if len(names) == len(ROLES):
        return "a setting of every client"
    return f"{_article(names[0])} {' and '.join(names)} setting"


def other_client_setting(key: str, role: str) -> bool:
    """Whether ``key`` is a known setting of another kind of client and not of ``role`` (a
    shared client.properties holds producer and consumer keys alike)."""
    known = _DEFS_BY_NAME.get(ALIASES.get(key, key))
    return known is not None and role not in known.roles


# (key, role) pairs already logged as ignored: each is logged once per process.
_LOGGED_IGNORED: set[tuple[str, str]] = set()


def _log_ignored(key: str, role: str, roles: frozenset[str]) -> None:
    if (key, role) in _LOGGED_IGNORED:
        return
    _LOGGED_IGNORED.add((key, role))
    log.warning(
        "%s: %s, ignored by this %s (set %s=true to refuse it)",
        key,
        _role_phrase(roles),
        role,
        STRICT_KEY,
    )


def _unknown_key(key: str, role: str) -> ConfigError:
    known = _DEFS_BY_NAME.get(ALIASES.get(key, key))
    if known is not None:
        return ConfigError(key, f"{_role_phrase(known.roles)}, not {_article(role)} {role} one")
    for name, reason in _UNSUPPORTED_JAVA_KEYS:
        if key == name or (name.endswith(".") and key.startswith(name)):
            return ConfigError(key, f"a Java client setting kcore does not take: {reason}")
    own = [*_ROLE_DEFS[role], *(a for a, t in ALIASES.items() if t in _ROLE_DEFS[role])]
    close = difflib.get_close_matches(key, own, n=1, cutoff=0.8)
    if close:
        return ConfigError(key, f"unknown config; did you mean {close[0]!r}?")
    close = difflib.get_close_matches(key, [*_DEFS_BY_NAME, *ALIASES], n=1, cutoff=0.8)
    if close:
        other = _DEFS_BY_NAME[ALIASES.get(close[0], close[0])]
        return ConfigError(
            key, f"unknown config; did you mean {close[0]!r} ({_role_phrase(other.roles)})?"
        )
    return ConfigError(key, "unknown config")


# -- ISO-8601 durations and JAAS --------------------------------------------------------------

_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?"
    r"(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_iso_duration(text: str) -> float:
    """Seconds in an ISO-8601 duration as Java's ``Duration.parse`` reads it (``PnDTnHnMn.nS``,
    signed parts, no weeks/months/years). Raises ValueError for a malformed or negative one,
    which ``auto.offset.reset=by_duration:`` does not allow."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    sign, days, t_part, hours, minutes, secs, frac = m.groups()
    if (t_part is not None and t_part.upper() == "T") or not (days or hours or minutes or secs):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    total = Decimal(0)
    for part, scale in ((days, 86400), (hours, 3600), (minutes, 60)):
        if part:
            total += Decimal(int(part)) * scale
    if secs:
        # The fraction takes the sign of the seconds, as in Java ("PT-0.5S" is -0.5 s).
        seconds = Decimal(f"{secs.lstrip('+-') or '0'}.{frac or '0'}")
        total += -seconds if secs.startswith("-") else seconds
    if sign == "-":
        total = -total
    if total < 0:
        raise ValueError(f"negative duration: {text!r}")
    return float(total)


OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
    OAUTHBEARER_LOGIN_MODULE,
}
_JAAS_UNSUPPORTED = {
    "com.sun.security.auth.module.Krb5LoginModule": "Kerberos (GSSAPI)",
}
_JAAS_FLAGS = {"required", "requisite", "sufficient", "optional"}
_JAAS_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def _jaas_tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) with kind "word", "quoted", "=" or ";". Error text never holds the input:
    it is a password line."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "=;":
            tokens.append((c, c))
            i += 1
        elif c in "\"'":
            j, buf = i + 1, []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                    buf.append(_JAAS_ESCAPES.get(text[j], text[j]))
                else:
                    buf.append(text[j])
                j += 1
            if j >= n:
                raise _Invalid("a JAAS entry whose quoted values are closed")
            tokens.append(("quoted", "".join(buf)))
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "=;\"'":
                j += 1
            tokens.append(("word", text[i:j]))
            i = j
    return tokens


def _parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    tokens = _jaas_tokens(text)
    if len(tokens) < 2 or tokens[0][0] != "word" or tokens[1][0] != "word":
        raise _Invalid('a JAAS entry: <LoginModule> <flag> name="value" ... ;')
    module, flag = tokens[0][1], tokens[1][1]
    if module in _JAAS_UNSUPPORTED:
        raise _Invalid(
            "a PlainLoginModule, ScramLoginModule or OAuthBearerLoginModule entry: "
            f"{_JAAS_UNSUPPORTED[module]} is not supported by kcore"
        )
    if module not in _JAAS_MODULES:
        raise _Invalid(
            "a JAAS entry with org.apache.kafka.common.security.plain.PlainLoginModule, "
            "org.apache.kafka.common.security.scram.ScramLoginModule or "
            f"{OAUTHBEARER_LOGIN_MODULE}"
        )
    if flag.lower() not in _JAAS_FLAGS:
        raise _Invalid("a JAAS entry whose flag is required, requisite, sufficient or optional")
    options: dict[str, str] = {}
    i = 2
    while i < len(tokens) and tokens[i][0] != ";":
        kinds = [kind for kind, _ in tokens[i : i + 3]]
        if kinds not in (["word", "=", "word"], ["word", "=", "quoted"]):
            raise _Invalid('a JAAS entry whose options are name="value" pairs')
        options[tokens[i][1]] = tokens[i + 2][1]
        i += 3
    if i >= len(tokens):
        raise _Invalid("a JAAS entry ending with a semicolon")
    if i + 1 != len(tokens):
        raise _Invalid("exactly one JAAS login module entry")
    return module, options


def parse_jaas_config(text: str) -> tuple[str, dict[str, str]]:
    """The login module class and options of a ``sasl.jaas.config`` value, e.g.
    ``org.apache.kafka.common.security.plain.PlainLoginModule required username="alice"
    password="secret";``. Quoted values may hold any character (backslash escapes as in Java);
    unquoted ones stop at space, ``=`` and ``;``. Only the PLAIN, SCRAM and OAUTHBEARER login
    modules are accepted. Raises ConfigError, whose text never includes the value."""
    try:
        return _parse_jaas(text)
    except _Invalid as e:
        raise ConfigError("sasl.jaas.config", f"must be {e.allowed}") from None


# -- the config -------------------------------------------------------------------------------


def _strict(given: Mapping[str, Any]) -> bool:
    """Whether ``given`` asks for strict mode (checked before the other keys, which it governs)."""
    value = given.get(STRICT_KEY)
    if value is None:
        return False
    try:
        return bool(_parse_value(_DEFS_BY_NAME[STRICT_KEY], value))
    except _Invalid:
        raise _bad_value(_DEFS_BY_NAME[STRICT_KEY], value) from None


class ClientConfig(Mapping[str, Any]):
    """A validated, read-only client configuration for one role.

    ``config`` maps Java client keys (or a few librdkafka aliases, see :data:`ALIASES`) to
    values, as Java-properties strings (``"100"``, ``"true"``, ``"a,b"``) or Python values
    (``100``, ``True``, ``["a", "b"]``). ``None`` means "not set". Another ClientConfig may be
    passed: its caller-set values are checked again for this role. Every key of the role can be
    read, with Java's default where the caller set none. A key that only another kind of client
    takes is checked, logged once (``kcore.config`` logger) and ignored (:attr:`ignored_keys`), so
    one dict serves every client; with ``kcore.config.strict=true`` it is refused. Raises
    :class:`~kcore.errors.ConfigError` for an unknown key, a bad value or a conflict."""

    __slots__ = ("_ignored", "_role", "_user", "_values")

    def __init__(self, config: Mapping[str, Any] | None = None, *, role: Role = "common") -> None:
        if role not in _ROLE_DEFS:
            raise ConfigError("role", f"must be one of {', '.join(_ROLE_DEFS)}, got {role!r}")
        defs = _ROLE_DEFS[role]
        given: Mapping[str, Any] = (
            config._user if isinstance(config, ClientConfig) else (config or {})
        )
        strict = _strict(given)
        user: dict[str, Any] = {}
        ignored: list[str] = []
        spelled: dict[str, str] = {}  # canonical key -> the caller's spelling, for conflicts
        for key, value in given.items():
            if not isinstance(key, str):
                raise ConfigError(_show(key), "config keys must be strings")
            name = ALIASES.get(key, key)
            d = defs.get(name)
            if d is None and role == "share_consumer" and name in SHARE_UNSUPPORTED:
                raise ConfigError(name, "cannot be set when using a share group")
            if d is None:
                other = _DEFS_BY_NAME.get(name)
                # One dict may serve every client (as Java and librdkafka take it): a key only
                # another client role takes is checked as that role would, logged once and
                # ignored; "common" (the shared layers) and strict mode refuse it.
                if other is None or strict or role == "common":
                    raise _unknown_key(key, role)
                if value is None:
                    continue
                try:
                    _parse_value(other, value)
                except _Invalid as e:
                    raise _bad_value(
                        other, value if e.item is None else e.item, e.allowed
                    ) from None
                _log_ignored(key, role, other.roles)
                ignored.append(key)
                continue
            if name in spelled:
                raise ConfigError(name, f"set both as {spelled[name]!r} and {key!r}; keep one")
            spelled[name] = key
            if value is None:
                continue
            try:
                user[name] = _parse_value(d, value)
            except _Invalid as e:
                raise _bad_value(d, value if e.item is None else e.item, e.allowed) from None
        base_role = "consumer" if role == "share_consumer" else role
        values = {name: user.get(name, d.default_for(base_role)) for name, d in defs.items()}
        self._role: str = role
        self._user: dict[str, Any] = user
        self._ignored: frozenset[str] = frozenset(ignored)
        self._values: dict[str, Any] = values
        _check_common(self, values, user)
        if role == "producer":
            _check_producer(values, user)
        elif role == "consumer":
            _check_consumer(values, user)
        elif role == "share_consumer":
            _check_share_consumer(values)
        elif role == "admin":
            _check_admin(values, user)

    # -- Mapping ---------------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        # Lists are stored as tuples so that the config cannot be changed through them.
        return list(value) if isinstance(value, tuple) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        shown = {k: (HIDDEN if _DEFS_BY_NAME[k].secret else self[k]) for k in self._user}
        return f"ClientConfig({shown!r}, role={self._role!r})"

    __str__ = __repr__

    # -- accessors -------------------------------------------------------------------------

    @property
    def role(self) -> str:
        return self._role

    @property
    def user_keys(self) -> frozenset[str]:
        """The keys the caller set (canonical names, aliases resolved; None values excluded)."""
        return frozenset(self._user)

    @property
    def ignored_keys(self) -> frozenset[str]:
        """The keys given that only other kinds of client take (as the caller spelled them):
        logged and left out of this config."""
        return self._ignored

    @property
    def bootstrap_servers(self) -> list[str]:
        """``host:port`` strings, IPv6 hosts in brackets."""
        return list(self._values["bootstrap.servers"])

    @property
    def bootstrap_addresses(self) -> list[tuple[str, int]]:
        """(host, port) pairs, IPv6 hosts without brackets (as socket functions take them)."""
        return [_split_host_port(s) for s in self._values["bootstrap.servers"]]

    def setting(self, key: str) -> Any:
        """``key``'s value for this role; for a key another role takes (the cluster layer is
        shared: a producer's reads ``default.api.timeout.ms``, a consumer's
        ``max.in.flight.requests.per.connection``), its default in ``CONFIG_DEFS``."""
        if key in self._values:
            return self[key]
        return default_of(key)

    def seconds(self, key: str) -> float:
        """An ``*.ms`` setting in seconds (asyncio and socket timeouts take seconds)."""
        if not key.endswith(".ms") or _DEFS_BY_NAME.get(key, None) is None:
            raise KeyError(key)
        return float(self.setting(key)) / 1000.0

    def backoff(
        self, kind: Literal["reconnect", "retry", "connection.setup"]
    ) -> tuple[float, float]:
        """(first, max) seconds of an exponential backoff, as Java applies them: a first value
        above the max gives a constant backoff at the max."""
        low, high = {
            "reconnect": ("reconnect.backoff.ms", "reconnect.backoff.max.ms"),
            "retry": ("retry.backoff.ms", "retry.backoff.max.ms"),
            "connection.setup": (
                "socket.connection.setup.timeout.ms",
                "socket.connection.setup.timeout.max.ms",
            ),
        }[kind]
        top = self.seconds(high)
        return min(self.seconds(low), top), top

    def sasl_credentials(self) -> tuple[str, str] | None:
        """(username, password) from sasl.username/sasl.password, or from the username and
        password options of sasl.jaas.config; None when neither holds both."""
        user, password = self._values.get("sasl.username"), self._values.get("sasl.password")
        if user is not None and password is not None:
            return user, password
        jaas = self._values.get("sasl.jaas.config")
        if jaas is None:
            return None
        _, options = _parse_jaas(jaas)
        if "username" in options and "password" in options:
            return options["username"], options["password"]
        return None

    def oauthbearer_settings(self) -> OAuthBearerSettings:
        """Where an OAUTHBEARER client gets its token, from the keys of Java (a token endpoint,
        or the unsecured JAAS options), librdkafka (``enable.sasl.oauthbearer.unsecure.jwt``)
        or confluent-kafka (``oauth_cb``). Raises ConfigError when none is set."""
        v = self._values
        jaas_module: str | None = None
        jaas: dict[str, str] = {}
        if v["sasl.jaas.config"] is not None:
            jaas_module, jaas = _parse_jaas(v["sasl.jaas.config"])
            if jaas_module != OAUTHBEARER_LOGIN_MODULE:
                raise ConfigError(
                    "sasl.jaas.config",
                    f"sasl.mechanism=OAUTHBEARER takes an {OAUTHBEARER_LOGIN_MODULE} entry",
                )
        handler = OAUTHBEARER_LOGIN_HANDLERS.get(v["sasl.login.callback.handler.class"] or "")
        prefix = "extension_"  # Java's token endpoint login takes extensions as these options
        extensions = {k[len(prefix) :]: x for k, x in jaas.items() if k.startswith(prefix)}
        if v["sasl.oauthbearer.extensions"]:
            for item in v["sasl.oauthbearer.extensions"].split(","):
                name, eq, value = item.partition("=")
                if not eq:
                    raise ConfigError("sasl.oauthbearer.extensions", "must be key=value,key=value")
                extensions[name.strip()] = value.strip()
        url = v["sasl.oauthbearer.token.endpoint.url"]
        unsecured = jaas_module is not None and any(k.startswith("unsecuredLogin") for k in jaas)
        sources = {
            "oauth_cb": v["oauth_cb"] is not None,
            "sasl.oauthbearer.token.endpoint.url": url is not None,
            "enable.sasl.oauthbearer.unsecure.jwt": v["enable.sasl.oauthbearer.unsecure.jwt"],
            "unsecuredLogin options in sasl.jaas.config": unsecured,
        }
        chosen = [name for name, on in sources.items() if on]
        if len(chosen) > 1:  # as librdkafka refuses a callback with its unsecured JWTs
            raise ConfigError(
                "sasl.mechanism", f"OAUTHBEARER takes one token source; set {' or '.join(chosen)}"
            )
        if handler == "unsecured" and url is not None:
            raise ConfigError(
                "sasl.login.callback.handler.class",
                "names the unsecured login handler, but sasl.oauthbearer.token.endpoint.url is set",
            )
        if v["oauth_cb"] is not None:
            return OAuthBearerSettings("callback", extensions=extensions)
        if url is not None or handler == "endpoint" or v["sasl.oauthbearer.method"] == "oidc":
            if url is None:
                raise ConfigError(
                    "sasl.oauthbearer.token.endpoint.url",
                    "is required to fetch OAUTHBEARER tokens from a token endpoint",
                )
            return OAuthBearerSettings(
                "endpoint",
                url=url,
                client_id=(
                    v["sasl.oauthbearer.client.credentials.client.id"] or jaas.get("clientId")
                ),
                client_secret=(
                    v["sasl.oauthbearer.client.credentials.client.secret"]
                    or jaas.get("clientSecret")
                ),
                scope=v["sasl.oauthbearer.scope"] or jaas.get("scope"),
                extensions=extensions,
            )
        if unsecured:
            return OAuthBearerSettings("unsecured", unsecured=jaas)
        if v["enable.sasl.oauthbearer.unsecure.jwt"]:
            return OAuthBearerSettings(
                "unsecured", unsecured=_librdkafka_unsecured(v["sasl.oauthbearer.config"] or "")
            )
        raise ConfigError(
            "sasl.mechanism",
            "OAUTHBEARER needs a token source: oauth_cb (a callable), "
            "sasl.oauthbearer.token.endpoint.url (client credentials), or for development an "
            f"unsecured token: sasl.jaas.config set to {OAUTHBEARER_LOGIN_MODULE} required "
            'unsecuredLoginStringClaim_sub="<principal>";',
        )

    def auto_offset_reset(self) -> tuple[str, float | None]:
        """("earliest" | "latest" | "none", None) or ("by_duration", seconds)."""
        value: str = self._values["auto.offset.reset"]
        if value.startswith("by_duration:"):
            return "by_duration", parse_iso_duration(value[len("by_duration:") :])
        return value, None


@dataclass(frozen=True)
class OAuthBearerSettings:
    """An OAUTHBEARER token source: ``callback`` (oauth_cb), ``endpoint`` (client credentials
    or a file: URL) or ``unsecured`` (an unsigned JWT from Java's ``unsecuredLogin*``
    options)."""

    source: Literal["callback", "endpoint", "unsecured"]
    url: str | None = None
    client_id: str | None = field(default=None, repr=False)
    client_secret: str | None = field(default=None, repr=False)
    scope: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)
    unsecured: Mapping[str, str] = field(default_factory=dict)


def _librdkafka_unsecured(text: str) -> dict[str, str]:
    """librdkafka's unsecured JWT settings (``principal=alice scope=a,b lifeSeconds=60
    extension_x=1``, ``principalClaimName``, ``scopeClaimName``) as Java's JAAS options."""
    given: dict[str, str] = {}
    for part in text.split():
        name, eq, value = part.partition("=")
        if not eq:
            raise ConfigError("sasl.oauthbearer.config", "must be name=value pairs")
        given[name] = value
    if not given.get("principal"):
        raise ConfigError(
            "sasl.oauthbearer.config",
            "enable.sasl.oauthbearer.unsecure.jwt needs principal=<name> in it",
        )
    claim = given.get("principalClaimName", "sub")
    options = {"unsecuredLoginPrincipalClaimName": claim}
    options[f"unsecuredLoginStringClaim_{claim}"] = given["principal"]
    if "scope" in given:
        options[f"unsecuredLoginListClaim_{given.get('scopeClaimName', 'scope')}"] = (
            "," + given["scope"]
        )
    if "lifeSeconds" in given:
        options["unsecuredLoginLifetimeSeconds"] = given["lifeSeconds"]
    for name, value in given.items():
        if name.startswith("extension_"):
            options["unsecuredLoginExtension_" + name[len("extension_") :]] = value
    return options


# -- checks across keys -----------------------------------------------------------------------


# Settings sent to brokers as protocol strings (int16 length): at most this many bytes, UTF-8.
PROTOCOL_STRING_KEYS = (
    "client.id",
    "client.rack",
    "group.id",
    "group.instance.id",
    "transactional.id",
)
PROTOCOL_STRING_MAX_BYTES = 32767
# Settings that go on the wire as UTF-8 inside other bytes (SASL's): they must encode.
WIRE_TEXT_KEYS = ("sasl.username", "sasl.password")


def _check_common(cfg: ClientConfig, v: dict[str, Any], user: dict[str, Any]) -> None:
    if not v["bootstrap.servers"]:
        raise ConfigError("bootstrap.servers", "is required: at least one host:port")
    for key in PROTOCOL_STRING_KEYS:
        text = v.get(key)
        if not isinstance(text, str):
            continue
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ConfigError(key, f"is not valid text for the wire ({exc.reason})") from None
        if size > PROTOCOL_STRING_MAX_BYTES:
            raise ConfigError(
                key,
                f"is {size} bytes in UTF-8; a Kafka protocol string holds at most "
                f"{PROTOCOL_STRING_MAX_BYTES}",
            )
    for key in WIRE_TEXT_KEYS:
        text = v.get(key)
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # the value itself is never echoed (a secret)
                raise ConfigError(key, f"is not valid text for the wire ({exc.reason})") from None
    for key in ("otel.metrics.enable", "otel.traces.enable"):
        if v.get(key) and importlib.util.find_spec("opentelemetry") is None:
            raise ConfigError(
                key, "needs the OpenTelemetry API: pip install 'kcore[otel]' (opentelemetry-api)"
            )
    if v["statistics.interval.ms"] > 0 and v["stats_cb"] is None:
        raise ConfigError(
            "statistics.interval.ms", "needs stats_cb, the callable the statistics are given to"
        )
    # Java: reconnect.backoff.ms set alone also becomes the max (no exponential growth).
    if "reconnect.backoff.ms" in user and "reconnect.backoff.max.ms" not in user:
        v["reconnect.backoff.max.ms"] = v["reconnect.backoff.ms"]

    protocol: str = v["security.protocol"]
    if v["sasl.username"] is not None and v["sasl.password"] is None:
        raise ConfigError("sasl.password", "is required when sasl.username is set")
    if v["sasl.password"] is not None and v["sasl.username"] is None:
        raise ConfigError("sasl.username", "is required when sasl.password is set")
    if v["sasl.username"] is not None and v["sasl.jaas.config"] is not None:
        raise ConfigError(
            "sasl.jaas.config",
            "set either sasl.jaas.config or sasl.username and sasl.password, not both",
        )
    if protocol.startswith("SASL_"):
        if v["sasl.mechanism"] not in SUPPORTED_SASL_MECHANISMS:
            raise ConfigError(
                "sasl.mechanism",
                f"is required with security.protocol={protocol}: Java's default "
                f"{v['sasl.mechanism']} is not supported by kcore; set one of "
                + ", ".join(SUPPORTED_SASL_MECHANISMS),
            )
        if v["sasl.mechanism"] == "OAUTHBEARER":
            cfg.oauthbearer_settings()  # raises for a missing or ambiguous token source
        elif cfg.sasl_credentials() is None:
            raise ConfigError(
                "sasl.jaas.config" if v["sasl.jaas.config"] is not None else "sasl.username",
                f"security.protocol={protocol} needs credentials: sasl.username and "
                "sasl.password, or sasl.jaas.config with username and password options",
            )

    def one_of(*keys: str) -> None:
        present = [k for k in keys if v[k] is not None]
        if len(present) > 1:
            raise ConfigError(present[1], f"set only one of {', '.join(present)}")

    one_of("ssl.truststore.location", "ssl.truststore.certificates", "ssl.ca.location")
    one_of("ssl.keystore.location", "ssl.keystore.key", "ssl.certificate.location")
    if (v["ssl.keystore.key"] is None) != (v["ssl.keystore.certificate.chain"] is None):
        raise ConfigError(
            "ssl.keystore.key", "and ssl.keystore.certificate.chain must be set together"
        )
    if v["ssl.key.location"] is not None and v["ssl.certificate.location"] is None:
        raise ConfigError("ssl.key.location", "needs ssl.certificate.location")


def _check_producer(v: dict[str, Any], user: dict[str, Any]) -> None:
    # Kafka 4.x: idempotence is on by default. A conflicting acks or retries turns it off
    # silently unless the caller asked for it; too many in-flight requests always fails.
    explicit = "enable.idempotence" in user
    off_because = ""
    if v["enable.idempotence"]:
        if v["retries"] == 0:
            if explicit:
                raise ConfigError("retries", "must not be 0 when enable.idempotence is true")
            off_because = "retries=0"
        if v["acks"] != -1:
            if explicit:
                raise ConfigError(
                    "acks", f"must be all (-1) when enable.idempotence is true, got {v['acks']}"
                )
            off_because = f"acks={v['acks']}"
        if v["max.in.flight.requests.per.connection"] > 5:
            raise ConfigError(
                "max.in.flight.requests.per.connection",
                "must be at most 5 with the idempotent producer (on by default; set "
                f"enable.idempotence=false for more), got "
                f"{v['max.in.flight.requests.per.connection']}",
            )
        if off_because:
            v["enable.idempotence"] = False
    if v["transactional.id"] is not None and not v["enable.idempotence"]:
        why = f" (it is off because {off_because})" if off_because else ""
        raise ConfigError("transactional.id", f"needs enable.idempotence=true{why}")
    # lz4 at a level other than Java's default (9, the fast compressor) is LZ4 HC, which the
    # codec writes with the optional lz4 package: refused here, not by every batch later.
    if v["compression.type"] == "lz4" and v["compression.lz4.level"] != 9:
        from kcore.codec import lz4_high_compression_available

        if not lz4_high_compression_available():
            raise ConfigError(
                "compression.lz4.level",
                f"{v['compression.lz4.level']} is LZ4 HC (only 9, Java's default, is the fast "
                "compressor), which kcore writes with the lz4 package: pip install lz4 (or "
                "kcore[lz4])",
            )
    # Java's KafkaProducer: a delivery timeout must cover one linger plus one request.
    floor = min(v["linger.ms"] + v["request.timeout.ms"], INT_MAX)
    if v["delivery.timeout.ms"] < floor:
        if "delivery.timeout.ms" in user:
            raise ConfigError(
                "delivery.timeout.ms",
                f"must be >= linger.ms + request.timeout.ms ({floor}), "
                f"got {v['delivery.timeout.ms']}",
            )
        v["delivery.timeout.ms"] = floor


_GROUP_PROTOCOL_ONLY = {
    "consumer": ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"),
    "classic": ("group.remote.assignor",),
}


def _check_share_consumer(v: dict[str, Any]) -> None:
    if v["group.id"] is None:
        raise ConfigError("group.id", "a share consumer needs the share group to join")


def _check_consumer(v: dict[str, Any], user: dict[str, Any]) -> None:
    # Java: without a group there is nothing to commit to, so auto-commit defaults to off.
    if v["group.id"] is None:
        if user.get("enable.auto.commit"):
            raise ConfigError("enable.auto.commit", "cannot be true when group.id is not set")
        v["enable.auto.commit"] = False
    protocol: str = v["group.protocol"]
    for key in SHARE_ONLY:
        if key in user:
            raise ConfigError(
                key, f"cannot be set when group.protocol={protocol} (a ShareConsumer takes it)"
            )
    for key in _GROUP_PROTOCOL_ONLY[protocol]:
        if key in user:
            raise ConfigError(key, f"cannot be set when group.protocol={protocol}")
    if (
        protocol == "classic"
        and v["group.id"] is not None
        and v["heartbeat.interval.ms"] >= v["session.timeout.ms"]
    ):
        raise ConfigError(
            "heartbeat.interval.ms",
            f"must be lower than session.timeout.ms ({v['session.timeout.ms']}), "
            f"got {v['heartbeat.interval.ms']}",
        )


def _check_admin(v: dict[str, Any], user: dict[str, Any]) -> None:
    # Java's admin client: a call's timeout must cover at least one request.
    if v["default.api.timeout.ms"] < v["request.timeout.ms"]:
        if "default.api.timeout.ms" in user:
            raise ConfigError(
                "default.api.timeout.ms",
                f"must be >= request.timeout.ms ({v['request.timeout.ms']}), "
                f"got {v['default.api.timeout.ms']}",
            )
        v["default.api.timeout.ms"] = v["request.timeout.ms"]


# -- docs -------------------------------------------------------------------------------------


def _format_default(d: ConfigDef, role: str) -> str:
    if role not in d.roles:
        return "—"
    if d.required:
        return "(required)"
    value = d.default_for(role)
    if d.name == "acks":
        return "`all`"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`" if value else "(empty)"
    if value == "":
        return '`""`'
    return f"`{value}`"


def markdown_table() -> str:
    """The key table of ``docs/config.md``: key, default per role, allowed values, meaning."""
    lines = [
        "| key | admin | producer | consumer | allowed | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for d in CONFIG_DEFS:
        defaults = " | ".join(_format_default(d, r) for r in ROLES)
        secret = " Secret: never shown." if d.secret else ""
        # Escaped so that Markdown shows "<LoginModule>" rather than taking it for HTML.
        allowed = d.allowed().replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        lines.append(f"| `{d.name}` | {defaults} | {allowed} | {d.doc}{secret} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
