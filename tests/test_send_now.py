"""Requests sent from a callback (``BrokerConnection.send_now``, the producer's path for a
connection that can take its request at once) and the connection's request slots: the same
answers, errors, slots and deadlines as the awaited ``request``, against the fake broker."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_broker import TOPIC, FakeBroker  # noqa: E402

from kcore.errors import BrokerConnectionError, KcoreTimeoutError  # noqa: E402
from kcore.network.connection import (  # noqa: E402
    BrokerConnection,
    ConnectionSettings,
    _Slots,
)
from kcore.protocol import ApiKey  # noqa: E402
from kcore.protocol.messages import MetadataRequest  # noqa: E402
from kcore.protocol.messages.metadata_request import MetadataRequestTopic  # noqa: E402


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def _metadata_request() -> Any:
    return MetadataRequest(topics=[MetadataRequestTopic(name=TOPIC)])


@contextlib.asynccontextmanager
async def _connected(broker: FakeBroker, **settings: Any) -> AsyncIterator[BrokerConnection]:
    """A connection to ``broker`` (started here), closed and the broker stopped after."""
    host, port = broker.start().rsplit(":", 1)
    conn = await BrokerConnection(host, int(port), ConnectionSettings(**settings)).open()
    try:
        yield conn
    finally:
        conn.close()
        broker.stop()


def _answers() -> tuple[list[tuple[Any, BaseException | None]], asyncio.Event, Any]:
    got: list[tuple[Any, BaseException | None]] = []
    event = asyncio.Event()

    def on_answer(body: Any, error: BaseException | None) -> None:
        got.append((body, error))
        event.set()

    return got, event, on_answer


def test_send_now_hands_over_the_answer_and_frees_its_slot() -> None:
    async def main() -> None:
        broker = FakeBroker()
        async with _connected(broker, max_in_flight=1) as conn:
            got, event, on_answer = _answers()
            version = conn.version_for(ApiKey.METADATA)
            assert conn.can_send_now()
            assert conn.send_now(_metadata_request(), version, on_answer)
            # Its one slot is taken: a second waits for request(), and sends nothing now.
            assert not conn.can_send_now()
            assert not conn.send_now(_metadata_request(), version, on_answer)
            await asyncio.wait_for(event.wait(), 10)
            ((body, error),) = got
            assert error is None and [t.name for t in body.topics] == [TOPIC]
            assert conn.can_send_now() and conn.in_flight == 0
            # The awaited path on the same connection, after it, still answers.
            answer = await conn.request(_metadata_request(), version)
            assert [t.name for t in answer.topics] == [TOPIC]
            assert broker.requests[ApiKey.METADATA] == 2

    _run(main())


def test_send_now_past_its_deadline_closes_the_connection_with_a_timeout() -> None:
    async def main() -> None:
        broker = FakeBroker(ApiKey.METADATA, "never_answers")
        async with _connected(broker, request_timeout_s=0.2) as conn:
            got, event, on_answer = _answers()
            assert conn.send_now(_metadata_request(), conn.version_for(ApiKey.METADATA), on_answer)
            await asyncio.wait_for(event.wait(), 10)
            ((body, error),) = got
            assert body is None and isinstance(error, KcoreTimeoutError)
            assert "Metadata" in str(error) and "request.timeout.ms" in str(error)
            assert not conn.is_ready and not conn.can_send_now()
            assert not conn.send_now(_metadata_request(), 0, on_answer)

    _run(main())


def test_send_now_fails_with_the_connection() -> None:
    async def main() -> None:
        broker = FakeBroker(ApiKey.METADATA, "never_answers")
        async with _connected(broker) as conn:
            got, event, on_answer = _answers()
            assert conn.send_now(_metadata_request(), conn.version_for(ApiKey.METADATA), on_answer)
            conn.close()
            await asyncio.wait_for(event.wait(), 10)
            ((body, error),) = got
            assert body is None and isinstance(error, BrokerConnectionError)

    _run(main())


def test_a_request_that_cannot_be_encoded_raises_and_keeps_its_slot_free() -> None:
    async def main() -> None:
        broker = FakeBroker()
        async with _connected(broker, max_in_flight=1) as conn:
            _, _, on_answer = _answers()
            bad = MetadataRequest(topics=[MetadataRequestTopic(name=None)])  # not nullable in v0
            with pytest.raises(ValueError):
                conn.send_now(bad, 0, on_answer)
            assert conn.can_send_now() and conn.in_flight == 0

    _run(main())


def test_slots_go_to_waiters_in_order_never_to_a_later_take_now() -> None:
    async def main() -> None:
        slots = _Slots(1)
        assert slots.take_now() and not slots.free()
        order: list[str] = []

        async def waiter(name: str) -> None:
            await slots.take()
            order.append(name)

        first = asyncio.create_task(waiter("first"))
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        slots.release()  # handed to "first", not left free for take_now
        assert not slots.take_now()
        await asyncio.sleep(0)
        assert order == ["first"]
        slots.release()
        await second
        assert order == ["first", "second"]
        await first
        slots.release()
        assert slots.free() and slots.take_now()

    _run(main())


def test_a_cancelled_wait_for_a_slot_passes_its_slot_on() -> None:
    async def main() -> None:
        slots = _Slots(1)
        assert slots.take_now()
        cancelled = asyncio.create_task(slots.take())
        later = asyncio.create_task(slots.take())
        await asyncio.sleep(0)
        slots.release()  # handed to the first waiter...
        cancelled.cancel()  # ...cancelled before it ran: the slot goes to the next one
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.wait_for(later, 1)
        slots.release()
        # A waiter cancelled while still queued leaves the queue.
        assert slots.take_now()
        gone = asyncio.create_task(slots.take())
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        slots.release()
        assert slots.free()

    _run(main())


def test_a_wait_cancelled_while_queued_ends_cancelled_even_if_a_release_came_first() -> None:
    async def main() -> None:
        slots = _Slots(1)
        assert slots.take_now()
        waiting = asyncio.create_task(slots.take())
        await asyncio.sleep(0)
        waiting.cancel()  # its turn is cancelled now, the task runs its handler later...
        slots.release()  # ...after this release dropped the cancelled turn
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert slots.free() and slots.take_now()

    _run(main())


def test_a_request_sent_at_once_never_overtakes_an_awaited_one() -> None:
    """An awaited request that holds a slot and sleeps out a throttle (KIP-219) goes first:
    can_send_now says no until it is written, even once the throttle is over."""

    async def main() -> None:
        broker = FakeBroker()
        async with _connected(broker) as conn:
            version = conn.version_for(ApiKey.METADATA)
            conn._throttled_until = time.monotonic() + 0.3
            awaited = asyncio.create_task(conn.request(_metadata_request(), version))
            await asyncio.sleep(0.05)
            assert not conn.can_send_now()
            conn._throttled_until = time.monotonic()  # over, the awaited one still asleep
            assert not conn.can_send_now()
            _, _, on_answer = _answers()
            assert not conn.send_now(_metadata_request(), version, on_answer)
            answer = await asyncio.wait_for(awaited, 10)
            assert [t.name for t in answer.topics] == [TOPIC]
            assert conn.can_send_now()

    _run(main())
