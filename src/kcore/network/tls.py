"""An ``ssl.SSLContext`` from the Java-named ``ssl.*`` settings (PEM files or inline PEM), and
the librdkafka-named ones (``ssl.ca.location``, ``ssl.certificate.location``, ...)."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Mapping
from typing import Any

from kcore.config import default_of
from kcore.errors import ConfigError

__all__ = ["build_ssl_context", "uses_tls"]

_PROTOCOLS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


def uses_tls(config: Mapping[str, Any]) -> bool:
    return str(config.get("security.protocol") or "PLAINTEXT").upper() in ("SSL", "SASL_SSL")


def _get(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    return None if value in (None, "", []) else value


def build_ssl_context(config: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The client-side context for ``security.protocol`` SSL or SASL_SSL, else None.

    Trust: ``ssl.truststore.location`` / ``ssl.ca.location`` (PEM file), or inline
    ``ssl.truststore.certificates``; with neither, the system's CAs. Client certificate (mTLS):
    ``ssl.keystore.location`` (PEM with key and chain), ``ssl.certificate.location`` +
    ``ssl.key.location``, or inline ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key``;
    ``ssl.key.password`` unlocks an encrypted key. ``ssl.endpoint.identification.algorithm``
    ``https`` (the default) checks the broker's name against its certificate; empty skips it."""
    if not uses_tls(config):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    enabled = _get(config, "ssl.enabled.protocols")
    if enabled:
        names = [enabled] if isinstance(enabled, str) else list(enabled)
        versions = [_PROTOCOLS[n] for n in names if n in _PROTOCOLS]
        if not versions:
            raise ConfigError("ssl.enabled.protocols", "kcore supports TLSv1.2 and TLSv1.3")
        ctx.minimum_version, ctx.maximum_version = min(versions), max(versions)
    ciphers = _get(config, "ssl.cipher.suites")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers if isinstance(ciphers, str) else ":".join(ciphers))
        except ssl.SSLError:
            raise ConfigError("ssl.cipher.suites", "no cipher in the list is available") from None

    key = "ssl.endpoint.identification.algorithm"
    algorithm = config.get(key, default_of(key))
    ctx.check_hostname = bool(algorithm) and str(algorithm).lower() == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED

    cafile = _get(config, "ssl.truststore.location") or _get(config, "ssl.ca.location")
    cadata = _get(config, "ssl.truststore.certificates")
    try:
        if cafile:
            ctx.load_verify_locations(cafile=str(cafile))
        if cadata:
            ctx.load_verify_locations(cadata=str(cadata))
        if not cafile and not cadata:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as exc:
        key = "ssl.truststore.location" if cafile else "ssl.truststore.certificates"
        raise ConfigError(key, f"cannot load CA certificates: {_reason(exc)}") from None

    _load_client_certificate(ctx, config)
    return ctx


def _load_client_certificate(ctx: ssl.SSLContext, config: Mapping[str, Any]) -> None:
    password = _get(config, "ssl.key.password") or _get(config, "ssl.keystore.password")
    password_str = str(password) if password is not None else None
    keystore = _get(config, "ssl.keystore.location")
    certfile = _get(config, "ssl.certificate.location")
    keyfile = _get(config, "ssl.key.location")
    chain = _get(config, "ssl.keystore.certificate.chain")
    inline_key = _get(config, "ssl.keystore.key")
    if keystore:
        key_name, cert, key = "ssl.keystore.location", str(keystore), None
    elif certfile:
        key_name, cert, key = "ssl.certificate.location", str(certfile), keyfile
    elif chain and inline_key:
        # ssl has no in-memory loader for a key pair: go through a private temporary file.
        fd, path = tempfile.mkstemp(prefix="kcore-client-", suffix=".pem")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{str(inline_key).strip()}\n{str(chain).strip()}\n")
            _load_chain(ctx, "ssl.keystore.certificate.chain", path, None, password_str)
        finally:
            os.unlink(path)
        return
    else:
        return
    _load_chain(ctx, key_name, cert, str(key) if key else None, password_str)


def _load_chain(
    ctx: ssl.SSLContext, key_name: str, cert: str, key: str | None, password: str | None
) -> None:
    try:
        ctx.load_cert_chain(cert, key, password=password)
    except (OSError, ssl.SSLError) as exc:
        # Never echo the password; the reason from OpenSSL does not contain it.
        raise ConfigError(
            key_name, f"cannot load the client certificate and key: {_reason(exc)}"
        ) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.args[-1] if exc.args else exc).lower()
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc)
