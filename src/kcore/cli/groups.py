"""``kcore groups``: the cluster's consumer groups, and for the groups named their state,
members and per-partition lag (what Kafka's ``kafka-consumer-groups --list`` and
``--describe`` show), once or every few seconds (``--watch``)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from kcore.admin.types import AdminOperationError
from kcore.errors import GroupIdNotFoundError, KcoreError
from kcore.types import TopicPartition

__all__ = ["group_lag_rows", "run_groups", "watch_groups"]

# How long a watch waits at most after refreshes that failed (it doubles the interval).
MAX_BACKOFF_S = 30.0
_CLEAR_SCREEN = "\x1b[H\x1b[2J"


def group_lag_rows(
    description: Any,
    committed: Mapping[TopicPartition, int | None],
    ends: Mapping[TopicPartition, int],
) -> list[dict[str, Any]]:
    """One row per partition the group has an offset for or a member holds, sorted: its
    committed offset, the log end, the lag (None without a commit) and the member holding it."""
    owner: dict[TopicPartition, Any] = {}
    for member in description.members:
        for tp in member.assignment:
            owner[tp] = member
    rows = []
    for tp in sorted(set(committed) | set(owner)):
        offset, end, member = committed.get(tp), ends.get(tp), owner.get(tp)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current_offset": offset,
                "log_end_offset": end,
                "lag": None if offset is None or end is None else max(end - offset, 0),
                "member_id": member.member_id if member else None,
                "host": member.host if member else None,
                "client_id": member.client_id if member else None,
            }
        )
    return rows


def _describe(admin: Any, group_id: str, description: Any) -> dict[str, Any]:
    committed = admin.list_consumer_group_offsets(group_id)
    partitions = set(committed)
    for member in description.members:
        partitions |= set(member.assignment)
    ends: dict[TopicPartition, int] = {}
    if partitions:
        try:
            found = admin.list_offsets(dict.fromkeys(partitions, "latest"))
        except AdminOperationError as exc:  # a deleted topic, say: its rows show no end
            found = exc.results or {}
        ends = {tp: r.offset for tp, r in found.items()}
    return {
        "group_id": group_id,
        "type": description.type,
        "state": description.state,
        "partition_assignor": description.partition_assignor,
        "coordinator": description.coordinator,
        "members": len(description.members),
        "partitions": group_lag_rows(description, committed, ends),
    }


def _render(group: dict[str, Any]) -> str:
    lines = [
        f"Group {group['group_id']} ({group['type']}): {group['state']}, "
        f"{group['members']} member(s), assignor {group['partition_assignor'] or '-'}, "
        f"coordinator {group['coordinator']}"
    ]
    header = ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
              "HOST", "CLIENT-ID")  # fmt: skip
    table = [header] + [
        tuple("-" if v is None else str(v) for v in row.values()) for row in group["partitions"]
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines)


def run_groups(config: Mapping[str, Any], group_ids: list[str], as_json: bool) -> int:
    """List the groups (no ``group_ids``), or describe those named. Exit status 1 if one of
    them does not exist or could not be described (said on stderr)."""
    from kcore.admin.client import AdminClient

    with AdminClient(config) as admin:
        admin.wait_until_ready()  # fail fast: the cluster unreachable is said at once
        if not group_ids:
            listed = admin.list_consumer_groups()
            if as_json:
                print(json.dumps([vars(g) for g in listed], indent=2))
            for g in [] if as_json else listed:
                print(f"{g.group_id}  {g.type or '-'}  {g.state or '-'}  {g.protocol_type or '-'}")
            return 0
        out, errors = _describe_all(admin, group_ids)
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print("\n\n".join(_render(g) for g in out))
    _say_errors(errors)
    return 1 if errors else 0


def _describe_all(
    admin: Any, group_ids: list[str]
) -> tuple[list[dict[str, Any]], dict[Any, KcoreError]]:
    """The groups described (in ``group_ids``' order), and the errors of those that could not
    be (a group that does not exist: ``GroupIdNotFoundError``)."""
    try:
        descriptions = admin.describe_consumer_groups(group_ids)
        errors: dict[Any, KcoreError] = {}
    except AdminOperationError as exc:
        descriptions, errors = dict(exc.results or {}), dict(exc.errors)
    return [_describe(admin, g, descriptions[g]) for g in group_ids if g in descriptions], errors


def _say_errors(errors: Mapping[Any, KcoreError]) -> None:
    for group_id, error in errors.items():
        what = "no such group" if isinstance(error, GroupIdNotFoundError) else str(error)
        print(f"kcore groups: {group_id}: {what}", file=sys.stderr)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _watch_line(group: dict[str, Any], timestamp: str) -> str:
    """One refresh of one group as a JSON line: the ``--json`` object with the time and the
    total lag (of the partitions that have a lag)."""
    total = sum(row["lag"] for row in group["partitions"] if row["lag"] is not None)
    return json.dumps({"timestamp": timestamp, **group, "total_lag": total})


def watch_groups(
    config: Mapping[str, Any],
    group_ids: list[str],
    as_json: bool,
    interval_s: float,
    count: int | None = None,
) -> int:
    """Describe the groups every ``interval_s`` seconds, ``count`` times (None: until Ctrl-C
    or SIGTERM, which end the watch with status 0: it has no other end). With ``as_json``
    each refresh prints a JSON line per group; else the tables, after clearing the screen
    when stdout is a terminal, or after a time line when it is not (a log, a pipe).

    A group that does not exist (at the first refresh that gets an answer), or a cluster
    unreachable at the start, ends it with status 1, as without ``--watch``. Later failures
    (a broker down, a group deleted) are said on stderr and the watch goes on, waiting
    longer after each failure in a row (up to :data:`MAX_BACKOFF_S`)."""
    from kcore.admin.client import AdminClient
    from kcore.cli import SOFT_STOPS

    stop = threading.Event()  # SIGTERM: the watch ends between refreshes
    SOFT_STOPS.append(stop)
    tty = not as_json and sys.stdout.isatty()
    try:
        with AdminClient(config) as admin:
            admin.wait_until_ready()  # fail fast: the cluster unreachable is said at once
            refreshes = failures = 0
            described = False  # until a refresh succeeds, a missing group is an error
            while count is None or refreshes < count:
                if refreshes:
                    wait = interval_s * 2 ** min(failures, 16)
                    if stop.wait(min(wait, max(MAX_BACKOFF_S, interval_s))):
                        break
                refreshes += 1
                timestamp = _now()
                try:
                    out, errors = _describe_all(admin, group_ids)
                except KcoreError as exc:
                    out, errors = [], dict.fromkeys(group_ids, exc)
                missing = {g: e for g, e in errors.items() if isinstance(e, GroupIdNotFoundError)}
                if missing and not described:
                    _say_errors(missing)
                    return 1
                if len(errors) > len(missing):  # the cluster did not answer for some groups
                    failures += 1
                else:
                    described, failures = True, 0
                if as_json:
                    text = "\n".join(_watch_line(g, timestamp) for g in out)
                else:
                    title = f"Every {interval_s:g}s: {', '.join(group_ids)}  {timestamp}"
                    tables = "\n\n".join(_render(g) for g in out)
                    text = f"{_CLEAR_SCREEN if tty else '--- '}{title}\n{tables}".rstrip()
                if text:
                    print(text, flush=True)
                for group_id, error in errors.items():
                    what = "no such group" if group_id in missing else f"refresh failed: {error}"
                    print(f"kcore groups: {timestamp}: {group_id}: {what}", file=sys.stderr)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch is meant to end
    finally:
        SOFT_STOPS.remove(stop)
    return 0
