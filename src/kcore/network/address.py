"""Broker addresses: ``host:port`` strings, and name resolution as ``client.dns.lookup`` asks."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

__all__ = ["address_problem", "format_address", "is_ip_literal", "parse_address", "resolve"]

USE_ALL_DNS_IPS = "use_all_dns_ips"
RESOLVE_CANONICAL = "resolve_canonical_bootstrap_servers_only"


def parse_address(address: str, default_port: int = 9092) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``, or a bare host) to ``(host, port)``."""
    address = address.strip()
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.lstrip(":")
    elif address.count(":") == 1:
        host, port = address.split(":")
    else:
        host, port = address, ""
    return host, int(port) if port else default_port


def format_address(host: str, port: int) -> str:
    """``(host, port)`` back to the ``host:port`` form, bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def address_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` can never be dialled (a port outside 0-65535, an empty host, a name
    the IDNA rules reject: an empty label or one over 63 characters, over 253 in all), or
    None. Only what no DNS answer could change: a name that is valid but unknown is for
    resolving to report."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        return f"port {port} is outside 0-65535"
    if not host:
        return "the host is empty"
    if is_ip_literal(host):
        return None
    if "\x00" in host or any(c.isspace() for c in host):
        return f"{host!r} is not a valid host name"
    shown = repr(host) if len(host) <= 80 else f"{host[:60]!r}... ({len(host)} characters)"
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if any(not label for label in labels):
        return f"{shown} is not a valid host name: it has an empty label"
    if any(len(label) > 63 for label in labels):
        return f"{shown} is not a valid host name: a label is longer than 63 characters"
    try:
        encoded = host.encode("idna")
    except UnicodeError as exc:
        return f"{shown} is not a valid host name: {exc}"
    if len(encoded.rstrip(b".")) > 253:
        return f"{shown} is not a valid host name: longer than 253 characters"
    return None


async def resolve(host: str, port: int, *, all_ips: bool = True) -> list[tuple[str, int]]:
    """The addresses to dial for ``host``: every one DNS returns (``use_all_dns_ips``), or just
    the first, in DNS order and without repeats. Raises ``OSError`` (``socket.gaierror``) when
    the name does not resolve."""
    if is_ip_literal(host):
        return [(host, port)]
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[tuple[str, int]] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        ip = str(sockaddr[0])
        if (ip, port) not in seen:
            seen.append((ip, port))
    return seen if all_ips else seen[:1]


async def canonical_names(host: str, port: int) -> list[str]:
    """``resolve_canonical_bootstrap_servers_only``: each address of ``host`` replaced by its
    canonical (reverse-resolved) name, as Java's ``getCanonicalHostName`` does; an address
    without a reverse entry stays as the IP."""
    loop = asyncio.get_running_loop()
    names: list[str] = []
    for ip, _ in await resolve(host, port):
        try:
            name, _service = await loop.getnameinfo((ip, port), socket.NI_NAMEREQD)
        except OSError:
            name = ip
        if name not in names:
            names.append(name)
    return names
