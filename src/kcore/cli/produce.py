"""``kcore produce``: lines of stdin or files as records (what ``kcat -P`` does)."""

from __future__ import annotations

import json
import sys
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

from kcore.errors import KcoreError

__all__ = ["run_produce"]


def _lines(paths: Sequence[str]) -> Iterator[bytes]:
    """Each line without its newline; stdin when no file is given ("-" is stdin too)."""
    for path in paths or ["-"]:
        if path == "-":
            yield from _split(sys.stdin.buffer)
            continue
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, after the last line
        except OSError as exc:
            raise KcoreError(f"{path}: {exc.strerror}") from None
        with f:
            yield from _split(f)


def _split(f: BinaryIO) -> Iterator[bytes]:
    for line in f:
        yield line[:-1] if line.endswith(b"\n") else line


class _Tally:
    """Delivery outcomes, counted as futures complete: the futures themselves are let go once
    done, so memory stays flat however many lines come in."""

    KEEP = 50_000  # futures held before the done ones at the front are counted

    def __init__(self) -> None:
        self.pending: deque[Any] = deque()
        self.sent = 0
        self.per_partition: Counter[int] = Counter()
        self.failed = 0
        self.first_error: BaseException | None = None

    def add(self, future: Any) -> None:
        self.sent += 1
        self.pending.append(future)
        if len(self.pending) >= self.KEEP:
            self.count(only_done=True)

    def count(self, only_done: bool = False) -> None:
        while self.pending and (not only_done or self.pending[0].done()):
            future = self.pending.popleft()
            try:
                self.per_partition[future.result(0).partition] += 1
            except Exception as exc:  # noqa: BLE001 - every failure counted, the first shown
                self.failed += 1
                if self.first_error is None:
                    self.first_error = exc


def run_produce(
    config: Mapping[str, Any],
    topic: str,
    paths: Sequence[str],
    partition: int | None,
    key_separator: str | None,
    headers: Iterable[str],
    as_json: bool,
) -> int:
    import kcore

    pairs = []
    for item in headers:
        k, eq, v = item.partition("=")
        if not eq:
            raise KcoreError(f"-H takes key=value, not {item!r}")
        pairs.append((k, v.encode("utf-8", "surrogateescape")))
    sep = key_separator.encode("utf-8", "surrogateescape") if key_separator else None
    tally = _Tally()
    interrupted = False
    with kcore.Producer(config) as producer:
        producer.wait_until_ready()  # fail fast: the cluster unreachable is said at once
        try:
            for line in _lines(paths):
                key: bytes | None = None
                if sep is not None:
                    key, found, value = line.partition(sep)
                    if not found:  # as kcat: a line without the separator is a value only
                        key, value = None, line
                else:
                    value = line
                tally.add(producer.send(topic, value, key, partition=partition, headers=pairs))
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM: what was taken is still delivered and reported, then 130.
            interrupted = True
        producer.flush()
    tally.count()
    delivered = sum(tally.per_partition.values())
    if as_json:
        summary = {
            "topic": topic,
            "records": tally.sent,
            "delivered": delivered,
            "partitions": {str(p): n for p, n in sorted(tally.per_partition.items())},
            "failed": tally.failed,
            "error": str(tally.first_error) if tally.first_error else None,
            "interrupted": interrupted,
        }
        print(json.dumps(summary, indent=2))
    else:
        spread = ", ".join(f"{p}: {n}" for p, n in sorted(tally.per_partition.items()))
        print(
            f"produced {delivered} of {tally.sent} records to {topic}"
            + (f" (partitions {spread})" if spread else "")
            + (" (interrupted)" if interrupted else ""),
            file=sys.stderr,
        )
    if tally.failed:
        print(f"kcore produce: {tally.failed} records failed: {tally.first_error}", file=sys.stderr)
        return 1
    return 130 if interrupted else 0
