"""The fetch buffer between the fetcher (event loop) and poll (the caller's thread), without a
broker: order, removal, draining on seek and reassignment, one queued error per partition, and
waiting (blocking and asyncio) that wakes for what poll would take, not for paused data."""

from __future__ import annotations

import asyncio
import threading
import time

from kcore.consumer.fetch_buffer import NO_PARTITION, FetchBuffer, FetchedData
from kcore.errors import KcoreError
from kcore.types import TopicPartition

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


def data(tp: TopicPartition, offset: int = 0, records: object = b"x") -> FetchedData:
    return FetchedData(tp, offset, records, 10, offset + 1)


def test_entries_come_out_in_order_and_are_removed_by_identity() -> None:
    buf = FetchBuffer()
    first, second, third = data(A, 0), data(B, 0), data(A, 0)  # first and third look alike
    for d in (first, second, third):
        buf.add(d)
    assert buf.peek() == [first, second, third]
    buf.remove(third)
    assert [d is x for d, x in zip(buf.peek(), [first, second], strict=True)] == [True, True]
    buf.remove(third)  # gone already: nothing happens
    snapshot = buf.peek()
    buf.remove(first)
    assert len(snapshot) == 2 and buf.peek() == [second]  # a peek is a copy


def test_an_error_per_partition_waits_once() -> None:
    buf = FetchBuffer()
    for _ in range(5):
        buf.add_error(KcoreError("denied"), A, once=True)
    buf.add_error(KcoreError("other"), B, once=True)
    buf.add_error(KcoreError("bug"))
    buf.add_error(KcoreError("bug again"))
    errors = [(d.tp, str(d.error)) for d in buf.peek()]
    assert errors == [
        (A, "denied"),
        (B, "other"),
        (NO_PARTITION, "bug"),
        (NO_PARTITION, "bug again"),
    ]


def test_drain_and_retain() -> None:
    buf = FetchBuffer()
    buf.add(data(A))
    buf.add_error(KcoreError("a"), A)
    buf.add(data(B))
    buf.add_error(KcoreError("general"))
    buf.drain({A}, keep_errors=True)  # a new leader: the read-ahead goes, the error stays
    assert [(d.tp, d.error is not None) for d in buf.peek()] == [
        (A, True),
        (B, False),
        (NO_PARTITION, True),
    ]
    buf.drain({A})  # a seek: everything about A goes
    assert [d.tp for d in buf.peek()] == [B, NO_PARTITION]
    buf.retain({A})  # a new assignment without B
    assert buf.peek() == []


def test_paused_data_keeps_bytes_of_its_own() -> None:
    buf = FetchBuffer()
    response = bytearray(b"abcdef")
    buf.add(data(A, records=memoryview(response)[0:3]))
    buf.add(data(B, records=memoryview(response)[3:6]))
    buf.own_bytes({A})
    a, b = buf.peek()
    assert a.records == b"abc" and type(a.records) is bytes
    assert isinstance(b.records, memoryview)


def test_wait_wakes_for_data_errors_and_wakeup_not_for_paused_data() -> None:
    buf = FetchBuffer()
    buf.add(data(A))
    started = time.monotonic()
    buf.wait(0.2, paused={A})  # only paused data: waits it out
    assert time.monotonic() - started >= 0.19
    buf.wait(5, paused=set())  # A's data is there for the taking: at once
    assert time.monotonic() - started < 1

    wakes = [
        lambda b: b.add(data(B)),
        lambda b: b.add_error(KcoreError("x")),
        FetchBuffer.wakeup,
    ]
    for wake in wakes:
        buf = FetchBuffer()
        timer = threading.Timer(0.05, wake, (buf,))
        timer.start()
        started = time.monotonic()
        buf.wait(5, paused=set())
        assert time.monotonic() - started < 2
        timer.join()

    buf = FetchBuffer()
    buf.wakeup()
    buf.wait(5, paused=set())  # a wakeup before the wait ends it, once
    started = time.monotonic()
    buf.wait(0.1, paused=set())
    assert time.monotonic() - started >= 0.09

    buf.close()
    started = time.monotonic()
    buf.wait(5, paused=set())  # closed: nothing more will come
    assert time.monotonic() - started < 1


def test_wait_async() -> None:
    async def go() -> None:
        buf = FetchBuffer()
        started = time.monotonic()
        await buf.wait_async(5, paused=set())  # not started: a short sleep, no event yet
        assert time.monotonic() - started < 1
        buf.start()
        buf.add(data(A))
        started = time.monotonic()
        await buf.wait_async(0.2, paused={A})
        assert time.monotonic() - started >= 0.19
        asyncio.get_running_loop().call_later(0.05, buf.add, data(B))
        started = time.monotonic()
        await buf.wait_async(5, paused={A})
        assert time.monotonic() - started < 2

    asyncio.run(go())
