"""Gathering writes without a broker: a connection writes a request's buffers (a Produce
request's batches uncopied) straight to the socket, and what the socket does not take at once
goes through the transport, in order."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

from kcore.network.connection import _Stream, _write_gathered


def _pair(sndbuf: int) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    a.setblocking(False)
    return a, b


def _read(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "closed early"
        out += chunk
    return bytes(out)


def test_write_gathered_returns_what_the_socket_did_not_take() -> None:
    a, b = _pair(4096)
    try:
        buffers = [os.urandom(n) for n in (10, 300_000, 7, 200_000)]
        views = [buffers[0], memoryview(buffers[1]), bytearray(buffers[2]), buffers[3]]
        rest = _write_gathered(a.fileno(), views)
        total = sum(len(x) for x in buffers)
        left = sum(len(x) for x in rest)
        assert 0 < left < total  # a full socket: part written, the rest handed back
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(_read(b, total)))
        reader.start()
        a.setblocking(True)
        for piece in rest:
            a.sendall(piece)
        reader.join(30)
        assert got == [b"".join(buffers)]
        assert _write_gathered(a.fileno(), []) == []
    finally:
        a.close()
        b.close()


class _Owner:
    def __init__(self) -> None:
        self._buffer = memoryview(bytearray(65536))

    def _receive_buffer(self) -> memoryview:
        return self._buffer

    def _buffer_updated(self, buffer: memoryview, nbytes: int) -> None:
        pass

    def _lost(self, exc: Exception | None) -> None:
        pass


def test_a_stream_keeps_the_order_of_writes_while_the_socket_fills_and_empties(
    monkeypatch,
) -> None:
    """Requests flushed while the transport still buffers an earlier one's rest go behind it,
    and once it has written its buffer out, straight to the socket again: with a reader taking
    the bytes slowly meanwhile, every byte arrives in order, and both paths were taken."""
    import kcore.network.connection as connection

    direct = []
    original = connection._write_gathered

    def spy(fd: int, buffers: list) -> list:
        rest = original(fd, buffers)
        direct.append(len(rest))
        return rest

    monkeypatch.setattr(connection, "_write_gathered", spy)

    async def run() -> None:
        a, b = _pair(8192)
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(lambda: _Stream(_Owner()), sock=a)  # type: ignore[arg-type]
        assert stream._fd == a.fileno()
        plan = [[b"%d:" % i, os.urandom(150_000), b"small", os.urandom(70_000)] for i in range(40)]
        total = sum(len(x) for segments in plan for x in segments)
        got: list[bytes] = []

        def reader() -> None:  # slow at first, then takes whatever comes
            b.settimeout(30)
            have = 0
            while have < total:
                chunk = b.recv(65536 if have > 2_000_000 else 4096)
                if not chunk:
                    break
                got.append(chunk)
                have += len(chunk)
                if have < 2_000_000:
                    time.sleep(0.0005)

        thread = threading.Thread(target=reader)
        thread.start()
        for i, segments in enumerate(plan):
            stream.send(list(segments))
            await asyncio.sleep(0.002 if i % 3 else 0.05)  # sometimes long enough to empty
        deadline = time.monotonic() + 60
        while thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        sent = [x for segments in plan for x in segments]
        stream.transport.close()
        b.close()
        assert b"".join(got) == b"".join(sent)

    asyncio.run(run())
    assert any(direct), "the socket never filled up: the transport's path was not taken"
    assert len(direct) > 1, "nothing went straight to the socket after the transport's turn"


def test_writes_to_a_peer_that_hung_up_stop_at_the_first_error(caplog) -> None:
    """The peer is gone: the first write's error closes the transport and the request's other
    segments are not written (each would log asyncio's "socket.send() raised exception")."""

    async def run() -> None:
        a, b = _pair(8192)
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(lambda: _Stream(_Owner()), sock=a)  # type: ignore[arg-type]
        b.close()
        for _ in range(3):
            stream.send([os.urandom(100_000) for _ in range(9)])
            await asyncio.sleep(0.01)
        stream.transport.close()

    asyncio.run(run())
    assert sum("socket.send() raised" in r.getMessage() for r in caplog.records) <= 1
