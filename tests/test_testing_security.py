"""kcore.testing.security: throwaway certificates and TLS/SASL listener presets. One cluster
carries every listener (SSL, MTLS, SSL_WRONG_HOST, SASL_PLAINTEXT, SASL_SSL) and every login is
tried against it: TLS from Python's ``ssl`` (a handshake, then an ApiVersions request), SASL and
mTLS with Kafka's own Java tools as the oracle."""

from __future__ import annotations

import socket
import ssl
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kcore.protocol import KafkaProtocol
from kcore.protocol.messages import ApiVersionsRequest
from kcore.testing import KafkaCluster
from kcore.testing.cluster import read_properties
from kcore.testing.security import (
    MTLS_LISTENER,
    SASL_MECHANISMS,
    SASL_PLAINTEXT_LISTENER,
    SASL_SSL_LISTENER,
    SSL_LISTENER,
    WRONG_HOST_LISTENER,
    CertifiedKey,
    LocalPKI,
    java_client_properties,
    sasl_listener,
    security_listeners,
    ssl_listener,
    write_properties,
)

# carol's password has the characters the JAAS and --add-scram parsers treat specially.
USERS = {"alice": "alice-secret", "carol": "c\"a\\r ol=]'"}


def _openssl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    return LocalPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(pki: LocalPKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    work = tmp_path_factory.mktemp("kafka-security")
    with KafkaCluster(listeners=security_listeners(pki, users=USERS), work_dir=work) as c:
        print(f"secure 1-node startup_seconds={c.startup_seconds:.2f}")
        yield c


def _port(cluster: KafkaCluster, listener: str) -> int:
    return int(cluster.bootstrap_for(listener).rsplit(":", 1)[1])


def _api_versions_over_tls(
    port: int, ctx: ssl.SSLContext, server_hostname: str = "127.0.0.1"
) -> tuple[int, dict]:
    """TLS handshake with 127.0.0.1:port (SNI/verification as ``server_hostname``), then one
    ApiVersions request: (its error code, the broker's certificate as ssl decodes it)."""
    proto = KafkaProtocol("kcore-security-test")
    _, data = proto.send_request(ApiVersionsRequest(), 0)
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            tls.sendall(data)
            while True:
                chunk = tls.recv(65536)
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                responses = proto.receive_data(chunk)
                if responses:
                    return responses[0].body.error_code, tls.getpeercert() or {}


def _rejected(port: int, ctx: ssl.SSLContext, server_hostname: str = "127.0.0.1") -> OSError:
    with pytest.raises(OSError) as info:
        _api_versions_over_tls(port, ctx, server_hostname)
    assert not isinstance(info.value, TimeoutError), "the broker neither answered nor refused"
    return info.value


# -- certificates (no cluster) --------------------------------------------------------------------
def test_certificates_chain_to_their_ca_with_the_right_names(pki: LocalPKI) -> None:
    for cert in (pki.server_cert, pki.client_cert, pki.wrong_host_server.cert):
        res = _openssl("verify", "-x509_strict", "-CAfile", pki.ca_cert, cert)
        assert res.returncode == 0, res.stderr
    for cert in (pki.server_cert, pki.client_cert):  # nothing from the other CA is trusted
        assert _openssl("verify", "-CAfile", pki.other_ca_cert, cert).returncode != 0
    assert _openssl("verify", "-CAfile", pki.ca_cert, pki.untrusted_client.cert).returncode != 0
    untrusted = _openssl("verify", "-CAfile", pki.other_ca_cert, pki.untrusted_client.cert)
    assert untrusted.returncode == 0, untrusted.stderr

    def text(cert: Path) -> str:
        return _openssl("x509", "-noout", "-text", "-in", cert).stdout

    server = text(pki.server_cert)
    assert "DNS:localhost" in server and "IP Address:127.0.0.1" in server
    assert "TLS Web Server Authentication" in server
    assert "ASN1 OID: prime256v1" in server
    assert "TLS Web Client Authentication" in text(pki.client_cert)
    assert "CN = kcore-client" in text(pki.client_cert)
    assert "DNS:wrong-host.invalid" in text(pki.wrong_host_server.cert)
    assert "localhost" not in text(pki.wrong_host_server.cert).split("Subject Alternative")[1]


def test_keys_are_pkcs8_and_the_encrypted_one_needs_its_password(pki: LocalPKI) -> None:
    for key in (pki.server_key, pki.client_key, pki.ca.key):
        assert key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
        assert key.stat().st_mode & 0o077 == 0
    assert pki.client_key_encrypted.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY")
    assert pki.client_encrypted.cert == pki.client_cert
    assert pki.client_encrypted.password == pki.client_key_password
    ssl.create_default_context().load_cert_chain(
        pki.client_cert, pki.client_key_encrypted, pki.client_key_password
    )
    with pytest.raises(ssl.SSLError):
        ssl.create_default_context().load_cert_chain(
            pki.client_cert, pki.client_key_encrypted, "not-the-password"
        )


def test_issue_makes_more_certificates_and_a_temporary_pki_cleans_up(tmp_path: Path) -> None:
    with LocalPKI(days=2, client_cn="svc-a", key_password="pw") as temp:
        directory = temp.directory
        subject = _openssl("x509", "-noout", "-subject", "-in", temp.client_cert).stdout
        assert "CN = svc-a" in subject
        extra = temp.issue(
            "extra",
            dns=("kafka.test",),
            ips=("10.1.2.3",),
            server=True,
            issuer=temp.other_ca,
            password="secret",
        )
        assert isinstance(extra, CertifiedKey) and extra.password == "secret"
        assert extra.issuer == temp.other_ca_cert
        sans = _openssl("x509", "-noout", "-ext", "subjectAltName", "-in", extra.cert).stdout
        assert "DNS:kafka.test, IP Address:10.1.2.3" in sans
        ssl.create_default_context().load_cert_chain(extra.cert, extra.key, "secret")
        with pytest.raises(ValueError):
            temp.issue("../escape")
    assert not directory.exists()
    kept = LocalPKI(tmp_path / "kept")
    kept.cleanup()  # a directory the caller chose is the caller's
    assert (tmp_path / "kept" / "ca.pem").is_file()


def test_listener_presets_are_listener_scoped(pki: LocalPKI) -> None:
    listeners = {x.name: x for x in security_listeners(pki, users=USERS)}
    assert list(listeners) == [
        SSL_LISTENER,
        MTLS_LISTENER,
        WRONG_HOST_LISTENER,
        SASL_PLAINTEXT_LISTENER,
        SASL_SSL_LISTENER,
    ]
    for x in listeners.values():  # nothing global, so the listeners cannot clash
        prefix = f"listener.name.{x.name.lower()}."
        assert all(key.startswith(prefix) for key in x.properties), x.name
    assert listeners[MTLS_LISTENER].properties["listener.name.mtls.ssl.client.auth"] == "required"
    assert listeners[SSL_LISTENER].properties["listener.name.ssl.ssl.client.auth"] == "none"
    sasl = listeners[SASL_SSL_LISTENER]
    assert sasl.security_protocol == "SASL_SSL"
    assert sasl.properties["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == (
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    )
    assert sasl.scram_users == {"SCRAM-SHA-256": USERS, "SCRAM-SHA-512": USERS}
    plain_only = sasl_listener(mechanisms=["PLAIN"], users={"bob": "b"})
    assert plain_only.name == "SASL_PLAINTEXT" and plain_only.scram_users == {}
    assert 'user_bob="b";' in str(
        plain_only.properties["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    )

    with pytest.raises(ValueError, match="mechanisms"):
        sasl_listener(mechanisms=["GSSAPI"])
    with pytest.raises(ValueError, match="user name"):
        sasl_listener(users={"bad name": "x"})
    with pytest.raises(ValueError, match="client_auth"):
        ssl_listener(pki, client_auth="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without ','"):
        KafkaCluster(listeners=[sasl_listener(users={"dave": "a,b"})])
    with pytest.raises(ValueError, match="two listeners are named SSL"):
        KafkaCluster(listeners=[ssl_listener(pki), ssl_listener(pki)])
    with pytest.raises(ValueError, match="two different SCRAM-SHA-256 passwords"):
        KafkaCluster(
            listeners=[sasl_listener(users={"eve": "1"})],
            scram_users={"SCRAM-SHA-256": {"eve": "2"}},
        )


# -- one cluster with every listener --------------------------------------------------------------
def test_one_cluster_carries_every_listener(cluster: KafkaCluster) -> None:
    props = read_properties(cluster.nodes[0].properties_path)
    protocols = dict(item.split(":") for item in props["listener.security.protocol.map"].split(","))
    assert protocols[SSL_LISTENER] == protocols[MTLS_LISTENER] == "SSL"
    assert protocols[WRONG_HOST_LISTENER] == "SSL"
    assert protocols[SASL_PLAINTEXT_LISTENER] == "SASL_PLAINTEXT"
    assert protocols[SASL_SSL_LISTENER] == "SASL_SSL"
    assert protocols["INTERNAL"] == protocols["CONTROLLER"] == "PLAINTEXT"
    ports = [_port(cluster, name) for name in protocols]
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("listener", [SSL_LISTENER, SASL_SSL_LISTENER])
@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
def test_tls_listener_certificate_verifies_against_the_ca(
    cluster: KafkaCluster, pki: LocalPKI, listener: str, hostname: str
) -> None:
    port = _port(cluster, listener)
    if listener == SSL_LISTENER:
        error_code, cert = _api_versions_over_tls(port, pki.client_ssl_context(), hostname)
        assert error_code == 0
        assert ("DNS", "localhost") in cert["subjectAltName"]
        assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]
    else:  # SASL_SSL: the handshake verifies; what follows is SASL's business
        with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
            with pki.client_ssl_context().wrap_socket(raw, server_hostname=hostname) as tls:
                assert tls.getpeercert()
    wrong_ca = pki.client_ssl_context(ca_cert=pki.other_ca_cert)
    err = _rejected(port, wrong_ca, hostname)
    assert isinstance(err, ssl.SSLCertVerificationError), err


def test_wrong_host_certificate_fails_hostname_checks_only(
    cluster: KafkaCluster, pki: LocalPKI
) -> None:
    port = _port(cluster, WRONG_HOST_LISTENER)
    for hostname in ("127.0.0.1", "localhost"):
        err = _rejected(port, pki.client_ssl_context(), hostname)
        assert isinstance(err, ssl.SSLCertVerificationError) and "mismatch" in str(err), err
    unchecked = pki.client_ssl_context(check_hostname=False)  # the chain itself is fine
    assert _api_versions_over_tls(port, unchecked, "localhost")[0] == 0


def test_mtls_listener_wants_a_client_certificate_from_the_ca(
    cluster: KafkaCluster, pki: LocalPKI
) -> None:
    port = _port(cluster, MTLS_LISTENER)
    assert _api_versions_over_tls(port, pki.client_ssl_context(pki.client))[0] == 0
    assert _api_versions_over_tls(port, pki.client_ssl_context(pki.client_encrypted))[0] == 0
    _rejected(port, pki.client_ssl_context())
    _rejected(port, pki.client_ssl_context(pki.untrusted_client))
    # the plain SSL listener does not ask for one
    assert _api_versions_over_tls(_port(cluster, SSL_LISTENER), pki.client_ssl_context())[0] == 0


def test_logins_with_kafkas_java_tools(
    cluster: KafkaCluster, pki: LocalPKI, tmp_path: Path
) -> None:
    """Every SASL mechanism on both SASL listeners, good and bad passwords, and mTLS, each by
    kafka-topics --list through its own --command-config. A JVM start costs about a second of
    CPU, so the runs are concurrent and a bad password is tried on SASL_SSL once only (the SASL
    exchange is the same as on SASL_PLAINTEXT)."""
    sasl_failed = "SaslAuthenticationException"
    cases: list[tuple[str, str, dict[str, str], str | None]] = []  # id, listener, props, error
    for listener in (SASL_PLAINTEXT_LISTENER, SASL_SSL_LISTENER):
        ca = pki.ca_cert if listener == SASL_SSL_LISTENER else None
        for mech in SASL_MECHANISMS:
            attempts: list[tuple[str, str | None]] = [("alice-secret", None)]
            if listener == SASL_PLAINTEXT_LISTENER or mech == "SCRAM-SHA-256":
                attempts.append(("wrong", sasl_failed))
            for password, error in attempts:
                props = java_client_properties(
                    listener, ca_cert=ca, mechanism=mech, username="alice", password=password
                )
                cases.append((f"{listener}-{mech}-{error is None}", listener, props, error))
    for mech in ("PLAIN", "SCRAM-SHA-512"):  # escaping of a password full of specials
        props = java_client_properties(
            SASL_PLAINTEXT_LISTENER, mechanism=mech, username="carol", password=USERS["carol"]
        )
        cases.append((f"carol-{mech}", SASL_PLAINTEXT_LISTENER, props, None))
    for name, identity, error in (
        ("mtls-client", pki.client, None),
        ("mtls-encrypted-key", pki.client_encrypted, None),
        ("mtls-no-cert", None, "SslAuthenticationException"),
    ):
        props = java_client_properties("SSL", ca_cert=pki.ca_cert, identity=identity)
        cases.append((name, MTLS_LISTENER, props, error))

    def run(case: tuple[str, str, dict[str, str], str | None]) -> str | None:
        name, listener, props, error = case
        # bounded waits: a broken setup fails in seconds instead of hanging the tool
        props = {**props, "default.api.timeout.ms": "20000", "request.timeout.ms": "15000"}
        config = write_properties(tmp_path / f"{name}.properties", props)
        res = cluster.run_tool(
            "kafka-topics",
            "--bootstrap-server",
            cluster.bootstrap_for(listener),
            "--command-config",
            config,
            "--list",
            timeout=90,
        )
        out = res.stdout + res.stderr
        if error is None and res.returncode != 0:
            return f"{name}: expected success, got {res.returncode}:\n{out[-1500:]}"
        if error is not None and (res.returncode == 0 or error not in out):
            return f"{name}: expected {error!r}, got {res.returncode}:\n{out[-1500:]}"
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(run, cases) if f]
    assert not failures, "\n\n".join(failures)
