"""The ``kcore`` command line where no broker is needed: ``-F`` files read by Java's
properties rules, settings of another client in a shared file, a closed stdout, SIGTERM, and
what ``metadata`` shows for topics named with ``-t``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest

from kcore.cli import main
from kcore.cli.metadata import metadata_json
from kcore.cli.properties import load_properties, parse_properties
from kcore.cluster.metadata import ClusterMetadata, PartitionInfo, TopicInfo
from kcore.errors import KcoreError

# Each case checked once against java.util.Properties.load (Java 17) when written.
PROPERTIES = "\n".join(
    [
        "# a comment ending in a backslash does not go on \\",
        "a=1",
        "  b : two  ",
        "c three four",
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\",
        '    username="u" \\',
        '    password="p\\\\\\\\";',
        "d\\ key=v\\=x\\:y",
        "e=\\u00e9t\\t\\n",
        "! bang",
        "f",
        "g=",
        "h=trail\\\\",
        "i = x \\",
        "",
        "j:\\\\\\\\",
        "k=line \\",
    ]
)
JAVA_READS = {
    "a": "1",
    "b": "two  ",
    "c": "three four",
    "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="u" password="p\\\\";',
    "d key": "v=x:y",
    "e": "ét\t\n",
    "f": "",
    "g": "",
    "h": "trail\\",
    "i": "x ",
    "j": "\\\\",
    "k": "line ",
}


def test_properties_are_read_as_java_reads_them():
    assert parse_properties(PROPERTIES) == JAVA_READS
    assert parse_properties("a=1\r\nb=2\rc=3") == {"a": "1", "b": "2", "c": "3"}
    assert parse_properties("a=1\na=2") == {"a": "2"}  # the later one wins
    with pytest.raises(KcoreError, match="uxxxx"):
        parse_properties("a=\\u00zz")


def test_properties_files_latin1_and_not_properties(tmp_path):
    latin = tmp_path / "latin.properties"
    latin.write_bytes(b"user=J\xf6rg\n")  # ISO-8859-1, as Properties.load of a stream reads
    assert load_properties(latin) == {"user": "Jörg"}
    utf8 = tmp_path / "utf8.properties"
    utf8.write_bytes("user=Jörg\n".encode())
    assert load_properties(utf8) == {"user": "Jörg"}
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(KcoreError, match="not a properties file"):
        load_properties(binary)
    with pytest.raises(KcoreError, match="-F .*missing"):
        load_properties(tmp_path / "missing")


def kcore(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcore", *args], capture_output=True, text=True, timeout=60, **kwargs
    )


def test_a_shared_client_properties_file(tmp_path, capsys):
    """A client.properties for producers and consumers alike (Confluent Cloud's has acks and
    session.timeout.ms) serves every command: the other clients' settings are left out with a
    warning, bootstrap.servers may come from it, and a multi-line JAAS line holds together."""
    props = tmp_path / "client.properties"
    props.write_text(
        "bootstrap.servers=127.0.0.1:1\n"
        "acks=all\n"
        "session.timeout.ms: 45000\n"
        "socket.connection.setup.timeout.ms 1000\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
        '    required username="u" password="p";\n'
    )
    assert main(["doctor", "-F", str(props)]) == 1  # nothing listens on port 1
    captured = capsys.readouterr()
    assert "ignoring acks (not an admin setting)" in captured.err
    assert "ignoring session.timeout.ms (not an admin setting)" in captured.err
    assert "bootstrap server 127.0.0.1:1: connection refused" in captured.out
    assert "Traceback" not in captured.err
    # -X is exact: another client's setting there is a mistake, said as one.
    assert main(["doctor", "-F", str(props), "-X", "acks=all"]) == 1
    assert "acks: a producer setting, not an admin one" in capsys.readouterr().err
    # No bootstrap anywhere: said, not a traceback.
    assert main(["doctor"]) == 1
    assert "give -b HOST:PORT (or bootstrap.servers in -F)" in capsys.readouterr().err


def test_a_closed_stdout_is_not_a_traceback():
    """``kcore ... | head`` where head has gone: no BrokenPipeError traceback, exit 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcore", "doctor", "-b", "127.0.0.1:1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before it writes anything: it has to start Python first
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_sigterm_ends_a_command_as_ctrl_c_does():
    """SIGTERM (``timeout``, ``docker stop``) is Ctrl-C: exit 130, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcore", "produce", "-b", "127.0.0.1:1", "-t", "x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(3)  # started and reading stdin (~0.2 s idle; a loaded machine is slower)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err


@pytest.mark.parametrize(
    "args, said",
    [
        (["--watch", "0"], "--watch: must be a positive number of seconds, got '0'"),
        (["--watch", "-1"], "--watch: must be a positive number of seconds"),
        (["--watch", "soon"], "--watch: must be a positive number of seconds, got 'soon'"),
        (["--watch", "2", "--count", "0"], "--count: must be a positive integer, got '0'"),
        (["--count", "3"], "--count goes with --watch"),
    ],
)
def test_groups_watch_arguments_are_checked_before_connecting(args, said, capsys):
    with pytest.raises(SystemExit) as info:
        main(["groups", "-b", "127.0.0.1:1", "-g", "g", *args])
    assert info.value.code == 2
    assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["groups", "-b", "127.0.0.1:1", "--watch"])
    assert "--watch needs the groups to watch (-g GROUP)" in capsys.readouterr().err


def test_acls_remove_without_a_resource_is_refused_before_connecting(capsys):
    # Port 1 refuses connections: a refusal that needed the cluster would say so instead.
    assert main(["acls", "remove", "-b", "127.0.0.1:1", "--principal", "User:bob"]) == 1
    assert "remove needs a resource" in capsys.readouterr().err


def _cluster_with_internal_topic() -> ClusterMetadata:
    def topic(name: str, internal: bool) -> TopicInfo:
        return TopicInfo(name, uuid.uuid4(), {0: PartitionInfo(name, 0, 1)}, internal)

    topics = {"__consumer_offsets": topic("__consumer_offsets", True), "t": topic("t", False)}
    return ClusterMetadata("c", 1, {}, topics)


def test_metadata_shows_an_internal_topic_named_with_t():
    md = _cluster_with_internal_topic()
    listed = [t["name"] for t in metadata_json(md, include_internal=False)["topics"]]
    assert listed == ["t"]
    named = metadata_json(md, include_internal=False, named=["__consumer_offsets"])
    assert "__consumer_offsets" in [t["name"] for t in named["topics"]]
