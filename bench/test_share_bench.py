"""kcore's share consumer (KIP-932) against its peers: confluent-kafka's ``ShareConsumer`` and
Java's ``ShareConsumerPerformance`` tool (Kafka's jars kcore.testing runs the broker with),
measured in the same run against the same real broker.

Before the rounds, outside any timed part, N records (``KCORE_BENCH_SHARE_N``, default 200,000)
of 100-byte JSON-like values (the producer benchmark's ``make_values``), no keys, are written
once by kcore's ``Producer.send_batch`` into a topic of PARTITIONS partitions. Every round then
reads all N as a new share group (``share.auto.offset.reset=earliest`` set on the group by
``AdminClient.alter_configs`` before its members start) and ends when N records were accepted.

Cells (each round in a process of its own, bench/_share_child.py; the cells take turns round by
round, ROUNDS rounds, ``KCORE_BENCH_SHARE_ROUNDS``):

* kcore ``ShareConsumer``: 1, 2 and 4 members as threads of one process, and 2 and 4 members
  as processes of their own; explicit (``acknowledge(record)`` for each) and implicit
  acknowledgement; and 1 member reading ``poll_arrow`` batches (explicit: ``acknowledge_batch``
  for each);
* confluent-kafka ``ShareConsumer`` (librdkafka's share consumer preview): the same member
  counts and spreads, explicit and implicit;
* Java ``org.apache.kafka.tools.ShareConsumerPerformance --threads 1`` (and 2 and 4; implicit
  acknowledgement), in a JVM with the JIT's full tiers and 1 GiB of heap; its figure is the
  tool's own elapsed time (its start.time to its end.time, which leaves the JVM's start-up
  out).

Each kcore cell is compared with confluent-kafka's cell of the same members, spread and
acknowledgement, and with Java's of the same number of members (threads, implicit).

Every client gets its defaults (``max.poll.records`` 500 in kcore and Java) plus CONFIG
(``KCORE_BENCH_SHARE_CONFIG``, JSON, the same keys for all three). The Python cells' timed part
runs from the moment their members exist to the broker's answer to the last member's
``commit_sync`` (see bench/_share_child.py). The Python members poll with a 0.05 s timeout
(``KCORE_BENCH_SHARE_POLL_TIMEOUT``): a member whose partitions ran dry notices within it that
the round is over. After every round the group's lag
(``list_share_group_offsets``) must be 0 on every partition: the broker holds all N records
as acknowledged.

Run: ``pytest bench/test_share_bench.py -s --benchmark-json=out.json`` (``python
bench/report.py out.json`` prints it again); the table is printed and kept in the benchmark's
extra_info (docs/share-groups.md, "Benchmark").
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_producer_bench import Broker, _need, _optional, make_values

import kcore
from kcore.admin import NewTopic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = int(os.environ.get("KCORE_BENCH_SHARE_N", "200000"))
ROUNDS = int(os.environ.get("KCORE_BENCH_SHARE_ROUNDS", "3"))
PARTITIONS = int(os.environ.get("KCORE_BENCH_SHARE_PARTITIONS", "6"))
# Settings every client gets on top of its defaults (JSON, e.g. '{"max.poll.records": 2000}':
# kcore, librdkafka and Java all take that key).
CONFIG: dict[str, Any] = json.loads(os.environ.get("KCORE_BENCH_SHARE_CONFIG", "{}"))
LINGER_MS = 5
BATCH_SIZE = 1_000_000
TIMEOUT_S = 300.0
CHILD = str(Path(__file__).with_name("_share_child.py"))
JAVA_TOOL = "org.apache.kafka.tools.ShareConsumerPerformance"
JAVA_HEAP = "1g"

confluent = _optional("confluent_kafka")


SPREADS = ((1, "threads"), (2, "threads"), (4, "threads"), (2, "processes"), (4, "processes"))


def _cells() -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for ack in ("explicit", "implicit"):
        for client in ("kcore", "confluent"):
            for members, spread in SPREADS:
                cells.append({"client": client, "members": members, "spread": spread, "ack": ack})
            if client == "kcore":
                cells.append(
                    {
                        "client": "kcore",
                        "members": 1,
                        "spread": "threads",
                        "ack": ack,
                        "api": "arrow",
                    }
                )
    for members in (1, 2, 4):
        cells.append({"client": "java", "members": members, "spread": "threads", "ack": "implicit"})
    return cells


def _label(cell: dict[str, Any]) -> str:
    spread = "" if cell["members"] == 1 else f" {cell['spread']}"
    api = " arrow" if cell.get("api") == "arrow" else ""
    return f"{cell['client']}{api} {cell['members']}{spread} {cell['ack']}"


def _group_lag(admin: kcore.AdminClient, group: str, topic: str) -> dict[int, int | None]:
    got = admin.list_share_group_offsets(group, [(topic, p) for p in range(PARTITIONS)])
    return {tp.partition: (info.lag if info is not None else None) for tp, info in got.items()}


def _python_round(cell: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, CHILD, json.dumps({**spec, **cell})],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode != 0:
        raise AssertionError(f"{_label(cell)} round failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _java_round(spec: dict[str, Any], config_file: str, members: int) -> dict[str, Any]:
    """One run of Java's tool; its elapsed time from its own start.time and end.time."""
    from kcore.testing import _cds, jars
    from kcore.testing.versions import KAFKA_VERSION

    libs = jars.kafka_libs(KAFKA_VERSION)
    cmd = [
        jars.java_executable(),
        f"-Xmx{JAVA_HEAP}",
        "-XX:+UseG1GC",
        "-XX:-UsePerfData",
        f"-Dlog4j2.configurationFile={jars.tools_log4j2_config(KAFKA_VERSION)}",
        *_cds.classpath_args(libs),
        JAVA_TOOL,
        "--bootstrap-server",
        spec["bootstrap"],
        "--topic",
        spec["topic"],
        "--group",
        spec["group"],
        "--num-records",
        str(spec["records"]),
        "--threads",
        str(members),
        "--timeout",
        "60000",
        "--command-config",
        config_file,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    process_wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise AssertionError(f"java round failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {**_parse_java(done.stdout), "process_wall_s": process_wall}


def _parse_java(out: str) -> dict[str, Any]:
    """The tool prints a header line and a line of values: start.time, end.time,
    data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg, fetch.time.ms."""
    lines = [line for line in out.splitlines() if line.strip()]
    header_at = next(i for i, line in enumerate(lines) if line.startswith("start.time"))
    names = [h.strip() for h in lines[header_at].split(",")]
    values = [v.strip() for v in lines[header_at + 1].split(",")]
    row = dict(zip(names, values, strict=False))
    fmt = "%Y-%m-%d %H:%M:%S:%f"
    start = datetime.strptime(row["start.time"], fmt)
    end = datetime.strptime(row["end.time"], fmt)
    return {
        "wall_s": (end - start).total_seconds(),
        "records": int(row["data.consumed.in.nMsg"]),
        "row": row,
    }


def _table(times: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    med = {label: statistics.median(r["wall_s"] for r in rows) for label, rows in times.items()}
    # The Python cells also from their first records on (the join left out); Java's tool
    # does not say when its first records came.
    steady = {
        label: statistics.median(r["after_first_s"] for r in rows)
        for label, rows in times.items()
        if rows and all("after_first_s" in r for r in rows)
    }
    lines = [
        f"share-consume {N:,} records of 100 B, {PARTITIONS} partitions, "
        f"{ROUNDS} rounds a cell, cells alternating, config {CONFIG or 'defaults'}",
        f"{'cell':34} {'median s':>9} {'records/s':>11} {'CPU s':>6} {'vs confluent':>13} "
        f"{'vs java':>8} {'after 1st s':>12} {'vs confluent':>13} {'broker CPU s':>13}",
    ]
    summary: dict[str, Any] = {}
    for label, m in med.items():
        # The peers' cell of the same members (and for confluent-kafka the same spread and
        # acknowledgement): "kcore arrow 2 processes explicit" -> "confluent 2 processes
        # explicit", "java 2 threads implicit".
        client, rest = label.split(" arrow ", 1) if " arrow " in label else label.split(" ", 1)
        members = rest.split(" ", 1)[0]
        peer_label = f"confluent {rest}"
        java_cell = {"client": "java", "members": int(members), "spread": "threads"}
        java = med.get(_label({**java_cell, "ack": "implicit"}))
        peer = med.get(peer_label)
        vs_c = f"{peer / m:.2f}x" if peer and client != "confluent" else ""
        vs_j = f"{java / m:.2f}x" if java and client != "java" else ""
        cpu_rounds = [r["cpu_s"] for r in times[label] if "cpu_s" in r]
        cpu = f"{statistics.median(cpu_rounds):.2f}" if cpu_rounds else ""
        after = f"{steady[label]:.3f}" if label in steady else ""
        peer_after = steady.get(peer_label)
        vs_c_after = (
            f"{peer_after / steady[label]:.2f}x"
            if peer_after and label in steady and client != "confluent"
            else ""
        )
        broker_rounds = [r["broker_cpu_s"] for r in times[label] if "broker_cpu_s" in r]
        broker_cpu = f"{statistics.median(broker_rounds):.2f}" if broker_rounds else ""
        lines.append(
            f"{label:34} {m:9.3f} {N / m:11,.0f} {cpu:>6} {vs_c:>13} {vs_j:>8} {after:>12} "
            f"{vs_c_after:>13} {broker_cpu:>13}"
        )
        summary[label] = {"median_s": m, "records_per_s": N / m, "rounds": times[label]}
        if label in steady:
            summary[label]["after_first_s"] = steady[label]
    lines.append(
        "vs X: X's median time / the row's (above 1: the row is faster), X's cell of the "
        "same members (confluent: and spread, acknowledgement); CPU: the round's "
        "process time, all members' (Java's is not measured); after 1st: from the first "
        "poll that returned records to the end (the join left out); broker CPU: the broker "
        "JVM's CPU time over the round's process (its start and close included)"
    )
    return "\n".join(lines), summary


@pytest.mark.benchmark(group="share-consume")
def test_share_consume(benchmark: Any, kafka_cluster: Any) -> None:
    _need(confluent, "confluent-kafka")
    bootstrap = kafka_cluster.bootstrap_servers
    values = make_values(N)
    cells = _cells()
    times: dict[str, list[dict[str, Any]]] = {_label(c): [] for c in cells}
    nodes = getattr(kafka_cluster, "nodes", [])
    process = getattr(nodes[0], "process", None) if len(nodes) == 1 else None
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        broker = Broker(bootstrap, admin, process.pid if process else None)
        topic = f"bench-share-{broker.run}"
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)], timeout=30)
        broker.created.append(topic)
        producer_config = {
            "bootstrap.servers": bootstrap,
            "linger.ms": LINGER_MS,
            "batch.size": BATCH_SIZE,
            "acks": "all",
        }
        with kcore.Producer(producer_config) as producer:
            for result in [
                producer.send_batch(topic, values[p::PARTITIONS], partition=p)
                for p in range(PARTITIONS)
            ]:
                result.result(TIMEOUT_S)
        ends = admin.list_offsets({(topic, p): "latest" for p in range(PARTITIONS)})
        assert sum(r.offset for r in ends.values()) == N
        del values
        with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as f:
            f.writelines(f"{k}={v}\n" for k, v in CONFIG.items())
            java_config = f.name
        groups = 0

        def one(cell: dict[str, Any]) -> None:
            nonlocal groups
            groups += 1
            group = f"bench-share-{broker.run}-{groups:03d}"
            admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
            spec = {
                "bootstrap": bootstrap,
                "topic": topic,
                "group": group,
                "records": N,
                "config": CONFIG,
            }
            broker_cpu0 = broker.cpu_s()
            if cell["client"] == "java":
                got = _java_round(spec, java_config, cell["members"])
            else:
                got = _python_round(cell, spec)
            broker_cpu1 = broker.cpu_s()
            if broker_cpu0 is not None and broker_cpu1 is not None:
                # Joining, setting up and closing included (the JVM's whole run for Java).
                got["broker_cpu_s"] = broker_cpu1 - broker_cpu0
            assert got["records"] >= N, (_label(cell), got)
            lag = _group_lag(admin, group, topic)
            assert set(lag.values()) == {0}, (_label(cell), lag)
            times[_label(cell)].append(got)
            print(f"{_label(cell)}: {got['wall_s']:.3f} s", flush=True)

        def rounds() -> None:
            for cell in cells:  # warm-up: the broker's JIT, every client's first start
                if cell["members"] == 1:
                    one(cell)
            for label in times:
                times[label].clear()
            for _ in range(ROUNDS):
                for cell in cells:
                    one(cell)

        try:
            benchmark.pedantic(rounds, rounds=1, iterations=1)
        finally:
            os.unlink(java_config)
            admin.delete_topics([topic], timeout=30)
    table, summary = _table(times)
    print(table)
    benchmark.extra_info.update(table=table, cells=summary)
