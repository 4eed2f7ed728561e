"""SASL/OAUTHBEARER: the mechanism's bytes, each token source (a callback, a token endpoint
with client credentials, a file, unsigned JWTs from Java's or librdkafka's settings), the
refresh schedule, the config, and logins against a real broker, including a rejected token and
tokens refreshed across re-authentications (KIP-368)."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus

import pytest

import kcore
from kcore.admin import NewTopic
from kcore.config import ClientConfig
from kcore.errors import ConfigError, IllegalSaslStateError, SaslAuthenticationFailedError
from kcore.network.connection import BrokerConnection
from kcore.network.oauthbearer import (
    CallbackTokenProvider,
    ClientCredentialsTokenProvider,
    OAuthBearerLogin,
    OAuthBearerToken,
    RefreshPolicy,
    TokenProvider,
    UnsecuredTokenProvider,
    jwt_claims,
    login_from_config,
)
from kcore.network.sasl import OAuthBearerMechanism
from kcore.testing import KafkaCluster
from kcore.testing.security import (
    OAUTHBEARER,
    SASL_PLAINTEXT_LISTENER,
    java_client_properties,
    sasl_listener,
    write_properties,
)

MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
BOOT = {"bootstrap.servers": "127.0.0.1:9092"}
SESSION_MS = 3000


def unsigned_jwt(sub: str = "alice", lifetime_s: float = 3600, **claims) -> str:
    now = time.time()
    body = {"sub": sub, "iat": now, "exp": now + lifetime_s, **claims}

    def b64(obj) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none'})}.{b64(body)}."


def jaas(**options: str) -> str:
    return f"{MODULE} required " + " ".join(f'{k}="{v}"' for k, v in options.items()) + ";"


# -- the mechanism --------------------------------------------------------------------------------


def test_initial_response_is_what_kafka_reads():
    mech = OAuthBearerMechanism("abc.def.", {"traceId": "123", "b": "x y"})
    assert mech.initial_response() == b"n,,\x01auth=Bearer abc.def.\x01traceId=123\x01b=x y\x01\x01"
    assert OAuthBearerMechanism("t").initial_response() == b"n,,\x01auth=Bearer t\x01\x01"


def test_success_and_rejection_answers():
    ok = OAuthBearerMechanism("t")
    ok.initial_response()
    assert not ok.complete  # the broker's answer decides
    assert ok.step(b"") is None and ok.complete
    bad = OAuthBearerMechanism("t")
    bad.initial_response()
    # RFC 7628: a rejection is a JSON challenge; the client acknowledges with one %x01.
    assert bad.step(b'{"status":"invalid_token"}') == b"\x01"
    assert bad.server_error == '{"status":"invalid_token"}' and not bad.complete
    with pytest.raises(IllegalSaslStateError):
        bad.step(b"")
    with pytest.raises(IllegalSaslStateError):
        OAuthBearerMechanism("t").step(b"")


@pytest.mark.parametrize("token", ["", "a b", "tok\x01en", "t=="])
def test_tokens_a_broker_cannot_read_are_refused(token):
    with pytest.raises(SaslAuthenticationFailedError, match="token"):
        OAuthBearerMechanism(token)


@pytest.mark.parametrize("extensions", [{"auth": "x"}, {"a1": "x"}, {"a": ""}, {"a": "\x00"}])
def test_bad_extensions_are_config_errors(extensions):
    with pytest.raises(ConfigError):
        OAuthBearerMechanism("t", extensions)


def test_repr_never_shows_the_token():
    mech = OAuthBearerMechanism("secret-token", principal="alice")
    assert "secret-token" not in repr(mech) and "alice" in repr(mech)
    token = OAuthBearerToken("secret-token", 1.0)
    assert "secret-token" not in repr(token)


# -- token sources --------------------------------------------------------------------------------


def test_unsecured_token_as_javas():
    provider = UnsecuredTokenProvider(
        {
            "unsecuredLoginStringClaim_sub": "alice",
            "unsecuredLoginListClaim_scope": "|read|write",
            "unsecuredLoginNumberClaim_level": "3",
            "unsecuredLoginLifetimeSeconds": "60",
            "unsecuredLoginExtension_traceId": "42",
        },
        clock=lambda: 1000.0,
    )
    token = provider.fetch()
    header = token.value.split(".")[0]
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"}
    assert token.value.endswith(".")  # no signature
    assert jwt_claims(token.value) == {
        "exp": 1060.0,
        "iat": 1000.0,
        "sub": "alice",
        "scope": ["read", "write"],
        "level": 3,
    }
    assert (token.principal, token.expires_at, dict(token.extensions)) == (
        "alice",
        1060.0,
        {"traceId": "42"},
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "unsecuredLoginStringClaim_sub"),
        ({"unsecuredLoginStringClaim_sub": "a", "unsecuredLoginNumberClaim_exp": "1"}, "exp"),
        ({"unsecuredLoginStringClaim_sub": "a", "unsecuredLoginLifetimeSeconds": "x"}, "whole"),
        ({"unsecuredLoginStringClaim_sub": "a", "unsecuredLoginExtension_auth": "x"}, "auth"),
        (
            {"unsecuredLoginPrincipalClaimName": "user", "unsecuredLoginStringClaim_sub": "a"},
            "user",
        ),
    ],
)
def test_unsecured_options_that_cannot_make_a_token(options, match):
    with pytest.raises(ConfigError, match=match):
        UnsecuredTokenProvider(options)


def test_callback_as_confluent_kafka_calls_it():
    calls = []

    def oauth_cb(config):
        calls.append(config)
        return "tok", 2000.5, "alice", {"traceId": "1"}

    token = CallbackTokenProvider(oauth_cb, "anything").fetch()
    assert calls == ["anything"]
    assert (token.value, token.expires_at, token.principal) == ("tok", 2000.5, "alice")
    assert dict(token.extensions) == {"traceId": "1"}
    assert CallbackTokenProvider(lambda c: ("tok", 5), None).fetch().principal == ""


@pytest.mark.parametrize(
    ("result", "match"),
    [
        ("tok", "must return"),
        (("tok",), "must return"),
        (("tok", "soon"), "expiry"),
        (("tok", 5, "p", ["x"]), "extensions"),
    ],
)
def test_callback_results_that_are_not_tokens(result, match):
    with pytest.raises(SaslAuthenticationFailedError, match=match):
        CallbackTokenProvider(lambda c: result, None).fetch()


def test_callback_exception_names_the_callback():
    def oauth_cb(config):
        raise RuntimeError("identity provider down")

    with pytest.raises(SaslAuthenticationFailedError, match="oauth_cb raised RuntimeError"):
        CallbackTokenProvider(oauth_cb, None).fetch()


class TokenEndpoint:
    """A local OAuth 2 token endpoint: client credentials in, an unsigned JWT out (which the
    test broker's unsecured validator takes). ``fail`` answers the next requests with errors."""

    def __init__(self, client_id: str = "svc client", secret: str = "s3cr:et", lifetime_s=3600):
        self.requests: list[dict] = []
        self.fail: list[int] = []
        self.encoded = False  # the client form-encodes id and secret (header_urlencode)
        self.redirect = False
        self.lifetime_s = lifetime_s
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                auth = base64.b64decode(self.headers["Authorization"].split()[1]).decode()
                user, _, password = auth.partition(":")
                if endpoint.encoded:
                    user, password = unquote_plus(user), unquote_plus(password)
                endpoint.requests.append(
                    {"form": parse_qs(body), "id": user, "secret": password, "raw": auth}
                )
                if endpoint.redirect:
                    self.send_response(302)
                    self.send_header("Location", "http://elsewhere.example/token")
                    self.end_headers()
                    return
                if endpoint.fail:
                    self.send_response(endpoint.fail.pop(0))
                    self.end_headers()
                    self.wfile.write(b'{"error":"try_later"}')
                    return
                if (unquote_plus(user), unquote_plus(password)) != (client_id, secret):
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b'{"error":"invalid_client"}')
                    return
                answer = {
                    "access_token": unsigned_jwt("svc", endpoint.lifetime_s),
                    "token_type": "Bearer",
                    "expires_in": endpoint.lifetime_s,
                }
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(answer).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = TokenEndpoint()
    yield e
    e.close()


def test_client_credentials(endpoint):
    provider = ClientCredentialsTokenProvider(endpoint.url, "svc client", "s3cr:et", "kafka")
    token = provider.fetch()
    assert token.principal == "svc" and jwt_claims(token.value)["sub"] == "svc"
    # As Java by default (sasl.oauthbearer.header.urlencode=false): Basic of id:secret as
    # given; the form asks for the scope.
    (request,) = endpoint.requests
    assert request["form"] == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
    assert request["raw"] == "svc client:s3cr:et"


def test_client_credentials_form_encoded(endpoint):
    endpoint.encoded = True
    provider = ClientCredentialsTokenProvider(
        endpoint.url, "svc client", "s3cr:et", header_urlencode=True
    )
    assert provider.fetch().principal == "svc"
    (request,) = endpoint.requests
    assert request["raw"] == "svc+client:s3cr%3Aet"  # RFC 6749 2.3.1, as Java's URLEncoder
    assert (request["id"], request["secret"]) == ("svc client", "s3cr:et")


def test_redirects_are_not_followed(endpoint):
    endpoint.redirect = True
    provider = ClientCredentialsTokenProvider(endpoint.url, "svc client", "s3cr:et")
    with pytest.raises(SaslAuthenticationFailedError, match="redirects are not followed") as info:
        provider.fetch()
    assert "s3cr" not in str(info.value) and len(endpoint.requests) == 1


def test_token_endpoint_errors_are_retried_until_they_pass(endpoint):
    endpoint.fail = [500, 503, 429, 408]
    provider = ClientCredentialsTokenProvider(
        endpoint.url, "svc client", "s3cr:et", retry_backoff_s=0.01, retry_backoff_max_s=5
    )
    assert provider.fetch().principal == "svc"
    assert len(endpoint.requests) == 5


@pytest.mark.parametrize("status", [400, 403, 415, 501])
def test_token_endpoint_errors_java_does_not_retry(endpoint, status):
    endpoint.fail = [status]
    provider = ClientCredentialsTokenProvider(endpoint.url, "svc client", "s3cr:et")
    with pytest.raises(SaslAuthenticationFailedError, match=f"HTTP {status}"):
        provider.fetch()
    assert len(endpoint.requests) == 1


def test_wrong_client_secret_fails_at_once(endpoint):
    provider = ClientCredentialsTokenProvider(endpoint.url, "svc client", "wrong")
    with pytest.raises(SaslAuthenticationFailedError) as info:
        provider.fetch()
    assert "HTTP 401" in str(info.value) and "wrong" not in str(info.value)
    assert len(endpoint.requests) == 1


def test_unreachable_token_endpoint_gives_up_after_the_backoff_max():
    provider = ClientCredentialsTokenProvider(
        "http://127.0.0.1:9/token", "id", "secret", retry_backoff_s=0.01, retry_backoff_max_s=0.2
    )
    t0 = time.monotonic()
    with pytest.raises(SaslAuthenticationFailedError, match="no token from the token endpoint"):
        provider.fetch()
    assert time.monotonic() - t0 < 5


def test_token_file(tmp_path):
    path = tmp_path / "token.jwt"
    path.write_text(unsigned_jwt("from-file") + "\n")
    provider = ClientCredentialsTokenProvider(path.as_uri())
    assert provider.fetch().principal == "from-file"
    path.write_text("not-a-jwt")
    with pytest.raises(SaslAuthenticationFailedError, match="not a JWT"):
        provider.fetch()
    missing = ClientCredentialsTokenProvider((tmp_path / "none").as_uri())
    with pytest.raises(SaslAuthenticationFailedError, match="cannot read the token"):
        missing.fetch()


def test_fetched_token_needs_exp_and_principal(tmp_path):
    path = tmp_path / "token.jwt"
    path.write_text(unsigned_jwt("x", exp="soon"))
    with pytest.raises(SaslAuthenticationFailedError, match="exp"):
        ClientCredentialsTokenProvider(path.as_uri()).fetch()
    path.write_text(unsigned_jwt(""))
    with pytest.raises(SaslAuthenticationFailedError, match="'sub' claim"):
        ClientCredentialsTokenProvider(path.as_uri()).fetch()


# -- refresh --------------------------------------------------------------------------------------


def test_refresh_point_as_javas():
    policy = RefreshPolicy()  # 0.8 (+ up to 0.05), at least 60 s from now, 300 s before expiry
    hour = OAuthBearerToken("t", expires_at=3600.0, issued_at=0.0)
    assert policy.refresh_at(0.0, hour, 0.0) == 2880.0
    assert policy.refresh_at(0.0, hour, 1.0) == pytest.approx(3060.0)
    # A 10-minute token: 0.8 would leave 120 s, under the 300 s buffer.
    ten = OAuthBearerToken("t", expires_at=600.0, issued_at=0.0)
    assert policy.refresh_at(0.0, ten, 0.0) == 300.0
    # Tokens too short for both buffers: the window factor of what is left (Java's rule).
    for life in (300.0, 90.0, 10.0):
        short = OAuthBearerToken("t", expires_at=life, issued_at=0.0)
        assert policy.refresh_at(0.0, short, 0.0) == pytest.approx(0.8 * life)
    # The minimum period counts from now: an old token (iat long ago) is not refreshed at once.
    old = OAuthBearerToken("t", expires_at=10_000.0, issued_at=0.0)
    assert policy.refresh_at(9_000.0, old, 0.0) == 9_060.0
    fast = RefreshPolicy(window_factor=0.5, window_jitter=0.0, min_period_s=0, buffer_s=0)
    assert fast.refresh_at(0.0, OAuthBearerToken("t", expires_at=10.0), 0.5) == 5.0


def test_login_fetches_once_then_again_when_due():
    now = [1000.0]
    fetched = []

    class Counting(UnsecuredTokenProvider):
        def fetch(self):
            fetched.append(now[0])
            return super().fetch()

    provider = Counting(
        {"unsecuredLoginStringClaim_sub": "a", "unsecuredLoginLifetimeSeconds": "100"},
        clock=lambda: now[0],
    )
    login = OAuthBearerLogin(
        provider, RefreshPolicy(0.5, 0.0, 0, 0), {"x": "1"}, clock=lambda: now[0]
    )
    assert login.current is None
    first = login.token_blocking()
    assert login.token_blocking() is first and fetched == [1000.0]
    now[0] = 1049.0
    assert login.current is first
    now[0] = 1050.0
    assert login.current is None
    assert login.token_blocking() is not first and fetched == [1000.0, 1050.0]


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (("tok", time.time() - 5), "already expired"),
        ((None, time.time() + 60), "must be a str, not NoneType"),
        (("tok en", time.time() + 60), "from oauth_cb is empty or has other characters"),
        (("tok", time.time() * 1000 + 60_000), "milliseconds"),
        (("tok", time.time() + 60, None, {"auth": "x"}), "extension name"),
    ],
)
def test_login_refuses_tokens_it_cannot_use(result, match):
    login = OAuthBearerLogin(CallbackTokenProvider(lambda c: result, None))
    with pytest.raises(SaslAuthenticationFailedError, match=match) as info:
        login.token_blocking()
    assert "tok en" not in str(info.value)
    assert login.current is None  # nothing kept


class Flaky(UnsecuredTokenProvider):
    """Unsigned tokens of 100 s, but the fetches listed in ``failing`` (1-based) fail."""

    def __init__(self, now: list[float], failing: set[int]) -> None:
        opts = {"unsecuredLoginStringClaim_sub": "a", "unsecuredLoginLifetimeSeconds": "100"}
        super().__init__(opts, clock=lambda: now[0])
        self.calls = 0
        self.failing = failing

    def fetch(self):
        self.calls += 1
        if self.calls in self.failing:
            raise ConnectionError("identity provider unreachable")
        return super().fetch()


def test_a_failed_refresh_keeps_the_valid_token_and_tries_again_later(caplog):
    now = [1000.0]
    provider = Flaky(now, failing={2, 3})
    login = OAuthBearerLogin(provider, RefreshPolicy(0.5, 0.0, 0, 0), clock=lambda: now[0])
    first = login.token_blocking()
    now[0] = 1060.0  # past the refresh point (1050); the refresh fails
    assert login.token_blocking() is first
    assert "refreshing the token failed" in caplog.text and "ConnectionError" in caplog.text
    assert login.token_blocking() is first and provider.calls == 2  # no retry before 10 s
    now[0] = 1070.0
    assert login.token_blocking() is first and provider.calls == 3  # failed again
    now[0] = 1080.0
    second = login.token_blocking()
    assert second is not first and provider.calls == 4


def test_refresh_points_never_pass_the_expiry_nor_lie_behind_now():
    now = [1000.0]
    # A window factor of 1 and the most jitter (1.25 of the life): due at the expiry anyway.
    late = RefreshPolicy(1.0, 0.25, 0, 0)
    login = OAuthBearerLogin(Flaky(now, set()), late, clock=lambda: now[0])
    login.token_blocking()
    now[0] = 1100.0
    assert login.current is None

    # A token issued long ago (a cached one): its refresh point is past at once; as Java,
    # it is moved 10 s ahead instead of making every connection fetch.
    class Cached(TokenProvider):
        source = "a cache"

        def fetch(self):
            return OAuthBearerToken(unsigned_jwt(), expires_at=2000.0, issued_at=0.0)

    login = OAuthBearerLogin(Cached(), RefreshPolicy(0.5, 0.0, 0, 0), clock=lambda: now[0])
    login.token_blocking()  # half its life (0 to 2000) is 1000: before now (1100)
    assert login.current is not None
    now[0] = 1109.0
    assert login.current is not None
    now[0] = 1110.0
    assert login.current is None


@pytest.mark.parametrize("expiry", [float("nan"), float("inf")])
def test_an_expiry_that_is_not_a_time_is_refused(expiry):
    login = OAuthBearerLogin(CallbackTokenProvider(lambda c: ("tok", expiry), None))
    with pytest.raises(SaslAuthenticationFailedError, match="not seconds since the epoch"):
        login.token_blocking()


def test_a_failure_without_a_token_is_shared_then_retried():
    now = [1000.0]
    provider = Flaky(now, failing={1})
    login = OAuthBearerLogin(provider, clock=lambda: now[0], monotonic=lambda: now[0])
    for _ in range(3):  # connections asking at once get the one failure
        with pytest.raises(SaslAuthenticationFailedError, match="ConnectionError"):
            login.token_blocking()
    assert provider.calls == 1
    now[0] = 1001.5
    assert login.token_blocking().principal == "a" and provider.calls == 2


# -- config ---------------------------------------------------------------------------------------


def oauth_config(**extra) -> ClientConfig:
    return ClientConfig(
        {**BOOT, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER", **extra}
    )


def test_each_token_source_from_config(tmp_path):
    cb = oauth_config(oauth_cb=lambda c: ("t", 1))
    assert cb.oauthbearer_settings().source == "callback"
    java = oauth_config(
        **{
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
            "sasl.login.callback.handler.class": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
            ),
            "sasl.jaas.config": jaas(
                clientId="id", clientSecret="hunter2", scope="s", extension_a="1"
            ),
        }
    )
    s = java.oauthbearer_settings()
    assert (s.source, s.url, s.client_id, s.client_secret, s.scope) == (
        "endpoint",
        "https://idp.example/token",
        "id",
        "hunter2",
        "s",
    )
    assert dict(s.extensions) == {"a": "1"}
    assert "hunter2" not in repr(s)
    # librdkafka's names for the same
    rdk = oauth_config(
        **{
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
            "sasl.oauthbearer.client.id": "id2",
            "sasl.oauthbearer.client.secret": "sec2",
            "sasl.oauthbearer.extensions": "a=1,b=2",
        }
    )
    s = rdk.oauthbearer_settings()
    assert (s.client_id, s.client_secret, dict(s.extensions)) == (
        "id2",
        "sec2",
        {"a": "1", "b": "2"},
    )
    unsecured = oauth_config(**{"sasl.jaas.config": jaas(unsecuredLoginStringClaim_sub="bob")})
    assert unsecured.oauthbearer_settings().unsecured == {"unsecuredLoginStringClaim_sub": "bob"}
    rd_unsecured = oauth_config(
        **{
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principal=carol scope=a,b lifeSeconds=60 extension_t=1",
        }
    )
    token = login_from_config(rd_unsecured).token_blocking()
    claims = jwt_claims(token.value)
    assert claims["sub"] == "carol" and claims["scope"] == ["a", "b"]
    assert round(claims["exp"] - claims["iat"]) == 60 and dict(token.extensions) == {"t": "1"}


@pytest.mark.parametrize(
    ("extra", "key", "match"),
    [
        ({}, "sasl.mechanism", "needs a token source"),
        ({"sasl.jaas.config": jaas()}, "sasl.mechanism", "needs a token source"),
        (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                'required username="a" password="b";'
            },
            "sasl.jaas.config",
            "OAuthBearerLoginModule",
        ),
        ({"sasl.oauthbearer.method": "oidc"}, "sasl.oauthbearer.token.endpoint.url", "required"),
        (
            {"sasl.oauthbearer.token.endpoint.url": "https://idp/token"},
            "sasl.oauthbearer.client.credentials.client.id",
            "client id and secret",
        ),
        (
            {"sasl.oauthbearer.token.endpoint.url": "ftp://idp/token", "oauth_cb": None},
            "sasl.oauthbearer.token.endpoint.url",
            "http",
        ),
        ({"sasl.login.callback.handler.class": "com.example.MyHandler"}, None, "Java"),
        ({"sasl.login.refresh.window.factor": 0.2}, "sasl.login.refresh.window.factor", "0.5"),
        ({"enable.sasl.oauthbearer.unsecure.jwt": True}, "sasl.oauthbearer.config", "principal"),
        ({"sasl.oauthbearer.jwks.endpoint.url": "x"}, None, "does not take"),
        (
            {"oauth_cb": print, "enable.sasl.oauthbearer.unsecure.jwt": True},
            "sasl.mechanism",
            "one token source",
        ),
        (
            {
                "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                "sasl.jaas.config": jaas(unsecuredLoginStringClaim_sub="a"),
            },
            "sasl.mechanism",
            "one token source",
        ),
        ({"sasl.login.read.timeout.ms": -1}, "sasl.login.read.timeout.ms", ">= 1"),
    ],
)
def test_oauthbearer_config_errors_name_the_setting(extra, key, match):
    with pytest.raises(ConfigError, match=match) as info:
        login_from_config(oauth_config(**extra))
    if key is not None:
        assert info.value.key == key


def test_java_client_properties_for_oauthbearer():
    props = java_client_properties("SASL_PLAINTEXT", mechanism=OAUTHBEARER, username="alice")
    assert props["sasl.mechanism"] == "OAUTHBEARER"
    assert props["sasl.jaas.config"] == jaas(unsecuredLoginStringClaim_sub="alice")


# -- against a broker -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oauth_cluster():
    listener = sasl_listener(name=SASL_PLAINTEXT_LISTENER, mechanisms=["PLAIN", OAUTHBEARER])
    config = {"connections.max.reauth.ms": SESSION_MS}
    with KafkaCluster(listeners=[listener], broker_config=config) as cluster:
        yield cluster


def client_config(cluster, **extra) -> dict:
    return {
        "bootstrap.servers": cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        **extra,
    }


def round_trip(config: dict, n: int = 20) -> None:
    topic = f"oauth-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient(config) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with kcore.Producer(config) as producer:
        producer.send_batch(topic, [b"v%d" % i for i in range(n)]).result(30)
    with kcore.Consumer({**config, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(topic, 0)])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += consumer.poll(0.5)
    assert [r.value for r in got] == [b"v%d" % i for i in range(n)]


def test_unsecured_jaas_login(oauth_cluster):
    round_trip(
        client_config(
            oauth_cluster,
            **{
                "sasl.jaas.config": jaas(
                    unsecuredLoginStringClaim_sub="alice", unsecuredLoginExtension_traceId="7"
                )
            },
        )
    )


def test_oauth_cb_login(oauth_cluster):
    calls = []

    def oauth_cb(config):
        calls.append(config)
        return unsigned_jwt("cb-user"), time.time() + 3600, "cb-user"

    round_trip(
        client_config(oauth_cluster, oauth_cb=oauth_cb, **{"sasl.oauthbearer.config": "cfg"})
    )
    # One token a client (its connections share it), each fetched once in its hour.
    assert calls and set(calls) == {"cfg"} and len(calls) <= 3


def test_token_endpoint_login(oauth_cluster, endpoint):
    round_trip(
        client_config(
            oauth_cluster,
            **{
                "sasl.oauthbearer.token.endpoint.url": endpoint.url,
                "sasl.jaas.config": jaas(clientId="svc client", clientSecret="s3cr:et"),
            },
        )
    )
    assert 1 <= len(endpoint.requests) <= 3


def test_librdkafka_unsecure_jwt_login(oauth_cluster):
    round_trip(
        client_config(
            oauth_cluster,
            **{
                "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": "principal=rdk",
            },
        ),
        n=5,
    )


def test_rejected_token_fails_at_once_with_the_brokers_reason(oauth_cluster):
    # A signed-looking token: the broker's unsecured validator takes alg "none" only.
    header = base64.urlsafe_b64encode(b'{"alg":"HS256"}').rstrip(b"=").decode()
    body = unsigned_jwt("mallory").split(".")[1]
    forged = f"{header}.{body}.c2ln"
    config = client_config(
        oauth_cluster,
        oauth_cb=lambda c: (forged, time.time() + 3600),
        **{"socket.connection.setup.timeout.ms": 5000},
    )
    t0 = time.monotonic()
    with pytest.raises(kcore.errors.KcoreError) as info:
        timeouts = {"default.api.timeout.ms": 20000, "request.timeout.ms": 20000}
        with kcore.AdminClient({**config, **timeouts}) as admin:
            admin.describe_cluster()
    assert time.monotonic() - t0 < 15
    text = str(info.value)
    assert "OAUTHBEARER" in text and "invalid_token" in text, text
    assert forged not in text


def test_a_token_source_that_hangs_fails_the_connection_within_the_request_timeout(
    oauth_cluster,
):
    def oauth_cb(config):
        time.sleep(8)  # an identity provider that does not answer
        return unsigned_jwt(), time.time() + 3600

    config = client_config(
        oauth_cluster,
        oauth_cb=oauth_cb,
        **{"request.timeout.ms": 1000, "default.api.timeout.ms": 4000},
    )
    t0 = time.monotonic()
    with pytest.raises(kcore.errors.KcoreError) as info:
        with kcore.AdminClient(config) as admin:
            admin.describe_cluster()
    assert time.monotonic() - t0 < 7
    assert "no SASL token within 1s" in str(info.value), str(info.value)


def test_tokens_are_refreshed_across_reauthentications(oauth_cluster, monkeypatch):
    """Tokens of 4 s, refreshed halfway: the broker's sessions end with the token, so each
    connection logs in again (KIP-368) with a fresh one, and nothing sent is lost."""
    fetched = []
    reauths = []
    run_reauth = BrokerConnection._run_reauth

    async def counted(self):
        await run_reauth(self)
        reauths.append(self.address)

    monkeypatch.setattr(BrokerConnection, "_run_reauth", counted)

    def oauth_cb(config):
        fetched.append(time.time())
        return unsigned_jwt("refresher", 4), time.time() + 4

    config = client_config(
        oauth_cluster,
        oauth_cb=oauth_cb,
        **{
            "sasl.login.refresh.window.factor": 0.5,
            "sasl.login.refresh.window.jitter": 0,
            "sasl.login.refresh.min.period.seconds": 0,
            "sasl.login.refresh.buffer.seconds": 0,
        },
    )
    topic = f"oauth-refresh-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient(config) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    sent = []
    with kcore.Producer(config) as producer:
        deadline = time.monotonic() + 10
        i = 0
        while time.monotonic() < deadline:
            producer.send(topic, b"r%d" % i).result(30)
            sent.append(b"r%d" % i)
            i += 1
            time.sleep(0.1)
    # The admin's token, then the producer's and its refreshes, presented by re-authentications
    # (the broker ends a session when its token expires). Not an exact count: under load a
    # session may end first, and the connection is made again (also with a fresh token).
    assert len(fetched) >= 3 and len(reauths) >= 1
    with kcore.Consumer({**config, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(topic, 0)])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += consumer.poll(0.5)
    assert [r.value for r in got] == sent


def test_kafkas_java_tools_log_in_to_the_test_listener(oauth_cluster, tmp_path):
    """kcore.testing's OAUTHBEARER listener and java_client_properties work for Java's client
    too (its own unsigned token), so a test can mix kcore and Kafka's tools on it."""
    props = java_client_properties(
        SASL_PLAINTEXT_LISTENER, mechanism=OAUTHBEARER, username="java-user"
    )
    props = {**props, "default.api.timeout.ms": "20000", "request.timeout.ms": "15000"}
    res = oauth_cluster.run_tool(
        "kafka-topics",
        "--bootstrap-server",
        oauth_cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "--command-config",
        write_properties(tmp_path / "oauth.properties", props),
        "--list",
        timeout=90,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-1500:]
