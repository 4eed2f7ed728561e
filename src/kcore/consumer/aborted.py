"""``isolation.level=read_committed``: the records of aborted transactions, dropped.

With read_committed the broker returns a partition's records only up to its last stable offset,
and with them the transactions aborted in that range: ``(producer_id, first_offset)`` each. The
batches of an aborted transaction are still in the log, so the client drops them, as Java's
CompletedFetch does: walking the batches in offset order, an aborted transaction's producer id
counts as aborted from the first batch whose last offset reaches its ``first_offset``, until
that producer's ABORT control batch; a transactional batch of a producer id that counts as
aborted is dropped. Control batches (the COMMIT/ABORT markers) are never records for the caller.

A Fetch response carries the aborted transactions its own range overlaps, so each fetched
partition's records are filtered on their own. Nothing here runs for read_uncommitted, or when
the list is empty (the common case): the consumer calls it only then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kcore.codec import LegacyBatch, RecordBatch, decode_batches

__all__ = ["committed_batches", "drop_aborted"]

Batch = RecordBatch | LegacyBatch


def committed_batches(batches: Sequence[Batch], aborted: Iterable[tuple[int, int]]) -> list[Batch]:
    """The batches of ``batches`` (in offset order) that hold records for a read_committed
    caller: not a control batch, and not a transactional batch of an aborted transaction.
    ``aborted``: ``(producer_id, first_offset)`` of the transactions the broker reported
    aborted (in any order)."""
    todo = sorted(aborted, key=lambda a: a[1])  # by first offset
    next_abort = 0
    aborting: set[int] = set()  # producer ids whose aborted transaction has started
    out: list[Batch] = []
    for batch in batches:
        producer_id = batch.producer_id
        if producer_id >= 0:
            last = batch.last_offset
            while next_abort < len(todo) and todo[next_abort][1] <= last:
                aborting.add(todo[next_abort][0])
                next_abort += 1
            if batch.is_control:
                if isinstance(batch, RecordBatch) and batch.control_type() == "abort":
                    aborting.discard(producer_id)  # that transaction ends here
                continue
            if batch.is_transactional and producer_id in aborting:
                continue
        elif batch.is_control:
            continue
        out.append(batch)
    return out


def drop_aborted(records: Any, aborted: Iterable[tuple[int, int]]) -> Any:
    """``records`` (a fetched partition's record batches, possibly ending with part of one)
    without the batches of aborted transactions: ``records`` itself when there are none, else
    the kept batches' bytes (a trailing partial batch is left out then too). Reads only batch
    headers (and control records); CRCs are checked when the kept batches are decoded."""
    batches = decode_batches(records, True, check_crcs=False)
    committed = {id(b) for b in committed_batches(batches, aborted)}
    # Control batches stay (the decoders skip them): only aborted records cost a copy.
    kept = [b for b in batches if b.is_control or id(b) in committed]
    if len(kept) == len(batches):
        return records
    view = memoryview(records)
    parts: list[Any] = []
    start = end = -1
    for batch in kept:  # contiguous runs of kept batches, one slice each
        if batch.position != end:
            if end > start:
                parts.append(view[start:end])
            start = batch.position
        end = batch.position + batch.size_in_bytes
    if end > start:
        parts.append(view[start:end])
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)
