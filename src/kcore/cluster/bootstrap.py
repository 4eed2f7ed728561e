"""Bootstrap: ask the ``bootstrap.servers``, in random order and in rounds, for the cluster's
metadata until one answers, within the call's deadline.

A round tries every address once; rounds are paced by ``reconnect.backoff.ms``. A failure that
waiting cannot fix (TLS trust, credentials, a non-retriable broker error) ends the wait at once
when every address of a round failed so; otherwise ``BootstrapError`` at the deadline names
each address with its last reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from kcore.errors import BootstrapError, BrokerConnectionError, KafkaError, KcoreTimeoutError
from kcore.metrics import ConnectionCounters
from kcore.network.address import address_problem, canonical_names, format_address, parse_address
from kcore.network.backoff import ExponentialBackoff
from kcore.network.connection import BrokerConnection, ConnectionSettings
from kcore.network.retry import Deadline, RetryPacing

__all__ = ["bootstrap_addresses", "first_metadata_answer", "lists_usable_broker"]

log = logging.getLogger("kcore.cluster")

# Failures that retrying cannot fix (a certificate not trusted, a name mismatch, a TLS or
# SASL setting the listener rejects): bootstrap reports them at once instead of at its timeout.
FATAL_STAGES = frozenset({"tls", "authentication"})


async def bootstrap_addresses(servers: list[str], dns_lookup: str) -> list[str]:
    """The addresses of one round: ``servers`` (each name's canonical names with
    ``client.dns.lookup=resolve_canonical_bootstrap_servers_only``), shuffled."""
    addresses = list(servers)
    if dns_lookup == "resolve_canonical_bootstrap_servers_only":
        expanded: list[str] = []
        for address in addresses:
            host, port = parse_address(address)
            try:
                names = await canonical_names(host, port)
            except Exception:  # (OSError; UnicodeError for a name IDNA rejects; ...)
                names = [host]  # the connect attempt will report the DNS failure
            expanded += [format_address(n, port) for n in names]
        addresses = expanded
    random.shuffle(addresses)  # spread clients over the list, as Java does
    return addresses


async def first_metadata_answer(
    servers: list[str],
    dns_lookup: str,
    settings: ConnectionSettings,
    metadata_request: Callable[[BrokerConnection], tuple[Any, int]],
    deadline: Deadline | None,
    backoff: ExponentialBackoff,
    on_failure: Callable[[str, str], None] | None = None,
    counters_for: Callable[[str, int], ConnectionCounters | None] | None = None,
) -> tuple[str, Any]:
    """(address, Metadata response) of the first bootstrap server that answers with a broker
    list. Each connection is closed once asked: the client reconnects by node id.
    ``deadline`` None: rounds go on until one answers, or a failure waiting cannot fix (a
    client's background bootstrap, which the caller cancels on close); ``on_failure(address,
    reason)`` hears of each failed try as it happens; ``counters_for(host, port)`` gives the
    statistics' counters of a bootstrap server's connections."""
    pacing = RetryPacing(deadline, backoff)
    timeout = math.inf if deadline is None else deadline.timeout
    attempts: list[tuple[str, str]] = []

    def failed(address: str, reason: str) -> None:
        attempts.append((address, reason))
        if on_failure is not None:
            on_failure(address, reason)

    while True:
        # Per failure this round: whether waiting cannot fix it (TLS trust, credentials).
        fatal: list[bool] = []
        for address in await bootstrap_addresses(servers, dns_lookup):
            host, port = parse_address(address)
            remaining = math.inf if deadline is None else deadline.remaining()
            if remaining <= 0:
                break
            counters = counters_for(host, port) if counters_for is not None else None
            conn = BrokerConnection(host, port, settings, counters=counters)
            try:
                # (no deadline: the connection's own setup timeout bounds the try)
                await asyncio.wait_for(conn.open(), None if deadline is None else remaining)
                request, version = metadata_request(conn)
                # request.timeout.ms, as Java's: a server that takes the request and never
                # answers must not use up the time the next one would have had.
                wait = settings.request_timeout_s
                if deadline is not None:
                    wait = min(deadline.remaining(), wait)
                response = await conn.request(request, version, timeout=max(wait, 0.001))
                check_brokers(response, address)
            except KafkaError as exc:  # e.g. authentication failed: no point going on
                if not exc.retriable:
                    raise
                failed(address, str(exc))
                fatal.append(False)
                continue
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                # (before TimeoutError: a KcoreTimeoutError is one, with its own reason)
                reason = exc.reason if isinstance(exc, BrokerConnectionError) else str(exc)
                if isinstance(exc, BrokerConnectionError):
                    reason = f"{exc.stage}: {exc.reason}"
                fatal.append(  # (a hang-up mid-handshake is retried, as Java's)
                    isinstance(exc, BrokerConnectionError)
                    and exc.stage in FATAL_STAGES
                    and not exc.transient
                )
                failed(address, reason)
                log.info("bootstrap server %s failed: %s", address, reason)
                continue
            except asyncio.TimeoutError:
                # The deadline cut this attempt short: an earlier attempt's reason for the
                # same address says more than "no answer" (a token source that hangs, say).
                if not any(a == address for a, _ in attempts):
                    failed(address, f"no answer within {timeout:g}s")
                break
            finally:
                conn.close()  # also when cancelled
            return address, response
        attempts[:] = _dedupe(attempts)  # bounded, however many rounds
        if fatal and all(fatal):
            raise BootstrapError(attempts)
        if not await pacing.pause():
            raise BootstrapError(attempts, timeout)


def _dedupe(attempts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each address once, with its last reason, in first-tried order."""
    last: dict[str, str] = {}
    for address, reason in attempts:
        last[address] = reason
    return list(last.items())


def check_brokers(response: Any, source: str) -> None:
    """A Metadata answer that lists no broker (one from a broker still starting) is not
    applied, as Java's NetworkClient ignores it: it would leave the client knowing nobody.
    Nor one whose brokers all have addresses no connection can be made to."""
    if not response.brokers:
        raise BrokerConnectionError(source, "metadata", "the answer listed no broker (starting?)")
    if not lists_usable_broker(response):
        first = response.brokers[0]
        raise BrokerConnectionError(
            source,
            "metadata",
            "the answer listed no broker that can be dialled (broker "
            f"{first.node_id}: {address_problem(first.host, first.port)})",
        )


def lists_usable_broker(response: Any) -> bool:
    """Whether a Metadata answer lists a broker at an address that can be dialled."""
    return any(address_problem(b.host, b.port) is None for b in response.brokers)
