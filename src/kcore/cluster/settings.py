"""Security and socket settings: a client config turned into the
:class:`~kcore.network.connection.ConnectionSettings` every connection of the client shares
(TLS context, SASL mechanism and login, timeouts, buffer sizes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kcore.config import ClientConfig
from kcore.errors import ConfigError
from kcore.metrics import ClientMetrics
from kcore.network.connection import ConnectionSettings
from kcore.network.tls import build_ssl_context

__all__ = ["connection_settings"]


def connection_settings(
    config: Mapping[str, Any], metrics: ClientMetrics | None = None
) -> ConnectionSettings:
    """The per-connection settings of a client config (a :class:`kcore.config.ClientConfig`,
    or a mapping of the same keys: unset keys take their defaults from ``CONFIG_DEFS``)."""
    if not isinstance(config, ClientConfig):
        config = ClientConfig(config)
    protocol = str(config.get("security.protocol") or "PLAINTEXT").upper()
    sasl_factory = None
    sasl_prepare = None
    mechanism = None
    if protocol.startswith("SASL_") and str(config.get("sasl.mechanism")) == "OAUTHBEARER":
        from kcore.network.oauthbearer import login_from_config

        mechanism = "OAUTHBEARER"
        # One login per client: its connections share the token and its refreshes.
        login = login_from_config(config)
        sasl_factory = login.mechanism
        sasl_prepare = login.prepare
    elif protocol.startswith("SASL_"):
        from kcore.network.sasl import create_mechanism

        mechanism = str(config.get("sasl.mechanism") or "GSSAPI").upper()
        credentials = config.sasl_credentials()
        if credentials is None:
            raise ConfigError(
                "sasl.jaas.config",
                f"security.protocol {protocol} needs credentials: set sasl.username and "
                "sasl.password, or sasl.jaas.config",
            )
        user, password = str(credentials[0]), str(credentials[1])
        mech_name = mechanism

        def sasl_factory() -> Any:
            return create_mechanism(mech_name, user, password)

        sasl_factory()  # fail now on a mechanism kcore does not support, not at first connect
    return ConnectionSettings(
        client_id=str(config.get("client.id") or "kcore"),
        request_timeout_s=config.seconds("request.timeout.ms"),
        setup_timeout_s=config.seconds("socket.connection.setup.timeout.ms"),
        max_in_flight=int(config.setting("max.in.flight.requests.per.connection")),
        # Both values Java 3.0+ takes dial every address of a broker's name;
        # resolve_canonical_bootstrap_servers_only changes only how the bootstrap list expands.
        all_dns_ips=True,
        send_buffer_bytes=int(config["send.buffer.bytes"]),
        receive_buffer_bytes=int(config["receive.buffer.bytes"]),
        ssl_context=build_ssl_context(config),
        sasl_mechanism=mechanism,
        sasl_factory=sasl_factory,
        sasl_prepare=sasl_prepare,
        metrics=metrics,
    )
