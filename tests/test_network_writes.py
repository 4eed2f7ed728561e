"""Gathering writes without a broker: a connection writes a request's buffers (a Produce
request's batches uncopied) straight to the socket, and what the socket does not take at once
goes through the transport, in order."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

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


def test_a_stream_keeps_the_order_of_writes_while_the_socket_is_full() -> None:
    """Requests flushed while the transport still buffers an earlier one's rest go behind it;
    once the reader catches up, every byte arrives in order."""

    class Owner:
        def _data_received(self, data: bytes) -> None:
            pass

        def _lost(self, exc: Exception | None) -> None:
            pass

    async def run() -> bytes:
        a, b = _pair(8192)
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(lambda: _Stream(Owner()), sock=a)  # type: ignore[arg-type]
        assert stream._fd == a.fileno()
        sent = []
        for i in range(6):
            segments = [b"%d:" % i, os.urandom(150_000), b"small", os.urandom(70_000)]
            sent += segments
            stream.send(segments)
            await asyncio.sleep(0)  # each flush runs on its own
        assert stream.transport.get_write_buffer_size() > 0  # the socket filled up
        total = sum(len(x) for x in sent)
        b.setblocking(False)
        got = bytearray()
        while len(got) < total:
            try:
                got += b.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
        stream.transport.close()
        b.close()
        assert bytes(got) == b"".join(sent)
        return bytes(got)

    asyncio.run(run())
