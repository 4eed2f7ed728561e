"""``kcore doctor``: walk the path a client takes into a cluster and say in plain words where it
breaks.

The path (see docs/cli.md): for each bootstrap address, DNS, TCP connect, then a Kafka login
(TLS, ApiVersions, SASL) and a Metadata request; then, for every broker the cluster advertises,
DNS, TCP connect and a login from this machine, with round-trip times; then the group
coordinator when a group is named. The classic failure it is built to catch: the bootstrap
address works but brokers advertise addresses (``advertised.listeners``) for another network.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kcore.cluster.settings import connection_settings
from kcore.errors import BrokerConnectionError, ErrorCode, KafkaError, KcoreError
from kcore.network.address import format_address, parse_address, resolve
from kcore.network.connection import BrokerConnection, ConnectionSettings
from kcore.protocol import ApiKey
from kcore.protocol.messages import FindCoordinatorRequest, MetadataRequest

__all__ = ["AddressReport", "DoctorReport", "run_doctor"]

RTT_SAMPLES = 3


@dataclass
class AddressReport:
    """What happened on the way to one address (a bootstrap server or an advertised broker)."""

    address: str
    node_id: int | None = None
    dns: list[str] = field(default_factory=list)
    dns_error: str | None = None
    tcp: dict[str, str] = field(default_factory=dict)  # ip -> "ok" or the failure
    login_stage_failed: str | None = None  # dns/connect/tls/api_versions/authentication
    login_error: str | None = None
    rtt_ms: float | None = None
    api_versions: int = 0  # how many APIs the broker offers (0: not reached)
    cluster_id: str | None = None  # the cluster that answered there

    @property
    def failing_ips(self) -> dict[str, str]:
        """The addresses of a name that fail while others of it work (ip -> why)."""
        if "ok" not in self.tcp.values():
            return {}
        return {ip: why for ip, why in self.tcp.items() if why != "ok"}

    @property
    def ok(self) -> bool:
        return self.login_error is None and self.dns_error is None


@dataclass
class DoctorReport:
    bootstrap: list[AddressReport] = field(default_factory=list)
    cluster_id: str | None = None
    controller_id: int | None = None
    brokers: list[AddressReport] = field(default_factory=list)
    group: str | None = None
    coordinator: AddressReport | None = None
    coordinator_error: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


async def _probe_address(
    address: str, settings: ConnectionSettings, node_id: int | None = None
) -> tuple[AddressReport, BrokerConnection | None]:
    """DNS, raw TCP to every IP, then a full kcore login; the connection is returned open."""
    report = AddressReport(address, node_id)
    host, port = parse_address(address)
    try:
        ips = await asyncio.wait_for(resolve(host, port), settings.setup_timeout_s)
        report.dns = [ip for ip, _ in ips]
    except (OSError, asyncio.TimeoutError) as exc:
        report.dns_error = "timed out" if isinstance(exc, asyncio.TimeoutError) else _reason(exc)
        report.login_stage_failed = "dns"
        report.login_error = report.dns_error
        return report, None
    for ip in report.dns:
        report.tcp[ip] = await _tcp(ip, port, settings.setup_timeout_s)
    conn = BrokerConnection(host, port, settings, node_id=node_id)
    try:
        await conn.open()
    except BrokerConnectionError as exc:
        report.login_stage_failed, report.login_error = exc.stage, exc.reason
        return report, None
    except KafkaError as exc:  # SASL rejected the credentials
        report.login_stage_failed, report.login_error = "authentication", exc.message
        return report, None
    report.api_versions = len(conn.api_versions)
    samples = []
    for _ in range(RTT_SAMPLES):
        start = time.perf_counter()
        try:
            answer = await conn.request(MetadataRequest(topics=[]))
        except KcoreError:
            break
        report.cluster_id = answer.cluster_id
        samples.append((time.perf_counter() - start) * 1000)
    if samples:
        report.rtt_ms = round(statistics.median(samples), 3)
    return report, conn


async def _tcp(ip: str, port: int, timeout: float) -> str:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
    except asyncio.TimeoutError:
        return f"no answer within {timeout:g}s"
    except OSError as exc:
        return _reason(exc)
    writer.close()
    return "ok"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


async def run_doctor(
    bootstrap_servers: list[str], config: Mapping[str, Any], group: str | None = None
) -> DoctorReport:
    """Probe everything and return the report; never raises for what it diagnoses."""
    settings = connection_settings(config)
    report = DoctorReport(group=group)
    metadata = None
    first_ok: AddressReport | None = None
    for address in bootstrap_servers:
        probe, conn = await _probe_address(address, settings)
        report.bootstrap.append(probe)
        if conn is None:
            report.problems.append(_explain_bootstrap(probe, settings))
            continue
        try:
            answer = await conn.request(MetadataRequest(topics=[]))
            if metadata is None:
                metadata, first_ok = answer, probe
        except KcoreError as exc:
            hint = (
                "; if this listener uses SASL, set security.protocol=SASL_PLAINTEXT or "
                "SASL_SSL and sasl.mechanism"
                if settings.sasl_mechanism is None
                else ""
            )
            report.problems.append(
                f"bootstrap server {address} logs in but does not answer a Metadata request: "
                f"{exc}{hint}"
            )
        conn.close()
    if metadata is None:
        if not report.problems:
            report.problems.append("no bootstrap server given")
        report.notes.append("no bootstrap server worked, so the brokers could not be checked")
        return report
    assert first_ok is not None
    report.cluster_id = metadata.cluster_id
    report.controller_id = metadata.controller_id
    probes = await asyncio.gather(
        *(
            _probe_address(format_address(b.host, b.port), settings, b.node_id)
            for b in sorted(metadata.brokers, key=lambda b: b.node_id)
        )
    )
    for probe, conn in probes:
        report.brokers.append(probe)
        if conn is None:
            report.problems.append(_explain_broker(probe, first_ok))
        else:
            conn.close()
    if not metadata.brokers:
        report.problems.append("the cluster's metadata lists no brokers")
    for probe in (*report.bootstrap, *report.brokers):
        failing = probe.failing_ips
        if failing:
            # Clients (client.dns.lookup=use_all_dns_ips, the default) go on to the next
            # address: one that refuses costs a moment, one that does not answer costs the
            # connection setup timeout each time it is picked.
            bad = "; ".join(f"{ip}: {why}" for ip, why in failing.items())
            text = (
                f"{probe.address} resolves to {len(probe.tcp)} addresses and "
                f"{len(failing)} of them cannot be reached ({bad})"
            )
            if all("refused" in why for why in failing.values()):
                report.notes.append(
                    text + "; clients try the next address, so this only slows connecting "
                    "(a listener bound to one address family or interface?)"
                )
            else:
                report.problems.append(
                    text + "; a client that picks one waits its connection setup timeout "
                    "before trying the next: fix DNS or /etc/hosts, or the listener's address"
                )
        if probe.cluster_id is not None and probe.cluster_id != metadata.cluster_id:
            report.problems.append(
                f"{probe.address} answers for another cluster ({probe.cluster_id}, not "
                f"{metadata.cluster_id}); advertised.listeners or a bootstrap address points at "
                "a different Kafka"
            )
    by_address: dict[str, list[int]] = {}
    for b in metadata.brokers:
        by_address.setdefault(format_address(b.host, b.port), []).append(b.node_id)
    for address, ids in sorted(by_address.items()):
        if len(ids) > 1:
            # Every probe then reaches the same broker and looks fine: name it explicitly.
            report.problems.append(
                f"brokers {', '.join(map(str, sorted(ids)))} all advertise {address}; each "
                "broker needs its own address in advertised.listeners, or clients reach one "
                "broker when they mean another"
            )
    if group is not None:
        await _check_coordinator(report, group, first_ok, settings)
    return report


async def _check_coordinator(
    report: DoctorReport,
    group: str,
    bootstrap: AddressReport,
    settings: ConnectionSettings,
) -> None:
    # Ask through the bootstrap address that worked: it answers even when the advertised
    # addresses do not, and the answer says which broker the group depends on.
    probe, conn = await _probe_address(bootstrap.address, settings)
    if conn is None:
        report.coordinator_error = probe.login_error
        report.problems.append(f"group {group!r}: cannot ask for its coordinator")
        return
    try:
        response = None
        for _attempt in range(10):  # the offsets topic may still be being created
            version = conn.version_for(ApiKey.FIND_COORDINATOR)
            if version >= 4:
                request = FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
            else:
                request = FindCoordinatorRequest(key_type=0, key=group)
            response = await conn.request(request, version)
            entry = response.coordinators[0] if version >= 4 else response
            if entry.error_code == ErrorCode.NONE:
                break
            from kcore.errors import ERRORS_BY_CODE

            known = ERRORS_BY_CODE.get(entry.error_code)
            if known is None or not known.retriable:
                break  # e.g. not authorized: asking again will not help
            await asyncio.sleep(0.5)
        assert response is not None
    except KcoreError as exc:
        report.coordinator_error = str(exc)
        report.problems.append(f"group {group!r}: FindCoordinator failed: {exc}")
        return
    finally:
        conn.close()
    if entry.error_code != ErrorCode.NONE:
        from kcore.errors import error_for_code

        err = error_for_code(entry.error_code)
        report.coordinator_error = str(err)
        report.problems.append(f"group {group!r}: the cluster has no coordinator for it ({err})")
        return
    address = format_address(entry.host, entry.port)
    coordinator = next((p for p in report.brokers if p.node_id == entry.node_id), None)
    if coordinator is None or coordinator.address != address:
        coordinator, c2 = await _probe_address(address, settings, entry.node_id)
        if c2 is not None:
            c2.close()
    report.coordinator = coordinator
    if not coordinator.ok:
        report.problems.append(
            f"group {group!r}: its coordinator, broker {entry.node_id} at {address}, cannot be "
            f"reached from this machine ({coordinator.login_error}); consumers in this group "
            "will not be able to join or commit"
        )


def _explain_bootstrap(probe: AddressReport, settings: ConnectionSettings) -> str:
    a = probe.address
    stage, why = probe.login_stage_failed, probe.login_error
    if stage == "dns":
        return (
            f"bootstrap server {a}: the host name does not resolve from this machine ({why}); "
            "check the name, DNS or /etc/hosts"
        )
    if stage == "connect":
        if probe.tcp and all("refused" in r for r in probe.tcp.values()):
            return (
                f"bootstrap server {a}: connection refused; nothing listens on that port "
                "(wrong port, or the broker is down)"
            )
        return (
            f"bootstrap server {a}: cannot connect ({why}); a firewall may drop the "
            "traffic, or the host is down"
        )
    if stage == "tls":
        return f"bootstrap server {a}: TCP works but TLS fails ({why})"
    if stage == "api_versions":
        hint = (
            "; if this is a TLS listener, set security.protocol=SSL"
            if settings.ssl_context is None
            else ""
        )
        return (
            f"bootstrap server {a}: TCP works but it does not speak the Kafka protocol as "
            f"configured ({why}){hint}"
        )
    if stage == "authentication":
        return f"bootstrap server {a}: authentication failed ({why}); check the SASL settings"
    return f"bootstrap server {a}: {stage} failed ({why})"


def _explain_broker(probe: AddressReport, bootstrap: AddressReport) -> str:
    who = f"broker {probe.node_id} advertises {probe.address}"
    context = (
        f"; the bootstrap address {bootstrap.address} worked, so advertised.listeners is set "
        "for another network (clients here reach the bootstrap server but not the partition "
        "leaders)"
    )
    if probe.login_stage_failed == "dns":
        return (
            f"{who}, a name this machine cannot resolve ({probe.login_error})"
            + context
            + ", or this machine's DNS lacks the brokers' names"
        )
    if probe.login_stage_failed == "connect":
        return f"{who}, which this machine cannot reach ({probe.login_error})" + context
    return (
        f"{who}, which this machine reaches but cannot log in to "
        f"({probe.login_stage_failed}: {probe.login_error})"
    )


def render_text(report: DoctorReport) -> str:
    """The human-readable report."""
    lines: list[str] = []
    for probe in report.bootstrap:
        lines.append(f"bootstrap {probe.address}")
        lines += _probe_lines(probe)
    if report.cluster_id is not None:
        lines.append(
            f"cluster {report.cluster_id}, controller {report.controller_id}, "
            f"{len(report.brokers)} broker(s) advertised"
        )
    for probe in report.brokers:
        lines.append(f"broker {probe.node_id} at {probe.address}")
        lines += _probe_lines(probe)
    if report.group is not None:
        if report.coordinator is not None:
            c = report.coordinator
            lines.append(
                f"group {report.group!r}: coordinator is broker {c.node_id} at {c.address}"
                + (" (reachable)" if c.ok else " (NOT reachable)")
            )
        else:
            lines.append(f"group {report.group!r}: {report.coordinator_error}")
    lines.append("")
    if report.ok:
        lines.append("OK: every check passed.")
    else:
        lines.append(f"{len(report.problems)} problem(s) found:")
        lines += [f"  - {p}" for p in report.problems]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _probe_lines(probe: AddressReport) -> list[str]:
    out = []
    if probe.dns_error:
        out.append(f"  dns: FAILED ({probe.dns_error})")
        return out
    out.append(f"  dns: {', '.join(probe.dns)}")
    for ip, result in probe.tcp.items():
        out.append(f"  tcp {ip}: {result if result != 'ok' else 'ok'}")
    if probe.login_error:
        out.append(f"  kafka: FAILED at {probe.login_stage_failed} ({probe.login_error})")
    else:
        rtt = f", rtt {probe.rtt_ms:.2f} ms" if probe.rtt_ms is not None else ""
        out.append(f"  kafka: ok ({probe.api_versions} APIs{rtt})")
    return out
