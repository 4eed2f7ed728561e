"""TLS and SASL for test clusters: throwaway certificates made with the ``openssl`` CLI, and
:class:`~kcore.testing.cluster.Listener` presets that use them.

::

    pki = LocalPKI()  # a CA, a server cert for localhost/127.0.0.1, client certs, ...
    with KafkaCluster(listeners=security_listeners(pki)) as cluster:
        cluster.bootstrap_for("SSL")  # TLS; also "MTLS", "SASL_PLAINTEXT", "SASL_SSL", ...
        ctx = pki.client_ssl_context(pki.client)  # Python: trusts the CA, presents a cert
        props = java_client_properties("SASL_SSL", ca_cert=pki.ca_cert,
                                       mechanism="SCRAM-SHA-512", username="alice",
                                       password="alice-secret")  # for Kafka's Java tools

Only the standard library, ``openssl`` (``KCORE_OPENSSL`` names another binary) and the JDK
the brokers run on are needed: the brokers read the PEM files directly (``ssl.keystore.type=
PEM``), so there is no keytool and no Python ``cryptography``. Keys are EC P-256 (fast to
make); nothing is cached between runs.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from .cluster import SCRAM_MECHANISMS, Listener, PropertyValue, render_properties
from .errors import ClusterError

__all__ = [
    "DEFAULT_USERS",
    "MTLS_LISTENER",
    "OAUTHBEARER",
    "SASL_MECHANISMS",
    "SASL_PLAINTEXT_LISTENER",
    "SASL_SSL_LISTENER",
    "SSL_LISTENER",
    "WRONG_HOST_LISTENER",
    "CertifiedKey",
    "LocalPKI",
    "PKIError",
    "java_client_properties",
    "sasl_listener",
    "security_listeners",
    "ssl_listener",
    "write_properties",
]

# The listener names security_listeners() uses (each is a cluster.bootstrap_for() name).
SSL_LISTENER = "SSL"
MTLS_LISTENER = "MTLS"
WRONG_HOST_LISTENER = "SSL_WRONG_HOST"
SASL_PLAINTEXT_LISTENER = "SASL_PLAINTEXT"
SASL_SSL_LISTENER = "SASL_SSL"

SASL_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
# Not in SASL_MECHANISMS (the username/password ones every user can log in with): an
# OAUTHBEARER listener takes unsigned JWTs (Kafka's unsecured validator), for development only.
OAUTHBEARER = "OAUTHBEARER"
_OAUTHBEARER_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
DEFAULT_USERS: Mapping[str, str] = {"alice": "alice-secret"}

ClientAuth = Literal["none", "requested", "required"]

# EC P-256: a key takes milliseconds (RSA-2048 takes ~100 ms) and both JSSE and OpenSSL use it.
_KEY_ALGORITHM = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
# User names go into a JAAS option name (user_<name>) and into kafka-storage --add-scram:
# keep to characters both read literally.
_USER_NAME = re.compile(r"[A-Za-z0-9._@-]+")
_PASSWORD_ENV = "KCORE_PKI_KEY_PASSWORD"  # passwords reach openssl through its environment


class PKIError(ClusterError):
    """``openssl`` is missing or one of its commands failed (the message has its output)."""


@dataclass(frozen=True)
class CertifiedKey:
    """A certificate and its private key, both PEM files. ``password`` is set when the key is
    encrypted (PKCS#8 ``ENCRYPTED PRIVATE KEY``); ``issuer`` is the certificate of the CA that
    signed it (the certificate itself for a CA)."""

    name: str
    cert: Path
    key: Path
    issuer: Path
    password: str | None = None

    def cert_pem(self) -> str:
        return self.cert.read_text()

    def key_pem(self) -> str:
        return self.key.read_text()


def _openssl() -> str:
    exe = os.environ.get("KCORE_OPENSSL") or shutil.which("openssl")
    if not exe:
        raise PKIError("kcore.testing.security needs the `openssl` command (not found on PATH)")
    return exe


class LocalPKI:
    """Certificates for TLS tests, made with ``openssl`` in ``directory`` (default: a new
    temporary directory, removed by :meth:`cleanup` or at the end of a ``with`` block).

    What it makes (each a :class:`CertifiedKey`):

    * ``ca``: the CA every broker and client trusts (``ca_cert`` is its PEM file).
    * ``server``: the brokers' certificate; subjectAltName ``DNS:localhost``, ``IP:127.0.0.1``,
      ``IP:::1``.
    * ``client``: a client certificate for mTLS (CN ``client_cn``, extendedKeyUsage
      clientAuth); ``client_encrypted`` is the same certificate with its key encrypted under
      ``key_password``.
    * ``other_ca``: a second CA nobody trusts; ``untrusted_client`` is a client certificate it
      signed (for tests where verification must fail).
    * ``wrong_host_server``: signed by ``ca`` but only for ``DNS:wrong-host.invalid``, for
      hostname-verification failures.

    :meth:`issue` makes more.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        days: int = 30,
        client_cn: str = "kcore-client",
        key_password: str = "kcore-key-password",
    ) -> None:
        self._exe = _openssl()  # before making a directory that would otherwise be left over
        self._temporary = directory is None
        if directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="kcore-pki-")).resolve()
        else:
            self.directory = Path(directory).resolve()
            self.directory.mkdir(parents=True, exist_ok=True)
        self.days = days
        try:
            # A random tag in the CA names: two PKIs (or a rerun) never share an issuer name.
            tag = secrets.token_hex(4)
            self.ca = self._make_ca("ca", f"kcore-testing CA {tag}")
            self.other_ca = self._make_ca("other-ca", f"kcore-testing other CA {tag}")
            self.server = self.issue(
                "server", dns=("localhost",), ips=("127.0.0.1", "::1"), server=True
            )
            self.client = self.issue("client", common_name=client_cn, client=True)
            self.client_encrypted = self._encrypt(self.client, key_password)
            self.untrusted_client = self.issue(
                "untrusted-client", common_name=client_cn, client=True, issuer=self.other_ca
            )
            self.wrong_host_server = self.issue(
                "wrong-host-server", dns=("wrong-host.invalid",), server=True
            )
        except BaseException:
            self.cleanup()
            raise

    def __repr__(self) -> str:
        return f"<LocalPKI {self.directory}>"

    def __enter__(self) -> LocalPKI:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the directory if this object created it (a given directory is left alone)."""
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- the files ------------------------------------------------------------------------------
    @property
    def ca_cert(self) -> Path:
        return self.ca.cert

    @property
    def other_ca_cert(self) -> Path:
        return self.other_ca.cert

    @property
    def server_cert(self) -> Path:
        return self.server.cert

    @property
    def server_key(self) -> Path:
        return self.server.key

    @property
    def client_cert(self) -> Path:
        return self.client.cert

    @property
    def client_key(self) -> Path:
        return self.client.key

    @property
    def client_key_encrypted(self) -> Path:
        return self.client_encrypted.key

    @property
    def client_key_password(self) -> str:
        assert self.client_encrypted.password is not None
        return self.client_encrypted.password

    # -- making certificates --------------------------------------------------------------------
    def _run(self, *args: str, password: str | None = None) -> None:
        env = dict(os.environ)
        if password is not None:
            env[_PASSWORD_ENV] = password
        try:
            res = subprocess.run(
                [self._exe, *args], cwd=self.directory, env=env, capture_output=True, text=True
            )
        except OSError as exc:
            raise PKIError(f"cannot run {self._exe}: {exc}") from exc
        if res.returncode != 0:
            raise PKIError(
                f"openssl {' '.join(args)} exited with status {res.returncode}:\n"
                f"{(res.stderr or res.stdout).strip()[-2000:]}"
            )

    def _new_key(self, path: Path) -> None:
        # genpkey always writes PKCS#8 ("BEGIN PRIVATE KEY"), the only form Kafka's PEM
        # key store reads.
        self._run("genpkey", *_KEY_ALGORITHM, "-out", str(path))
        path.chmod(0o600)

    def _extensions(self, name: str, lines: Iterable[str]) -> Path:
        path = self.directory / f"{name}.ext"
        # [req]/[dn]: older openssl releases insist on a distinguished_name section.
        head = "[req]\ndistinguished_name = dn\n[dn]\n[ext]\n"
        path.write_text(head + "".join(f"{line}\n" for line in lines))
        return path

    def _make_ca(self, name: str, common_name: str) -> CertifiedKey:
        key, cert = self.directory / f"{name}.key", self.directory / f"{name}.pem"
        self._new_key(key)
        # Own extension file, not the system openssl.cnf: the result must not depend on it.
        # Critical basicConstraints and the key identifiers keep strict verifiers (Python's
        # VERIFY_X509_STRICT, JSSE) happy.
        ext = self._extensions(
            name,
            (
                "basicConstraints = critical, CA:TRUE",
                "keyUsage = critical, keyCertSign, cRLSign",
                "subjectKeyIdentifier = hash",
                "authorityKeyIdentifier = keyid:always",
            ),
        )
        self._run(
            "req", "-new", "-x509", "-key", str(key), "-out", str(cert),
            "-days", str(self.days), "-subj", _subject(common_name), "-sha256",
            "-config", str(ext), "-extensions", "ext",
        )  # fmt: skip
        ext.unlink()
        return CertifiedKey(name, cert, key, issuer=cert)

    def issue(
        self,
        name: str,
        *,
        common_name: str | None = None,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
        issuer: CertifiedKey | None = None,
        password: str | None = None,
    ) -> CertifiedKey:
        """Make ``<name>.pem`` / ``<name>.key`` signed by ``issuer`` (default ``ca``): a leaf
        certificate for TLS servers (``server``) and/or clients (``client``), with the given
        subjectAltNames; the key is encrypted when ``password`` is given."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ValueError(f"certificate name {name!r}: letters, digits, '.', '_', '-' only")
        issuer = issuer or self.ca
        key, cert = self.directory / f"{name}.key", self.directory / f"{name}.pem"
        csr = self.directory / f"{name}.csr"
        self._new_key(key)
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{ip}" for ip in ips]
        lines = [
            "basicConstraints = critical, CA:FALSE",
            "keyUsage = critical, digitalSignature",
            "subjectKeyIdentifier = hash",
            "authorityKeyIdentifier = keyid, issuer",
        ]
        if usages:
            lines.append(f"extendedKeyUsage = {', '.join(usages)}")
        if sans:
            lines.append(f"subjectAltName = {', '.join(sans)}")
        ext = self._extensions(name, lines)
        subject = _subject(common_name or (next(iter(dns), None) or name))
        self._run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject,
                  "-config", str(ext))  # fmt: skip
        self._run(
            "x509", "-req", "-in", str(csr), "-CA", str(issuer.cert), "-CAkey", str(issuer.key),
            "-set_serial", str(secrets.randbits(63) + 1), "-days", str(self.days), "-sha256",
            "-extfile", str(ext), "-extensions", "ext", "-out", str(cert),
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
        made = CertifiedKey(name, cert, key, issuer=issuer.cert)
        return self._encrypt(made, password, replace=True) if password is not None else made

    def _encrypt(self, plain: CertifiedKey, password: str, replace: bool = False) -> CertifiedKey:
        """``plain`` with its key encrypted as PKCS#8 with PBE-SHA1-3DES. Not PBES2 (openssl's
        default): JDK 17, which Kafka's PEM key store relies on, cannot decrypt that; both it
        and OpenSSL (Python's ssl) decrypt this."""
        out = plain.key if replace else plain.key.with_name(f"{plain.name}-encrypted.key")
        tmp = out.with_suffix(".tmp")
        self._run(
            "pkcs8", "-topk8", "-in", str(plain.key), "-out", str(tmp),
            "-v1", "PBE-SHA1-3DES", "-passout", f"env:{_PASSWORD_ENV}",
            password=password,
        )  # fmt: skip
        tmp.chmod(0o600)
        tmp.replace(out)
        return CertifiedKey(plain.name, plain.cert, out, plain.issuer, password)

    # -- Python clients -------------------------------------------------------------------------
    def client_ssl_context(
        self,
        identity: CertifiedKey | None = None,
        *,
        ca_cert: str | os.PathLike[str] | None = None,
        check_hostname: bool = True,
    ) -> ssl.SSLContext:
        """An ``ssl`` client context trusting ``ca_cert`` (default this PKI's CA) and, with
        ``identity``, presenting that certificate (e.g. ``pki.client`` for mTLS)."""
        ctx = ssl.create_default_context(cafile=os.fspath(ca_cert or self.ca_cert))
        ctx.check_hostname = check_hostname
        if identity is not None:
            ctx.load_cert_chain(identity.cert, identity.key, identity.password)
        return ctx


def _subject(common_name: str) -> str:
    # -subj syntax: '/' separates attributes and '\' escapes; keep the CN to one attribute.
    return "/CN=" + common_name.replace("\\", "\\\\").replace("/", "\\/")


# -- listener presets -----------------------------------------------------------------------------
def _prefix(name: str) -> str:
    return f"listener.name.{name.lower()}."


def _tls_properties(
    name: str, pki: LocalPKI, server: CertifiedKey | None, client_auth: ClientAuth
) -> dict[str, PropertyValue]:
    if client_auth not in ("none", "requested", "required"):
        raise ValueError(f"client_auth must be none, requested or required, not {client_auth}")
    server = server or pki.server
    p = _prefix(name)
    # Inline PEM (not file locations): Kafka reads an unencrypted key only inline, and the
    # node.properties file then shows the whole setup.
    props: dict[str, PropertyValue] = {
        p + "ssl.keystore.type": "PEM",
        p + "ssl.keystore.certificate.chain": server.cert_pem(),
        p + "ssl.keystore.key": server.key_pem(),
        p + "ssl.truststore.type": "PEM",
        p + "ssl.truststore.certificates": pki.ca.cert_pem(),
        p + "ssl.client.auth": client_auth,
    }
    if server.password is not None:
        props[p + "ssl.key.password"] = server.password
    return props


def ssl_listener(
    pki: LocalPKI,
    *,
    name: str = SSL_LISTENER,
    client_auth: ClientAuth = "none",
    server: CertifiedKey | None = None,
    advertised_host: str | None = None,
) -> Listener:
    """A TLS listener (security protocol SSL) presenting ``server`` (default ``pki.server``).
    With ``client_auth="required"`` clients must present a certificate signed by ``pki.ca``;
    their principal is then ``User:CN=<client_cn>``."""
    props = _tls_properties(name, pki, server, client_auth)
    return Listener(name, "SSL", props, advertised_host)


def _jaas_quote(text: str) -> str:
    # Kafka parses sasl.jaas.config with java.io.StreamTokenizer: in a quoted value a backslash
    # escapes the next character, and a line break ends the value.
    if any(c in text for c in "\r\n"):
        raise ValueError("SASL passwords cannot contain line breaks")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sasl_listener(
    *,
    name: str | None = None,
    mechanisms: Iterable[str] = SASL_MECHANISMS,
    users: Mapping[str, str] = DEFAULT_USERS,
    pki: LocalPKI | None = None,
    client_auth: ClientAuth = "none",
    server: CertifiedKey | None = None,
    advertised_host: str | None = None,
) -> Listener:
    """A SASL listener: SASL_PLAINTEXT, or SASL_SSL when ``pki`` is given (``server`` and
    ``client_auth`` as in :func:`ssl_listener`). Every user (name -> password) can log in with
    every mechanism in ``mechanisms`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); the SCRAM
    credentials travel with the listener (``Listener.scram_users``) and are created when the
    cluster formats its storage. ``name`` defaults to the security protocol.

    ``OAUTHBEARER`` may be added to ``mechanisms``: the broker then takes unsigned JWTs (its
    unsecured validator: ``alg`` none, a ``sub`` and an ``exp`` not past), as Java clients make
    them from ``unsecuredLoginStringClaim_sub`` JAAS options. Development and tests only."""
    protocol = "SASL_SSL" if pki is not None else "SASL_PLAINTEXT"
    name = name or protocol
    mechs = list(dict.fromkeys(mechanisms))
    known = (*SASL_MECHANISMS, OAUTHBEARER)
    unknown = [m for m in mechs if m not in known]
    if unknown or not mechs:
        raise ValueError(f"SASL mechanisms must be some of {known}, not {mechs}")
    for user in users:
        if not _USER_NAME.fullmatch(user):
            raise ValueError(f"SASL user name {user!r}: use letters, digits and . _ @ - only")
    p = _prefix(name)
    # Everything is listener-scoped, so several SASL listeners can differ in one cluster.
    props: dict[str, PropertyValue] = {p + "sasl.enabled.mechanisms": ",".join(mechs)}
    if "PLAIN" in mechs:
        # The broker's PLAIN login module checks passwords against its user_<name> options.
        entries = "".join(f" user_{u}={_jaas_quote(pw)}" for u, pw in users.items())
        props[p + "plain.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required{entries};"
        )
    if OAUTHBEARER in mechs:
        # The broker's own login (it logs in as a client would) needs a principal; the
        # validator of client tokens is the unsecured default.
        props[p + "oauthbearer.sasl.jaas.config"] = (
            f'{_OAUTHBEARER_MODULE} required unsecuredLoginStringClaim_sub="broker";'
        )
    scram = {m: dict(users) for m in mechs if m in SCRAM_MECHANISMS}
    for mech in scram:
        props[p + f"{mech.lower()}.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
    if pki is not None:
        props.update(_tls_properties(name, pki, server, client_auth))
    return Listener(name, protocol, props, advertised_host, scram_users=scram)


def security_listeners(
    pki: LocalPKI,
    *,
    users: Mapping[str, str] = DEFAULT_USERS,
    mechanisms: Iterable[str] = SASL_MECHANISMS,
) -> list[Listener]:
    """One listener per kind of login, for a single cluster that tests them all:

    * ``SSL``: TLS, no client certificate;
    * ``MTLS``: TLS with a required client certificate (``pki.client``);
    * ``SSL_WRONG_HOST``: TLS presenting ``pki.wrong_host_server`` (hostname checks fail);
    * ``SASL_PLAINTEXT`` and ``SASL_SSL``: ``mechanisms`` for ``users``.
    """
    mechs = tuple(mechanisms)
    return [
        ssl_listener(pki, name=SSL_LISTENER),
        ssl_listener(pki, name=MTLS_LISTENER, client_auth="required"),
        ssl_listener(pki, name=WRONG_HOST_LISTENER, server=pki.wrong_host_server),
        sasl_listener(name=SASL_PLAINTEXT_LISTENER, mechanisms=mechs, users=users),
        sasl_listener(name=SASL_SSL_LISTENER, mechanisms=mechs, users=users, pki=pki),
    ]


# -- Java clients (Kafka's CLI tools) -------------------------------------------------------------
def java_client_properties(
    security_protocol: str,
    *,
    ca_cert: str | os.PathLike[str] | None = None,
    identity: CertifiedKey | None = None,
    check_hostname: bool = True,
    mechanism: str | None = None,
    username: str | None = None,
    password: str | None = None,
) -> dict[str, str]:
    """Client properties for Kafka's Java clients and tools (``--command-config``): TLS
    trusting ``ca_cert`` and presenting ``identity``, and/or a SASL login."""
    props: dict[str, str] = {"security.protocol": security_protocol}
    if security_protocol in ("SSL", "SASL_SSL"):
        if ca_cert is not None:
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = os.fspath(ca_cert)
        if identity is not None:
            props["ssl.keystore.type"] = "PEM"
            props["ssl.keystore.certificate.chain"] = identity.cert_pem()
            props["ssl.keystore.key"] = identity.key_pem()
            if identity.password is not None:
                props["ssl.key.password"] = identity.password
        if not check_hostname:
            props["ssl.endpoint.identification.algorithm"] = ""
    if security_protocol in ("SASL_PLAINTEXT", "SASL_SSL") and mechanism == OAUTHBEARER:
        if username is None:
            raise ValueError("OAUTHBEARER needs a username (the unsigned token's sub)")
        props["sasl.mechanism"] = OAUTHBEARER
        sub = f"unsecuredLoginStringClaim_sub={_jaas_quote(username)}"
        props["sasl.jaas.config"] = f"{_OAUTHBEARER_MODULE} required {sub};"
    elif security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        if mechanism not in SASL_MECHANISMS or username is None or password is None:
            raise ValueError(f"SASL needs a mechanism of {SASL_MECHANISMS}, username, password")
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        props["sasl.mechanism"] = mechanism
        login = f"username={_jaas_quote(username)} password={_jaas_quote(password)}"
        props["sasl.jaas.config"] = f"{module} required {login};"
    return props


def write_properties(path: str | os.PathLike[str], props: Mapping[str, PropertyValue]) -> Path:
    """Write ``props`` as a Java ``.properties`` file; returns its path."""
    out = Path(path)
    out.write_text(render_properties(props))
    return out
