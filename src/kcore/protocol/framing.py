"""Sans-IO request/response framing for the Kafka wire protocol (in the manner of h11).

:class:`KafkaProtocol` owns no socket. The caller hands it request objects and gets bytes to
write; it hands it whatever bytes arrived and gets the decoded responses back::

    proto = KafkaProtocol(client_id="my-app")
    correlation_id, data = proto.send_request(MetadataRequest(topics=None), 12)
    sock.sendall(data)
    for response in proto.receive_data(sock.recv(65536)):
        print(response.correlation_id, response.body)

Framing: every request and response is an int32 size followed by that many bytes. A request is
a request header (v2 when the request's version is flexible, v1 otherwise; the client id is
always an int16-length string) then the body. A response is a response header (v1 when the
response's version is flexible, v0 otherwise, and v0 for every ``ApiVersionsResponse``, so that
a client can read the answer of a broker that does not know the version it asked for) then the
body. Responses carry only the correlation id; the API key and version come from the matching
request in flight.
"""

from __future__ import annotations

import gc
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from kcore.codec import receive_buffer
from kcore.errors import KcoreError, ProtocolError, UnsupportedVersionError
from kcore.protocol._decoders import DECODERS as _COMPILED_DECODERS
from kcore.protocol.messages import APIS, ApiKey, response_class
from kcore.protocol.messages.response_header import ResponseHeader
from kcore.protocol.types import FrameBuffer, Message, check_version

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "InFlight",
    "KafkaProtocol",
    "PendingBody",
    "Response",
    "broker_versions",
    "choose_version",
    "negotiate_versions",
    "request_header_version",
    "response_header_version",
    "use_compiled_decoders",
]

# A corrupt size field must not make us buffer gigabytes; real responses are far smaller (the
# broker's fetch.max.bytes defaults to 55 MiB).
DEFAULT_MAX_FRAME_SIZE = 256 * 1024 * 1024

# Reads land in a scratch buffer of this size; a frame bigger than it gets a buffer of its own.
SCRATCH_SIZE = 64 * 1024
_EMPTY = memoryview(b"")

_SIZE = struct.Struct(">i")
_HEADER_V1 = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_INT32_MAX = 0x7FFFFFFF


# Response class -> its compiled decoder (kcore.protocol._decoders, generated with the classes):
# the same objects as ``cls.decode``, faster. Responses not listed use ``cls.decode``.
_decoders: dict[type[Any], Callable[[Any, int, int], tuple[Any, int]]] = dict(_COMPILED_DECODERS)


def use_compiled_decoders(enabled: bool) -> bool:
    """Decode the responses that have a compiled decoder with it (the default) or, with
    ``enabled=False``, with their Python classes (the reference, for comparisons); returns the
    previous setting. Process-wide."""
    before = bool(_decoders)
    _decoders.clear()
    if enabled:
        _decoders.update(_COMPILED_DECODERS)
    return before


def _is_flexible(api_key: int, version: int) -> bool:
    first = APIS[api_key].flexible_versions
    return first is not None and version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header version for a request: 2 (with tagged fields) when flexible, else 1."""
    return 2 if _is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version: 1 when flexible, else 0; always 0 for ApiVersions (KIP-511:
    the client must be able to read the reply of a broker that rejects the version)."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if _is_flexible(api_key, api_version) else 0


class Response(NamedTuple):
    """A decoded response, matched to the request that asked for it."""

    correlation_id: int
    api_key: int
    api_version: int  # the version the body was decoded with
    body: Any  # the generated response class instance, e.g. MetadataResponse


# A body decoded off the caller's thread (PendingBody.decode) pauses for other threads after
# about this many array elements: a tenth of a millisecond of decoding.
PAUSE_EVERY = 1024


class PendingBody:
    """The body of a response too large to decode in :meth:`KafkaProtocol.receive_data`
    (see ``defer_decode_above``): :meth:`decode` it, from any thread. A compiled decoder run
    so lets other threads (the caller's event loop) run while it works."""

    __slots__ = ("_frame", "_pos", "_cls", "_api_key", "_version", "correlation_id", "size")

    def __init__(
        self,
        frame: bytes | memoryview,
        pos: int,
        cls: type[Message],
        api_key: int,
        version: int,
        correlation_id: int,
    ) -> None:
        self._frame = frame
        self._pos = pos
        self._cls = cls
        self._api_key = api_key
        self._version = version
        self.correlation_id = correlation_id
        self.size = len(frame)

    def decode(self, pause: Callable[[], object] | None = None) -> Any:
        """The decoded body; ``ProtocolError`` if it does not parse (as ``receive_data``
        would raise: the connection's byte stream is then not to be trusted). ``pause`` is
        called every ``PAUSE_EVERY`` array elements and returns once the thread the decoding
        must not hold up has had a turn (without one, the decoder only sleeps a moment without
        the GIL then)."""
        frame, self._frame = self._frame, b""  # decoded once; the frame is freed with it
        # No collection while decoding: the compiled decoders' objects are untracked (see
        # _decode_runtime.pxi), yet each counts as an allocation, so the hundreds of thousands
        # of a large answer would set off hundreds of collections, and now and then a full
        # one, on this thread with the GIL held (tens of milliseconds the loop waits).
        _GC_PAUSE.enter()
        try:
            body, _ = KafkaProtocol._decode_checked(
                self._cls,
                frame,
                self._pos,
                self._api_key,
                self._version,
                self.correlation_id,
                PAUSE_EVERY,
                pause,
            )
        finally:
            _GC_PAUSE.leave()
        return body


class _GcPause:
    """Collection off while at least one large answer is being decoded (on any thread), and
    back as it was before the first of them once the last is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decoding = 0
        self._was_enabled = False

    def enter(self) -> None:
        with self._lock:
            if self._decoding == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._decoding += 1

    def leave(self) -> None:
        with self._lock:
            self._decoding -= 1
            if self._decoding == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GcPause()


class InFlight(NamedTuple):
    """What the protocol remembers about a request that is waiting for its response."""

    api_key: int
    api_version: int
    response_class: type[Message]


class KafkaProtocol:
    """One connection's request/response state: correlation ids, the requests in flight and
    the receive buffer. Not thread-safe; use one per connection.

    After :meth:`receive_data` raises :class:`~kcore.errors.ProtocolError` the byte stream can
    no longer be trusted: close the connection and fail the requests in :attr:`in_flight`.
    """

    def __init__(
        self,
        client_id: str | None = None,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        defer_decode_above: int | None = None,
    ) -> None:
        """``defer_decode_above``: a response frame larger than this many bytes, of a response
        with a compiled decoder, is not decoded by :meth:`receive_data`: its ``body`` is a
        :class:`PendingBody` for the caller to decode (on a worker thread, say)."""
        self.client_id = client_id
        self.max_frame_size = max_frame_size
        self.defer_decode_above = defer_decode_above
        self._next_correlation_id = 0
        self._in_flight: dict[int, InFlight] = {}
        # Received bytes land in the scratch buffer (``_start``..``_end`` not yet taken), except
        # within a frame bigger than it, which is read straight into a buffer of its own
        # (``_big_frame``, filled up to ``_frame_filled``).
        self._scratch = bytearray(SCRATCH_SIZE)
        self._scratch_view = memoryview(self._scratch)
        self._start = self._end = 0
        self._big_frame: Any = None
        self._frame_view = _EMPTY
        self._frame_filled = 0
        self._pending_error: ProtocolError | None = None
        # The request header after (api key, version, correlation id) never changes: the
        # client id as an int16-length nullable string, always non-compact (even in header v2).
        if client_id is None:
            self._client_id_bytes = b""
            self._client_id_len = -1
        else:
            self._client_id_bytes = client_id.encode("utf-8")
            self._client_id_len = len(self._client_id_bytes)
            if self._client_id_len > 0x7FFF:
                raise ValueError("client_id is longer than 32767 bytes")

    # -- sending --------------------------------------------------------------------------------

    def send_request(
        self, request: Message, api_version: int, *, expect_response: bool | None = None
    ) -> tuple[int, bytearray]:
        """Frame ``request`` at ``api_version``; return ``(correlation_id, bytes to send)``
        (the buffer it was encoded into: a Produce request's megabytes are not copied again).

        ``expect_response``: whether the broker will answer. By default it does, except for a
        ProduceRequest with ``acks == 0``. Requests that get no answer are not kept in flight.
        Raises ``UnsupportedVersionError`` if the request class lacks ``api_version``.
        """
        correlation_id, out = self._frame(request, api_version, expect_response, bytearray(4))
        return correlation_id, out

    def send_request_segments(
        self, request: Message, api_version: int, *, expect_response: bool | None = None
    ) -> tuple[int, list[bytes | bytearray | memoryview]]:
        """As :meth:`send_request`, the frame as buffers to write one after the other: large
        records fields (a Produce request's batches) are not copied into the frame but listed
        as they are, for a gathering write (``os.writev``)."""
        correlation_id, out = self._frame(request, api_version, expect_response, FrameBuffer(4))
        if not out.splices:
            return correlation_id, [out]
        view = memoryview(out)
        segments: list[bytes | bytearray | memoryview] = []
        start = 0
        for position, records in out.splices:
            segments.append(view[start:position])
            segments.append(records)
            start = position
        segments.append(view[start:])
        return correlation_id, segments

    def _frame(
        self, request: Message, api_version: int, expect_response: bool | None, out: Any
    ) -> tuple[int, Any]:
        api_key = request.API_KEY
        info = APIS.get(api_key) if api_key is not None else None
        if api_key is None or info is None or info.request != request.NAME:  # e.g. a response
            raise TypeError(f"{type(request).__name__} is not a request message")
        check_version(type(request), api_version)
        if expect_response is None:
            expect_response = not (api_key == ApiKey.PRODUCE and getattr(request, "acks", 1) == 0)
        correlation_id = self._next_correlation_id
        # out: 4 bytes for the size, filled in below
        out += _HEADER_V1.pack(api_key, api_version, correlation_id, self._client_id_len)
        out += self._client_id_bytes
        if request_header_version(api_key, api_version) >= 2:
            out.append(0)  # no tagged fields in the header
        request.encode_into(out, api_version)  # raises before any state changes
        size = len(out) - 4
        if type(out) is FrameBuffer:
            size += sum(len(records) for _, records in out.splices)
        _SIZE.pack_into(out, 0, size)
        self._next_correlation_id = 0 if correlation_id == _INT32_MAX else correlation_id + 1
        if expect_response:
            self._in_flight[correlation_id] = InFlight(
                api_key, api_version, response_class(api_key)
            )
        return correlation_id, out

    @property
    def in_flight(self) -> Mapping[int, InFlight]:
        """Requests sent and not yet answered, by correlation id (read-only view)."""
        return dict(self._in_flight)

    def forget(self, correlation_id: int) -> None:
        """Stop waiting for a response (e.g. the request timed out). A response that arrives
        for it later is a ``ProtocolError``, like any unknown correlation id."""
        self._in_flight.pop(correlation_id, None)

    # -- receiving ------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes from the peer go (``asyncio.BufferedProtocol.get_buffer``):
        write them there, then call :meth:`buffer_updated` with their count.

        Within a frame larger than the scratch buffer this is the rest of that frame's own
        buffer, so a big fetch response goes from the socket straight to where its records
        are decoded from, never copied in between."""
        if self._big_frame is not None:
            return self._frame_view[self._frame_filled :]
        return self._scratch_view[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Response]:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`; returns every
        response they complete, in arrival order (errors as :meth:`receive_data`)."""
        if self._pending_error is not None:
            raise self._pending_error
        responses: list[Response] = []
        try:
            if self._big_frame is not None:
                self._frame_filled += nbytes
                if self._frame_filled < len(self._frame_view):
                    return responses
                frame, self._big_frame = self._frame_view, None
                self._frame_view = _EMPTY
                responses.append(self._decode_frame(frame))
            else:
                self._end += nbytes
            self._take_frames(responses)
        except ProtocolError as exc:
            self._pending_error = exc  # the stream is out of step from here on
            if not responses:
                raise
        return responses

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Response]:
        """Buffer ``data`` and return every response it completes, in arrival order (for a
        caller that reads into buffers of its own; :meth:`get_buffer` and
        :meth:`buffer_updated` save the copy).

        Raises ``ProtocolError`` for a bad frame size, a correlation id that is not in flight,
        or a body that does not parse. If good responses precede the bad frame in the same
        call they are returned first and the error is raised by the next call.
        """
        if self._pending_error is not None:
            raise self._pending_error
        with memoryview(data) as whole:
            view = whole.cast("B") if whole.format != "B" or whole.ndim != 1 else whole
            responses: list[Response] = []
            pos, size = 0, view.nbytes
            while pos < size:
                target = self.get_buffer()
                n = min(target.nbytes, size - pos)
                target[:n] = view[pos : pos + n]
                pos += n
                try:
                    responses += self.buffer_updated(n)
                except ProtocolError:
                    if responses:
                        return responses  # the error is pending: the next call raises it
                    raise
                if self._pending_error is not None:
                    break
            return responses

    def _take_frames(self, responses: list[Response]) -> None:
        """Every whole frame in the scratch buffer, decoded into ``responses``; a frame too big
        for it moves to a buffer of its own (what it has of it copied there), which the
        following reads fill directly."""
        buf, view = self._scratch, self._scratch_view
        start, end = self._start, self._end
        try:
            while end - start >= 4:
                (size,) = _SIZE.unpack_from(buf, start)
                if size < 4 or size > self.max_frame_size:
                    raise ProtocolError(f"response frame size {size} is out of range")
                if 4 + size <= end - start:
                    # Copied out: records decode as views into the frame, which must outlive
                    # the scratch buffer's next use (a small frame: a small copy).
                    frame = bytes(view[start + 4 : start + 4 + size])
                    start += 4 + size
                    responses.append(self._decode_frame(frame))
                    continue
                if 4 + size > len(buf):
                    self._big_frame = receive_buffer(size)
                    self._frame_view = memoryview(self._big_frame)
                    have = end - start - 4
                    self._frame_view[:have] = view[start + 4 : end]
                    self._frame_filled = have
                    start = end
                break
        finally:
            # What is left (the start of a frame that fits) moves to the front for the next read.
            if start == end:
                start = end = 0
            elif start:
                buf[: end - start] = buf[start:end]
                start, end = 0, end - start
            self._start, self._end = start, end

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete response."""
        within = 4 + self._frame_filled if self._big_frame is not None else 0  # (its size too)
        return self._end - self._start + within

    def _decode_frame(self, frame: bytes | memoryview) -> Response:
        (correlation_id,) = _SIZE.unpack_from(frame, 0)
        request = self._in_flight.pop(correlation_id, None)
        if request is None:
            raise ProtocolError(
                f"response with correlation id {correlation_id} matches no request in flight"
            )
        api_key, version, cls = request
        limit = self.defer_decode_above
        if limit is not None and len(frame) > limit and cls in _decoders:
            try:
                pos = self._skip_header(frame, api_key, version)
            except (KcoreError, ValueError) as exc:
                raise ProtocolError(
                    f"{cls.NAME} v{version} (correlation id {correlation_id}) does not parse: {exc}"
                ) from exc
            pending = PendingBody(frame, pos, cls, api_key, version, correlation_id)
            return Response(correlation_id, api_key, version, pending)
        pos = 0
        try:
            pos = self._skip_header(frame, api_key, version)
        except (KcoreError, ValueError) as exc:
            raise ProtocolError(
                f"{cls.NAME} v{version} (correlation id {correlation_id}) does not parse: {exc}"
            ) from exc
        body, version = self._decode_checked(cls, frame, pos, api_key, version, correlation_id)
        return Response(correlation_id, api_key, version, body)

    @staticmethod
    def _skip_header(frame: bytes | memoryview, api_key: int, version: int) -> int:
        _, pos = ResponseHeader.decode(frame, response_header_version(api_key, version), 0)
        return pos

    @staticmethod
    def _decode_checked(
        cls: type[Message],
        frame: bytes | memoryview,
        pos: int,
        api_key: int,
        version: int,
        correlation_id: int,
        pause_every: int = 0,
        pause: Callable[[], object] | None = None,
    ) -> tuple[Any, int]:
        try:
            return KafkaProtocol._decode_body(cls, frame, pos, api_key, version, pause_every, pause)
        except ProtocolError:
            raise
        except (KcoreError, ValueError) as exc:
            raise ProtocolError(
                f"{cls.NAME} v{version} (correlation id {correlation_id}) does not parse: {exc}"
            ) from exc

    @staticmethod
    def _decode_body(
        cls: type[Message],
        frame: bytes | memoryview,
        pos: int,
        api_key: int,
        version: int,
        pause_every: int = 0,
        pause: Callable[[], object] | None = None,
    ) -> tuple[Any, int]:
        try:
            compiled = _decoders.get(cls)
            if compiled is None:
                body, end = cls.decode(frame, version, pos)  # type: ignore[attr-defined]
            elif pause_every:
                body, end = compiled(frame, version, pos, pause_every, pause)  # type: ignore[call-arg]
            else:
                body, end = compiled(frame, version, pos)
            if end != len(frame):
                raise ProtocolError(f"{len(frame) - end} unread bytes after {cls.NAME}")
            return body, version
        except (KcoreError, ValueError):
            if api_key != ApiKey.API_VERSIONS or version == 0:
                raise
        # A broker that does not support our ApiVersionsRequest version answers with an
        # UNSUPPORTED_VERSION ApiVersionsResponse v0 listing the versions it does support.
        body, end = cls.decode(frame, 0, pos)  # type: ignore[attr-defined]
        if end != len(frame):
            raise ProtocolError(f"{len(frame) - end} unread bytes after {cls.NAME} v0")
        return body, 0


# ---------------------------------------------------------------------------------------------
# Version negotiation


def broker_versions(api_versions_response: Any) -> dict[int, tuple[int, int]]:
    """``{api_key: (min_version, max_version)}`` from an ``ApiVersionsResponse``."""
    return {k.api_key: (k.min_version, k.max_version) for k in api_versions_response.api_keys}


def choose_version(
    api_key: int,
    broker: Mapping[int, tuple[int, int]] | Any,
    *,
    min_version: int | None = None,
    max_version: int | None = None,
    allow_unstable: bool = False,
) -> int:
    """The highest version of ``api_key`` that both kcore and the broker support.

    ``broker``: an ``ApiVersionsResponse`` or the mapping :func:`broker_versions` makes of one.
    ``min_version``/``max_version`` narrow kcore's side further (e.g. a feature needs v3+).
    Unless ``allow_unstable``, a version Kafka marks as still in development is not used.
    Raises ``UnsupportedVersionError`` when the ranges do not overlap.
    """
    if not isinstance(broker, Mapping):
        broker = broker_versions(broker)
    info = APIS.get(api_key)
    if info is None or info.valid_versions is None:
        raise UnsupportedVersionError(f"kcore supports no version of API key {api_key}")
    lo, hi = info.valid_versions
    if not allow_unstable:
        hi = info.max_stable_version  # type: ignore[assignment]
    if min_version is not None:
        lo = max(lo, min_version)
    if max_version is not None:
        hi = min(hi, max_version)
    theirs = broker.get(api_key)
    if theirs is None:
        raise UnsupportedVersionError(f"the broker does not support {info.name} (key {api_key})")
    best = min(hi, theirs[1])
    if best < max(lo, theirs[0]):
        raise UnsupportedVersionError(
            f"no common version of {info.name}: kcore supports {lo}-{hi}, "
            f"the broker {theirs[0]}-{theirs[1]}"
        )
    return best


def negotiate_versions(
    broker: Mapping[int, tuple[int, int]] | Any, api_keys: Iterable[int] | None = None
) -> dict[int, int]:
    """:func:`choose_version` for many APIs at once, leaving out those with no common version.
    ``api_keys`` defaults to every API the broker lists."""
    if not isinstance(broker, Mapping):
        broker = broker_versions(broker)
    keys = broker.keys() if api_keys is None else api_keys
    chosen = {}
    for key in keys:
        try:
            chosen[key] = choose_version(key, broker)
        except UnsupportedVersionError:
            continue
    return chosen
