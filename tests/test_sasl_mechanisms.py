"""kcore.network.sasl: the sans-IO SASL PLAIN and SCRAM clients.

Checked against the RFC test vectors (RFC 7677 for SHA-256, RFC 5802 for SHA-1) and against a
minimal SCRAM server written here from RFC 5802 section 3, which stores only StoredKey and
ServerKey the way a broker does. No broker needed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcore.errors import ConfigError, IllegalSaslStateError, SaslAuthenticationFailedError
from kcore.network.sasl import (
    MIN_ITERATIONS,
    PASSWORD_MECHANISMS,
    SUPPORTED_MECHANISMS,
    PlainMechanism,
    SaslMechanism,
    ScramMechanism,
    create_mechanism,
)

PASSWORD = "Tr0ub4dor&3-correct-horse"


# -- a tiny SCRAM server, from RFC 5802 ---------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unescape_saslname(name: str) -> str:
    # RFC 5802 5.1: '=' must be followed by 2C or 3D.
    assert re.fullmatch(r"(?:[^=,]|=2C|=3D)+", name), name
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """The broker's half of one exchange, for a single user."""

    def __init__(
        self,
        hash_name: str,
        username: str,
        password: str,
        *,
        salt: bytes = b"kcore-test-salt!",
        iterations: int = 4096,
        server_nonce: str = "srv%Nonce)x$0",
        server_first_suffix: str = "",
    ) -> None:
        self.hash_name = hash_name
        self.username = username
        self.salt = salt
        self.iterations = iterations
        self.server_nonce = server_nonce
        self.server_first_suffix = server_first_suffix
        # What a broker stores: never the password or SaltedPassword itself.
        salted = hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        self.stored_key = hashlib.new(hash_name, client_key).digest()
        self.server_key = hmac.digest(salted, b"Server Key", hash_name)
        self.extensions: dict[str, str] = {}
        self.seen_username = ""

    def client_first(self, message: bytes) -> bytes:
        text = message.decode("utf-8")
        assert text.startswith("n,,"), text  # no channel binding, no authzid
        self.client_first_bare = text[3:]
        attrs = self.client_first_bare.split(",")
        assert attrs[0].startswith("n=") and attrs[1].startswith("r="), text
        self.seen_username = _unescape_saslname(attrs[0][2:])
        self.extensions = dict(attr.split("=", 1) for attr in attrs[2:])
        self.nonce = attrs[1][2:] + self.server_nonce
        self.server_first = (
            f"r={self.nonce},s={_b64(self.salt)},i={self.iterations}{self.server_first_suffix}"
        )
        return self.server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        text = message.decode("utf-8")
        without_proof, _, proof = text.rpartition(",p=")
        assert without_proof == f"c=biws,r={self.nonce}", text
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        client_signature = hmac.digest(self.stored_key, auth_message, self.hash_name)
        client_key = bytes(
            a ^ b for a, b in zip(base64.b64decode(proof), client_signature, strict=True)
        )
        if self.seen_username != self.username:
            return b"e=unknown-user"
        if not hmac.compare_digest(
            hashlib.new(self.hash_name, client_key).digest(), self.stored_key
        ):
            return b"e=invalid-proof"
        return f"v={_b64(hmac.digest(self.server_key, auth_message, self.hash_name))}".encode()


def run_exchange(mech: SaslMechanism, server: ScramServer) -> list[bytes]:
    """The I/O layer's loop from the module docstring, with ``server`` as the broker."""
    replies = iter([server.client_first, server.client_final])
    sent = []
    token: bytes | None = mech.initial_response()
    while token is not None:
        sent.append(token)
        server_bytes = next(replies)(token)
        token = None if mech.complete else mech.step(server_bytes)
    return sent


def to_server_final(mech: ScramMechanism, server: ScramServer) -> bytes:
    """Run the exchange up to (not including) the client's handling of server-final; returns
    the genuine server-final message."""
    first = server.client_first(mech.initial_response())
    final = mech.step(first)
    assert final is not None
    return server.client_final(final)


def sha256_mech(username: str = "user", password: str = PASSWORD, **kwargs) -> ScramMechanism:
    return ScramMechanism("SCRAM-SHA-256", username, password, nonce="cLiEnTnOnCe", **kwargs)


# -- RFC test vectors ---------------------------------------------------------------------------


def test_rfc7677_scram_sha256_vector():
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert mech.name == "SCRAM-SHA-256"
    assert mech.initial_response() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert not mech.complete
    client_final = mech.step(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client_final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert not mech.complete
    assert mech.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert mech.complete


def test_rfc5802_scram_sha1_vector():
    # SHA-1 is internal only (Kafka has no SCRAM-SHA-1); the vector checks the shared code path.
    mech = ScramMechanism("SCRAM-SHA-1", "user", "pencil", nonce="fyko+d2lbbFgONRv9qkxdawL")
    assert mech.initial_response() == b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
    client_final = mech.step(
        b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
    )
    assert client_final == (
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    )
    assert mech.step(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=") is None
    assert mech.complete


def test_the_test_server_reproduces_the_rfc7677_vector():
    # Pins the in-test server to the RFC too, so round trips against it mean something.
    server = ScramServer(
        "sha256",
        "user",
        "pencil",
        salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
        server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    mech = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    sent = run_exchange(mech, server)
    assert sent[1].endswith(b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert mech.complete


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mechanism", "hash_name"), [("SCRAM-SHA-512", "sha512"), ("SCRAM-SHA-256", "sha256")]
)
def test_round_trip(mechanism, hash_name):
    server = ScramServer(hash_name, "alice", PASSWORD, iterations=8192)
    mech = create_mechanism(mechanism, "alice", PASSWORD)
    assert isinstance(mech, ScramMechanism)
    assert mech.name == mechanism
    sent = run_exchange(mech, server)
    assert len(sent) == 2
    assert mech.complete
    assert server.seen_username == "alice"
    assert PASSWORD.encode() not in b"".join(sent)


def test_wrong_password_is_reported_by_the_server():
    server = ScramServer("sha512", "alice", "the-real-one")
    mech = create_mechanism("SCRAM-SHA-512", "alice", PASSWORD)
    with pytest.raises(SaslAuthenticationFailedError, match="invalid-proof"):
        run_exchange(mech, server)
    assert not mech.complete


def test_server_first_extensions_are_ignored_but_signed():
    # RFC 5802 7: unknown extensions MUST be ignored; AuthMessage covers the message as received.
    server = ScramServer("sha256", "user", PASSWORD, server_first_suffix=",x=ext,foo=bar")
    mech = sha256_mech()
    run_exchange(mech, server)
    assert mech.complete


def test_client_extensions_for_delegation_tokens():
    server = ScramServer("sha256", "token-id", "token-hmac")
    mech = create_mechanism(
        "SCRAM-SHA-256", "token-id", "token-hmac", extensions={"tokenauth": "true"}
    )
    first = mech.initial_response()
    assert re.fullmatch(rb"n,,n=token-id,r=[^,]+,tokenauth=true", first)
    final = mech.step(server.client_first(first))
    assert final is not None
    assert mech.step(server.client_final(final)) is None
    assert server.extensions == {"tokenauth": "true"}
    assert mech.complete


@settings(max_examples=25, deadline=None)
@given(
    # Text that encodes (a lone surrogate does not: the config refuses it, see below).
    username=st.text(
        st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=20,
    ),
    password=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
)
def test_round_trip_any_credentials(username, password):
    server = ScramServer("sha256", username, password)
    mech = ScramMechanism("SCRAM-SHA-256", username, password)
    run_exchange(mech, server)
    assert mech.complete
    assert server.seen_username == username


@pytest.mark.parametrize("key", ["sasl.username", "sasl.password"])
def test_credentials_that_do_not_encode_are_config_errors(key):
    import kcore
    from kcore.errors import ConfigError

    config = {
        "bootstrap.servers": "127.0.0.1:1",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "user",
        "sasl.password": "secret",
        key: "a\ud800b",
    }
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
        kcore.Producer(config)
    assert "\ud800" not in str(info.value)


# -- usernames and passwords on the wire --------------------------------------------------------


@pytest.mark.parametrize(
    ("username", "saslname"),
    [
        ("plain", "plain"),
        ("a,b", "a=2Cb"),
        ("a=b", "a=3Db"),
        ("=2C", "=3D2C"),  # '=' is escaped first, so an escape-looking name survives
        (",=,", "=2C=3D=2C"),
        ("用户", "用户"),
    ],
)
def test_username_escaping(username, saslname):
    mech = ScramMechanism("SCRAM-SHA-256", username, PASSWORD, nonce="abc")
    assert mech.initial_response() == f"n,,n={saslname},r=abc".encode()
    server = ScramServer("sha256", username, PASSWORD)
    run_exchange(ScramMechanism("SCRAM-SHA-256", username, PASSWORD), server)
    assert server.seen_username == username


def test_no_saslprep_matching_kafka():
    # Kafka's Java client salts the password's raw UTF-8 bytes and sends the username as given;
    # normalizing (NFKC would turn U+2168 into "IX", U+FB01 into "fi") would break logins.
    username, password = "\ufb01le", "pass\u2168word"
    mech = ScramMechanism("SCRAM-SHA-256", username, password, nonce="n0nce")
    assert mech.initial_response() == "n,,n=\ufb01le,r=n0nce".encode()
    run_exchange(
        ScramMechanism("SCRAM-SHA-256", username, password),
        ScramServer("sha256", username, password),
    )
    normalized = ScramServer("sha256", username, "passIXword")
    with pytest.raises(SaslAuthenticationFailedError):
        run_exchange(ScramMechanism("SCRAM-SHA-256", username, password), normalized)


def test_generated_nonce_is_printable_and_fresh():
    nonces = set()
    for _ in range(20):
        first = ScramMechanism("SCRAM-SHA-256", "u", "p").initial_response().decode()
        nonce = first.split(",r=", 1)[1]
        assert re.fullmatch(r"[\x21-\x2b\x2d-\x7e]{24,}", nonce)
        nonces.add(nonce)
    assert len(nonces) == 20


# -- bad server messages ------------------------------------------------------------------------


def _server_first(nonce: str = "cLiEnTnOnCeSRV", salt: str = "c2FsdA==", i: str = "4096") -> bytes:
    return f"r={nonce},s={salt},i={i}".encode()


@pytest.mark.parametrize(
    ("server_first", "match"),
    [
        (_server_first(nonce="someoneElsesNonce"), "nonce"),
        (_server_first(nonce="cLiEnT"), "nonce"),  # a prefix of ours is not ours
        (_server_first(i="4095"), "below the minimum 4096"),
        (_server_first(i="0"), "below the minimum"),
        (_server_first(i="-4096"), "not a number"),
        (_server_first(i="4096.0"), "not a number"),
        (_server_first(i="\u0664\u0660\u0669\u0666"), "not a number"),  # Arabic-Indic digits
        (_server_first(i="99999999999999999999"), "not a number"),
        (_server_first(i="2000000000"), "above the maximum"),
        (_server_first(salt="not base64!"), "salt"),
        (_server_first(salt="c2FsdA="), "salt"),
        (b"m=must-understand," + _server_first(), "mandatory extension"),
        (_server_first() + b",m=late", "mandatory extension"),
        (b"e=unknown-user", "unknown-user"),
        (b"s=c2FsdA==,r=cLiEnTnOnCeSRV,i=4096", "must start with r=, s=, i="),
        (b"r=cLiEnTnOnCeSRV,s=c2FsdA==", "must start with r=, s=, i="),
        (b"", "malformed"),
        (b"garbage", "malformed"),
        (_server_first() + b",", "malformed"),
        (b"r=cLiEnTnOnCe\xff,s=c2FsdA==,i=4096", "UTF-8"),
    ],
)
def test_bad_server_first_fails(server_first, match):
    mech = sha256_mech()
    mech.initial_response()
    with pytest.raises(SaslAuthenticationFailedError, match=match) as info:
        mech.step(server_first)
    assert "SCRAM-SHA-256" in str(info.value)
    assert not mech.complete
    with pytest.raises(IllegalSaslStateError):  # a failed exchange stays failed
        mech.step(server_first)


def test_max_iterations_is_configurable():
    mech = sha256_mech(max_iterations=5000)
    mech.initial_response()
    with pytest.raises(SaslAuthenticationFailedError, match="above the maximum 5000"):
        mech.step(_server_first(i="5001"))
    with pytest.raises(ConfigError):
        sha256_mech(max_iterations=MIN_ITERATIONS - 1)


def _tamper(server_final: bytes) -> bytes:
    signature = bytearray(base64.b64decode(server_final[2:]))
    signature[-1] ^= 1
    return b"v=" + base64.b64encode(bytes(signature))


@pytest.mark.parametrize(
    ("rewrite", "match"),
    [
        (_tamper, "invalid server signature"),
        (lambda final: final[:-8] + b"AAAAAAA=", "invalid server signature"),
        (lambda final: final[: len(final) // 2], "signature"),  # truncated
        (lambda final: b"v=", "invalid server signature"),
        (lambda final: b"v=***", "not valid base64"),
        (lambda final: b"e=other-error", "server reported error 'other-error'"),
        (lambda final: b"x=" + final[2:], "neither v= nor e="),
        (lambda final: b"", "malformed"),
        (lambda final: b"\xc3\x28", "UTF-8"),
    ],
)
def test_bad_server_final_fails(rewrite, match):
    server = ScramServer("sha512", "alice", PASSWORD)
    mech = ScramMechanism("SCRAM-SHA-512", "alice", PASSWORD)
    server_final = to_server_final(mech, server)
    with pytest.raises(SaslAuthenticationFailedError, match=match):
        mech.step(rewrite(server_final))
    assert not mech.complete
    with pytest.raises(IllegalSaslStateError):  # not even the genuine message helps now
        mech.step(server_final)


def test_server_final_extensions_are_ignored():
    server = ScramServer("sha256", "user", PASSWORD)
    mech = sha256_mech()
    assert mech.step(to_server_final(mech, server) + b",x=whatever") is None
    assert mech.complete


def test_long_server_error_is_truncated():
    server = ScramServer("sha256", "user", PASSWORD)
    mech = sha256_mech()
    to_server_final(mech, server)
    with pytest.raises(SaslAuthenticationFailedError) as info:
        mech.step(b"e=" + b"x" * 10_000)
    assert len(str(info.value)) < 400


# -- state misuse -------------------------------------------------------------------------------


def test_scram_state_misuse():
    mech = sha256_mech()
    with pytest.raises(IllegalSaslStateError, match="step"):
        mech.step(b"r=x,s=c2FsdA==,i=4096")
    first = mech.initial_response()
    with pytest.raises(IllegalSaslStateError, match="initial_response"):
        mech.initial_response()
    server = ScramServer("sha256", "user", PASSWORD)
    final = mech.step(server.client_first(first))
    assert final is not None
    assert mech.step(server.client_final(final)) is None
    with pytest.raises(IllegalSaslStateError):
        mech.step(b"v=AAAA")
    with pytest.raises(IllegalSaslStateError):
        mech.initial_response()
    assert mech.complete


def test_plain():
    mech = create_mechanism("PLAIN", "alice", "s3cret \u00e9")
    assert isinstance(mech, PlainMechanism)
    assert mech.name == "PLAIN"
    assert not mech.complete
    assert mech.initial_response() == b"\0alice\0s3cret \xc3\xa9"
    assert mech.complete
    with pytest.raises(IllegalSaslStateError):
        mech.initial_response()
    with pytest.raises(IllegalSaslStateError):
        mech.step(b"")


def test_plain_step_before_initial_response():
    with pytest.raises(IllegalSaslStateError, match="before"):
        PlainMechanism("alice", "pw").step(b"")


# -- configuration ------------------------------------------------------------------------------


def test_supported_mechanisms():
    assert SUPPORTED_MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    assert PASSWORD_MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    for name in PASSWORD_MECHANISMS:
        mech = create_mechanism(name.lower(), "u", "p")  # SASL names are case-insensitive
        assert mech.name == name
        assert mech.username == "u"


# OAUTHBEARER is made from a token (OAuthBearerMechanism), not from a username and password.
@pytest.mark.parametrize("name", ["GSSAPI", "OAUTHBEARER", "SCRAM-SHA-1", "SCRAM-SHA-384", ""])
def test_unknown_mechanism(name):
    with pytest.raises(ConfigError) as info:
        create_mechanism(name, "u", "p")
    assert info.value.key == "sasl.mechanism"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"username": ""}, "sasl.username"),
        ({"username": "a\0b"}, "sasl.username"),
        ({"password": ""}, "sasl.password"),
        ({"extensions": {"r": "x"}}, "sasl.extensions"),  # would shadow the nonce attribute
        ({"extensions": {"token-auth": "x"}}, "sasl.extensions"),
        ({"extensions": {"tokenauth": ""}}, "sasl.extensions"),
        ({"extensions": {"tokenauth": "a,b"}}, "sasl.extensions"),
    ],
)
def test_bad_scram_config(kwargs, key):
    args = {"username": "u", "password": PASSWORD, **kwargs}
    with pytest.raises(ConfigError) as info:
        create_mechanism("SCRAM-SHA-256", **args)
    assert info.value.key == key
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize(
    ("username", "password", "key"),
    [("", "p", "sasl.username"), ("a\0", "p", "sasl.username"), ("u", "", "sasl.password")],
)
def test_bad_plain_config(username, password, key):
    with pytest.raises(ConfigError) as info:
        create_mechanism("PLAIN", username, password)
    assert info.value.key == key


def test_plain_password_with_nul_is_not_echoed():
    password = "hunter2\0more"
    with pytest.raises(ConfigError) as info:
        create_mechanism("PLAIN", "u", password)
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value)


def test_plain_rejects_extensions():
    with pytest.raises(ConfigError):
        create_mechanism("PLAIN", "u", "p", extensions={"tokenauth": "true"})


def test_bad_nonce():
    with pytest.raises(ConfigError):
        ScramMechanism("SCRAM-SHA-256", "u", "p", nonce="has,comma")
    with pytest.raises(ConfigError):
        ScramMechanism("SCRAM-SHA-256", "u", "p", nonce="")


# -- secrets stay out of errors and reprs -------------------------------------------------------


def _secret_texts(hash_name: str, server: ScramServer, sent: list[bytes]) -> list[str]:
    """The password and everything derived from it that must never be printed."""
    salted = hashlib.pbkdf2_hmac(hash_name, PASSWORD.encode(), server.salt, server.iterations)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    texts = [PASSWORD, salted.hex(), _b64(salted), client_key.hex(), _b64(client_key)]
    texts += [server.stored_key.hex(), _b64(server.stored_key), server.server_key.hex()]
    texts += [_b64(server.server_key)]
    if len(sent) > 1:
        texts.append(sent[1].decode().rpartition(",p=")[2])  # the proof
    return texts


def _all_text(exc: BaseException) -> str:
    parts = []
    seen: BaseException | None = exc
    while seen is not None:  # chained exceptions end up in tracebacks too
        parts += [str(seen), repr(seen), repr(seen.args), repr(vars(seen))]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


@pytest.mark.parametrize(
    "server_final",
    [
        lambda final: _tamper(final),
        lambda final: b"e=invalid-proof",
        lambda final: b"v=%%%",
        lambda final: b"junk",
    ],
)
def test_password_never_in_server_final_errors(server_final):
    server = ScramServer("sha256", "alice", PASSWORD)
    mech = ScramMechanism("SCRAM-SHA-256", "alice", PASSWORD)
    sent = [mech.initial_response()]
    client_final = mech.step(server.client_first(sent[0]))
    assert client_final is not None
    sent.append(client_final)
    genuine = server.client_final(client_final)
    with pytest.raises(SaslAuthenticationFailedError) as info:
        mech.step(server_final(genuine))
    text = _all_text(info.value)
    for secret in _secret_texts("sha256", server, sent):
        assert secret not in text
    assert PASSWORD not in repr(mech)


@pytest.mark.parametrize(
    "server_first",
    [_server_first(nonce="wrong"), _server_first(i="1"), b"\xff", b"m=x," + _server_first()],
)
def test_password_never_in_server_first_errors(server_first):
    mech = sha256_mech()
    mech.initial_response()
    with pytest.raises(SaslAuthenticationFailedError) as info:
        mech.step(server_first)
    assert PASSWORD not in _all_text(info.value)


def test_password_never_in_state_errors_or_repr():
    for mech in (sha256_mech(), PlainMechanism("user", PASSWORD)):
        assert PASSWORD not in repr(mech) and PASSWORD not in str(mech)
        with pytest.raises(IllegalSaslStateError) as info:
            mech.step(b"")
        assert PASSWORD not in _all_text(info.value)
        mech.initial_response()
        with pytest.raises(IllegalSaslStateError) as info:
            mech.initial_response()
        assert PASSWORD not in _all_text(info.value)
        assert PASSWORD not in repr(mech)


def test_secrets_are_dropped_once_used():
    # Belt and braces: after the exchange nothing on the object holds the password.
    server = ScramServer("sha256", "user", PASSWORD)
    mech = sha256_mech()
    run_exchange(mech, server)
    assert PASSWORD not in repr(vars(mech))
    plain = PlainMechanism("user", PASSWORD)
    plain.initial_response()
    assert PASSWORD not in repr(vars(plain))
