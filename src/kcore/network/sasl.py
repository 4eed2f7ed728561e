"""Client side of the SASL mechanisms Kafka brokers offer (username/password logins and
OAUTHBEARER bearer tokens), sans-IO.

A mechanism only turns bytes into bytes; the I/O layer carries each message in a
SaslAuthenticate request (KIP-152) and feeds the broker's ``auth_bytes`` back::

    mech = create_mechanism("SCRAM-SHA-256", username, password)
    token = mech.initial_response()
    while token is not None:
        server_bytes = send_sasl_authenticate(token)  # the I/O layer's job
        token = None if mech.complete else mech.step(server_bytes)

``PLAIN`` (RFC 4616) is complete as soon as its one message is built. ``SCRAM-SHA-256`` and
``SCRAM-SHA-512`` (RFC 5802, RFC 7677) take two round trips and are complete only once the
broker's signature has been verified, so a successful exchange also proves the broker knows the
credential. ``OAUTHBEARER`` (RFC 7628, KIP-255) sends a token got elsewhere
(:mod:`kcore.network.oauthbearer` gets and refreshes it) in one message.

Compatibility choices, matching Kafka's Java client (``ScramSaslClient``/``ScramFormatter``):

* No SASLprep. Java sends the username as given (only ``,`` and ``=`` escaped) and salts the
  password's plain UTF-8 bytes, and the credentials brokers store are built the same way, so
  normalizing here (even NFKC alone) would make every non-normalized password fail to log in.
* Client-first extensions (KIP-84, e.g. ``tokenauth=true`` for delegation tokens) follow the
  nonce, as Java sends them.
* Iteration counts below Kafka's minimum for SCRAM (4096) are refused.

Errors never include the password or anything derived from it.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from kcore.errors import ConfigError, IllegalSaslStateError, SaslAuthenticationFailedError

__all__ = [
    "MAX_ITERATIONS",
    "MIN_ITERATIONS",
    "PASSWORD_MECHANISMS",
    "SUPPORTED_MECHANISMS",
    "OAuthBearerMechanism",
    "PlainMechanism",
    "SaslMechanism",
    "ScramMechanism",
    "create_mechanism",
]

SUPPORTED_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
#: The mechanisms :func:`create_mechanism` makes from a username and password.
PASSWORD_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: Kafka's ``ScramMechanism.minIterations``; fewer makes offline guessing of the password cheap.
MIN_ITERATIONS = 4096
#: Default ceiling on the server's iteration count. Kafka stores at most 16384; the cap is there
#: so a hostile or spoofed server cannot make the client spin in PBKDF2 for minutes.
MAX_ITERATIONS = 1_000_000

# SCRAM-SHA-1 is not offered to users (Kafka has no such mechanism); it exists so the RFC 5802
# test vector can exercise the same code.
_SCRAM_HASHES = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

# Attribute names RFC 5802 gives a meaning to; an extension reusing one would be ambiguous.
_SCRAM_ATTRIBUTES = frozenset("acnmrsipve")
_EXTENSION_NAME = re.compile(r"[A-Za-z]+")
# RFC 5802 "printable": %x21-7E except ",".
_PRINTABLE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_ATTRIBUTE = re.compile(r"([A-Za-z]+)=(.*)", re.DOTALL)
_DIGITS = re.compile(r"[0-9]{1,10}")
# gs2-header "n,," (no channel binding, no authzid), base64-encoded for the c= attribute.
_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"
_MAX_SERVER_ERROR_CHARS = 200


class SaslMechanism(ABC):
    """One client-side SASL exchange. Single use: build a new one for each authentication."""

    #: The mechanism name sent in SaslHandshake, e.g. ``"SCRAM-SHA-256"``.
    name: str

    def __init__(self, name: str, username: str) -> None:
        self.name = name
        self._username = username

    @property
    def username(self) -> str:
        return self._username

    @abstractmethod
    def initial_response(self) -> bytes:
        """The first message to send. May be called once."""

    @abstractmethod
    def step(self, server_bytes: bytes) -> bytes | None:
        """Consume the server's reply; return the next message to send, or ``None`` once the
        client side is done (then :attr:`complete` is true). Raises
        :class:`~kcore.errors.SaslAuthenticationFailedError` for a bad server message and
        :class:`~kcore.errors.IllegalSaslStateError` when called out of turn."""

    @property
    @abstractmethod
    def complete(self) -> bool:
        """True once the exchange has succeeded on the client side."""

    @property
    @abstractmethod
    def _state_label(self) -> str: ...

    def __repr__(self) -> str:
        # Spelled out so the password can never reach a log line through repr().
        return (
            f"<{type(self).__name__} name={self.name!r} username={self._username!r} "
            f"state={self._state_label}>"
        )


def _check_username(username: str) -> None:
    if not username:
        raise ConfigError("sasl.username", "must not be empty")
    if "\0" in username:
        raise ConfigError("sasl.username", "must not contain NUL characters")


class PlainMechanism(SaslMechanism):
    """SASL PLAIN (RFC 4616): one message, ``authzid NUL authcid NUL passwd``, with an empty
    authzid so the broker authorizes as the authenticated user. Sends the password in clear,
    so only use it over TLS."""

    def __init__(self, username: str, password: str) -> None:
        _check_username(username)
        # NUL is the field separator, so it cannot appear inside one (RFC 4616 SAFE).
        if not password:
            raise ConfigError("sasl.password", "must not be empty")
        if "\0" in password:
            raise ConfigError("sasl.password", "must not contain NUL characters")
        super().__init__("PLAIN", username)
        self._password: str | None = password
        self._sent = False

    def initial_response(self) -> bytes:
        if self._sent or self._password is None:
            raise IllegalSaslStateError("PLAIN: initial_response() may only be called once")
        message = f"\0{self._username}\0{self._password}".encode()
        self._password = None  # nothing else needs it; don't keep it around
        self._sent = True
        return message

    def step(self, server_bytes: bytes) -> bytes | None:
        if not self._sent:
            raise IllegalSaslStateError("PLAIN: step() called before initial_response()")
        raise IllegalSaslStateError("PLAIN: step() called after the exchange completed")

    @property
    def complete(self) -> bool:
        return self._sent

    @property
    def _state_label(self) -> str:
        return "complete" if self._sent else "initial"


class _ScramState(enum.Enum):
    INITIAL = "initial"
    AWAIT_SERVER_FIRST = "await-server-first"
    AWAIT_SERVER_FINAL = "await-server-final"
    COMPLETE = "complete"
    FAILED = "failed"


def _sasl_name(username: str) -> str:
    """RFC 5802 saslname: '=' first, so the '=' of '=2C' is not escaped again."""
    return username.replace("=", "=3D").replace(",", "=2C")


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")


def _attributes(message: str) -> list[tuple[str, str]]:
    """Split ``k=v,k=v,...`` into pairs; raises ValueError for a part that is not ``k=v``."""
    pairs = []
    for part in message.split(","):
        match = _ATTRIBUTE.fullmatch(part)
        if match is None:
            raise ValueError("malformed attribute")
        pairs.append((match.group(1), match.group(2)))
    return pairs


class ScramMechanism(SaslMechanism):
    """SASL SCRAM (RFC 5802) with SHA-256 or SHA-512 (RFC 7677), no channel binding.

    :param mechanism: ``"SCRAM-SHA-256"`` or ``"SCRAM-SHA-512"``.
    :param extensions: client-first extensions, e.g. ``{"tokenauth": "true"}`` to log in with a
        delegation token (KIP-84; then ``username`` is the token id and ``password`` its HMAC).
    :param nonce: the client nonce; random unless given (tests pin it).
    :param max_iterations: refuse a server asking for more PBKDF2 iterations than this.
    """

    def __init__(
        self,
        mechanism: str,
        username: str,
        password: str,
        *,
        extensions: Mapping[str, str] | None = None,
        nonce: str | None = None,
        max_iterations: int = MAX_ITERATIONS,
    ) -> None:
        hash_name = _SCRAM_HASHES.get(mechanism)
        if hash_name is None:
            raise ConfigError("sasl.mechanism", f"{mechanism!r} is not a SCRAM mechanism")
        _check_username(username)
        if not password:
            raise ConfigError("sasl.password", "must not be empty")
        if nonce is None:
            # 24 random bytes as URL-safe base64: printable and never ','.
            nonce = secrets.token_urlsafe(24)
        elif not _PRINTABLE.fullmatch(nonce):
            raise ConfigError("nonce", "must be printable ASCII without ','")
        if max_iterations < MIN_ITERATIONS:
            raise ConfigError("max_iterations", f"must be at least {MIN_ITERATIONS}")
        super().__init__(mechanism, username)
        self._hash_name = hash_name
        self._password: str | None = password
        self._client_nonce = nonce
        self._extensions = self._check_extensions(extensions or {})
        self._max_iterations = max_iterations
        self._state = _ScramState.INITIAL
        self._client_first_bare = ""
        # All that is kept past the client-final message: what the server must answer with.
        self._expected_server_signature: bytes | None = None

    @staticmethod
    def _check_extensions(extensions: Mapping[str, str]) -> dict[str, str]:
        for key, value in extensions.items():
            if not _EXTENSION_NAME.fullmatch(key) or key in _SCRAM_ATTRIBUTES:
                raise ConfigError("sasl.extensions", f"invalid SCRAM extension name {key!r}")
            if not value or "," in value or "\0" in value:
                raise ConfigError(
                    "sasl.extensions", f"extension {key!r}: value must be non-empty, no ',' or NUL"
                )
        return dict(extensions)

    def initial_response(self) -> bytes:
        if self._state is not _ScramState.INITIAL:
            raise IllegalSaslStateError(
                f"{self.name}: initial_response() called in state {self._state.value}"
            )
        parts = [f"n={_sasl_name(self._username)}", f"r={self._client_nonce}"]
        parts.extend(f"{key}={value}" for key, value in self._extensions.items())
        self._client_first_bare = ",".join(parts)
        self._state = _ScramState.AWAIT_SERVER_FIRST
        return (_GS2_HEADER + self._client_first_bare).encode()

    def step(self, server_bytes: bytes) -> bytes | None:
        handler: Callable[[bytes], bytes | None]
        if self._state is _ScramState.AWAIT_SERVER_FIRST:
            handler = self._on_server_first
        elif self._state is _ScramState.AWAIT_SERVER_FINAL:
            handler = self._on_server_final
        else:
            raise IllegalSaslStateError(f"{self.name}: step() called in state {self._state.value}")
        try:
            return handler(bytes(server_bytes))
        except SaslAuthenticationFailedError:
            self._state = _ScramState.FAILED
            self._password = None
            self._expected_server_signature = None
            raise

    @property
    def complete(self) -> bool:
        return self._state is _ScramState.COMPLETE

    @property
    def _state_label(self) -> str:
        return self._state.value

    def _failure(self, reason: str) -> SaslAuthenticationFailedError:
        # Only the mechanism, the (non-secret) username and a fixed reason: never the password,
        # and never raw server bytes, which could be anything and arbitrarily long.
        return SaslAuthenticationFailedError(
            f"{self.name} authentication of user {self._username!r} failed: {reason}"
        )

    def _decode(self, server_bytes: bytes, which: str) -> str:
        try:
            return server_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise self._failure(f"{which} message is not valid UTF-8") from None

    def _server_error(self, value: str) -> SaslAuthenticationFailedError:
        if len(value) > _MAX_SERVER_ERROR_CHARS:
            value = value[:_MAX_SERVER_ERROR_CHARS] + "..."
        return self._failure(f"server reported error {value!r}")

    def _on_server_first(self, server_bytes: bytes) -> bytes:
        message = self._decode(server_bytes, "server-first")
        try:
            attrs = _attributes(message)
        except ValueError:
            raise self._failure("malformed server-first message") from None
        if attrs[0][0] == "e":
            # Not in RFC 5802's grammar here, but some servers reject an unknown user this way.
            raise self._server_error(attrs[0][1])
        if any(key == "m" for key, _ in attrs):
            # RFC 5802 5.1: a mandatory extension we cannot know MUST fail authentication.
            raise self._failure("server requires an unsupported mandatory extension (m=)")
        # r, s, i in this order; anything after is an optional extension, ignored (RFC 5802 7).
        if len(attrs) < 3 or [key for key, _ in attrs[:3]] != ["r", "s", "i"]:
            raise self._failure("server-first message must start with r=, s=, i=")
        nonce, salt_b64, iterations_text = (value for _, value in attrs[:3])
        if not _PRINTABLE.fullmatch(nonce) or not nonce.startswith(self._client_nonce):
            raise self._failure("server nonce does not start with the client nonce")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except binascii.Error:
            raise self._failure("server salt is not valid base64") from None
        if not _DIGITS.fullmatch(iterations_text):
            raise self._failure("server iteration count is not a number")
        iterations = int(iterations_text)
        if iterations < MIN_ITERATIONS:
            raise self._failure(
                f"server iteration count {iterations} is below the minimum {MIN_ITERATIONS}"
            )
        if iterations > self._max_iterations:
            raise self._failure(
                f"server iteration count {iterations} is above the maximum {self._max_iterations}"
            )
        if self._password is None:  # unreachable by the state machine; keeps mypy honest
            raise IllegalSaslStateError(f"{self.name}: password already discarded")

        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._client_first_bare},{message},{without_proof}".encode()
        # No SASLprep on the password: Kafka salts its plain UTF-8 bytes (see module docstring).
        salted = hashlib.pbkdf2_hmac(self._hash_name, self._password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self._hash_name)
        stored_key = hashlib.new(self._hash_name, client_key).digest()
        client_signature = hmac.digest(stored_key, auth_message, self._hash_name)
        proof = _xor(client_key, client_signature)
        server_key = hmac.digest(salted, b"Server Key", self._hash_name)
        self._expected_server_signature = hmac.digest(server_key, auth_message, self._hash_name)
        self._password = None
        self._state = _ScramState.AWAIT_SERVER_FINAL
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _on_server_final(self, server_bytes: bytes) -> None:
        message = self._decode(server_bytes, "server-final")
        try:
            attrs = _attributes(message)
        except ValueError:
            raise self._failure("malformed server-final message") from None
        key, value = attrs[0]  # later attributes are extensions, ignored (RFC 5802 7)
        if key == "e":
            raise self._server_error(value)
        if key != "v":
            raise self._failure("server-final message has neither v= nor e=")
        try:
            signature = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise self._failure("server signature is not valid base64") from None
        expected = self._expected_server_signature
        self._expected_server_signature = None
        # Constant time, so response timing says nothing about how much of a forgery matched.
        if expected is None or not hmac.compare_digest(signature, expected):
            raise self._failure("invalid server signature (the server does not know the password)")
        self._state = _ScramState.COMPLETE
        return None


# RFC 7628 section 3.1 (as Kafka checks them): extension keys are letters; values printable
# ASCII, space and the three whitespace controls; "auth" is the token's own key.
_OAUTH_KEY = re.compile(r"[A-Za-z]+")
_OAUTH_VALUE = re.compile(r"[\x21-\x7e \t\r\n]+")
# Kafka's broker reads the token as [-_.a-zA-Z0-9]+ (a JWS in compact form fits).
_OAUTH_TOKEN = re.compile(r"[-_.a-zA-Z0-9]+")
_KVSEP = "\x01"


def check_oauth_extensions(extensions: Mapping[str, str], key: str) -> dict[str, str]:
    """``extensions`` as RFC 7628 allows them; ConfigError naming ``key`` (the setting they
    came from) for a bad name or value."""
    checked: dict[str, str] = {}
    for name, value in extensions.items():
        if not isinstance(name, str) or not _OAUTH_KEY.fullmatch(name) or name == "auth":
            raise ConfigError(
                key, f"SASL extension name {name!r} is invalid (letters only, not auth)"
            )
        if not isinstance(value, str) or not _OAUTH_VALUE.fullmatch(value):
            raise ConfigError(
                key, f"SASL extension {name!r}: its value must be printable ASCII (RFC 7628)"
            )
        checked[name] = value
    return checked


def check_token(token: object, source: str) -> None:
    """SaslAuthenticationFailedError unless ``token`` is a string a broker reads as a bearer
    token (``source`` names where it came from). The token is never in the message."""
    if not isinstance(token, str) or not _OAUTH_TOKEN.fullmatch(token):
        where = f" from {source}" if source else ""
        kind = "not a string" if not isinstance(token, str) else "empty or has other characters"
        raise SaslAuthenticationFailedError(
            f"OAUTHBEARER: the token{where} is {kind}: a bearer token is letters, digits and "
            "- _ . (a JWS in compact form)"
        )


class OAuthBearerMechanism(SaslMechanism):
    """SASL OAUTHBEARER (RFC 7628) as Kafka's brokers take it (KIP-255, extensions KIP-342):
    one message, ``n,,<SOH>auth=Bearer <token><SOH>[key=value<SOH>...]<SOH>``.

    A broker that rejects the token answers with a JSON error (RFC 7628 section 3.2.2) instead of
    failing at once; the client must then send a single SOH, after which the broker fails the
    exchange. :meth:`step` does that, and keeps the broker's JSON in :attr:`server_error`.

    :param principal: for logs and ``repr`` only (the broker takes it from the token)."""

    def __init__(
        self,
        token: str,
        extensions: Mapping[str, str] | None = None,
        *,
        principal: str = "",
    ) -> None:
        check_token(token, "")
        super().__init__("OAUTHBEARER", principal)
        self._token: str | None = token
        self._extensions = check_oauth_extensions(extensions or {}, "sasl.oauthbearer.extensions")
        self._state = "initial"
        self.server_error: str | None = None

    def initial_response(self) -> bytes:
        if self._state != "initial" or self._token is None:
            raise IllegalSaslStateError("OAUTHBEARER: initial_response() may only be called once")
        extensions = "".join(f"{_KVSEP}{k}={v}" for k, v in self._extensions.items())
        message = f"n,,{_KVSEP}auth=Bearer {self._token}{extensions}{_KVSEP}{_KVSEP}".encode()
        self._token = None  # a credential: not kept once sent
        self._state = "sent"
        return message

    def step(self, server_bytes: bytes) -> bytes | None:
        if self._state == "initial":
            raise IllegalSaslStateError("OAUTHBEARER: step() called before initial_response()")
        if self._state != "sent":
            raise IllegalSaslStateError("OAUTHBEARER: step() called after the exchange ended")
        if not server_bytes:  # success: nothing more to say
            self._state = "complete"
            return None
        # The broker's error: acknowledge it (RFC 7628: a lone %x01), and it fails the login.
        self.server_error = server_bytes[:_MAX_SERVER_ERROR_CHARS].decode("utf-8", "replace")
        self._state = "failed"
        return _KVSEP.encode()

    @property
    def complete(self) -> bool:
        # Not once sent: a broker that rejects the token answers without an error code (its
        # JSON error as the challenge), and only step() can tell the two answers apart.
        return self._state == "complete"

    @property
    def _state_label(self) -> str:
        return self._state


def create_mechanism(
    mechanism: str,
    username: str,
    password: str,
    *,
    extensions: Mapping[str, str] | None = None,
) -> SaslMechanism:
    """A fresh client for ``mechanism`` (one of :data:`PASSWORD_MECHANISMS`, any case; an
    OAUTHBEARER client is an :class:`OAuthBearerMechanism` made from a token).

    ``extensions`` are SCRAM client-first extensions (e.g. ``{"tokenauth": "true"}``); PLAIN has
    none. Raises :class:`~kcore.errors.ConfigError` for an unknown mechanism or a bad value."""
    canonical = mechanism.upper()
    if canonical not in PASSWORD_MECHANISMS:
        supported = ", ".join(PASSWORD_MECHANISMS)
        raise ConfigError(
            "sasl.mechanism", f"unsupported SASL mechanism {mechanism!r}; supported: {supported}"
        )
    if canonical == "PLAIN":
        if extensions:
            raise ConfigError("sasl.extensions", "PLAIN does not support extensions")
        return PlainMechanism(username, password)
    return ScramMechanism(canonical, username, password, extensions=extensions)
