"""Spans around ``send`` and ``send_batch`` when ``otel.traces.enable`` is on (kcore.cluster.otel):
the compiled send path is wrapped, never changed, so a producer without tracing pays nothing.

Rules kept: the span starts before the record is queued (a child of the caller's current span)
and ends when its delivery is known, with the partition and offset or the error; its context
goes into the record's headers, replacing context headers the record already had. A
``send_batch`` call is one span with ``messaging.batch.message_count``, and every record of
it carries that span's context; contexts the records carried already become the span's links
(a Spark job passing records on keeps the trace going through its batch span)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kcore.cluster.otel import ClientOTel, header_pairs
from kcore.producer.accumulator import MemoryShortage
from kcore.producer.results import SendBatchResult

__all__ = ["traced_send", "traced_send_batch"]

Send = Callable[..., Any]


def traced_send(otel: ClientOTel, send: Send) -> Send:
    """``send`` (the compiled path's signature) with a PRODUCER span per record."""

    def send_traced(
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, Any]] | None = None,
        on_delivery: Callable[[BaseException | None, Any], Any] | None = None,
    ) -> Any:
        span, context = otel.send_span(topic, 1, (headers,) if headers else ())

        def delivered(error: BaseException | None, metadata: Any) -> Any:
            if metadata is not None:
                otel.end_send_span(span, error, metadata.partition, metadata.offset)
            else:
                otel.end_send_span(span, error)
            return on_delivery(error, metadata) if on_delivery is not None else None

        try:
            return send(
                topic,
                value,
                key,
                partition,
                timestamp_ms,
                otel.with_context(headers, context),
                delivered,
            )
        except MemoryShortage:
            # Internal (AsyncProducer): the send is made again off the loop, in a span of its
            # own; this one is left unended, so it is never exported.
            raise
        except BaseException as exc:  # not queued: the span ends with the refusal
            otel.end_send_span(span, exc)
            raise

    return send_traced


def traced_send_batch(
    otel: ClientOTel, topic: str, n: int, headers: Any, append: Callable[[Any], SendBatchResult]
) -> SendBatchResult:
    """``append(headers)`` (one send_batch call of ``n`` records) inside one PRODUCER span,
    every record's headers carrying its context."""
    rows = (
        None
        if headers is None
        else [
            header_pairs(row)
            for row in (headers.to_pylist() if hasattr(headers, "to_pylist") else headers)
        ]
    )
    span, context = otel.send_span(topic, n, rows or ())
    if rows is None:
        with_context: list[Any] = [context] * n
    else:
        with_context = [otel.with_context(row, context) for row in rows]
    try:
        result = append(with_context)
    except BaseException as exc:
        otel.end_send_span(span, exc)
        raise

    def done(error: BaseException | None) -> None:
        otel.end_send_span(span, error)

    result.add_done_callback(done)
    return result
