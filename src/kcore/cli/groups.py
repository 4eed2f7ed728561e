"""``kcore groups``: the cluster's consumer groups, and for the groups named their state,
members and per-partition lag (what Kafka's ``kafka-consumer-groups --list`` and
``--describe`` show)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from kcore.admin.types import AdminOperationError
from kcore.errors import GroupIdNotFoundError, KcoreError
from kcore.types import TopicPartition

__all__ = ["group_lag_rows", "run_groups"]


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
        try:
            descriptions = admin.describe_consumer_groups(group_ids)
            errors: dict[Any, KcoreError] = {}
        except AdminOperationError as exc:
            descriptions, errors = dict(exc.results or {}), dict(exc.errors)
        out = [_describe(admin, g, descriptions[g]) for g in group_ids if g in descriptions]
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print("\n\n".join(_render(g) for g in out))
    for group_id, error in errors.items():
        what = "no such group" if isinstance(error, GroupIdNotFoundError) else str(error)
        print(f"kcore groups: {group_id}: {what}", file=sys.stderr)
    return 1 if errors else 0
