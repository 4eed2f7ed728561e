"""``kcore groups``: the cluster's groups (consumer and share groups, with their type), and
for the groups named their state, members and per-partition lag (what Kafka's
``kafka-consumer-groups --list`` and ``--describe`` show; for a share group what
``kafka-share-groups --describe`` shows: each partition's start offset and lag, and the
members with their assignments), once or every few seconds (``--watch``)."""

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

__all__ = ["group_lag_rows", "run_groups", "share_group_rows", "watch_groups"]

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


def share_group_rows(
    description: Any, offsets: Mapping[TopicPartition, Any]
) -> list[dict[str, Any]]:
    """One row per partition the share group has a start offset for or a member is assigned,
    sorted: its start offset and lag (None where the broker has none) and the members
    assigned it (several members of a share group may fetch from one partition)."""
    members: dict[TopicPartition, list[str]] = {}
    for member in description.members:
        for tp in member.assignment:
            members.setdefault(tp, []).append(member.member_id)
    rows = []
    for tp in sorted(set(offsets) | set(members)):
        info = offsets.get(tp)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "start_offset": None if info is None else info.start_offset,
                "lag": None if info is None else info.lag,
                "member_ids": sorted(members.get(tp, [])),
            }
        )
    return rows


def _describe_share(admin: Any, group_id: str, description: Any) -> dict[str, Any]:
    try:
        offsets = admin.list_share_group_offsets(group_id)
    except AdminOperationError as exc:  # a deleted topic, say: its rows show no offset
        offsets = exc.results or {}
    return {
        "group_id": group_id,
        "type": "share",
        "state": description.state,
        "partition_assignor": description.partition_assignor,
        "coordinator": description.coordinator,
        "group_epoch": description.group_epoch,
        "members": len(description.members),
        "member_details": [
            {
                "member_id": m.member_id,
                "host": m.host,
                "client_id": m.client_id,
                "member_epoch": m.member_epoch,
                "assignment": [f"{tp.topic}-{tp.partition}" for tp in sorted(m.assignment)],
            }
            for m in sorted(description.members, key=lambda m: m.member_id)
        ],
        "partitions": share_group_rows(description, offsets),
    }


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(value) or "-"
    return str(value)


def _render_share(group: dict[str, Any]) -> str:
    lines = [
        f"Group {group['group_id']} (share): {group['state']}, {group['members']} member(s), "
        f"group epoch {group['group_epoch']}, assignor {group['partition_assignor'] or '-'}, "
        f"coordinator {group['coordinator']}"
    ]
    header = ("TOPIC", "PARTITION", "START-OFFSET", "LAG", "MEMBER-IDS")
    lines += _table(header, [tuple(_cell(v) for v in r.values()) for r in group["partitions"]])
    if group["member_details"]:
        header = ("MEMBER-ID", "HOST", "CLIENT-ID", "MEMBER-EPOCH", "ASSIGNMENT")
        rows = [tuple(_cell(v) for v in m.values()) for m in group["member_details"]]
        lines += ["", *_table(header, rows)]
    return "\n".join(lines)


def _render(group: dict[str, Any]) -> str:
    if group["type"] == "share":
        return _render_share(group)
    lines = [
        f"Group {group['group_id']} ({group['type']}): {group['state']}, "
        f"{group['members']} member(s), assignor {group['partition_assignor'] or '-'}, "
        f"coordinator {group['coordinator']}"
    ]
    header = ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
              "HOST", "CLIENT-ID")  # fmt: skip
    lines += _table(header, [tuple(_cell(v) for v in r.values()) for r in group["partitions"]])
    return "\n".join(lines)


def run_groups(config: Mapping[str, Any], group_ids: list[str], as_json: bool) -> int:
    """List the groups (no ``group_ids``), or describe those named. Exit status 1 if one of
    them does not exist or could not be described (said on stderr)."""
    from kcore.admin.client import AdminClient

    with AdminClient(config) as admin:
        admin.wait_until_ready()  # fail fast: the cluster unreachable is said at once
        if not group_ids:
            listed = admin.list_groups()
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
    be (a group that does not exist: ``GroupIdNotFoundError``). A group the broker says is
    not a consumer group (``GroupIdNotFoundError`` too) is described as a share group."""
    try:
        descriptions = admin.describe_consumer_groups(group_ids)
        errors: dict[Any, KcoreError] = {}
    except AdminOperationError as exc:
        descriptions, errors = dict(exc.results or {}), dict(exc.errors)
    maybe_share = [g for g, e in errors.items() if isinstance(e, GroupIdNotFoundError)]
    shares: dict[str, Any] = {}
    if maybe_share:
        try:
            shares = admin.describe_share_groups(maybe_share)
        except AdminOperationError as exc:  # one that is neither keeps the first error
            shares = dict(exc.results or {})
        for g in shares:
            del errors[g]
    out = []
    for g in group_ids:
        if g in descriptions:
            out.append(_describe(admin, g, descriptions[g]))
        elif g in shares:
            out.append(_describe_share(admin, g, shares[g]))
    return out, errors


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
