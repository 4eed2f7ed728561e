"""TLS and SASL logins of kcore's clients against a real broker with every kind of listener:
good credentials work, bad ones fail at once with a clear error that never shows the secret."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from kcore import AdminClient
from kcore.errors import BootstrapError, ConfigError, SaslAuthenticationFailedError
from kcore.testing import KafkaCluster
from kcore.testing.security import (
    MTLS_LISTENER,
    SASL_PLAINTEXT_LISTENER,
    SASL_SSL_LISTENER,
    SSL_LISTENER,
    WRONG_HOST_LISTENER,
    LocalPKI,
    security_listeners,
)

USER, PASSWORD = "alice", "alice-secret"
BAD_PASSWORD = "not-the-secret-42"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return LocalPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(pki):
    with KafkaCluster(listeners=security_listeners(pki, users={USER: PASSWORD})) as cluster:
        yield cluster


def describe(config: dict) -> list[int]:
    timeouts = {"default.api.timeout.ms": 20000, "request.timeout.ms": 20000}
    with AdminClient({**config, **timeouts}) as admin:
        return [b.node_id for b in admin.describe_cluster().brokers]


def tls(secure, pki, listener=SSL_LISTENER, **extra):
    return {
        "bootstrap.servers": secure.bootstrap_for(listener),
        "security.protocol": "SSL",
        "ssl.truststore.location": str(pki.ca_cert),
        **extra,
    }


def test_tls_with_server_verification(secure, pki):
    assert describe(tls(secure, pki)) == [1]
    # librdkafka's name for the CA file works as well
    config = tls(secure, pki)
    del config["ssl.truststore.location"]
    config["ssl.ca.location"] = str(pki.ca_cert)
    assert describe(config) == [1]


def test_tls_untrusted_certificate_fails_at_once(secure, pki):
    config = tls(secure, pki, **{"ssl.truststore.location": str(pki.other_ca_cert)})
    with AdminClient({**config, "default.api.timeout.ms": 60000}) as admin:
        with pytest.raises(BootstrapError) as info:
            admin.describe_cluster()  # the first call that needs the cluster
    text = str(info.value)
    assert "tls" in text and "not trusted" in text
    assert "within" not in text  # reported without waiting out the timeout


def test_tls_hostname_is_checked(secure, pki):
    with pytest.raises(BootstrapError, match="hostname|IP address mismatch"):
        describe(tls(secure, pki, WRONG_HOST_LISTENER))
    # Switching endpoint identification off (as Java's empty setting does) lets it through.
    assert describe(
        tls(secure, pki, WRONG_HOST_LISTENER, **{"ssl.endpoint.identification.algorithm": ""})
    ) == [1]


def test_mutual_tls_with_client_certificate(secure, pki):
    client = {"ssl.keystore.location": None}
    del client["ssl.keystore.location"]
    assert describe(
        tls(
            secure,
            pki,
            MTLS_LISTENER,
            **{
                "ssl.certificate.location": str(pki.client_cert),
                "ssl.key.location": str(pki.client_key),
            },
        )
    ) == [1]
    # An encrypted key with its password; and inline PEM in the Java names.
    assert describe(
        tls(
            secure,
            pki,
            MTLS_LISTENER,
            **{
                "ssl.certificate.location": str(pki.client_cert),
                "ssl.key.location": str(pki.client_key_encrypted),
                "ssl.key.password": pki.client_key_password,
            },
        )
    ) == [1]
    assert describe(
        tls(
            secure,
            pki,
            MTLS_LISTENER,
            **{
                "ssl.keystore.type": "PEM",
                "ssl.keystore.certificate.chain": pki.client.cert_pem(),
                "ssl.keystore.key": pki.client.key_pem(),
            },
        )
    ) == [1]


def test_mutual_tls_without_certificate_fails_clearly(secure, pki):
    config = tls(
        secure, pki, MTLS_LISTENER, **{"default.api.timeout.ms": 10000, "request.timeout.ms": 10000}
    )
    with AdminClient(config) as admin, pytest.raises(BootstrapError) as info:
        admin.wait_until_ready()
    assert "certificate" in str(info.value)


def test_wrong_key_password_is_a_config_error_without_the_password(secure, pki):
    config = tls(
        secure,
        pki,
        MTLS_LISTENER,
        **{
            "ssl.certificate.location": str(pki.client_cert),
            "ssl.key.location": str(pki.client_key_encrypted),
            "ssl.key.password": BAD_PASSWORD,
        },
    )
    with pytest.raises(ConfigError) as info:
        describe(config)
    assert BAD_PASSWORD not in str(info.value) and BAD_PASSWORD not in repr(info.value)


def sasl(secure, pki, mechanism, password=PASSWORD, listener=SASL_PLAINTEXT_LISTENER, **extra):
    config = {
        "bootstrap.servers": secure.bootstrap_for(listener),
        "security.protocol": listener,
        "sasl.mechanism": mechanism,
        "sasl.username": USER,
        "sasl.password": password,
        **extra,
    }
    if listener == SASL_SSL_LISTENER:
        config["ssl.truststore.location"] = str(pki.ca_cert)
    return config


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_login(secure, pki, mechanism):
    assert describe(sasl(secure, pki, mechanism)) == [1]


def test_sasl_ssl_with_scram_and_jaas_config(secure, pki):
    config = sasl(secure, pki, "SCRAM-SHA-512", listener=SASL_SSL_LISTENER)
    del config["sasl.username"], config["sasl.password"]
    config["sasl.jaas.config"] = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{USER}" password="{PASSWORD}";'
    )
    assert describe(config) == [1]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_bad_password_fails_clearly_and_never_shows_it(secure, pki, mechanism, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(SaslAuthenticationFailedError) as info:
        describe(sasl(secure, pki, mechanism, BAD_PASSWORD))
    text = f"{info.value} {info.value!r}"
    assert "Authentication failed" in text or "authentication" in text.lower()
    assert mechanism in text or "invalid credentials" in text
    assert BAD_PASSWORD not in text
    assert BAD_PASSWORD not in caplog.text and PASSWORD not in caplog.text


def test_config_repr_hides_secrets(secure, pki):
    with AdminClient(sasl(secure, pki, "PLAIN")) as admin:
        assert PASSWORD not in repr(admin.cluster.config)
        assert PASSWORD not in str(admin.cluster.config)


def test_doctor_reports_a_failed_login(secure, pki):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcore",
            "doctor",
            "-b",
            secure.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        ]
        + [
            f"-X{k}={v}"
            for k, v in sasl(secure, pki, "SCRAM-SHA-256", BAD_PASSWORD).items()
            if k != "bootstrap.servers"
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "authentication failed" in proc.stdout
    assert BAD_PASSWORD not in proc.stdout + proc.stderr


def test_doctor_explains_a_plaintext_client_on_a_tls_listener(secure):
    proc = subprocess.run(
        [sys.executable, "-m", "kcore", "doctor", "-b", secure.bootstrap_for(SSL_LISTENER)]
        + ["-X", "socket.connection.setup.timeout.ms=3000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "does not speak the Kafka protocol as configured" in proc.stdout
    assert "security.protocol=SSL" in proc.stdout
