"""The ``kcore`` command line against real brokers: ``metadata`` (checked against Kafka's own
``kafka-topics --describe``), ``produce`` and ``consume``, ``groups`` (and its ``--watch``),
and ``doctor`` on healthy and broken set-ups."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import IO

import pytest
from conftest import UNREACHABLE_HOST, read_records

from kcore.admin import TopicPartition
from kcore.cli import main


def kcore(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcore", *args], capture_output=True, text=True, timeout=timeout
    )


def lines_of(stream: IO[str]) -> queue.Queue[str]:
    """The lines a running process writes to ``stream``, as they come (read by a thread)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def java_describe(cluster, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr) as Kafka's own TopicCommand prints them."""
    bootstrap = cluster.bootstrap_servers
    args = ["--bootstrap-server", bootstrap, "--describe", "--topic", topic]
    out = cluster.run_tool("kafka-topics", *args, check=True).stdout
    rows = {}
    for m in re.finditer(
        r"Partition: (\d+)\s+Leader: (-?\d+)\s+Replicas: ([\d,]+)\s+Isr: ([\d,]*)", out
    ):
        rows[int(m[1])] = (int(m[2]), _ids(m[3]), _ids(m[4]))
    return rows


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def test_metadata_json_matches_kafka_topics(kafka_cluster3):
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster3.create_topic(topic, partitions=3, replication_factor=3)
    proc = kcore("metadata", "-b", kafka_cluster3.bootstrap_servers, "--json", "-t", topic)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [b["id"] for b in data["brokers"]] == kafka_cluster3.node_ids
    (entry,) = [t for t in data["topics"] if t["name"] == topic]
    ours = {p["partition"]: (p["leader"], p["replicas"], p["isr"]) for p in entry["partitions"]}
    theirs = java_describe(kafka_cluster3, topic)
    assert {p: (lead, reps, sorted(isr)) for p, (lead, reps, isr) in ours.items()} == {
        p: (lead, reps, sorted(isr)) for p, (lead, reps, isr) in theirs.items()
    }


def test_metadata_text(kafka_cluster, capsys):
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=2)
    assert main(["metadata", "-b", kafka_cluster.bootstrap_servers]) == 0
    out = capsys.readouterr().out
    assert "1 brokers:" in out and "broker 1 at 127.0.0.1:" in out
    assert f'topic "{topic}" with 2 partitions:' in out
    assert "partition 1, leader 1, replicas: 1, isrs: 1" in out


def test_doctor_healthy_cluster(kafka_cluster3):
    proc = kcore(
        "doctor", "-b", kafka_cluster3.bootstrap_servers, "--group", "doctor-group", "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and not report["problems"]
    assert [b["node_id"] for b in report["brokers"]] == kafka_cluster3.node_ids
    assert all(b["rtt_ms"] is not None and b["api_versions"] > 50 for b in report["brokers"])
    assert report["coordinator"]["node_id"] in kafka_cluster3.node_ids
    text = kcore("doctor", "-b", kafka_cluster3.bootstrap_servers).stdout
    assert "OK: every check passed." in text


def test_doctor_catches_a_wrong_advertised_host(unreachable_cluster):
    bootstrap = unreachable_cluster.bootstrap_servers
    port = bootstrap.rsplit(":", 1)[1]
    proc = kcore("doctor", "-b", bootstrap, "-X", "socket.connection.setup.timeout.ms=2000")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"broker 1 advertises {UNREACHABLE_HOST}:{port}, which this machine cannot reach" in out
    assert f"the bootstrap address {bootstrap} worked" in out
    assert "advertised.listeners is set for another network" in out
    report = json.loads(
        kcore(
            "doctor", "-b", bootstrap, "--json", "-X", "socket.connection.setup.timeout.ms=2000"
        ).stdout
    )
    assert report["bootstrap"][0]["login_error"] is None
    assert report["brokers"][0]["login_stage_failed"] == "connect"


def test_doctor_dead_and_unknown_bootstrap_hosts():
    proc = kcore("doctor", "-b", "127.0.0.1:1,no-such-host.invalid:9092")
    assert proc.returncode == 1
    assert "bootstrap server 127.0.0.1:1: connection refused" in proc.stdout
    assert (
        "bootstrap server no-such-host.invalid:9092: the host name does not resolve" in proc.stdout
    )
    assert "no bootstrap server worked" in proc.stdout


def test_doctor_tls_client_on_a_plaintext_port_is_explained(unreachable_cluster):
    proc = kcore(
        "doctor",
        "-b",
        unreachable_cluster.bootstrap_servers,
        "-X",
        "security.protocol=SSL",
        "-X",
        "socket.connection.setup.timeout.ms=2000",
    )
    assert proc.returncode == 1
    assert "TLS fails" in proc.stdout


def test_doctor_finds_a_name_with_a_dead_address_and_another_cluster(
    kafka_cluster, kafka_cluster3, monkeypatch
):
    """A bootstrap name whose DNS gives a refusing address besides the live one (a note: clients
    move on), and a bootstrap address of another cluster (a problem), each named."""
    import asyncio

    from kcore.cli import doctor
    from kcore.config import ClientConfig

    host, port = kafka_cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    real = doctor.resolve

    async def two_addresses(name: str, p: int) -> list[tuple[str, int]]:
        found = await real(name, p)
        # The broker listens on 127.0.0.1 only: 127.0.0.2 (loopback too) refuses.
        return [*found, ("127.0.0.2", p)] if name == host and p == int(port) else found

    monkeypatch.setattr(doctor, "resolve", two_addresses)
    servers = [f"{host}:{port}", kafka_cluster3.bootstrap_servers.split(",")[0]]
    config = ClientConfig({"bootstrap.servers": servers}, role="admin")
    report = asyncio.run(doctor.run_doctor(servers, config))
    notes, problems = "\n".join(report.notes), "\n".join(report.problems)
    # Refused: clients move on to the next address at once, so a note, not a problem.
    assert f"{host}:{port} resolves to 2 addresses and 1 of them cannot be reached" in notes
    assert "127.0.0.2: connection refused" in notes and "only slows connecting" in notes
    assert f"{servers[1]} answers for another cluster" in problems
    assert not report.ok


def test_bad_config_is_reported_with_the_key_meant(capsys):
    assert main(["doctor", "-b", "127.0.0.1:1", "-X", "request.timeout.m=5"]) == 1
    err = capsys.readouterr().err
    assert "request.timeout.m" in err and "did you mean 'request.timeout.ms'" in err


def kcore_in(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "kcore", *args], input=stdin, capture_output=True, timeout=120
    )


def test_produce_and_consume(kafka_cluster, tmp_path):
    """Lines in (stdin and a file; keys split off with -K; a header on each; one partition with
    -p), records out (-e stops at the end; JSON lines with base64 for non-UTF-8 bytes; -o -N;
    -c); keyed records on the Java client's partitions; a group commits what it read."""
    from kcore.codec import partition_for_key

    bs = kafka_cluster.bootstrap_servers
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=3)
    lines = b"".join(b"user-%d:event %d\n" % (i % 5, i) for i in range(30)) + b"no separator"
    proc = kcore_in(lines, "produce", "-b", bs, "-t", topic, "-K", ":", "-H", "src=cli")
    assert proc.returncode == 0, proc.stderr
    assert b"produced 31 of 31 records to " + topic.encode() in proc.stderr
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\xff\xfe binary\n")
    proc = kcore_in(b"", "produce", "-b", bs, "-t", topic, "-p", "0", str(raw), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "topic": topic,
        "records": 1,
        "delivered": 1,
        "partitions": {"0": 1},
        "failed": 0,
        "error": None,
        "interrupted": False,
    }

    proc = kcore_in(b"", "consume", "-b", bs, "-t", topic, "-e", "--json")
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(got) == 32 and b"consumed 32 records" in proc.stderr
    keyed = [r for r in got if r.get("key", "").startswith("user-")]
    assert sorted(int(r["value"].split()[1]) for r in keyed) == list(range(30))
    for r in keyed:
        assert r["partition"] == partition_for_key(r["key"].encode(), 3)
        assert r["headers"] == [{"key": "src", "value": "cli"}]
    [plain] = [r for r in got if r.get("value") == "no separator"]
    assert "key" not in plain  # a null key
    [binary] = [r for r in got if "value_base64" in r]
    assert binary["partition"] == 0 and binary["value_base64"] == "//4gYmluYXJ5"

    proc = kcore_in(b"", "consume", "-b", bs, "-t", topic, "-p", "0", "-o", "-1", "-e")
    assert proc.returncode == 0 and proc.stdout == b"\xff\xfe binary\n", proc.stderr
    proc = kcore_in(b"", "consume", "-b", bs, "-t", topic, "-c", "5", "-K", "=")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 5, proc.stderr

    group = ["consume", "-b", bs, "-t", topic, "-g", f"g-{topic}", "-e"]
    first, again = kcore_in(b"", *group), kcore_in(b"", *group)
    assert first.returncode == 0 and len(first.stdout.splitlines()) == 32, first.stderr
    assert again.returncode == 0 and again.stdout == b"", again.stderr  # committed


def test_produce_and_consume_mistakes(kafka_cluster, tmp_path):
    bs = kafka_cluster.bootstrap_servers
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=2)
    cases = [
        (["consume", "-t", "no-such-topic", "-e"], "topic 'no-such-topic' does not exist"),
        (["consume", "-t", topic, "-p", "5", "-e"], "there is no partition 5"),
        (["consume", "-t", topic, "-o", "soon"], "-o takes beginning, end"),
        (["consume", "-t", topic, "-g", "g", "-p", "0"], "-g joins a group"),
        (["produce", "-t", topic, str(tmp_path / "missing.txt")], "missing.txt: No such file"),
        (["produce", "-t", topic, "-X", "fetch.min.bytes=5"], "a consumer setting"),
        (["metadata", "-F", str(tmp_path / "missing.properties")], "-F "),
        (["metadata", "-t", "no-such-topic"], "no-such-topic: no such topic"),
    ]
    for args, expected in cases:
        proc = kcore_in(b"", args[0], "-b", bs, *args[1:])
        assert proc.returncode == 1, (args, proc.stderr)
        assert expected in proc.stderr.decode() and b"Traceback" not in proc.stderr, args


def test_consume_offsets_past_the_end_and_partial_reads(kafka_cluster):
    """-o past the end waits at the end (as kcat), it does not replay the partition; reading by
    partition commits nothing even when the config names a group; a group read whose reader
    goes away (``| head``) commits only what was written out."""
    import kcore
    from kcore.admin import AdminClient

    bs = kafka_cluster.bootstrap_servers
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=1)
    with kcore.Producer({"bootstrap.servers": bs, "linger.ms": 5}) as producer:
        for i in range(2000):
            producer.send(topic, b"%05d" % i + b"x" * 1000)
    proc = kcore_in(b"", "consume", "-b", bs, "-t", topic, "-o", "5000", "-e")
    assert proc.returncode == 0 and proc.stdout == b"", proc.stderr[-500:]
    by_hand = f"g-hand-{topic}"
    proc = kcore_in(b"", "consume", "-b", bs, "-t", topic, "-c", "3", "-X", f"group.id={by_hand}")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3, proc.stderr[-500:]

    group = f"g-{topic}"
    reader = subprocess.Popen(
        [sys.executable, "-m", "kcore", "consume", "-b", bs, "-t", topic, "-g", group, "-e"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()  # then the reader goes away with ~2 MB not yet read
    reader.stdout.close()
    err = reader.stderr.read()
    assert reader.wait(120) == 0, err[-1000:]
    assert first.startswith(b"00000x") and b"Traceback" not in err
    with AdminClient({"bootstrap.servers": bs}) as admin:
        offsets = admin.list_consumer_group_offsets(group)
        assert admin.list_consumer_group_offsets(by_hand) == {}
    # Only what went into the pipe (64 KiB and a write buffer: ~70 records) can have been read.
    committed = offsets.get(TopicPartition(topic, 0))
    assert committed is None or committed < 200, committed


def test_sigterm_flushes_and_reports_what_produce_took(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcore", "produce", "-b", bs, "-t", topic],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"one\ntwo\nthree\n")
    proc.stdin.flush()  # stdin stays open: produce would wait for more
    from kcore.admin import AdminClient

    with AdminClient({"bootstrap.servers": bs}) as admin:
        deadline = time.monotonic() + 60
        end = 0
        while end < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            (end,) = [r.offset for r in admin.list_offsets({(topic, 0): "latest"}).values()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"produced 3 of 3 records to {topic}".encode() in err and b"interrupted" in err


def ctrl_c_reaches_it() -> None:
    """(In the child, before exec.) SIGINT back to its default: a test run started in the
    background by a non-interactive shell (as CI may be) ignores SIGINT, and its children
    inherit that, so Python in them would never raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ten_records_on_two_partitions(bootstrap: str, prefix: str) -> tuple[str, str]:
    """A new two-partition topic holding records 0-9 (even ones on partition 0), and a new
    group id: ``(topic, group)``."""
    import kcore as kc
    from kcore.admin import NewTopic

    topic, group = f"{prefix}-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    with kc.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(10):
            p.send(topic, b"%d" % i, partition=i % 2)
        p.flush(30)
    return topic, group


def test_groups_lists_and_describes_with_lag(kafka_cluster, capsys):
    """``kcore groups``: the list, then a live group's state, member and per-partition lag (as
    kafka-consumer-groups --describe), and a group that does not exist (exit status 1)."""

    import kcore as kc

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = ten_records_on_two_partitions(bootstrap, "cli-groups")
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "lag-reader",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    with kc.Consumer(config) as c:
        c.subscribe([topic])
        read_records(c, 10, 60)  # the group joined and every record read
        c.commit({(topic, 0): 3, (topic, 1): 5})  # partition 0 lags by 2, partition 1 by 0
        capsys.readouterr()
        assert main(["groups", "-b", bootstrap]) == 0
        assert group in capsys.readouterr().out
        assert main(["groups", "-b", bootstrap, "-g", group, "--json"]) == 0
        (described,) = json.loads(capsys.readouterr().out)
        assert (described["group_id"], described["state"], described["members"]) == (
            group,
            "Stable",
            1,
        )
        rows = {r["partition"]: r for r in described["partitions"]}
        assert [
            (rows[p]["current_offset"], rows[p]["log_end_offset"], rows[p]["lag"]) for p in (0, 1)
        ] == [(3, 5, 2), (5, 5, 0)]
        assert {r["client_id"] for r in rows.values()} == {"lag-reader"}
        assert main(["groups", "-b", bootstrap, "-g", group]) == 0
        text = capsys.readouterr().out
        assert "CURRENT-OFFSET" in text and "lag-reader" in text
    assert main(["groups", "-b", bootstrap, "-g", "no-such-group-x"]) == 1
    assert "no such group" in capsys.readouterr().err


def test_groups_lists_and_describes_a_share_group(kafka_cluster, share_members, capsys):
    """``kcore groups`` lists a share group with its type; ``-g`` describes it as
    kafka-share-groups does: its member and assignment, each partition's start offset and lag
    (as the admin client has them), in text, ``--json`` and ``--watch``."""
    import kcore as kc

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = ten_records_on_two_partitions(bootstrap, "cli-share")
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
        member = share_members(bootstrap, topic, group)
        member.wait_for_records(10)
        deadline = time.monotonic() + 60
        while True:  # every record acknowledged: nothing left to deliver
            offsets = admin.list_share_group_offsets(group)
            if len(offsets) == 2 and all(o is not None and o.lag == 0 for o in offsets.values()):
                break
            assert time.monotonic() < deadline, f"the lag never fell to 0: {offsets}"
            time.sleep(0.3)

    capsys.readouterr()
    assert main(["groups", "-b", bootstrap]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(group)]
    assert line.split() == [group, "share", "Stable", "share"]
    assert main(["groups", "-b", bootstrap, "-g", group, "--json"]) == 0
    (described,) = json.loads(capsys.readouterr().out)
    assert (described["type"], described["state"], described["members"]) == ("share", "Stable", 1)
    (m,) = described["member_details"]
    assert m["client_id"] == "console-share-consumer"
    assert m["assignment"] == [f"{topic}-0", f"{topic}-1"]
    assert [
        (r["topic"], r["partition"], r["start_offset"], r["lag"], r["member_ids"])
        for r in described["partitions"]
    ] == [
        (tp.topic, tp.partition, info.start_offset, 0, [m["member_id"]])
        for tp, info in offsets.items()
    ]
    assert main(["groups", "-b", bootstrap, "-g", group]) == 0
    text = capsys.readouterr().out
    assert f"Group {group} (share): Stable, 1 member(s)" in text
    assert "START-OFFSET" in text and "console-share-consumer" in text
    watch = ["groups", "-b", bootstrap, "-g", group, "--watch", "0.1", "--count", "2", "--json"]
    assert main(watch) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["type"], x["total_lag"]) for x in lines] == [("share", 0), ("share", 0)]


def test_consume_as_a_share_group_member(kafka_cluster):
    """``kcore consume --share-group G`` reads what the group hands out and accepts what it
    prints: two runs of ``-c 4`` and one of the rest print every record once between them
    (what a run took beyond its count went back to the group), and the group's lag ends at 0."""
    import kcore as kc

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = ten_records_on_two_partitions(bootstrap, "cli-share-consume")
    group = f"cli-share-consume-{uuid.uuid4().hex[:6]}"
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
        printed: list[str] = []
        for count in ("4", "4", "2"):
            share = ["--share-group", group]
            run = kcore("consume", "-b", bootstrap, "-t", topic, *share, "-c", count)
            assert run.returncode == 0, run.stderr
            lines = run.stdout.splitlines()
            assert len(lines) == int(count)
            assert f"consumed {count} records from {topic} (share group {group})" in run.stderr
            printed += lines
        assert sorted(printed) == sorted(set(printed)) and len(printed) == 10
        deadline = time.monotonic() + 60
        while True:
            offsets = admin.list_share_group_offsets(group)
            if offsets and all(o is not None and o.lag == 0 for o in offsets.values()):
                break
            assert time.monotonic() < deadline, f"the lag never fell to 0: {offsets}"
            time.sleep(0.3)
    mixed = kcore("consume", "-b", bootstrap, "-t", topic, "--share-group", group, "-g", "x")
    assert mixed.returncode == 1 and "--share-group" in mixed.stderr


def test_groups_watch_follows_the_lag_until_ctrl_c(kafka_cluster):
    """``kcore groups -g G --watch``: with ``--count`` and ``--json`` that many JSON lines with
    the lag; as text (not a terminal) a time line per refresh; run without a count, the lag
    it shows falls when the group consumes, and Ctrl-C ends it with status 0."""
    import kcore as kc

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = ten_records_on_two_partitions(bootstrap, "cli-watch")
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        # A backlog: partition 0 behind by 2, partition 1 by 0.
        admin.alter_consumer_group_offsets(group, {(topic, 0): 3, (topic, 1): 5})

    watch = ["groups", "-b", bootstrap, "-g", group, "--watch", "0.2"]
    res = kcore(*watch, "--count", "3", "--json")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert (line["group_id"], line["state"], line["total_lag"]) == (group, "Empty", 2)
        assert [(r["partition"], r["current_offset"], r["log_end_offset"], r["lag"])
                for r in line["partitions"]] == [(0, 3, 5, 2), (1, 5, 5, 0)]  # fmt: skip
    assert [line["timestamp"] for line in lines] == sorted(line["timestamp"] for line in lines)

    text = kcore(*watch, "--count", "2")
    assert text.returncode == 0, text.stderr
    assert [line.startswith(f"--- Every 0.2s: {group}  ") for line in text.stdout.splitlines()
            if line.startswith("---")] == [True, True]  # fmt: skip
    assert text.stdout.count("CURRENT-OFFSET") == 2 and "\x1b[" not in text.stdout

    proc = subprocess.Popen(
        [sys.executable, "-m", "kcore", *watch, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    assert proc.stdout is not None
    lines_out = lines_of(proc.stdout)
    try:
        assert json.loads(lines_out.get(timeout=60))["total_lag"] == 2
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
        }
        with kc.Consumer(config) as c:  # the group reads its backlog and commits
            c.subscribe([topic])
            assert len(read_records(c, 2, 60)) == 2
            c.commit()
        deadline = time.monotonic() + 60
        while json.loads(lines_out.get(timeout=60))["total_lag"] != 0:
            assert time.monotonic() < deadline, "the watch never showed the lag gone"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_groups_watch_of_a_group_that_does_not_exist_fails(kafka_cluster, capsys):
    bootstrap = kafka_cluster.bootstrap_servers
    watch = ["groups", "-b", bootstrap, "-g", "no-such-group-w", "--watch", "0.1", "--count", "2"]
    assert main(watch) == 1
    assert "kcore groups: no-such-group-w: no such group" in capsys.readouterr().err


@pytest.mark.slow
def test_groups_watch_goes_on_through_a_broker_outage(kafka_cluster):
    """The broker stops under a watch: each refresh that fails is said on stderr and the watch
    goes on (backing off); once the broker is back it shows the group again."""
    import kcore as kc

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = f"cli-watch-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=1)
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_consumer_group_offsets(group, {(topic, 0): 0})
    timeouts = ["-X", "request.timeout.ms=2000", "-X", "default.api.timeout.ms=3000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcore", "groups", "-b", bootstrap, "-g", group, "--json",
         "--watch", "0.2", *timeouts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    out, err = lines_of(proc.stdout), lines_of(proc.stderr)
    (node,) = kafka_cluster.node_ids
    try:
        assert json.loads(out.get(timeout=60))["group_id"] == group
        kafka_cluster.stop_broker(node)
        deadline = time.monotonic() + 60
        while f"{group}: refresh failed:" not in err.get(timeout=60):
            assert time.monotonic() < deadline, "no failed refresh was said"
        kafka_cluster.start_broker(node)
        while not out.empty():  # the refreshes from before the outage
            out.get()
        assert json.loads(out.get(timeout=120))["group_id"] == group
    finally:
        if not kafka_cluster.is_running(node):
            kafka_cluster.start_broker(node)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0
    said = []
    while not err.empty():
        said.append(err.get())
    assert not any("Traceback" in line for line in said), said
