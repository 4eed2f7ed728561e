"""One asyncio connection to one broker, driving the sans-IO :class:`KafkaProtocol`.

Setting up a connection walks the same stages a broker login does, and a failure names the
stage (:class:`~kcore.errors.BrokerConnectionError`): DNS (every address of the name with
``client.dns.lookup=use_all_dns_ips``), TCP connect, TLS, ApiVersions (the highest version both
sides support is used for every request after it), then SASL (SaslHandshake + SaslAuthenticate,
KIP-152). After that, requests are pipelined up to ``max_in_flight`` and matched to responses by
correlation id.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kcore._version import __version__
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    ProtocolError,
    SaslAuthenticationFailedError,
    UnsupportedVersionError,
    error_for_code,
)
from kcore.metrics import ClientMetrics, ConnectionCounters
from kcore.network.address import address_problem, format_address, resolve
from kcore.network.events import EarliestTimer
from kcore.protocol import ApiKey, KafkaProtocol, broker_versions, choose_version
from kcore.protocol.framing import PendingBody
from kcore.protocol.messages import (
    APIS,
    ApiVersionsRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)

__all__ = ["BrokerConnection", "ConnectionSettings", "SaslMechanismFactory"]

SOFTWARE_NAME = "kcore"
SOFTWARE_VERSION = __version__

# A callable making a fresh SASL mechanism object (see kcore.network.sasl) per connection.
SaslMechanismFactory = Callable[[], Any]


def loop_turn_pause(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """For work on another thread that must not hold ``loop`` up (PendingBody.decode's
    ``pause``): a call waits, without the GIL, until the loop has run a callback, so that the
    loop gets a turn however busy the machine (a timed release of the GIL alone does not ensure
    it); not for long if the loop is held up by something else."""
    turn = threading.Event()

    def pause() -> None:
        turn.clear()
        try:
            loop.call_soon_threadsafe(turn.set)
        except RuntimeError:  # the loop is closed: nobody to make way for
            return
        turn.wait(LOOP_TURN_WAIT_S)

    return pause


class _Expired(Exception):
    """Set on a request's waiter when request.timeout.ms has passed without an answer."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


class _Deadlines:
    """When each request in flight on a connection times out, on one EarliestTimer (a Produce
    request's answer usually comes in milliseconds: a timer made and cancelled for each was a
    cost of every request). A waiter still listed at its deadline gets ``_Expired``."""

    # A deadline this close counts as passed when the timer fires (the loop runs a timer up to
    # its clock's resolution early).
    SLACK_S = 0.001

    def __init__(self) -> None:
        self._deadlines: dict[asyncio.Future[Any], float] = {}
        self._timer = EarliestTimer(self._fire)

    def add(self, waiter: asyncio.Future[Any], timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        self._deadlines[waiter] = deadline
        self._timer.arm(deadline)

    def remove(self, waiter: asyncio.Future[Any]) -> None:
        # (the timer stays armed: when it fires with nothing due it re-arms for what is left)
        self._deadlines.pop(waiter, None)

    def clear(self) -> None:
        self._deadlines.clear()
        self._timer.cancel()

    def _fire(self) -> None:
        if not self._deadlines:
            return
        due = asyncio.get_running_loop().time() + self.SLACK_S
        for waiter, deadline in list(self._deadlines.items()):
            if deadline <= due:
                del self._deadlines[waiter]
                _expire(waiter)
        if self._deadlines:
            self._timer.arm(min(self._deadlines.values()))


class _Slots:
    """A connection's ``max.in.flight`` request slots, handed out in the order they were asked
    for. ``take_now`` is the synchronous half (a free slot with nobody waiting), so that a
    request can go out from a callback without a coroutine of its own."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: deque[asyncio.Future[None]] = deque()

    def free(self) -> bool:
        """Whether :meth:`take_now` would take one."""
        return self._free > 0 and not self._waiting

    def take_now(self) -> bool:
        if self.free():
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.take_now():
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed a slot just as the wait was cancelled: pass it on
            elif turn in self._waiting:  # (a release may have dropped it, cancelled, already)
                self._waiting.remove(turn)
            raise

    def release(self) -> None:
        # A freed slot goes straight to the first still waiting (never to a later take_now).
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1


# Response frames larger than this (of a response with a compiled decoder: a Metadata answer of
# some 10,000 partitions and up, 2 ms of decoding) are decoded on a worker thread, not on the
# event loop.
DECODE_OFF_LOOP_BYTES = 256 * 1024
# How long such a decoding waits at most for the loop to take its turn (see _decode_off_loop).
LOOP_TURN_WAIT_S = 0.01


@dataclass(frozen=True)
class ConnectionSettings:
    """What every connection of a client shares (built from its config by the cluster layer)."""

    client_id: str = "kcore"
    request_timeout_s: float = 30.0
    setup_timeout_s: float = 10.0
    max_in_flight: int = 5
    all_dns_ips: bool = True
    send_buffer_bytes: int = -1  # the OS default (autotuned); else SO_SNDBUF
    receive_buffer_bytes: int = 65536
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    sasl_factory: SaslMechanismFactory | None = None
    # Awaited before connecting and before logging in again, outside the setup timeout: an
    # OAUTHBEARER token source may be slow (HTTP), and that is not the broker's fault.
    sasl_prepare: Callable[[], Awaitable[None]] | None = None
    # The client's metrics (request count, bytes out and in), or None.
    metrics: ClientMetrics | None = None


Buffer = bytes | bytearray | memoryview
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 16


def _write_gathered(fd: int, buffers: list[Buffer]) -> list[Buffer]:
    """Write ``buffers`` to the non-blocking socket ``fd`` with ``writev`` for as long as it
    takes them; returns what is left (the first buffer sliced where the socket stopped).
    An error other than a full socket leaves the rest for the transport, which reports it."""
    while buffers:
        batch = buffers[:_IOV_MAX]
        try:
            written = os.writev(fd, batch)
        except (BlockingIOError, InterruptedError):
            return buffers
        except OSError:
            return buffers
        whole = 0
        for buffer in batch:
            size = buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
            if written < size:
                rest = memoryview(buffer)[written:] if written else buffer
                return [rest, *buffers[whole + 1 :]]
            written -= size
            whole += 1
        buffers = buffers[whole:]
    return buffers


class _Stream(asyncio.BufferedProtocol):
    """Bytes in and out of the transport; everything else happens in :class:`BrokerConnection`.
    The transport reads into the buffers the connection's protocol hands out (``recv_into``):
    a fetch response's bytes are written once, by the socket, where they are decoded from."""

    def __init__(self, owner: BrokerConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._pending: list[Buffer] = []
        self._fd = -1  # the socket, for gathering writes (plain TCP; TLS writes through SSL)
        self._reading: memoryview | None = None  # the buffer the transport is reading into

    def send(self, segments: list[Buffer]) -> None:
        """Queue a request's ``segments``; everything queued in one loop iteration goes out in
        one write (one system call for many pipelined requests)."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending += segments

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._fd < 0:  # TLS: one write of everything (its records are copied to encrypt)
            transport.write(memoryview(pending[0]) if len(pending) == 1 else b"".join(pending))
            return
        if not transport.get_write_buffer_size():
            # Nothing buffered in the transport, so the socket may be written directly: the
            # buffers as they are (a Produce request's batches are not copied into one frame,
            # nor into the transport's buffer unless the socket does not take them at once).
            pending = _write_gathered(self._fd, pending)
        # What the socket did not take goes through the transport, which buffers it until it
        # can be written (Python 3.11 copies it then) and reports a socket error.
        for buffer in pending:
            if transport.is_closing():  # (further writes would each log a warning)
                break
            transport.write(buffer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        plain = transport.get_extra_info("sslcontext") is None
        if sock is not None and plain and hasattr(os, "writev"):  # (not on Windows)
            self._fd = sock.fileno()

    def get_buffer(self, sizehint: int) -> memoryview:
        self._reading = self.owner._receive_buffer()
        return self._reading

    def buffer_updated(self, nbytes: int) -> None:
        reading, self._reading = self._reading, None
        assert reading is not None
        self.owner._buffer_updated(reading, nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        self.owner._lost(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def can_write(self) -> bool:
        """Whether the transport takes writes now (its buffer is below its high-water mark)."""
        return self._can_write.is_set()

    async def drain(self) -> None:
        await self._can_write.wait()


class BrokerConnection:
    """One connection to the broker at ``host:port`` (``node_id`` once known).

    Not thread-safe: use it from the event loop that opened it."""

    def __init__(
        self,
        host: str,
        port: int,
        settings: ConnectionSettings,
        *,
        node_id: int | None = None,
        counters: ConnectionCounters | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.settings = settings
        self.api_versions: dict[int, tuple[int, int]] = {}
        # Cluster-wide finalized feature levels from ApiVersions (v3+), e.g.
        # {"transaction.version": 2}; valid when finalized_features_epoch >= 0.
        self.finalized_features: dict[str, int] = {}
        self.finalized_features_epoch = -1
        self.connected_ip: str | None = None
        self.last_active = time.monotonic()
        self.session_lifetime_ms = 0
        # KIP-368: with a session lifetime from the broker (connections.max.reauth.ms), the
        # connection logs in again on itself before the session ends; meanwhile no new request
        # goes out (``_open`` cleared), answers to those in flight still come in.
        self._reauth_at: float | None = None
        self._reauth_task: asyncio.Task[None] | None = None
        self._open = asyncio.Event()
        self._open.set()
        self.reauthentications = 0
        self._proto = KafkaProtocol(settings.client_id, defer_decode_above=DECODE_OFF_LOOP_BYTES)
        self._stream: _Stream | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._deadlines = _Deadlines()
        self._slots = _Slots(max(1, settings.max_in_flight))
        # Awaited requests not written yet (waiting for a re-login, a slot or a throttle): while
        # there are any, can_send_now says no, so that a request sent at once never overtakes
        # one that was asked for first.
        self._unsent = 0
        self._closed_error: BaseException | None = None
        self._throttled_until = 0.0
        self._ready = False
        # The first bytes the peer sent: what a setup failure's hint judges the peer by.
        self._head = b""
        # Called when the broker's end goes away (not on close()): the cluster client then
        # refreshes its metadata, as Java's does on every disconnect (a broker gone, or
        # leadership moving with it), even with no request in flight to fail.
        self.on_lost: Callable[[], None] | None = None
        # The statistics' counters of this connection's key (None: statistics are off, and
        # nothing is counted here).
        self.counters = counters

    def __repr__(self) -> str:
        node = f"node {self.node_id} at " if self.node_id is not None else ""
        state = "ready" if self.is_ready else "closed" if self._closed_error else "new"
        return f"<BrokerConnection {node}{self.address} {state}>"

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def is_ready(self) -> bool:
        return self._ready and self._closed_error is None

    @property
    def in_flight(self) -> int:
        return len(self._waiters)

    # -- setup ----------------------------------------------------------------------------------

    async def open(self) -> BrokerConnection:
        """DNS, connect, TLS, ApiVersions and SASL, within ``setup_timeout_s`` for each
        address tried. Raises ``BrokerConnectionError`` naming the stage that failed, or
        ``SaslAuthenticationFailedError`` for rejected credentials (or a token that could not
        be got)."""
        await self._prepare_sasl()
        counters = self.counters
        if counters is not None:
            counters.connects += 1  # (librdkafka's: every attempt, failed ones too)
            counters.set_state("CONNECT")
        problem = address_problem(self.host, self.port)
        if problem is not None:  # (as an unknown host: Java's client logs it and goes on)
            raise BrokerConnectionError(self.address, "dns", f"cannot be dialled: {problem}")
        try:
            addresses = await asyncio.wait_for(
                resolve(self.host, self.port, all_ips=self.settings.all_dns_ips),
                self.settings.setup_timeout_s,
            )
        except Exception as exc:
            # (OSError from the resolver, UnicodeError from the IDNA codec, ValueError,
            # OverflowError for a port out of range: whatever a peer's name makes it raise)
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else _os_reason(exc)
            raise BrokerConnectionError(
                self.address, "dns", f"cannot resolve {self.host!r}: {reason}"
            ) from None
        last: BrokerConnectionError | None = None
        for ip, port in addresses:
            try:
                await self._connect(ip, port)
                break
            except BrokerConnectionError as exc:
                last = exc
        else:
            assert last is not None
            raise last
        try:
            await asyncio.wait_for(self._handshake(), self.settings.setup_timeout_s)
        except KcoreTimeoutError as exc:  # a request's own timeout (request.timeout.ms)
            self.close(exc)
            stage = "api_versions" if not self.api_versions else "authentication"
            raise BrokerConnectionError(self.address, stage, str(exc), transient=True) from None
        except asyncio.TimeoutError:
            self.close(KcoreTimeoutError("connection setup timed out"))
            raise BrokerConnectionError(
                self.address,
                "api_versions" if not self.api_versions else "authentication",
                f"no answer within {self.settings.setup_timeout_s:g}s "
                "(socket.connection.setup.timeout.ms); is this a Kafka listener, and does its "
                "security.protocol match?",
                transient=True,
            ) from None
        except BaseException:
            self.close(KcoreError("connection setup failed"))
            raise
        self._ready = True
        if counters is not None:
            counters.set_state("UP")
        return self

    async def _connect(self, ip: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        # Name the IP only when the host is a name (one of several addresses may have failed).
        where = "" if ip == self.host else f"{format_address(ip, port)}: "
        ctx = self.settings.ssl_context
        try:
            _, stream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Stream(self),
                    ip,
                    port,
                    ssl=ctx,
                    server_hostname=self.host if ctx is not None else None,
                    ssl_handshake_timeout=self.settings.setup_timeout_s if ctx else None,
                ),
                self.settings.setup_timeout_s,
            )
        except asyncio.TimeoutError:
            raise BrokerConnectionError(
                self.address,
                "connect",
                f"{where}no answer within {self.settings.setup_timeout_s:g}s "
                "(socket.connection.setup.timeout.ms)",
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise BrokerConnectionError(
                self.address,
                "tls",
                f"the broker's certificate is not trusted: {exc.verify_message}",
            ) from None
        except ssl.SSLError as exc:
            raise BrokerConnectionError(
                self.address, "tls", f"TLS handshake failed: {exc.reason or exc}"
            ) from None
        except OSError as exc:
            stage = "connect"
            if ctx is not None and isinstance(exc, ConnectionResetError | BrokenPipeError):
                stage = "tls"  # the TCP connect worked; the peer hung up during the handshake
            reason = f"{where}{_os_reason(exc)}"
            if stage == "tls":
                reason += " during the handshake (a broker restarting, or not a TLS listener?)"
            raise BrokerConnectionError(
                self.address, stage, reason, transient=stage == "tls"
            ) from None
        except Exception as exc:
            # Whatever dialling an address raises (OverflowError, ValueError, UnicodeError)
            # makes it unreachable, like a refused one.
            raise BrokerConnectionError(
                self.address, "connect", f"{where}{_os_reason(exc)}"
            ) from None
        self._stream = stream
        self.connected_ip = ip
        sock = stream.transport.get_extra_info("socket") if stream.transport else None
        if sock is not None:
            for opt, size in (
                (socket.SO_SNDBUF, self.settings.send_buffer_bytes),
                (socket.SO_RCVBUF, self.settings.receive_buffer_bytes),
            ):
                if size > 0:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, opt, size)
                    except OSError:  # the peer already hung up; ApiVersions will say so
                        break

    async def _prepare_sasl(self) -> None:
        """``sasl_prepare`` (an OAUTHBEARER token fetched if due), bounded by
        ``request_timeout_s``: a token source that never answers fails the connection instead
        of holding it up."""
        prepare = self.settings.sasl_prepare
        if prepare is None:
            return
        timeout = self.settings.request_timeout_s
        try:
            await asyncio.wait_for(prepare(), timeout)
        except asyncio.TimeoutError:
            raise BrokerConnectionError(
                self.address,
                "authentication",
                f"no SASL token within {timeout:g}s (request.timeout.ms): the token source "
                "(oauth_cb or the token endpoint) did not answer",
                transient=True,
            ) from None

    async def _handshake(self) -> None:
        await self._negotiate_versions()
        if self.settings.sasl_factory is not None:
            await self._authenticate()

    async def _negotiate_versions(self) -> None:
        version = APIS[ApiKey.API_VERSIONS].max_stable_version
        assert version is not None
        request = ApiVersionsRequest(
            client_software_name=SOFTWARE_NAME, client_software_version=SOFTWARE_VERSION
        )
        try:
            response = await self._call(request, version)
            if response.error_code == ErrorCode.UNSUPPORTED_VERSION and version > 0:
                # KIP-511: the broker answered in v0 with the ApiVersions versions it supports;
                # a broker before 2.4 lists none: v0 then, as Java's NetworkClient falls back.
                theirs = broker_versions(response).get(ApiKey.API_VERSIONS, (0, 0))
                response = await self._call(request, min(version, theirs[1]))
        except (BrokerConnectionError, ProtocolError) as exc:
            reason = exc.reason if isinstance(exc, BrokerConnectionError) else str(exc)
            head = self._head
            size = int.from_bytes(head[:4], "big", signed=True) if len(head) >= 4 else None
            bad_size = size is not None and not 4 <= size <= self._proto.max_frame_size
            if head.startswith(b"HTTP"):  # b"HTTP" read as a frame size: not a Kafka port
                hint = " (the peer answered in HTTP: an HTTP server or proxy, not a Kafka broker)"
            elif head[:2] in (b"\x15\x03", b"\x16\x03") and self.settings.ssl_context is None:
                # A TLS alert or handshake record (content type 21 or 22, version 3.x).
                hint = (
                    " (the peer answered with a TLS record: a TLS listener; check "
                    "security.protocol)"
                )
            elif bad_size:
                hint = (
                    f" (the peer sent an impossible frame size, {size}: not a Kafka broker, or a "
                    "broken one)"
                )
            elif self.settings.ssl_context is None:
                hint = (
                    " (a TLS listener drops plaintext clients like this; check security.protocol)"
                )
            else:
                hint = (
                    " (after a TLS handshake this is how a broker turns away a client whose "
                    "certificate it does not accept, e.g. none given where ssl.client.auth="
                    "required; check ssl.keystore.location / ssl.certificate.location)"
                )
            raise BrokerConnectionError(self.address, "api_versions", reason + hint) from None
        if response.error_code != ErrorCode.NONE:
            err = error_for_code(response.error_code) or UnsupportedVersionError()
            raise BrokerConnectionError(self.address, "api_versions", str(err))
        self.api_versions = broker_versions(response)
        self.finalized_features_epoch = getattr(response, "finalized_features_epoch", -1)
        self.finalized_features = {
            f.name: f.max_version_level for f in getattr(response, "finalized_features", None) or ()
        }

    async def _authenticate(self) -> None:
        factory = self.settings.sasl_factory
        assert factory is not None
        mechanism = factory()
        if inspect.isawaitable(mechanism):  # OAUTHBEARER: the token may need fetching first
            mechanism = await mechanism
        name = mechanism.name
        try:
            handshake = await self._call(
                SaslHandshakeRequest(mechanism=name),
                self.version_for(ApiKey.SASL_HANDSHAKE, max_version=1),
                auth=True,
            )
        except BrokerConnectionError as exc:
            raise BrokerConnectionError(
                self.address,
                "authentication",
                f"{exc.reason} (is this listener SASL? check security.protocol)",
                transient=True,
            ) from None
        if handshake.error_code == ErrorCode.ILLEGAL_SASL_STATE:
            raise BrokerConnectionError(
                self.address,
                "authentication",
                "this listener does not do SASL (check security.protocol)",
            )
        if handshake.error_code != ErrorCode.NONE:
            enabled = ", ".join(handshake.mechanisms) or "none"
            raise BrokerConnectionError(
                self.address,
                "authentication",
                f"the broker does not enable SASL mechanism {name} (enabled: {enabled})",
            )
        version = self.version_for(ApiKey.SASL_AUTHENTICATE)
        token: bytes | None = mechanism.initial_response()
        while token is not None:
            try:
                response = await self._call(
                    SaslAuthenticateRequest(auth_bytes=token), version, auth=True
                )
            except BrokerConnectionError as exc:
                # The stage that failed is the login, whatever broke the connection; as a
                # connection failure it is retried (transient), not taken for a rejection.
                raise BrokerConnectionError(
                    self.address,
                    "authentication",
                    f"SASL {name}: {exc.reason}",
                    transient=True,
                ) from None
            token = None  # PLAIN's token holds the password: keep it out of traceback frames
            if response.error_code != ErrorCode.NONE:
                err = error_for_code(response.error_code)
                text = response.error_message or (err.message if err else "")
                server_error = getattr(mechanism, "server_error", None)
                if server_error:  # OAUTHBEARER: the broker's reason, as RFC 7628 JSON
                    reason = text if server_error in text else f"{text} {server_error}".strip()
                    text = f"the broker rejected the token: {reason}"
                if isinstance(err, SaslAuthenticationFailedError) or err is None:
                    raise SaslAuthenticationFailedError(f"{self.address}: SASL {name}: {text}")
                raise err.with_message(f"{self.address}: SASL {name}: {text}")
            self.session_lifetime_ms = response.session_lifetime_ms
            if getattr(mechanism, "complete", False):
                break
            try:
                token = mechanism.step(bytes(response.auth_bytes))
            except KafkaError as exc:
                raise exc.with_message(f"{self.address}: {exc.message}") from None
        self._reauth_at = None
        if self.session_lifetime_ms > 0:
            # As Java: at 85-95% of the session (spread so that a client's connections do not
            # all log in again at once).
            lifetime_s = self.session_lifetime_ms / 1000
            self._reauth_at = time.monotonic() + lifetime_s * random.uniform(0.85, 0.95)

    async def _reauthenticate(self) -> None:
        """Log in again on this connection (KIP-368), once for every request waiting on it.
        A failure closes the connection and is raised to each of them."""
        if self._reauth_task is None:
            self._reauth_task = asyncio.get_running_loop().create_task(self._run_reauth())
        await asyncio.shield(self._reauth_task)

    async def _run_reauth(self) -> None:
        try:
            # A token fetched (if due) before the exchange starts: requests already sent are
            # answered meanwhile.
            await self._prepare_sasl()
            self._open.clear()
            await self._authenticate()
            self.reauthentications += 1
        except BaseException as exc:
            self.close(exc if isinstance(exc, Exception) else KcoreError("re-login cancelled"))
            if isinstance(exc, BrokerConnectionError | KafkaError):
                raise
            raise BrokerConnectionError(
                self.address, "authentication", f"logging in again failed: {exc!r}"
            ) from exc
        finally:
            self._reauth_task = None
            self._open.set()

    # -- requests -------------------------------------------------------------------------------

    def version_for(self, api_key: int, **limits: Any) -> int:
        """The highest version of ``api_key`` kcore and this broker both support."""
        return choose_version(api_key, self.api_versions, **limits)

    async def request(
        self,
        request: Any,
        version: int | None = None,
        *,
        timeout: float | None = None,
        expect_response: bool | None = None,
    ) -> Any:
        """Send ``request`` (at ``version``, else the negotiated one) and return the response
        body, or ``None`` for a request the broker does not answer (acks=0 produce).

        Raises ``BrokerConnectionError`` if the connection is or goes down, and
        ``KcoreTimeoutError`` after ``timeout`` (default: ``request.timeout.ms``), which also
        closes the connection, as the Java client does: its byte stream is no longer trusted."""
        if not self.is_ready:
            raise self._down_error()
        if self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            self._unsent += 1  # (_call counts it from here on)
            try:
                await self._reauthenticate()
            finally:
                self._unsent -= 1
        if version is None:
            version = self.version_for(request.API_KEY)
        return await self._call(
            request, version, timeout=timeout, expect_response=expect_response, throttle=True
        )

    async def _call(
        self,
        request: Any,
        version: int,
        *,
        timeout: float | None = None,
        expect_response: bool | None = None,
        throttle: bool = False,
        auth: bool = False,
    ) -> Any:
        """One request. ``auth``: a step of a (re-)login, which goes out at once; any other
        request waits while the connection logs in again, and for one of the
        ``max.in.flight`` slots."""
        if auth:
            return await self._send_and_wait(request, version, timeout, expect_response)
        self._unsent += 1  # until it is written (no await between the count's end and that)
        slot = False
        try:
            while True:
                await self._open.wait()
                await self._slots.take()
                if self._open.is_set():
                    break
                self._slots.release()  # a re-login began meanwhile: not between its steps
            slot = True
            # KIP-219: after a response with throttle_time_ms the broker expects nothing more
            # on this connection until then; checked once a slot is ours, so requests queued
            # for a slot wait too.
            while throttle and (delay := self._throttled_until - time.monotonic()) > 0:
                await asyncio.sleep(delay)
        except BaseException:
            if slot:
                self._slots.release()
            raise
        finally:
            self._unsent -= 1
        try:
            return await self._send_and_wait(request, version, timeout, expect_response)
        finally:
            self._slots.release()

    async def _send_and_wait(
        self,
        request: Any,
        version: int,
        timeout: float | None,
        expect_response: bool | None,
    ) -> Any:
        stream = self._stream
        correlation_id, waiter, sent_at = self._write(request, version, expect_response)
        assert stream is not None  # (_write raised otherwise)
        await stream.drain()
        if waiter is None:
            return None
        limit = self.settings.request_timeout_s if timeout is None else timeout
        # A deadline on the waiter itself rather than asyncio.wait_for, which hands the answer
        # over through a future of its own: one turn of the loop more for every request.
        self._deadlines.add(waiter, limit)
        try:
            await waiter
        except _Expired:
            pass  # (_answer raises the timeout)
        finally:
            self._deadlines.remove(waiter)
        return self._answer(request.API_KEY, correlation_id, waiter, limit, sent_at)

    def can_send_now(self) -> bool:
        """Whether a request would go out at once (:meth:`send_now`): the connection ready,
        no re-login due or under way, no awaited request still to be written, a
        ``max.in.flight`` slot free, no throttle pending, its socket taking writes. Nothing
        but the loop's callbacks changes that, except the re-login clock, which only this
        reads: a request built right after a yes goes out even if the clock passes meanwhile
        (a re-login falls due at 85-95% of the session, which leaves room for it)."""
        return self._takes_requests() and (
            self._reauth_at is None or time.monotonic() < self._reauth_at
        )

    def _takes_requests(self) -> bool:
        stream = self._stream
        return (
            self._unsent == 0
            and self.is_ready
            and self._reauth_task is None
            and self._open.is_set()
            and self._slots.free()
            and stream is not None
            and stream.can_write()
            and self._throttled_until <= time.monotonic()
        )

    def send_now(
        self,
        request: Any,
        version: int,
        on_answer: Callable[[Any, BaseException | None], None],
    ) -> bool:
        """Send ``request`` now, from the caller's turn of the loop, if it can go at once (see
        :meth:`can_send_now`, whose yes holds until the caller's turn ends).
        Then ``on_answer(body, None)`` or ``on_answer(None, error)`` is called from the loop
        once it is answered or fails (with the errors of :meth:`request`), and True is
        returned; else nothing is sent and False is returned (use :meth:`request`). For
        requests that are answered (not an acks=0 Produce). One that cannot be encoded raises
        here, with nothing sent."""
        if not self._takes_requests() or not self._slots.take_now():
            return False
        try:
            correlation_id, waiter, sent_at = self._write(request, version, True)
        except BaseException:
            self._slots.release()
            raise
        assert waiter is not None
        # (the request is not kept until its answer: it holds a Produce request's batches)
        api_key = request.API_KEY
        limit = self.settings.request_timeout_s

        def answered(waiter: asyncio.Future[Any]) -> None:
            self._slots.release()
            self._deadlines.remove(waiter)
            if waiter.cancelled():  # (nothing cancels it but an event loop going away)
                on_answer(None, self._down_error())
                return
            try:
                body = self._answer(api_key, correlation_id, waiter, limit, sent_at)
            except Exception as exc:
                on_answer(None, exc)
                return
            on_answer(body, None)

        self._deadlines.add(waiter, limit)
        waiter.add_done_callback(answered)
        return True

    def _write(
        self, request: Any, version: int, expect_response: bool | None
    ) -> tuple[int, asyncio.Future[Any] | None, float]:
        """Frame ``request`` and queue it on the stream: its correlation id, the future its
        answer is handed to (None if the broker will not answer) and when it went out."""
        stream = self._stream
        counters = self.counters
        if stream is None or stream.transport is None or self._closed_error is not None:
            if counters is not None:
                counters.txerrs += 1
            raise self._down_error()
        correlation_id, segments = self._proto.send_request_segments(
            request, version, expect_response=expect_response
        )
        waiter: asyncio.Future[Any] | None = None
        if correlation_id in self._proto._in_flight:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[correlation_id] = waiter
        sent_at = self.last_active = time.monotonic()
        metrics = self.settings.metrics
        if metrics is not None or counters is not None:
            nbytes = sum(len(s) for s in segments)
            if metrics is not None:
                metrics.record_all(("request", 1.0), ("outgoing-byte", nbytes))
            if counters is not None:
                counters.sent(APIS[request.API_KEY].name, nbytes)
        stream.send(segments)
        return correlation_id, waiter, sent_at

    def _answer(
        self,
        api_key: int,
        correlation_id: int,
        waiter: asyncio.Future[Any],
        limit: float,
        sent_at: float,
    ) -> Any:
        """The body a finished ``waiter`` was handed, or its error raised: a request past its
        deadline closes the connection (its byte stream is no longer trusted) and raises
        ``KcoreTimeoutError``. Counts the answer, and keeps a throttle it asks for."""
        counters = self.counters
        error = waiter.exception()  # (raises CancelledError for a cancelled one)
        if isinstance(error, _Expired):
            self._proto.forget(correlation_id)
            self._waiters.pop(correlation_id, None)
            api = APIS[api_key].name
            if counters is not None:
                counters.req_timeouts += 1
            timed_out = KcoreTimeoutError(
                f"{self.address}: no response to {api} within {limit:g}s "
                "(request.timeout.ms); the connection is closed"
            )
            self.close(timed_out)
            raise timed_out
        if error is not None:
            raise error
        body = waiter.result()
        throttle_ms = getattr(body, "throttle_time_ms", 0) or 0
        if counters is not None:
            counters.answered(time.monotonic() - sent_at, throttle_ms)
        if throttle_ms > 0:
            self._throttled_until = max(
                self._throttled_until, time.monotonic() + throttle_ms / 1000
            )
        return body

    # -- events from the stream -----------------------------------------------------------------

    def _receive_buffer(self) -> memoryview:
        """Where the transport puts the next bytes it reads (the protocol's buffer)."""
        return self._proto.get_buffer()

    def _buffer_updated(self, buffer: memoryview, nbytes: int) -> None:
        """``nbytes`` were read into the start of ``buffer`` (from :meth:`_receive_buffer`)."""
        self.last_active = time.monotonic()
        if len(self._head) < 4:
            self._head += bytes(buffer[: min(nbytes, 4 - len(self._head))])
        if self.settings.metrics is not None:
            self.settings.metrics.record("incoming-byte", nbytes)
        if self.counters is not None:
            self.counters.rxbytes += nbytes
        try:
            responses = self._proto.buffer_updated(nbytes)
        except ProtocolError as exc:
            if self.counters is not None:
                self.counters.rxerrs += 1
            self.close(exc)
            return
        self._deliver(responses)

    def _deliver(self, responses: list[Any]) -> None:
        for response in responses:
            if type(response.body) is PendingBody:
                self._decode_off_loop(response.body)
                continue
            waiter = self._waiters.pop(response.correlation_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(response.body)

    def _decode_off_loop(self, pending: PendingBody) -> None:
        """Decode a large response (a 100,000-partition Metadata answer: tens of milliseconds)
        on a worker thread, which lets the loop run meanwhile (see PendingBody), then hand it
        to its waiter here. Its waiter stays listed meanwhile, so that a connection closed
        meanwhile fails it; one that does not parse closes the connection, as in
        ``_data_received``."""

        def done(decoding: asyncio.Future[Any]) -> None:
            waiter = self._waiters.pop(pending.correlation_id, None)
            if decoding.cancelled():
                return
            error = decoding.exception()
            if isinstance(error, ProtocolError):
                if self.counters is not None:
                    self.counters.rxerrs += 1
                self.close(error)
            elif error is not None:
                if waiter is not None and not waiter.done():
                    waiter.set_exception(error)
            elif waiter is not None and not waiter.done():
                waiter.set_result(decoding.result())

        loop = asyncio.get_running_loop()
        pause = loop_turn_pause(loop)
        loop.run_in_executor(None, pending.decode, pause).add_done_callback(done)

    def _lost(self, exc: Exception | None) -> None:
        if self._closed_error is None:
            if self.counters is not None and self._ready:
                self.counters.disconnects += 1  # (the peer's or the network's doing only)
            reason = _os_reason(exc) if isinstance(exc, OSError) else str(exc or "")
            self._fail(
                BrokerConnectionError(
                    self.address,
                    "io",
                    f"the broker closed the connection{': ' + reason if reason else ''}",
                )
            )
            if self.on_lost is not None:
                self.on_lost()

    def _down_error(self) -> BaseException:
        err = self._closed_error
        if isinstance(err, BrokerConnectionError):
            return err
        return BrokerConnectionError(
            self.address, "io", f"the connection is closed{f' ({err})' if err else ''}"
        )

    def _fail(self, error: BaseException) -> None:
        if self.counters is not None:
            self.counters.set_state("DOWN")
        self._closed_error = error
        self._ready = False
        waiters, self._waiters = self._waiters, {}
        self._deadlines.clear()
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_exception(self._down_error())

    def close(self, error: BaseException | None = None) -> None:
        """Close the socket; requests in flight fail with ``BrokerConnectionError``."""
        if self._closed_error is None:
            self._fail(error or KcoreError("closed by the client"))
        stream, self._stream = self._stream, None
        if stream is not None and stream.transport is not None:
            stream.transport.abort()


def _os_reason(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower() if exc.strerror[0].isupper() else exc.strerror
    if not isinstance(exc, OSError) and str(exc):
        return f"{type(exc).__name__}: {exc}"  # (a ValueError's text alone says little)
    return str(exc) or type(exc).__name__
