"""``kcore consume``: records of a topic to stdout (what ``kcat -C`` does)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kcore.admin.types import TopicPartition
from kcore.errors import KcoreError

__all__ = ["parse_offset", "record_json", "run_consume"]


def parse_offset(text: str) -> str | int:
    """``beginning``, ``end``, an absolute offset (>= 0) or ``-N`` (N before the end)."""
    text = text.strip().lower()
    if text in ("beginning", "end"):
        return text
    try:
        return int(text)
    except ValueError:
        raise KcoreError(
            f"-o takes beginning, end, an offset or -N (N before the end), not {text!r}"
        ) from None


def _text(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        return {"": data.decode()}
    except UnicodeDecodeError:
        return {"_base64": base64.b64encode(data).decode()}


def record_json(r: Any) -> dict[str, Any]:
    """A record as a JSON object: key and value as UTF-8 text (``key``/``value``) or, where they
    are not UTF-8, base64 (``key_base64``/``value_base64``); absent when null."""
    out: dict[str, Any] = {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
    }
    for name, data in (("key", r.key), ("value", r.value)):
        out.update({name + suffix: v for suffix, v in _text(data).items()})
    out["headers"] = [
        {"key": k, **{"value" + s: v for s, v in _text(v).items()}} for k, v in r.headers
    ]
    return out


def _partitions(consumer: Any, topic: str, wanted: Sequence[int]) -> list[TopicPartition]:
    have = consumer.partitions_for(topic)
    if not have:
        raise KcoreError(f"topic {topic!r} does not exist (or this client may not describe it)")
    missing = sorted(set(wanted) - set(have))
    if missing:
        raise KcoreError(f"{topic} has partitions 0-{have[-1]}; there is no partition {missing[0]}")
    return [TopicPartition(topic, p) for p in (wanted or have)]


def run_consume(
    config: Mapping[str, Any],
    topic: str,
    partitions: Sequence[int],
    offset: str | int,
    count: int | None,
    exit_at_end: bool,
    group: str | None,
    key_separator: str | None,
    as_json: bool,
) -> int:
    import kcore

    config = dict(config)
    if group:
        config["group.id"] = group
        config.setdefault("auto.offset.reset", "earliest" if offset == "beginning" else "latest")
    out = sys.stdout.buffer
    seen = 0
    with kcore.Consumer(config) as consumer:
        tps = _partitions(consumer, topic, partitions)
        ends: dict[TopicPartition, int] = {}
        if exit_at_end or isinstance(offset, int):
            found = consumer.offsets_for_times({tp: "latest" for tp in tps})  # type: ignore[misc]
            ends = {tp: r.offset for tp, r in found.items()}
        if group and not partitions:
            consumer.subscribe([topic])
        else:
            consumer.assign(tps)
            if offset == "beginning":
                consumer.seek_to_beginning()
            elif offset == "end":
                consumer.seek_to_end()
            elif isinstance(offset, int):
                for tp in tps:
                    consumer.seek(tp, offset if offset >= 0 else max(0, ends[tp] + offset))
        done = {tp for tp, end in ends.items() if end == 0} if exit_at_end else set()
        while count is None or seen < count:
            if exit_at_end and consumer.assignment() == set(tps):  # a group: once it has all
                done |= {tp for tp in tps if consumer.position(tp) >= ends[tp]}
                if len(done) == len(tps):
                    break
            limit = None if count is None else count - seen
            for r in consumer.poll(timeout=0.5, max_records=limit):
                if as_json:
                    out.write(json.dumps(record_json(r)).encode() + b"\n")
                else:
                    if key_separator is not None:
                        out.write((r.key or b"") + key_separator.encode())
                    out.write((r.value or b"") + b"\n")
                seen += 1
            out.flush()
        if group:
            consumer.commit()
    print(f"consumed {seen} records from {topic}", file=sys.stderr)
    return 0
