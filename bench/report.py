"""Markdown report of a codec benchmark run: per group, each implementation's median time and
throughput and kcore's ratio against every peer (peer median / kcore median: above 1 means
kcore is faster), then the issue's goals as pass/fail rows.

    pytest bench/test_codec_bench.py --benchmark-json=out.json
    python bench/report.py out.json [more.json ...]

The cluster (bench/test_cluster_bench.py), producer (bench/test_producer_bench.py) and consumer
(bench/test_consumer_bench.py) runs get the same treatment; the producer's and the consumer's
groups also show records/s, MB/s, CPU and peak RSS growth. So do bench/test_group_bench.py's
transactional group; its join and rebalance groups are latencies (no records/s), shown with
their spread, CPU and, for rebalances, when the three members first covered the topic.
bench/test_spark_bench.py's groups (kcore's Spark data source against the JVM connector) show
records/s and the CPU of Spark's JVM and its Python workers.

With several files, each run gets its report, then one table puts the goal ratios side by side
(the spread between runs is the noise of the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CODEC_ORDER = ("none", "gzip", "snappy", "lz4", "zstd")
PEER_ORDER = ("aiokafka", "kafka-python", "crc32c", "google-crc32c", "aiokafka-py")
# bench/test_cluster_bench.py: its groups in the order of the docs, its peers after the above.
CLUSTER_ORDER = ("cold-start", "metadata-warm", "list-offsets-warm", "pipelining")
CLUSTER_PEER_ORDER = ("confluent-kafka", "confluent-kafka (no sparse conns)")
CLUSTER_UNITS = {"partitions": "partition", "requests": "request"}  # shown per µs and k/s
# bench/test_producer_bench.py: its codecs in the order of the docs, its peers after the above.
PRODUCE_ORDER = ("none", "lz4")
PRODUCE_PEER_ORDER = ("confluent-kafka", "kafka-python", "aiokafka")
# bench/test_consumer_bench.py: the same codecs; its diagnostic confluent-kafka row after the rest.
CONSUME_ORDER = ("none", "lz4")
CONSUME_PEER_ORDER = ("confluent-kafka (8 MiB partition fetch)",)
# bench/test_group_bench.py: its groups in the order of the docs, its peers' variants.
GROUP_KINDS = ("join", "rebalance", "txn")
GROUP_PEER_ORDER = (
    "confluent-kafka (cooperative-sticky)",
    "confluent-kafka (group.protocol=consumer)",
)
# Its groups that are latencies (latency_table) rather than throughputs.
LATENCY_GROUPS = ("join:", "rebalance:")
# bench/test_spark_bench.py: its groups in the order of the docs, its peer.
SPARK_ORDER = ("read", "write", "stream")
# The Spark goals' floors (bench/_spark_floor.py): the same job on a Python data source with no
# Kafka client, which no Python source or sink can beat.
SPARK_BOUNDS = {
    "write": ("floor.write", "Python sink"),
    "stream": ("floor.stream", "Python streaming source"),
}
SPARK_PEER_ORDER = ("spark-sql-kafka",)


@dataclass(frozen=True)
class Goal:
    text: str
    group: str
    kcore: tuple[str, ...]  # extra_info keys of the kcore benchmarks held to it
    peer: str | None  # the peer's key; None: the fastest of the group's ``package`` benchmarks
    target: float
    suite: str = "codec"  # a run is held to the goals of the suites it has a group of
    # A benchmark that does the least any implementation must (e.g. make the records' objects
    # and nothing else): its extra_info key, and who it bounds. peer / bound is the most any of
    # them could reach.
    bound: tuple[str, str] | None = None


GOALS = (
    Goal(
        "record-by-record append >= 1.5x aiokafka's append (uncompressed)",
        "encode:none",
        ("kcore.append",),
        "aiokafka.append",
        1.5,
    ),
    Goal(
        "bulk append (one call) >= 5x aiokafka's append (uncompressed)",
        "encode:none",
        ("kcore.append_many.lists", "kcore.append_many.pyarrow", "kcore.append_many.numpy"),
        "aiokafka.append",
        5.0,
    ),
    # Both sides as their consumers decode by default: batches' CRCs checked (Java's check.crcs,
    # aiokafka's and kafka-python's check_crcs), which is also how the issue measured aiokafka.
    Goal(
        "decode to records >= 2x aiokafka's decode (uncompressed)",
        "decode:none",
        ("kcore.decode_batches", "kcore.decode_records"),
        "aiokafka.decode",
        2.0,
    ),
    # The same with neither side checking CRCs: what is left is reading records and making
    # their objects, which the floor bounds.
    Goal(
        "decode to records >= 2x aiokafka's decode, neither checking CRCs (uncompressed)",
        "decode:none",
        ("kcore.decode_batches.no_crc",),
        "aiokafka.decode.no_crc",
        2.0,
        bound=("floor.decode_records", "decoder that returns the same record objects"),
    ),
    Goal(
        "columnar decode >= 10x aiokafka's decode (uncompressed)",
        "decode:none",
        ("kcore.decode_to_arrow", "kcore.decode_columns"),
        "aiokafka.decode",
        10.0,
    ),
    Goal(
        "CRC32C >= 0.9x the fastest CRC package (64 MiB)",
        "crc32c:64MiB",
        ("kcore.crc32c",),
        None,
        0.9,
    ),
    # bench/test_producer_bench.py
    *(
        goal
        for codec in PRODUCE_ORDER
        for goal in (
            Goal(
                f"send loop >= 1.5x confluent-kafka's produce loop ({codec})",
                f"produce:{codec}",
                ("kcore.send",),
                "confluent.produce",
                1.5,
                "producer",
            ),
            Goal(
                f"send_batch >= 3x confluent-kafka's produce loop ({codec})",
                f"produce:{codec}",
                ("kcore.send_batch.list", "kcore.send_batch.pyarrow"),
                "confluent.produce",
                3.0,
                "producer",
                bound=("floor.produce", "client on one connection to this broker"),
            ),
        )
    ),
    # bench/test_consumer_bench.py (the peer is confluent-kafka with its default fetch sizes)
    *(
        goal
        for codec in CONSUME_ORDER
        for goal in (
            Goal(
                f"poll >= 1.5x confluent-kafka's consume ({codec})",
                f"consume:{codec}",
                ("kcore.poll",),
                "confluent.consume",
                1.5,
                "consumer",
            ),
            Goal(
                f"poll_arrow >= 5x confluent-kafka's consume ({codec})",
                f"consume:{codec}",
                ("kcore.poll_arrow",),
                "confluent.consume",
                5.0,
                "consumer",
            ),
        )
    ),
    # bench/test_group_bench.py (times: not slower than confluent-kafka, like for like)
    Goal(
        "join to first record (classic) >= 1x confluent-kafka's",
        "join:first-record",
        ("kcore.join.classic",),
        "confluent.join.classic",
        1.0,
        "groups",
    ),
    Goal(
        "join to first record (group.protocol=consumer) >= 1x confluent-kafka's",
        "join:first-record",
        ("kcore.join.consumer",),
        "confluent.join.consumer",
        1.0,
        "groups",
    ),
    Goal(
        "rebalance, 3rd member (default assignors) >= 1x confluent-kafka's",
        "rebalance:3rd-member",
        ("kcore.rebalance.default",),
        "confluent.rebalance.default",
        1.0,
        "groups",
    ),
    Goal(
        "rebalance, 3rd member (cooperative-sticky) >= 1x confluent-kafka's",
        "rebalance:3rd-member",
        ("kcore.rebalance.cooperative-sticky",),
        "confluent.rebalance.cooperative-sticky",
        1.0,
        "groups",
    ),
    Goal(
        "rebalance, 3rd member (group.protocol=consumer) >= 1x confluent-kafka's",
        "rebalance:3rd-member",
        ("kcore.rebalance.consumer",),
        "confluent.rebalance.consumer",
        1.0,
        "groups",
    ),
    Goal(
        "transactions of 1,000 records >= 1.5x confluent-kafka's",
        "txn:1000x100B",
        ("kcore.txn.send", "kcore.txn.send_batch"),
        "confluent.txn.produce",
        1.5,
        "groups",
    ),
    # bench/test_spark_bench.py (format("kcore") against format("kafka"), the JVM connector)
    *(
        Goal(
            f"Spark {what} >= 1x the JVM Kafka connector's",
            f"spark:{what}",
            (f"kcore.{what}",),
            f"kafka.{what}",
            1.0,
            "spark",
            bound=SPARK_BOUNDS.get(what),
        )
        for what in SPARK_ORDER
    ),
)
SUITE_TITLES = {
    "codec": "Codec benchmarks",
    "producer": "Producer benchmarks",
    "consumer": "Consumer benchmarks",
    "groups": "Consumer group and transaction benchmarks",
    "spark": "Spark data source benchmarks",
}
# Suites whose goals are also shown by client CPU time (their rows record ``cpu_s``; rows
# without ``items``, the latencies, are left out).
CPU_SUITES = ("producer", "consumer", "groups", "spark")
# Group prefixes shown by client_table (records/s, MB/s, CPU, RSS), and whose ``settings``
# extra_info machine_lines prints.
CLIENT_GROUPS = {
    "produce:": "producer",
    "consume:": "consumer",
    "txn:": "group and transaction",
    "spark:": "Spark",
}
# Group prefixes that ran against a broker (machine_lines names it).
BROKER_GROUPS = ("cluster:", *CLIENT_GROUPS, *LATENCY_GROUPS)


@dataclass
class Bench:
    group: str
    name: str
    key: str
    label: str
    impl: str
    median: float  # seconds
    min: float
    iqr: float
    rounds: int
    items: int | None
    unit: str
    nbytes: int | None
    output_bytes: int | None
    package: bool
    info: dict[str, Any]  # everything the benchmark recorded (the producer's CPU, RSS, ...)


def load(path: Path) -> tuple[dict[str, Any], dict[str, list[Bench]]]:
    data = json.loads(path.read_text())
    groups: dict[str, list[Bench]] = {}
    for b in data["benchmarks"]:
        info, stats = b.get("extra_info", {}), b["stats"]
        bench = Bench(
            group=b.get("group") or "(no group)",
            name=b["name"],
            key=info.get("key", b["name"]),
            label=info.get("label", b["name"]),
            impl=info.get("impl", "?"),
            median=stats["median"],
            min=stats["min"],
            iqr=stats["iqr"],
            rounds=stats["rounds"],
            items=info.get("items"),
            unit=info.get("unit", "records"),
            nbytes=info.get("nbytes"),
            output_bytes=info.get("output_bytes"),
            package=bool(info.get("package")),
            info={**info, "max_s": stats.get("max")},
        )
        groups.setdefault(bench.group, []).append(bench)
    return data, groups


def group_order(name: str) -> tuple[int, int, str]:
    kind, _, codec = name.partition(":")
    kinds = (
        "encode",
        "decode",
        "crc32c",
        "murmur2",
        "cluster",
        "produce",
        "consume",
        *GROUP_KINDS,
        "spark",
    )
    k = kinds.index(kind) if kind in kinds else len(kinds)
    c = CODEC_ORDER.index(codec) if codec in CODEC_ORDER else len(CODEC_ORDER)
    if kind == "cluster" and codec in CLUSTER_ORDER:
        c = CLUSTER_ORDER.index(codec)
    if kind == "produce" and codec in PRODUCE_ORDER:
        c = PRODUCE_ORDER.index(codec)
    if kind == "consume" and codec in CONSUME_ORDER:
        c = CONSUME_ORDER.index(codec)
    if kind == "spark" and codec in SPARK_ORDER:
        c = SPARK_ORDER.index(codec)
    return (k, c, name)


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_rate(b: Bench) -> str:
    if b.nbytes:
        return f"{b.nbytes / b.median / 1e9:.2f} GB/s"
    if b.items:
        short = {"records": "rec", "keys": "keys"}.get(b.unit, b.unit)
        if b.unit in CLUSTER_UNITS:
            return f"{b.items / b.median / 1e3:.1f} k {b.unit}/s"
        return f"{b.items / b.median / 1e6:.2f} M {short}/s"
    return ""


def fmt_per_item(b: Bench) -> str:
    if b.items:
        short = {"records": "rec", "keys": "key"}.get(b.unit, b.unit)
        if b.unit in CLUSTER_UNITS:
            return f"{b.median / b.items * 1e6:.1f} µs/{CLUSTER_UNITS[b.unit]}"
        return f"{b.median / b.items * 1e9:.0f} ns/{short}"
    return ""


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x"


def is_kcore(b: Bench) -> bool:
    return b.impl == "kcore"


def peer_order(b: Bench) -> tuple[int, str]:
    order = (
        PEER_ORDER
        + CLUSTER_PEER_ORDER
        + PRODUCE_PEER_ORDER
        + CONSUME_PEER_ORDER
        + GROUP_PEER_ORDER
        + SPARK_PEER_ORDER
    )
    return (order.index(b.impl) if b.impl in order else len(order), b.impl)


def group_table(name: str, benches: list[Bench]) -> list[str]:
    kcore = sorted((b for b in benches if is_kcore(b)), key=lambda b: b.median)
    peers = sorted((b for b in benches if not is_kcore(b)), key=peer_order)
    show_output = any(b.output_bytes for b in benches)
    head = ["implementation", "median", "min", "IQR/median", "per item", "throughput"]
    if show_output:
        head.append("batch bytes")
    head += [f"vs {p.impl}" for p in peers]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in kcore + peers:
        row = [
            f"**{b.label}**" if is_kcore(b) else b.label,
            fmt_time(b.median),
            fmt_time(b.min),
            f"{b.iqr / b.median * 100:.0f}%" if b.median else "",
            fmt_per_item(b),
            fmt_rate(b),
        ]
        if show_output:
            row.append(f"{b.output_bytes:,}" if b.output_bytes else "")
        for p in peers:
            row.append(fmt_ratio(p.median / b.median) if is_kcore(b) else "")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def fmt_mib(nbytes: float | None) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes is not None else ""


def client_table(name: str, benches: list[Bench]) -> list[str]:
    """bench/test_producer_bench.py's and bench/test_consumer_bench.py's groups: besides the
    time, records/s and MB/s of payload (values only, 1 MB = 10^6 bytes), the client's CPU time
    per round (``process_time``: every thread of the process), the broker's (a separate
    process) and the peak RSS growth."""
    kcore = sorted((b for b in benches if is_kcore(b)), key=lambda b: b.median)
    peers = sorted((b for b in benches if not is_kcore(b)), key=peer_order)
    head = [
        "implementation",
        "median",
        "min",
        "IQR/median",
        "rounds",
        "records/s",
        "MB/s",
        "client CPU",
        "CPU/record",
        "broker CPU",
        "peak RSS growth",
    ]
    head += [f"vs {p.impl}" for p in peers]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in kcore + peers:
        cpu, broker_cpu = b.info.get("cpu_s"), b.info.get("broker_cpu_s")
        payload = b.info.get("payload_bytes")
        row = [
            f"**{b.label}**" if is_kcore(b) else b.label,
            fmt_time(b.median),
            fmt_time(b.min),
            f"{b.iqr / b.median * 100:.0f}%" if b.median else "",
            str(b.rounds),
            f"{b.items / b.median / 1e3:,.0f} k" if b.items else "",
            f"{payload / b.median / 1e6:.1f}" if payload else "",
            f"{cpu:.2f} s" if cpu is not None else "",
            f"{cpu / b.items * 1e6:.2f} µs" if cpu is not None and b.items else "",
            f"{broker_cpu:.2f} s" if broker_cpu is not None else "",
            fmt_mib(b.info.get("rss_growth_bytes")),
        ]
        for p in peers:
            row.append(fmt_ratio(p.median / b.median) if is_kcore(b) else "")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def spark_cpu_lines(groups: dict[str, list[Bench]]) -> list[str]:
    """bench/test_spark_bench.py's rows: where the CPU went (median round): Spark's JVM, its
    Python workers (kcore's reader and writer run there), the broker."""
    rows = [
        b
        for name in sorted(groups, key=group_order)
        if name.startswith("spark:")
        for b in sorted(groups[name], key=lambda b: (not is_kcore(b), b.key))
    ]
    if not rows:
        return []
    lines = [
        "### Spark: CPU time per round (median)",
        "",
        "| group | implementation | wall | JVM CPU | Python workers CPU | broker CPU |",
        "|---|---|---|---|---|---|",
    ]
    for b in rows:
        cells = [b.info.get(k) for k in ("jvm_cpu_s", "python_cpu_s", "broker_cpu_s")]
        lines.append(
            f"| {b.group} | {b.label} | {fmt_time(b.median)} | "
            + " | ".join(f"{c:.2f} s" if c is not None else "" for c in cells)
            + " |"
        )
    lines.append("")
    return lines


def latency_table(name: str, benches: list[Bench]) -> list[str]:
    """bench/test_group_bench.py's join and rebalance groups: a round is one event (a join, a
    rebalance), so the spread of the rounds, the client's and the broker's CPU time per round
    and, for rebalances, when the members first covered the topic (``covered_s_rounds``). A
    kcore row's ratio is against its ``counterpart``: confluent-kafka with the same group
    protocol and assignor (the other peers' ratios would compare different protocols)."""
    kcore = sorted((b for b in benches if is_kcore(b)), key=lambda b: b.median)
    peers = sorted((b for b in benches if not is_kcore(b)), key=peer_order)
    by_key = {b.key: b for b in benches}
    covered = any(b.info.get("covered_s_rounds") for b in benches)
    head = ["implementation", "median", "min", "max", "rounds", "client CPU", "broker CPU"]
    if covered:
        head.append("covered (median)")
    head += ["vs confluent-kafka, same protocol"]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in kcore + peers:
        cpu, broker_cpu = b.info.get("cpu_s"), b.info.get("broker_cpu_s")
        row = [
            f"**{b.label}**" if is_kcore(b) else b.label,
            fmt_time(b.median),
            fmt_time(b.min),
            fmt_time(b.info["max_s"]) if b.info.get("max_s") is not None else "",
            str(b.rounds),
            fmt_time(cpu) if cpu is not None else "",
            fmt_time(broker_cpu) if broker_cpu is not None else "",
        ]
        if covered:
            rounds = sorted(b.info.get("covered_s_rounds") or [])
            row.append(fmt_time(rounds[len(rounds) // 2]) if rounds else "")
        peer = by_key.get(b.info.get("counterpart", "")) if is_kcore(b) else None
        row.append(fmt_ratio(peer.median / b.median) if peer else "")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def client_cpu_table(results: list[GoalResult]) -> list[str]:
    """The producer and consumer goals' rows again, by client CPU time instead of wall time:
    the wall time of producing until acknowledged (or of fetching) includes the broker, the CPU
    time only the client."""
    rows = [r for r in results if r.goal.suite in CPU_SUITES and r.kcore and r.peer]
    if not rows:
        return []
    head = ["goal", "kcore", "kcore CPU/record", "peer CPU/record", "CPU ratio", "target"]
    lines = [
        "Client CPU (process time of every thread of the client, median round) for the same "
        "rows: peer CPU / kcore CPU.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        k, p = r.kcore, r.peer
        assert k is not None and p is not None
        kc, pc = k.info.get("cpu_s"), p.info.get("cpu_s")
        if not kc or not pc or not k.items or not p.items:
            continue
        lines.append(
            f"| {r.goal.text} | {k.label} | {kc / k.items * 1e6:.2f} µs | "
            f"{pc / p.items * 1e6:.2f} µs | {fmt_ratio(pc / kc)} | >= {r.goal.target:g}x |"
        )
    lines.append("")
    return lines


# Groups of benchmarks that carry a side measurement in their extra_info, not a timing.
SIDE_GROUPS = ("memory:",)


def memory_lines(groups: dict[str, list[Bench]]) -> list[str]:
    """The kcore send loop's peak RSS growth in a fresh process, against buffer.memory (the
    ``memory`` extra_info of bench/test_producer_bench.py's ``kcore.send`` benchmark)."""
    rows = [m for benches in groups.values() for b in benches for m in b.info.get("memory", [])]
    if not rows:
        return []
    lines = [
        "### kcore send loop: peak RSS growth against buffer.memory (a fresh process)",
        "",
        "| buffer.memory | RSS before the loop | peak RSS growth | growth / buffer.memory"
        " | loop time | client CPU |",
        "|---|---|---|---|---|---|",
    ]
    for m in rows:
        if "error" in m:
            lines.append(f"| {fmt_mib(m['buffer_memory'])} | {m['error']} | | | | |")
            continue
        lines.append(
            f"| {fmt_mib(m['buffer_memory'])} | {fmt_mib(m['rss_before'])} | "
            f"{fmt_mib(m['rss_growth'])} | {m['rss_growth'] / m['buffer_memory']:.2f} | "
            f"{fmt_time(m['seconds'])} | {m['cpu']:.2f} s |"
        )
    lines.append("")
    return lines


@dataclass
class GoalResult:
    goal: Goal
    kcore: Bench | None
    kcore_key: str
    peer: Bench | None
    ratio: float | None
    ratio_min: float | None

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "n/a (not run)"
        return "PASS" if self.ratio >= self.goal.target else "FAIL"


def evaluate(groups: dict[str, list[Bench]]) -> list[GoalResult]:
    out = []
    suites = {goal.suite for goal in GOALS if goal.group in groups}
    for goal in GOALS:
        if goal.suite not in suites:
            continue
        benches = {b.key: b for b in groups.get(goal.group, [])}
        if goal.peer is None:
            packages = [b for b in benches.values() if b.package]
            peer = min(packages, key=lambda b: b.median) if packages else None
        else:
            peer = benches.get(goal.peer)
        for key in goal.kcore:
            k = benches.get(key)
            if k is not None and peer is not None:
                out.append(GoalResult(goal, k, key, peer, peer.median / k.median, peer.min / k.min))
            else:
                out.append(GoalResult(goal, k, key, peer, None, None))
    return out


def fmt_median(b: Bench) -> str:
    per = fmt_per_item(b) or fmt_rate(b)
    return f"{fmt_time(b.median)} ({per})" if per else fmt_time(b.median)


def goals_table(results: list[GoalResult]) -> list[str]:
    head = [
        "goal",
        "kcore",
        "kcore median",
        "peer",
        "peer median",
        "ratio",
        "target",
        "result",
        "ratio of mins",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        k, p = r.kcore, r.peer
        lines.append(
            "| "
            + " | ".join(
                [
                    r.goal.text,
                    k.label if k else r.kcore_key,
                    fmt_median(k) if k else "-",
                    p.label if p else "-",
                    fmt_median(p) if p else "-",
                    fmt_ratio(r.ratio) if r.ratio is not None else "-",
                    f">= {r.goal.target:g}x",
                    f"**{r.verdict}**",
                    fmt_ratio(r.ratio_min) if r.ratio_min is not None else "-",
                ]
            )
            + " |"
        )
    lines.append("")
    return lines


def machine_lines(data: dict[str, Any]) -> list[str]:
    mi = data.get("machine_info", {})
    kb = mi.get("kcore_bench", {})
    cpu = kb.get("cpu_model") or mi.get("cpu", {}).get("brand_raw", "?")
    commit = data.get("commit_info", {})
    lines = [
        f"- when: {data.get('datetime', '?')}; commit {str(commit.get('id', '?'))[:12]}"
        + (" (dirty)" if commit.get("dirty") else ""),
        f"- machine: {cpu}, nproc {kb.get('nproc', '?')}, {mi.get('system', '')} "
        f"{mi.get('release', '')}; {kb.get('python_implementation', '')} "
        f"{kb.get('python', mi.get('python_version', '?'))}",
    ]
    if kb:
        versions = ", ".join(f"{k} {v}" for k, v in kb.get("versions", {}).items())
        lines += [
            f"- versions: {versions}",
            f"- kcore CRC32C: {kb.get('kcore_crc32c')}; aiokafka builder: "
            f"{kb.get('aiokafka_builder_module')}; kafka-python codecs: "
            f"{', '.join(kb.get('kafka_python_codecs', []))}",
        ]
        cluster_run = any(
            str(b.get("group") or "").startswith(BROKER_GROUPS) for b in data.get("benchmarks", [])
        )
        if cluster_run and "kafka_broker" in kb:  # bench/test_cluster_bench.py's broker
            lines.append(
                f"- Kafka broker: {kb['kafka_broker']}; librdkafka (confluent-kafka): "
                f"{kb.get('librdkafka', '?')}"
            )
    shown: list[Any] = []
    for prefix, suite in CLIENT_GROUPS.items():
        settings = next(
            (
                b["extra_info"]["settings"]
                for b in data.get("benchmarks", [])
                if str(b.get("group") or "").startswith(prefix) and "settings" in b["extra_info"]
            ),
            None,
        )
        if settings and settings not in shown:  # the workload and the clients' matched settings
            shown.append(settings)
            lines.append(
                f"- {suite} workload and settings: "
                + ", ".join(f"{k} {v}" for k, v in settings.items())
            )
    opts = next(iter(data.get("benchmarks", [])), {}).get("options", {})
    if opts:
        lines.append(
            f"- pytest-benchmark: min_rounds {opts.get('min_rounds')}, max_time "
            f"{opts.get('max_time')} s, timer {opts.get('timer')}, gc disabled: "
            f"{opts.get('disable_gc')}"
        )
    return lines


def bound_lines(results: list[GoalResult], groups: dict[str, list[Bench]]) -> list[str]:
    """For a goal with a bound benchmark in the run: how far ahead of the peer the bound itself
    is (the most any implementation reaches), and how close kcore's best comes to it."""
    lines = []
    for goal in dict.fromkeys(r.goal for r in results if r.goal.bound):
        benches = {b.key: b for b in groups.get(goal.group, [])}
        assert goal.bound is not None
        bound = benches.get(goal.bound[0])
        ran = [r for r in results if r.goal is goal and r.ratio is not None]
        if bound is None or not ran:
            continue
        best = max(ran, key=lambda r: r.ratio or 0.0)
        assert best.peer is not None and best.kcore is not None
        if best.kcore.median < bound.median:
            # The floor was measured under other conditions than the row it should bound
            # (e.g. which of the allocator's arenas were still mapped): no bound in this run.
            lines.append(
                f'"{goal.text}": {bound.label} took {fmt_median(bound)}, more than'
                f" {best.kcore.label} ({fmt_median(best.kcore)}): it ran under other"
                " conditions (memory state, load), so it bounds nothing in this run."
            )
            continue
        lines.append(
            f'Bound of "{goal.text}": {bound.label} takes {fmt_median(bound)}, so no'
            f" {goal.bound[1]} can pass {fmt_ratio(best.peer.median / bound.median)} of"
            f" {best.peer.label} in this run; {best.kcore.label} runs at"
            f" {100 * bound.median / best.kcore.median:.0f}% of the bound's speed."
        )
    return [*lines, ""] if lines else []


def report(path: Path) -> tuple[list[str], list[GoalResult]]:
    data, groups = load(path)
    results = evaluate(groups)
    # A run without any goal's group (e.g. bench/test_cluster_bench.py) gets no goals table.
    has_goals = any(goal.group in groups for goal in GOALS)
    suites = sorted({goal.suite for goal in GOALS if goal.group in groups})
    title = " and ".join(SUITE_TITLES[s] for s in suites) if has_goals else "Benchmarks"
    lines = [f"## {title}: {path.name}", "", *machine_lines(data), ""]
    lines += [
        "Ratios are peer median / kcore median: above 1 means kcore is faster. Results use the"
        " median ratio; the ratio of the minimum times is shown for judging noise.",
        "",
    ]
    if has_goals:
        lines += ["### Goals", "", *goals_table(results), *bound_lines(results, groups)]
        lines += client_cpu_table(results)
    for name in sorted(groups, key=group_order):
        if name.startswith(SIDE_GROUPS):
            continue  # not timed: their extra_info has its own table (memory_lines)
        if all("table" in b.info for b in groups[name]):
            # Variants alternating inside one benchmark (test_consumer_bench.py's large
            # values): the benchmark made its own table; pytest-benchmark's time is the lot.
            lines += [f"### {name}", *(b.info["table"] for b in groups[name]), ""]
        elif name.startswith(tuple(CLIENT_GROUPS)):
            lines += client_table(name, groups[name])
        elif name.startswith(LATENCY_GROUPS):
            lines += latency_table(name, groups[name])
        else:
            lines += group_table(name, groups[name])
    lines += spark_cpu_lines(groups)
    lines += memory_lines(groups)
    return lines, results


def across_runs(paths: list[Path], runs: list[list[GoalResult]]) -> list[str]:
    head = ["goal", "kcore", "target", *[p.name for p in paths]]
    lines = [
        "## Goals across runs (ratio, result)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    # Matched by goal and kcore row, not by position: runs of different suites have different
    # goals (a goal a run has no group of is "-").
    by_run = [{(r.goal.text, r.kcore_key): r for r in results} for results in runs]
    firsts: dict[tuple[str, str], GoalResult] = {}
    for results in runs:
        for r in results:
            firsts.setdefault((r.goal.text, r.kcore_key), r)
    for key, first in firsts.items():
        cells = []
        for results_by_key in by_run:
            got = results_by_key.get(key)
            if got is None:
                cells.append("-")
            else:
                cells.append(
                    f"{fmt_ratio(got.ratio)} {got.verdict}"
                    if got.ratio is not None
                    else got.verdict
                )
        label = first.kcore.label if first.kcore else first.kcore_key
        lines.append(
            "| " + " | ".join([first.goal.text, label, f">= {first.goal.target:g}x", *cells]) + " |"
        )
    lines.append("")
    return lines


def cluster_across_runs(
    paths: list[Path], prefix: str = "cluster:", title: str = "Cluster"
) -> list[str]:
    """The cluster groups' ratios (peer median / kcore median) side by side, one column per
    run: for groups without goals, the spread between runs is the thing to judge."""
    runs = [load(path)[1] for path in paths]
    names = sorted({g for groups in runs for g in groups if g.startswith(prefix)}, key=group_order)
    if not names:
        return []
    head = ["group", "kcore", "vs", *[p.name for p in paths]]
    lines = [
        f"## {title} ratios across runs (peer median / kcore median)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name in names:
        first = runs[0].get(name, [])
        kcore = sorted((b for b in first if is_kcore(b)), key=lambda b: b.key)
        peers = sorted((b for b in first if not is_kcore(b)), key=peer_order)
        for k in kcore:
            for p in peers:
                if k.info.get("counterpart") not in (None, p.key):
                    continue  # bench/test_group_bench.py: like for like only
                cells = []
                for groups in runs:
                    by_key = {b.key: b for b in groups.get(name, [])}
                    kb, pb = by_key.get(k.key), by_key.get(p.key)
                    cells.append(fmt_ratio(pb.median / kb.median) if kb and pb else "-")
                lines.append("| " + " | ".join([name, k.label, p.label, *cells]) + " |")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="pytest --benchmark-json output")
    args = parser.parse_args(argv)
    out: list[str] = []
    runs = []
    for path in args.json:
        lines, results = report(path)
        out += lines
        runs.append(results)
    if len(runs) > 1:
        if any(r.ratio is not None for results in runs for r in results):
            out += across_runs(args.json, runs)
        out += cluster_across_runs(args.json)
        out += cluster_across_runs(args.json, "produce:", "Producer")
        out += cluster_across_runs(args.json, "consume:", "Consumer")
        out += cluster_across_runs(args.json, "join:", "Group join")
        out += cluster_across_runs(args.json, "rebalance:", "Rebalance")
        out += cluster_across_runs(args.json, "txn:", "Transactions")
        out += cluster_across_runs(args.json, "spark:", "Spark")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
