"""A blocking connection to one broker, driving :class:`kcore.protocol.KafkaProtocol`, for
tests and tools that want no event loop.

It connects, negotiates versions with ApiVersions (retrying at the broker's highest version when
the broker does not know ours), then sends each request at the highest version both sides
support. Requests may be pipelined: :meth:`BlockingBrokerConnection.send` several, then
:meth:`BlockingBrokerConnection.receive` their responses in order.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from kcore.errors import ErrorCode, KcoreTimeoutError, NetworkError, UnsupportedVersionError
from kcore.protocol import ApiKey, KafkaProtocol, Response, broker_versions, choose_version
from kcore.protocol.messages import APIS, ApiVersionsRequest

__all__ = ["BlockingBrokerConnection"]


class BlockingBrokerConnection:
    """One TCP connection to one broker. Not thread-safe."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "kcore",
        timeout: float = 30.0,
        software_name: str = "kcore",
        software_version: str = "0.1.0",
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.client_id = client_id
        self._software = (software_name, software_version)
        self._sock: socket.socket | None = None
        self._protocol = KafkaProtocol(client_id)
        self._ready: dict[int, Response] = {}
        self.api_versions: dict[int, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return f"BlockingBrokerConnection({self.host}:{self.port})"

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> BlockingBrokerConnection:
        """Connect and negotiate API versions."""
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except TimeoutError as exc:
            raise KcoreTimeoutError(
                f"connecting to {self.host}:{self.port} took more than {self.timeout}s"
            ) from exc
        except OSError as exc:
            raise NetworkError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._negotiate()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> BlockingBrokerConnection:
        return self.open() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _negotiate(self) -> None:
        info = APIS[ApiKey.API_VERSIONS]
        version = info.max_stable_version
        assert version is not None
        request = ApiVersionsRequest(
            client_software_name=self._software[0], client_software_version=self._software[1]
        )
        response = self.request(request, version)
        if response.error_code == ErrorCode.UNSUPPORTED_VERSION and response.api_keys:
            # KIP-511: the broker answered in v0 with the ApiVersions versions it does support.
            theirs = broker_versions(response).get(ApiKey.API_VERSIONS, (0, 0))
            response = self.request(request, min(version, theirs[1]))
        if response.error_code != ErrorCode.NONE:
            from kcore.errors import error_for_code

            raise error_for_code(response.error_code) or UnsupportedVersionError()
        self.api_versions = broker_versions(response)

    # -- requests ---------------------------------------------------------------------------

    def version_for(self, api_key: int, **limits: Any) -> int:
        """The highest version of ``api_key`` kcore and this broker both support."""
        return choose_version(api_key, self.api_versions, **limits)

    def send(self, request: Any, version: int | None = None) -> int:
        """Write ``request`` (at ``version``, or the negotiated one); return its correlation id."""
        correlation_id, frame = self.prepare(request, version)
        self.send_prepared(frame)
        return correlation_id

    def prepare(self, request: Any, version: int | None = None) -> tuple[int, bytearray]:
        """Encode ``request`` now, to be written later with :meth:`send_prepared` (frames must
        go out in the order they were prepared); returns its correlation id and its frame."""
        if self._sock is None:
            raise NetworkError(f"connection to {self.host}:{self.port} is not open")
        if version is None:
            version = self.version_for(request.API_KEY)
        return self._protocol.send_request(request, version)

    def send_prepared(self, frame: bytes | bytearray | memoryview) -> None:
        """Write a frame from :meth:`prepare`."""
        if self._sock is None:
            raise NetworkError(f"connection to {self.host}:{self.port} is not open")
        try:
            self._sock.sendall(frame)
        except OSError as exc:
            self.close()
            raise NetworkError(f"sending to {self.host}:{self.port} failed: {exc}") from exc

    def receive(self, correlation_id: int, timeout: float | None = None) -> Response:
        """Block until the response to ``correlation_id`` has arrived and return it."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while correlation_id not in self._ready:
            if self._sock is None:
                raise NetworkError(f"connection to {self.host}:{self.port} is closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._protocol.forget(correlation_id)
                raise KcoreTimeoutError(
                    f"no response from {self.host}:{self.port} to request {correlation_id}"
                )
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError as exc:
                self.close()
                raise NetworkError(f"receiving from {self.host}:{self.port} failed: {exc}") from exc
            if not data:
                self.close()
                raise NetworkError(f"{self.host}:{self.port} closed the connection")
            for response in self._protocol.receive_data(data):
                self._ready[response.correlation_id] = response
        return self._ready.pop(correlation_id)

    def request(
        self, request: Any, version: int | None = None, timeout: float | None = None
    ) -> Any:
        """Send ``request`` and return the decoded response body."""
        return self.receive(self.send(request, version), timeout).body
