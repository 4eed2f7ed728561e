"""``kcore produce``: lines of stdin or files as records (what ``kcat -P`` does)."""

from __future__ import annotations

import json
import sys
from collections import Counter
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
    results = []
    with kcore.Producer(config) as producer:
        for line in _lines(paths):
            key: bytes | None = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:  # as kcat: a line without the separator is a value only
                    key, value = None, line
            else:
                value = line
            results.append(producer.send(topic, value, key, partition=partition, headers=pairs))
        producer.flush()
    per_partition: Counter[int] = Counter()
    failed = []
    for future in results:
        try:
            per_partition[future.result(0).partition] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is counted and the first shown
            failed.append(exc)
    if as_json:
        summary = {
            "topic": topic,
            "records": len(results),
            "delivered": sum(per_partition.values()),
            "partitions": {str(p): n for p, n in sorted(per_partition.items())},
            "failed": len(failed),
            "error": str(failed[0]) if failed else None,
        }
        print(json.dumps(summary, indent=2))
    else:
        spread = ", ".join(f"{p}: {n}" for p, n in sorted(per_partition.items()))
        print(
            f"produced {sum(per_partition.values())} of {len(results)} records to {topic}"
            + (f" (partitions {spread})" if spread else ""),
            file=sys.stderr,
        )
    if failed:
        print(f"kcore produce: {len(failed)} records failed: {failed[0]}", file=sys.stderr)
        return 1
    return 0
