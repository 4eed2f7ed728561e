"""``kcore consume``: records of a topic to stdout (what ``kcat -C`` does)."""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kcore.errors import KcoreError
from kcore.types import TopicPartition

__all__ = ["parse_offset", "record_json", "run_consume", "run_share_consume"]


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
    config.setdefault("allow.auto.create.topics", "false")  # reading creates nothing (as kcat)
    if group:
        if partitions or isinstance(offset, int):
            raise KcoreError("-g joins a group (subscribe, committed offsets): not with -p or -o N")
        config["group.id"] = group
        config.setdefault("auto.offset.reset", "earliest" if offset == "beginning" else "latest")
    else:
        # Reading partitions by hand commits nothing, even when -F names a group.id (closing
        # would otherwise auto-commit this read's positions as that group's).
        config["enable.auto.commit"] = "false"
        if offset != "end":
            # An offset below the log's start (deleted by retention) starts at its beginning.
            config.setdefault("auto.offset.reset", "earliest")
    sep = key_separator.encode("utf-8", "surrogateescape") if key_separator else None
    out = sys.stdout.buffer
    seen = 0
    with kcore.Consumer(config) as consumer:
        consumer.wait_until_ready()  # fail fast: poll would wait quietly for the cluster
        tps = _partitions(consumer, topic, partitions)
        # Where -e stops: the ends as they are now (read_committed: the last stable offsets).
        ends = consumer.end_offsets(tps) if exit_at_end or isinstance(offset, int) else {}
        if group:
            consumer.subscribe([topic])
        else:
            consumer.assign(tps)
            if offset == "beginning":
                consumer.seek_to_beginning()
            elif offset == "end":
                consumer.seek_to_end()
            elif isinstance(offset, int):
                starts = consumer.beginning_offsets(tps)
                for tp in tps:
                    at = offset if offset >= 0 else ends[tp] + offset
                    # Within the log: past its end waits there for new records (as kcat and
                    # the console consumer), not a reset to the beginning.
                    consumer.seek(tp, min(max(starts[tp], at), ends[tp]))
        unwritten: dict[TopicPartition, int] = {}  # the first record of this poll not yet out
        from kcore.cli import SOFT_STOPS, _stdout_to_devnull

        stop = threading.Event()  # SIGTERM: the loop ends between polls
        SOFT_STOPS.append(stop)
        try:
            while (count is None or seen < count) and not stop.is_set():
                if exit_at_end and _at_end(consumer, ends):
                    break
                limit = None if count is None else count - seen
                records = consumer.poll(timeout=0.5, max_records=limit)
                unwritten = {}
                for r in records:
                    unwritten.setdefault(TopicPartition(r.topic, r.partition), r.offset)
                for r in records:
                    _write(out, r, sep, as_json)
                out.flush()
                seen += len(records)
                unwritten = {}
        except BrokenPipeError:  # `kcore consume ... | head`: the reader has had enough
            _stdout_to_devnull()
        except KeyboardInterrupt:
            pass  # Ctrl-C ends a consume that would go on: commit and summary as usual
        finally:
            SOFT_STOPS.remove(stop)
        # Records of the last poll that did not all get out are not consumed: back to the
        # first of them, so that a group's commit does not skip what nobody read.
        for tp, first in unwritten.items():
            if tp in consumer.assignment():
                consumer.seek(tp, first)
        if group:
            consumer.commit()
    print(f"consumed {seen} records from {topic}", file=sys.stderr)
    return 0


def _write(out: Any, r: Any, sep: bytes | None, as_json: bool) -> None:
    if as_json:
        out.write(json.dumps(record_json(r)).encode() + b"\n")
    else:
        if sep is not None:
            out.write((r.key or b"") + sep)
        out.write((r.value or b"") + b"\n")


def run_share_consume(
    config: Mapping[str, Any],
    topic: str,
    group: str,
    count: int | None,
    key_separator: str | None,
    as_json: bool,
) -> int:
    """Read as a member of share group ``group``: each record printed is accepted; records
    taken but not printed (``-c`` reached, a closed pipe, Ctrl-C) are released for others."""
    import kcore
    from kcore.consumer.share import AcknowledgeType

    config = {**config, "group.id": group, "share.acknowledgement.mode": "explicit"}
    sep = key_separator.encode("utf-8", "surrogateescape") if key_separator else None
    out = sys.stdout.buffer
    seen = 0
    from kcore.cli import SOFT_STOPS, _stdout_to_devnull

    stop = threading.Event()  # SIGTERM: the loop ends between polls
    SOFT_STOPS.append(stop)
    with kcore.ShareConsumer(config) as consumer:
        consumer.subscribe([topic])
        try:
            while (count is None or seen < count) and not stop.is_set():
                for r in consumer.poll(timeout=0.5):
                    if count is not None and seen >= count:
                        consumer.acknowledge(r, AcknowledgeType.RELEASE)
                        continue
                    _write(out, r, sep, as_json)
                    out.flush()
                    consumer.acknowledge(r, AcknowledgeType.ACCEPT)
                    seen += 1
        except BrokenPipeError:  # `kcore consume ... | head`: the reader has had enough
            _stdout_to_devnull()
        except KeyboardInterrupt:
            pass
        finally:
            SOFT_STOPS.remove(stop)
            # What this poll took and nobody printed goes back to the group (close releases
            # the unacknowledged records of explicit mode).
            consumer.commit_sync()
    print(f"consumed {seen} records from {topic} (share group {group})", file=sys.stderr)
    return 0


def _at_end(consumer: Any, ends: Mapping[TopicPartition, int]) -> bool:
    """Every partition this consumer reads is at the end seen at the start (a group member:
    those assigned to it, once it has some)."""
    mine = consumer.assignment()
    return bool(mine) and all(consumer.position(tp) >= ends[tp] for tp in mine if tp in ends)
