"""What a poll that returned records tells OpenTelemetry (kcore.cluster.otel): its duration,
and with ``otel.traces.enable`` its CONSUMER span linked to each record's sender span."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kcore.cluster.otel import ClientOTel, header_pairs

__all__ = ["observe_poll"]


def observe_poll(otel: ClientOTel, result: Any, started: float, started_ns: int) -> None:
    """``result``: a poll's records (a list) or Arrow batch, not empty; ``started``: the poll's
    call, as time.monotonic() and time.time_ns()."""
    headers: Iterable[Sequence[tuple[str, Any]] | None]
    if isinstance(result, list):
        topics = sorted({r.topic for r in result})
        count = len(result)
        headers = (r.headers for r in result)
    else:
        topics = sorted(result.column("topic").unique().to_pylist())
        count = result.num_rows
        headers = (
            _arrow_rows(result.column("headers"))
            if otel.traces_on and "headers" in result.schema.names
            else ()
        )
    if otel.metrics_on:
        otel.poll_done(started, topics[0] if len(topics) == 1 else None)
    if otel.traces_on:
        otel.poll_span(started_ns, topics, count, headers)


ARROW_ROWS_AT_ONCE = 256


def _arrow_rows(column: Any) -> Iterable[list[tuple[str, Any]]]:
    """The Arrow headers column's rows (lists of ``{key:, value:}``) as ``(key, value)`` pairs,
    converted a slice at a time: the poll span stops reading at its link limit."""
    for start in range(0, len(column), ARROW_ROWS_AT_ONCE):
        for row in column.slice(start, ARROW_ROWS_AT_ONCE).to_pylist():
            yield header_pairs(row)
