"""``kcore metadata``: the cluster as the client sees it (what ``kcat -L`` shows)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import ClusterMetadata
from kcore.errors import ErrorCode

__all__ = ["metadata_json", "render_metadata", "run_metadata"]


async def fetch_metadata(config: Mapping[str, Any], topics: list[str] | None) -> ClusterMetadata:
    client = ClusterClient(config, all_topics=topics is None)
    try:
        await client.bootstrap()
        if topics:
            return await client.refresh_metadata(topics)
        return client.metadata
    finally:
        await client.close()


def metadata_json(
    md: ClusterMetadata, include_internal: bool = True, named: list[str] | None = None
) -> dict[str, Any]:
    """The cluster as JSON; internal topics only with ``include_internal`` or when ``named``."""
    return {
        "cluster_id": md.cluster_id,
        "controller_id": md.controller_id,
        "brokers": [
            {"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in sorted(md.brokers.values(), key=lambda b: b.node_id)
        ],
        "topics": [
            {
                "name": t.name,
                "topic_id": str(t.topic_id) if t.topic_id else None,
                "internal": t.is_internal,
                "error_code": t.error_code,
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                        "offline_replicas": list(p.offline_replicas),
                        "error_code": p.error_code,
                    }
                    for p in sorted(t.partitions.values(), key=lambda p: p.partition)
                ],
            }
            for t in sorted(md.topics.values(), key=lambda t: t.name)
            if include_internal or not t.is_internal or t.name in (named or ())
        ],
    }


def render_metadata(
    md: ClusterMetadata, include_internal: bool = True, named: list[str] | None = None
) -> str:
    data = metadata_json(md, include_internal, named)
    lines = [f"Metadata for cluster {md.cluster_id}:", f" {len(data['brokers'])} brokers:"]
    for b in data["brokers"]:
        role = " (controller)" if b["id"] == md.controller_id else ""
        rack = f" rack {b['rack']}" if b["rack"] else ""
        lines.append(f"  broker {b['id']} at {b['host']}:{b['port']}{rack}{role}")
    lines.append(f" {len(data['topics'])} topics:")
    for t in data["topics"]:
        internal = " (internal)" if t["internal"] else ""
        lines.append(f'  topic "{t["name"]}" with {len(t["partitions"])} partitions:{internal}')
        for p in t["partitions"]:
            err = f", error {p['error_code']}" if p["error_code"] else ""
            lines.append(
                f"    partition {p['partition']}, leader {p['leader']}, "
                f"replicas: {','.join(map(str, p['replicas']))}, "
                f"isrs: {','.join(map(str, p['isr']))}{err}"
            )
    return "\n".join(lines)


def run_metadata(
    config: Mapping[str, Any], topics: list[str] | None, include_internal: bool, as_json: bool
) -> int:
    md = asyncio.run(fetch_metadata(config, topics))
    if as_json:
        print(json.dumps(metadata_json(md, include_internal, topics), indent=2))
    else:
        print(render_metadata(md, include_internal, topics))
    # Topics asked for by name that the client cannot show: each said with its reason, and the
    # exit status is 1.
    problems = []
    for t in topics or []:
        if t in md.unauthorized_topics:
            problems.append(f"{t}: topic authorization failed (this client may not describe it)")
        elif t in md.invalid_topics:
            problems.append(f"{t}: not a valid topic name")
        elif t not in md.topics or md.topics[t].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            problems.append(f"{t}: no such topic")
    for problem in problems:
        print(f"kcore metadata: {problem}", file=sys.stderr)
    return 1 if problems else 0
