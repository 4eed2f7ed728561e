"""Where an OAUTHBEARER client's token comes from, and when it is fetched again.

Kafka's Java client logs in once per client and refreshes the token before it expires; every
connection (and every re-authentication, KIP-368) presents the current one. The same here: one
:class:`OAuthBearerLogin` per client, shared by its connections, fetches a token the first time
one is needed and again once the refresh point has passed (Java's
``sasl.login.refresh.window.factor``/``jitter``/``min.period.seconds``/``buffer.seconds``).

Token sources, as the Java client and librdkafka name them:

* :class:`CallbackTokenProvider`: a Python callable (``oauth_cb``, as confluent-kafka's) returning
  ``(token, expiry_seconds[, principal[, extensions]])``.
* :class:`ClientCredentialsTokenProvider`: OAuth 2 client credentials against
  ``sasl.oauthbearer.token.endpoint.url`` (KIP-768), or a ``file:`` URL whose file holds the
  token (Java's file retriever).
* :class:`UnsecuredTokenProvider`: an unsigned JWT made locally from ``unsecuredLogin*`` JAAS
  options (Java's default OAUTHBEARER login), for development against brokers that accept them.

Fetching may block (HTTP, a user callback): :meth:`OAuthBearerLogin.token` runs it in a worker
thread, so the event loop goes on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import http.client
import json
import logging
import math
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kcore.errors import ConfigError, SaslAuthenticationFailedError
from kcore.network.backoff import ExponentialBackoff
from kcore.network.retry import Deadline, RetryPacing
from kcore.network.sasl import OAuthBearerMechanism, check_oauth_extensions, check_token

log = logging.getLogger("kcore.network")

__all__ = [
    "CallbackTokenProvider",
    "ClientCredentialsTokenProvider",
    "OAuthBearerLogin",
    "OAuthBearerToken",
    "RefreshPolicy",
    "TokenProvider",
    "UnsecuredTokenProvider",
    "jwt_claims",
]

_UNSECURED = "unsecuredLogin"
_STRING_CLAIM = _UNSECURED + "StringClaim_"
_NUMBER_CLAIM = _UNSECURED + "NumberClaim_"
_LIST_CLAIM = _UNSECURED + "ListClaim_"
_UNSECURED_EXTENSION = _UNSECURED + "Extension_"
_MAX_ERROR_BODY = 300


@dataclass(frozen=True)
class OAuthBearerToken:
    """A bearer token and what the client needs to know of it."""

    value: str = field(repr=False)  # a credential: never in repr or logs
    expires_at: float  # seconds since the epoch
    principal: str = ""
    issued_at: float | None = None  # seconds since the epoch, when known (a JWT's iat)
    extensions: Mapping[str, str] = field(default_factory=dict)


class TokenProvider(ABC):
    """Gets a fresh token; may block (it runs in a worker thread)."""

    #: What the token comes from, for error messages (never a secret).
    source: str

    @abstractmethod
    def fetch(self) -> OAuthBearerToken: ...


# -- JWT ------------------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWS in compact form, not verified (the broker verifies; the client only
    reads the expiry and the principal, as Java's client-side token validation does).
    ValueError when it is not one."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[1]:
        raise ValueError("not a JWT (three base64url parts separated by dots)")
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (binascii.Error, ValueError):
        raise ValueError("not a JWT: its payload is not base64url-encoded JSON") from None
    if not isinstance(claims, dict):
        raise ValueError("not a JWT: its payload is not a JSON object")
    return claims


def token_from_jwt(value: str, sub_claim: str = "sub", source: str = "") -> OAuthBearerToken:
    """A token whose expiry and principal are read from its own claims (``exp`` in seconds,
    ``sub_claim``), as Java's ``LoginAccessTokenValidator`` reads a fetched token."""
    where = f" from {source}" if source else ""
    try:
        claims = jwt_claims(value)
    except ValueError as exc:
        raise SaslAuthenticationFailedError(f"OAUTHBEARER: the token{where} is {exc}") from None
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise SaslAuthenticationFailedError(
            f"OAUTHBEARER: the token{where} has no numeric exp (expiry) claim"
        )
    principal = claims.get(sub_claim)
    if not isinstance(principal, str) or not principal.strip():
        raise SaslAuthenticationFailedError(
            f"OAUTHBEARER: the token{where} has no {sub_claim!r} claim naming its principal "
            "(see sasl.oauthbearer.sub.claim.name)"
        )
    iat = claims.get("iat")
    issued = float(iat) if isinstance(iat, int | float) and not isinstance(iat, bool) else None
    return OAuthBearerToken(value, float(exp), principal, issued)


# -- sources --------------------------------------------------------------------------------------


class UnsecuredTokenProvider(TokenProvider):
    """An unsigned JWT (``{"alg":"none"}``) built from the JAAS options of Java's default
    OAUTHBEARER login: ``unsecuredLoginStringClaim_<name>``, ``unsecuredLoginNumberClaim_<name>``,
    ``unsecuredLoginListClaim_<name>`` (the first character is the separator),
    ``unsecuredLoginPrincipalClaimName`` (``sub``), ``unsecuredLoginLifetimeSeconds`` (3600),
    ``unsecuredLoginExtension_<name>``. Brokers accept these only with their unsecured validator
    (development and tests)."""

    source = "the unsecured JWT options of sasl.jaas.config"

    def __init__(
        self, options: Mapping[str, str], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self.principal_claim = options.get(_UNSECURED + "PrincipalClaimName", "").strip() or "sub"
        try:
            self.lifetime_s = int(options.get(_UNSECURED + "LifetimeSeconds", "3600"))
        except ValueError:
            raise ConfigError(
                "sasl.jaas.config", "unsecuredLoginLifetimeSeconds must be a whole number"
            ) from None
        claims: dict[str, Any] = {}
        for key, value in options.items():
            for prefix in (_STRING_CLAIM, _NUMBER_CLAIM, _LIST_CLAIM):
                if key.startswith(prefix) and len(key) > len(prefix):
                    name = key[len(prefix) :]
                    if name in ("iat", "exp"):
                        raise ConfigError(
                            "sasl.jaas.config", f"the {name} claim is set from the lifetime"
                        )
                    claims[name] = self._claim(prefix, name, value)
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise ConfigError(
                "sasl.jaas.config",
                f"an unsecured OAUTHBEARER login needs unsecuredLoginStringClaim_"
                f"{self.principal_claim}=<principal>",
            )
        self.claims = claims
        self.extensions = check_oauth_extensions(
            {
                k[len(_UNSECURED_EXTENSION) :]: v
                for k, v in options.items()
                if k.startswith(_UNSECURED_EXTENSION)
            },
            "sasl.jaas.config",
        )

    @staticmethod
    def _claim(prefix: str, name: str, value: str) -> Any:
        if prefix == _NUMBER_CLAIM:
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(
                    "sasl.jaas.config", f"unsecuredLoginNumberClaim_{name} must be a number"
                ) from None
            return int(number) if number.is_integer() else number
        if prefix == _LIST_CLAIM:
            # As Java: the first character separates the items ("|a|b" is ["a", "b"]).
            return value[1:].split(value[0]) if len(value) > 1 else []
        return value

    def fetch(self) -> OAuthBearerToken:
        now = self._clock()
        claims = {"exp": now + self.lifetime_s, "iat": now, **self.claims}
        header = _b64url(b'{"alg":"none"}')
        body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        return OAuthBearerToken(
            f"{header}.{body}.",
            now + self.lifetime_s,
            str(self.claims[self.principal_claim]),
            now,
            self.extensions,
        )


class CallbackTokenProvider(TokenProvider):
    """``oauth_cb(sasl.oauthbearer.config)`` as confluent-kafka calls it: it returns
    ``(token, expiry)`` with the expiry in seconds since the epoch, optionally followed by the
    principal name and a dict of SASL extensions."""

    source = "oauth_cb"

    def __init__(self, callback: Callable[[str | None], Any], config: str | None) -> None:
        self._callback = callback
        self._config = config

    def fetch(self) -> OAuthBearerToken:
        try:
            result = self._callback(self._config)
        except Exception as exc:
            # Its text, shortened, helps say what went wrong; the callback's own words, which
            # kcore cannot vet for secrets (so the doc says so).
            text = str(exc)[:_MAX_ERROR_BODY]
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: oauth_cb raised {type(exc).__name__}: {text}"
            ) from exc
        if not isinstance(result, tuple | list) or not 2 <= len(result) <= 4:
            raise SaslAuthenticationFailedError(
                "OAUTHBEARER: oauth_cb must return (token, expiry_seconds[, principal"
                f"[, extensions]]), not {type(result).__name__}"
            )
        token, expiry, *rest = result
        if isinstance(expiry, bool) or not isinstance(expiry, int | float):
            raise SaslAuthenticationFailedError(
                "OAUTHBEARER: oauth_cb's expiry must be seconds since the epoch (a number)"
            )
        principal = str(rest[0]) if rest and rest[0] is not None else ""
        extensions = rest[1] if len(rest) > 1 and rest[1] is not None else {}
        if not isinstance(extensions, Mapping):
            raise SaslAuthenticationFailedError("OAUTHBEARER: oauth_cb's extensions must be a dict")
        if isinstance(token, bytes):
            token = token.decode("ascii", "replace")
        if not isinstance(token, str):
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: oauth_cb's token must be a str, not {type(token).__name__}"
            )
        try:
            checked = check_oauth_extensions(extensions, "oauth_cb")
        except ConfigError as exc:
            raise SaslAuthenticationFailedError(f"OAUTHBEARER: {exc.message}") from None
        return OAuthBearerToken(token, float(expiry), principal, None, checked)


class ClientCredentialsTokenProvider(TokenProvider):
    """OAuth 2 client credentials (RFC 6749 section 4.4) against a token endpoint, as Java's
    ``OAuthBearerLoginCallbackHandler`` (KIP-768) does: a POST of
    ``grant_type=client_credentials[&scope=...]`` with the client id and secret as HTTP Basic
    auth (form-encoded first only with ``header_urlencode``, RFC 6749 section 2.3.1, as Java's
    ``sasl.oauthbearer.header.urlencode``); the answer's ``access_token`` is a JWT whose ``exp``
    and principal claim the client reads. Connection errors and HTTP errors are retried with a
    backoff for up to ``retry_backoff_max_s``, except the ones Java gives up on at once (400-407,
    409-415, 501, 505) and certificate failures. Redirects are not followed: they would carry
    the credentials elsewhere.

    A ``file:`` URL names a file holding the token instead (read again at every refresh)."""

    def __init__(
        self,
        url: str,
        client_id: str | None = None,
        client_secret: str | None = None,
        scope: str | None = None,
        *,
        sub_claim: str = "sub",
        extensions: Mapping[str, str] | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        retry_backoff_s: float = 0.1,
        retry_backoff_max_s: float = 10.0,
        header_urlencode: bool = False,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https", "file"):
            raise ConfigError(
                "sasl.oauthbearer.token.endpoint.url", "must be an http(s):// or file: URL"
            )
        self.url = url
        self.is_file = parsed.scheme == "file"
        if not self.is_file and (not client_id or not client_secret):
            raise ConfigError(
                "sasl.oauthbearer.client.credentials.client.id",
                "a token endpoint needs a client id and secret (clientId and clientSecret in "
                "sasl.jaas.config, or sasl.oauthbearer.client.credentials.client.id/.secret)",
            )
        self.source = f"the token endpoint {url}" if not self.is_file else f"the file {url}"
        self._client_id = client_id or ""
        self._client_secret = client_secret or ""
        self.scope = scope
        self.sub_claim = sub_claim
        self.extensions = check_oauth_extensions(extensions or {}, "sasl.jaas.config")
        # urllib has one timeout for both; the larger of Java's two (their default: none).
        timeouts = [t for t in (connect_timeout_s, read_timeout_s) if t is not None]
        self.timeout_s = max(timeouts) if timeouts else 30.0
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.header_urlencode = header_urlencode
        self._opener = urllib.request.build_opener(_RefuseRedirects)

    def fetch(self) -> OAuthBearerToken:
        value = self._read_file() if self.is_file else self._post_with_retries()
        token = token_from_jwt(value, self.sub_claim, self.source)
        return OAuthBearerToken(
            token.value, token.expires_at, token.principal, token.issued_at, self.extensions
        )

    def _read_file(self) -> str:
        path = urllib.request.url2pathname(urllib.parse.urlparse(self.url).path)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: cannot read the token from {self.url}: {exc.strerror or exc}"
            ) from None

    def _post_with_retries(self) -> str:
        # As Java's Retry: waits doubling from the backoff (no jitter), all within the max;
        # no wait left (or a backoff of 0): the last failure is the answer.
        pacing = RetryPacing(
            Deadline(self.retry_backoff_max_s),
            ExponentialBackoff(
                self.retry_backoff_s * 1000, self.retry_backoff_max_s * 1000, jitter=0.0
            ),
        )
        while True:
            try:
                return self._post()
            except _Retriable as exc:
                if self.retry_backoff_s <= 0 or not pacing.pause_blocking():
                    raise SaslAuthenticationFailedError(
                        f"OAUTHBEARER: no token from {self.source}: {exc}"
                    ) from None

    def _post(self) -> str:
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        request = urllib.request.Request(
            self.url,
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": self._basic_auth(),
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
            method="POST",
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise SaslAuthenticationFailedError(
                    f"OAUTHBEARER: {self.source}: its TLS certificate is not trusted "
                    f"({exc.reason.verify_message})"
                ) from None
            raise _Retriable(str(exc.reason)) from None
        except (OSError, http.client.HTTPException) as exc:  # also timeouts, a bad status line
            raise _Retriable(f"{type(exc).__name__}: {exc}") from None
        try:
            answer = json.loads(body)
            token = answer["access_token"]
            if not isinstance(token, str) or not token:
                raise KeyError("access_token")
        except (ValueError, KeyError, TypeError):
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: {self.source} answered without an access_token (JSON expected)"
            ) from None
        return token

    def _basic_auth(self) -> str:
        client_id, secret = self._client_id, self._client_secret
        if self.header_urlencode:
            # Java's URLEncoder: form encoding (a space is "+")
            client_id, secret = urllib.parse.quote_plus(client_id), urllib.parse.quote_plus(secret)
        return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()

    def _http_error(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            text = exc.read()[:_MAX_ERROR_BODY].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        reason = f"HTTP {exc.code} {exc.reason}: {text}".rstrip(": ")
        if 300 <= exc.code < 400:
            return SaslAuthenticationFailedError(
                f"OAUTHBEARER: {self.source} redirected to {exc.headers.get('Location')!r}; "
                "redirects are not followed (they would carry the client credentials): set the "
                "final URL"
            )
        if exc.code in _UNRETRIABLE_HTTP:
            return SaslAuthenticationFailedError(
                f"OAUTHBEARER: {self.source} refused the request: {reason}"
            )
        return _Retriable(reason)


# HTTP answers Java's token retriever gives up on at once; it retries the others.
_UNRETRIABLE_HTTP = frozenset([*range(400, 408), *range(409, 416), 501, 505])


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


class _Retriable(Exception):
    """A token request that may work if made again (connection error, 5xx, 429)."""


# -- refresh --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefreshPolicy:
    """Java's ``sasl.login.refresh.*``: refresh at ``window_factor`` (plus up to
    ``window_jitter``) of the token's life, but at least ``buffer_s`` before it expires and no
    sooner than ``min_period_s`` from now; a token too short for both buffers is refreshed at
    that fraction of what is left of it."""

    window_factor: float = 0.8
    window_jitter: float = 0.05
    min_period_s: float = 60.0
    buffer_s: float = 300.0

    def refresh_at(self, now: float, token: OAuthBearerToken, rnd: float) -> float:
        pct = self.window_factor + self.window_jitter * rnd
        expiry = token.expires_at
        if now + self.min_period_s + self.buffer_s > expiry:
            return now + (expiry - now) * pct
        start = token.issued_at if token.issued_at is not None else now
        proposed = start + (expiry - start) * pct
        if proposed > expiry - self.buffer_s:
            return expiry - self.buffer_s
        return max(proposed, now + self.min_period_s)


# As Java's refreshing login: after a failed refresh, the next try comes this much later (the
# current token goes on being used while it is valid).
RETRY_AFTER_FAILURE_S = 10.0
# A failed fetch with no token to fall back on is reported to every connection asking within
# this time, rather than each asking the token source again in turn.
_FAILURE_SHARED_S = 1.0
# Expiries past this are not seconds since the epoch (milliseconds, most likely).
_MAX_EPOCH_SECONDS = 1e11


class OAuthBearerLogin:
    """A client's OAUTHBEARER login: the current token, fetched again once due. A failed refresh
    keeps the current token while it is valid (and tries again later), as Java's does.

    :meth:`prepare` fetches (when due) on a daemon thread of its own: fetching may block on
    HTTP or a user callback, must not hold the event loop or its default executor (which
    resolves names), and must not keep the interpreter from exiting. :meth:`mechanism` only
    presents the token held."""

    def __init__(
        self,
        provider: TokenProvider,
        policy: RefreshPolicy | None = None,
        extensions: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self.policy = policy or RefreshPolicy()
        self.extensions = dict(extensions or {})
        self._clock = clock  # the epoch clock tokens' expiries are on
        self._monotonic = monotonic  # for the shared failure's short life
        self._token: OAuthBearerToken | None = None
        self._refresh_at = 0.0
        self._failure: tuple[str, float] | None = None  # its message, until (monotonic)
        self._lock = threading.Lock()

    def _due(self, now: float) -> bool:
        token = self._token
        return token is None or now >= min(self._refresh_at, token.expires_at)

    @property
    def current(self) -> OAuthBearerToken | None:
        """The token a connection would present now, or None when one must be fetched."""
        token = self._token
        return None if self._due(self._clock()) else token

    def token_blocking(self) -> OAuthBearerToken:
        """The current token, fetched first if there is none or it is due (blocks)."""
        with self._lock:
            now = self._clock()
            old = self._token
            if old is not None and not self._due(now):
                return old
            if self._failure is not None:
                message, until = self._failure
                if self._monotonic() < until:
                    raise SaslAuthenticationFailedError(message)
                self._failure = None
            try:
                token = self._fetch()
            except SaslAuthenticationFailedError as exc:
                if old is not None and now < old.expires_at:
                    retry_at = min(now + RETRY_AFTER_FAILURE_S, old.expires_at)
                    log.warning(
                        "OAUTHBEARER: refreshing the token failed (%s); the current one is used "
                        "until it expires in %.0f s, next try in %.0f s",
                        exc.message,
                        old.expires_at - now,
                        retry_at - now,
                    )
                    self._refresh_at = retry_at
                    return old
                self._failure = (exc.message, self._monotonic() + _FAILURE_SHARED_S)
                raise
            self._token = token
            now = self._clock()
            at = self.policy.refresh_at(now, token, random.random())
            if at <= now:  # as Java: a refresh point already past is moved a little ahead
                at = now + RETRY_AFTER_FAILURE_S
            self._refresh_at = at
            return token

    def _fetch(self) -> OAuthBearerToken:
        """A token from the provider, checked before it is kept: its characters, its expiry."""
        source = self.provider.source
        try:
            token = self.provider.fetch()
        except SaslAuthenticationFailedError:
            raise
        except Exception as exc:  # a bug or an unexpected failure below: named, not raw
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: getting a token from {source} failed: {type(exc).__name__}"
            ) from None
        check_token(token.value, source)
        if not math.isfinite(token.expires_at) or token.expires_at > _MAX_EPOCH_SECONDS:
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: the expiry of the token from {source} ({token.expires_at!r}) "
                "is not seconds since the epoch (milliseconds?)"
            )
        now = self._clock()
        if token.expires_at <= now:
            raise SaslAuthenticationFailedError(
                f"OAUTHBEARER: the token from {source} has already expired "
                f"(exp {token.expires_at:.0f}, now {now:.0f})"
            )
        return token

    async def token(self) -> OAuthBearerToken:
        """The current token, fetched first (on a daemon thread) if there is none or it is
        due."""
        token = self.current
        if token is not None:
            return token
        done: concurrent.futures.Future[OAuthBearerToken] = concurrent.futures.Future()

        def fetch() -> None:
            # The waiter may have given up (its connection timed out): the token is kept
            # all the same, for the next one.
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                try:
                    token = self.token_blocking()
                except BaseException as exc:
                    done.set_exception(exc)
                else:
                    done.set_result(token)

        threading.Thread(target=fetch, name="kcore-oauthbearer", daemon=True).start()
        return await asyncio.wrap_future(done)

    async def prepare(self) -> None:
        """Have a current token, fetching one if due: a connection calls this before it
        connects and before it logs in again, outside its setup timeout, so that a slow
        token source is not taken for a broker that does not answer."""
        await self.token()

    async def mechanism(self) -> OAuthBearerMechanism:
        """A fresh SASL client presenting the token held (fetched only if there is none that
        is still valid: :meth:`prepare` does the refreshing)."""
        token = self._token
        if token is None or self._clock() >= token.expires_at:
            token = await self.token()
        extensions = {**self.extensions, **token.extensions}
        return OAuthBearerMechanism(token.value, extensions, principal=token.principal)


def login_from_config(config: Any) -> OAuthBearerLogin:
    """The OAUTHBEARER login a client config (a :class:`kcore.config.ClientConfig`) asks for."""
    settings = config.oauthbearer_settings()
    provider: TokenProvider
    if settings.source == "callback":
        provider = CallbackTokenProvider(config["oauth_cb"], config["sasl.oauthbearer.config"])
    elif settings.source == "endpoint":

        def ms(key: str) -> float | None:
            value = config[key]
            return None if value is None else value / 1000

        provider = ClientCredentialsTokenProvider(
            settings.url,
            settings.client_id,
            settings.client_secret,
            settings.scope,
            sub_claim=config["sasl.oauthbearer.sub.claim.name"],
            connect_timeout_s=ms("sasl.login.connect.timeout.ms"),
            read_timeout_s=ms("sasl.login.read.timeout.ms"),
            retry_backoff_s=config["sasl.login.retry.backoff.ms"] / 1000,
            retry_backoff_max_s=config["sasl.login.retry.backoff.max.ms"] / 1000,
            header_urlencode=config["sasl.oauthbearer.header.urlencode"],
        )
    else:
        provider = UnsecuredTokenProvider(settings.unsecured)
    policy = RefreshPolicy(
        window_factor=config["sasl.login.refresh.window.factor"],
        window_jitter=config["sasl.login.refresh.window.jitter"],
        min_period_s=config["sasl.login.refresh.min.period.seconds"],
        buffer_s=config["sasl.login.refresh.buffer.seconds"],
    )
    extensions = check_oauth_extensions(settings.extensions, "sasl.oauthbearer.extensions")
    return OAuthBearerLogin(provider, policy, extensions)
