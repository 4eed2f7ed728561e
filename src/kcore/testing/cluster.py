"""A real Apache Kafka cluster (KRaft, combined broker+controller nodes) for tests, run from the
official jars on this machine; and :class:`ExternalCluster`, the same interface over a cluster
someone else runs (``KCORE_BOOTSTRAP``).

::

    with KafkaCluster(brokers=3) as cluster:
        cluster.create_topic("t", partitions=3, replication_factor=3)
        cluster.kill_broker(2)
        ...

Each node listens on 127.0.0.1 on three ports: ``PLAINTEXT`` for clients (what
``bootstrap_servers`` lists), ``INTERNAL`` between brokers and ``CONTROLLER`` for the KRaft
quorum (a static voter set, node ids 1..n). Extra listeners (SSL, SASL, ...) can be added with
:class:`Listener`.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _cds, _process, jars
from .errors import ClusterControlError, ClusterError, ClusterStartError, KafkaToolError
from .network import NetworkHost, TestNetwork

log = logging.getLogger("kcore.testing")

__all__ = [
    "CLIENT_LISTENER",
    "CONTROLLER_LISTENER",
    "INTERNAL_LISTENER",
    "KAFKA_TOOLS",
    "READY_LINE",
    "BaseCluster",
    "ExternalCluster",
    "KafkaCluster",
    "KafkaNode",
    "Listener",
    "NetworkFault",
]

READY_LINE = b"Kafka Server started"
HOST = "127.0.0.1"
CLIENT_LISTENER = "PLAINTEXT"
INTERNAL_LISTENER = "INTERNAL"
CONTROLLER_LISTENER = "CONTROLLER"

# Short names (the release's bin/ scripts) for Kafka 4.x tool main classes, for run_tool().
KAFKA_TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-storage": "kafka.tools.StorageTool",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-groups": "org.apache.kafka.tools.GroupsCommand",
}

# Broker JVM: what Kafka's kafka-run-class.sh uses, minus what only matters in production.
_BROKER_JVM_ARGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-UsePerfData",  # no /tmp/hsperfdata files left behind by SIGKILLed brokers
    "-Djava.awt.headless=true",
)
# Short-lived tool JVMs (format, TopicCommand, ...): start fast, peak speed does not matter.
_TOOL_JVM_ARGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

_NODE_LOG4J2 = """\
# Written by kcore.testing: warnings, plus the lines that show a node's lifecycle.
status = warn
name = kcore-test-broker
shutdownHook = disable
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.kafka.name = kafka.Kafka$
logger.kafka.level = INFO
"""

PropertyValue = str | int | float | bool | os.PathLike
BrokerConfig = Mapping[str, PropertyValue] | Callable[[int], Mapping[str, PropertyValue]]


@dataclass(frozen=True)
class Listener:
    """An extra listener every node gets, on its own 127.0.0.1 port.

    ``properties`` are added to every node's config, e.g. for ``Listener("SSL", "SSL", {...})``
    the ``listener.name.ssl.*`` keystore settings; ``advertised_host`` replaces 127.0.0.1 in
    ``advertised.listeners`` for this listener only. ``scram_users`` (mechanism -> user ->
    password) are SCRAM credentials the cluster is formatted with, so that a SASL/SCRAM
    listener brings the users it authenticates (see :mod:`kcore.testing.security`)."""

    name: str
    security_protocol: str = "PLAINTEXT"
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    advertised_host: str | None = None
    scram_users: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass
class KafkaNode:
    """One combined broker+controller node of a :class:`KafkaCluster`."""

    node_id: int
    dir: Path
    ports: dict[str, int]  # listener name -> port on ``host``
    advertised_hosts: dict[str, str]  # listener name -> advertised host (non-controller ones)
    process: subprocess.Popen[bytes] | None = None
    host: str = HOST  # where every listener binds: 127.0.0.1, or its namespace's address
    network_host: NetworkHost | None = None  # its namespace, with isolated_network=True

    @property
    def port(self) -> int:
        """The client (``PLAINTEXT``) port."""
        return self.ports[CLIENT_LISTENER]

    @property
    def address(self) -> str:
        """``host:port`` of the client listener (where it really listens)."""
        return f"{self.host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """What the client listener tells clients to connect to (differs with advertised_host)."""
        return f"{self.advertised_hosts[CLIENT_LISTENER]}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def properties_path(self) -> Path:
        return self.dir / "node.properties"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def format_log_path(self) -> Path:
        return self.dir / "format.log"

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _prop_value(value: PropertyValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def _escape(text: str, *, key: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    elif out.startswith((" ", "\t")):
        out = "\\" + out
    return out


def render_properties(props: Mapping[str, PropertyValue]) -> str:
    """A Java ``.properties`` file, one ``key=value`` per line."""
    return "".join(f"{_escape(k, key=True)}={_escape(_prop_value(v))}\n" for k, v in props.items())


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """The simple ``key=value`` lines of a properties file (as written by this module)."""
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _random_cluster_id() -> str:
    """A Kafka ``Uuid`` string: 22 chars of unpadded base64url, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def merge_scram_users(
    *sources: Mapping[str, Mapping[str, str]],
) -> dict[str, dict[str, str]]:
    """Merge mechanism -> user -> password maps; the same user with two passwords for one
    mechanism is a ValueError (a cluster holds one credential per user and mechanism)."""
    out: dict[str, dict[str, str]] = {}
    for source in sources:
        for mechanism, users in source.items():
            if mechanism not in SCRAM_MECHANISMS:
                raise ValueError(f"SCRAM mechanism {mechanism!r} is not one of {SCRAM_MECHANISMS}")
            merged = out.setdefault(mechanism, {})
            for user, password in users.items():
                for what, text in (("user name", user), ("password", password)):
                    # kafka-storage --add-scram splits its argument on commas, without escapes
                    if not text or "," in text:
                        raise ValueError(f"SCRAM {what} {text!r} must be non-empty, without ','")
                if merged.setdefault(user, password) != password:
                    raise ValueError(f"two different {mechanism} passwords for user {user!r}")
    return out


def _add_scram_args(users: Mapping[str, Mapping[str, str]]) -> list[str]:
    """``kafka-storage format`` arguments that create SCRAM credentials at format time (so they
    exist before the first client connects). Values are quoted: the parser strips one pair."""
    args: list[str] = []
    for mechanism, by_user in users.items():
        for user, password in by_user.items():
            args += ["--add-scram", f'{mechanism}=[name="{user}",password="{password}"]']
    return args


class NetworkFault:
    """A partition or throttle in force; leaving its ``with`` block (or :meth:`undo`) heals
    it. Undoing twice, or after the cluster stopped, does nothing."""

    def __init__(self, undo: Callable[[], None], description: str) -> None:
        self._undo: Callable[[], None] | None = undo
        self.description = description

    def __repr__(self) -> str:
        state = "healed" if self._undo is None else "in force"
        return f"<NetworkFault {self.description} {state}>"

    def undo(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> NetworkFault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _first_id(targets: Sequence[int | NetworkHost]) -> int | str:
    if not targets:
        return "(none given)"
    first = targets[0]
    return first if isinstance(first, int) else first.name


def _tool_main(tool: str) -> str:
    return KAFKA_TOOLS.get(tool.removesuffix(".sh"), tool)


class BaseCluster:
    """What every test cluster offers; operations a kind of cluster cannot do raise
    :class:`~kcore.testing.errors.ClusterControlError`."""

    kafka_version: str | None = None
    startup_seconds: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> BaseCluster:
        return self

    def stop(self, graceful: bool = False) -> None:
        return None

    def __enter__(self) -> BaseCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.mark_failed()
        self.stop()

    def mark_failed(self) -> None:
        """Something went wrong while using the cluster: keep its logs when it stops."""
        return None

    @property
    def failed(self) -> bool:
        """True after a startup failure, an exception in the ``with`` block or mark_failed()."""
        return False

    @property
    def work_dir(self) -> Path | None:
        """Where the nodes' files are (None when kcore.testing does not run the nodes)."""
        return None

    # -- addresses ------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    @property
    def nodes(self) -> list[KafkaNode]:
        return []

    @property
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.nodes]

    def broker_address(self, node_id: int) -> str:
        raise self._cannot("know the address of node", node_id)

    # -- broker control -------------------------------------------------------------------------
    def stop_broker(self, node_id: int) -> None:
        raise self._cannot("stop node", node_id)

    def start_broker(self, node_id: int) -> None:
        raise self._cannot("start node", node_id)

    def kill_broker(self, node_id: int) -> None:
        raise self._cannot("kill node", node_id)

    def is_running(self, node_id: int) -> bool:
        raise self._cannot("tell whether it runs node", node_id)

    def log_path(self, node_id: int) -> Path:
        raise self._cannot("read the log of node", node_id)

    def log_tail(self, node_id: int, lines: int = 50) -> str:
        raise self._cannot("read the log of node", node_id)

    # -- network faults (KafkaCluster(isolated_network=True)) ------------------------------------
    def partition(self, *targets: int | NetworkHost) -> NetworkFault:
        """Cut the given nodes (ids) or client hosts off the network now; heal on leaving the
        returned context manager (or with :meth:`heal`)."""
        raise self._cannot("partition node", _first_id(targets))

    def throttle(self, *targets: int | NetworkHost, rate: str = "1mbit") -> NetworkFault:
        """Rate-limit the given nodes' or client hosts' traffic both ways (``tc`` units)."""
        raise self._cannot("throttle node", _first_id(targets))

    def heal(self, *targets: int | NetworkHost) -> None:
        """Undo partitions and throttles of the given targets; of every one without arguments."""
        return None

    def client_host(self, name: str) -> NetworkHost:
        """A host of the cluster's network of its own, for a client process that a test cuts
        off alone: run it with ``host.command(argv)``, cut it with ``partition(host)``."""
        raise ClusterControlError(
            f"{type(self).__name__} has no test network to add host {name!r} to"
        )

    def _cannot(self, what: str, node_id: int | str) -> ClusterControlError:
        return ClusterControlError(f"{type(self).__name__} cannot {what} {node_id}")

    # -- Kafka's own CLI tools ------------------------------------------------------------------
    def run_tool(
        self,
        tool: str,
        *args: str | int | os.PathLike[str],
        timeout: float = 120.0,
        check: bool = False,
        input: str | None = None,
        heap: str = "256m",
    ) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's command-line tools in a JVM with the broker's classpath.

        ``tool`` is a main class (``"org.apache.kafka.tools.TopicCommand"``) or a script name
        from :data:`KAFKA_TOOLS` (``"kafka-topics"``). Returns the CompletedProcess (text
        stdout/stderr); with ``check=True`` a non-zero exit raises
        :class:`~kcore.testing.errors.KafkaToolError`."""
        version = self.kafka_version
        libs = jars.kafka_libs(version)
        java = jars.java_executable()
        cmd = [
            java,
            f"-Xmx{heap}",
            *_TOOL_JVM_ARGS,
            *self._cds_flags("tool", java, libs),
            f"-Dlog4j2.configurationFile={jars.tools_log4j2_config(version)}",
            *_cds.classpath_args(libs),
            _tool_main(tool),
            *(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args),
        ]
        try:
            res = subprocess.run(
                cmd,
                input=input,
                # Without input, none: a console tool must not wait on the terminal.
                stdin=subprocess.DEVNULL if input is None else None,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                start_new_session=True,
                preexec_fn=_process._pdeathsig_preexec(),
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stderr or exc.stdout or ""
            if isinstance(out, bytes):
                out = out.decode(errors="replace")
            raise KafkaToolError(
                f"{_tool_main(tool)} did not finish within {timeout:g}s:\n{out.strip()[-4000:]}",
                returncode=None,
                stdout=exc.stdout if isinstance(exc.stdout, str) else "",
                stderr=out,
            ) from None
        if check and res.returncode != 0:
            raise KafkaToolError(
                f"{_tool_main(tool)} {' '.join(cmd[cmd.index(_tool_main(tool)) + 1 :])} exited "
                f"with status {res.returncode}:\n{(res.stderr or res.stdout).strip()[-4000:]}",
                returncode=res.returncode,
                stdout=res.stdout,
                stderr=res.stderr,
            )
        return res

    def _cds_flags(self, kind: str, java: str, libs: Path) -> list[str]:
        return _cds.Archives(java, libs, self.kafka_version).flags()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, PropertyValue] | None = None,
        *,
        bootstrap_servers: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        """Create a topic (kcore's admin client: no JVM, so it works in every mode) and return
        once the cluster's metadata gives each partition a leader and that leader answers for
        it (a ListOffsets: a broker named leader in the metadata can still refuse a produce
        with NOT_LEADER_OR_FOLLOWER for a moment, until it has taken the partition over), so
        a test can use it at once. ``replication_factor`` defaults to min(3, nodes) here, the
        broker default elsewhere. A topic that exists already raises kcore's
        TopicAlreadyExistsError."""
        from kcore.admin import AdminClient, AdminOperationError, NewTopic

        rf = replication_factor or (min(3, len(self.nodes)) if self.nodes else -1)
        topic = NewTopic(
            name, partitions, rf, {k: _prop_value(v) for k, v in (config or {}).items()}
        )
        deadline = time.monotonic() + timeout
        bootstrap = bootstrap_servers or self.bootstrap_servers
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            try:
                admin.create_topics([topic], timeout=timeout)
            except AdminOperationError as exc:  # one topic: its own error, as Java's get()
                raise exc.errors.get(name, exc) from None
            self._wait_for_leaders(admin, name, partitions, deadline)
            # list_offsets waits out NOT_LEADER_OR_FOLLOWER and such, up to its timeout.
            admin.list_offsets(
                {(name, p): "latest" for p in range(partitions)},
                timeout=max(deadline - time.monotonic(), 1.0),
            )

    def delete_topic(
        self, name: str, *, bootstrap_servers: str | None = None, timeout: float = 120.0
    ) -> None:
        """Delete a topic (kcore's admin client)."""
        from kcore.admin import AdminClient

        bootstrap = bootstrap_servers or self.bootstrap_servers
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.delete_topics([name], timeout=timeout)

    def _wait_for_leaders(self, admin: Any, name: str, partitions: int, deadline: float) -> None:
        from kcore.errors import KcoreError

        while True:
            try:
                described = admin.describe_topics([name])[name]
                if len(described.partitions) >= partitions and all(
                    p.leader >= 0 for p in described.partitions
                ):
                    return
            except KcoreError:
                pass  # not in the metadata yet
            if time.monotonic() > deadline:
                raise ClusterError(f"topic {name!r} has no leader for every partition yet")
            time.sleep(0.05)


class KafkaCluster(BaseCluster):
    """``brokers`` combined broker+controller KRaft nodes on 127.0.0.1, run from the Kafka jars
    (fetched with Maven once, see :mod:`kcore.testing.jars`).

    :param brokers: number of nodes (ids 1..n); all are voters of the KRaft quorum.
    :param isolated_network: run each node in a network namespace of its own on a bridge the
        cluster creates (:mod:`kcore.testing.network`; Linux, root), listening on its own
        address instead of 127.0.0.1, so that :meth:`partition` can cut a node off from
        clients and the other nodes alike (and :meth:`throttle` slow it) while it runs. The
        network goes when the cluster stops.
    :param advertised_host: host the *client* listener advertises instead of 127.0.0.1
        (replication and the quorum keep using 127.0.0.1); clients then get a wrong address.
    :param broker_config: extra/overriding broker properties, or a callable ``node_id -> dict``.
    :param listeners: extra :class:`Listener` s (SSL, SASL_PLAINTEXT, ...).
    :param scram_users: SCRAM credentials to create at format time, mechanism -> user ->
        password (``{"SCRAM-SHA-256": {"alice": "alice-secret"}}``); merged with the
        listeners' ``scram_users``.
    :param heap: ``-Xmx`` of each node JVM (None: the JVM default).
    :param jvm_args: extra arguments for each node JVM.
    :param extra_classpath: jars or class directories put on each broker's classpath after
        Kafka's own (a broker plugin: a metrics reporter, an authorizer, ...).
    :param startup_timeout: seconds for every node to log ``Kafka Server started``.
    :param shutdown_timeout: seconds a node gets to shut down on SIGTERM before SIGKILL.
    :param work_dir: where node dirs go (default: a new temp dir, removed on clean stop).
    :param kafka_version: Kafka release (default: ``KCORE_KAFKA_VERSION``, read when the
        cluster is made, else ``kcore.testing.versions.DEFAULT_KAFKA_VERSION``).
    :param keep_logs: keep ``server.log`` s after a clean stop (data dirs are removed). Default:
        keep them when ``work_dir`` was given. After a failure everything is always kept.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        advertised_host: str | None = None,
        broker_config: BrokerConfig | None = None,
        listeners: Iterable[Listener] = (),
        scram_users: Mapping[str, Mapping[str, str]] | None = None,
        heap: str | None = "512m",
        jvm_args: Sequence[str] = (),
        extra_classpath: Sequence[str | os.PathLike[str]] = (),
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 30.0,
        work_dir: str | os.PathLike[str] | None = None,
        kafka_version: str | None = None,
        keep_logs: bool | None = None,
        isolated_network: bool = False,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, not {brokers}")
        self.brokers = brokers
        self.advertised_host = advertised_host
        self.broker_config = broker_config
        self.listeners = tuple(listeners)
        reserved = {CLIENT_LISTENER, INTERNAL_LISTENER, CONTROLLER_LISTENER}
        seen: set[str] = set()
        for extra in self.listeners:
            if extra.name.upper() in reserved:
                raise ValueError(f"listener name {extra.name} is taken by kcore.testing")
            if extra.name.upper() in seen:
                raise ValueError(f"two listeners are named {extra.name}")
            seen.add(extra.name.upper())
        self.scram_users = merge_scram_users(
            *(x.scram_users for x in self.listeners), scram_users or {}
        )
        self.heap = heap
        self.jvm_args = tuple(jvm_args)
        self.extra_classpath = tuple(os.fspath(p) for p in extra_classpath)
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.kafka_version = kafka_version or jars.versions.kafka_version()
        self._work_dir_arg = Path(work_dir) if work_dir is not None else None
        self.keep_logs = keep_logs if keep_logs is not None else work_dir is not None
        self.cluster_id: str | None = None
        self.startup_seconds: float | None = None
        self.fetch_seconds: float | None = None
        self._work_dir: Path | None = None
        self._nodes: list[KafkaNode] = []
        self._libs: Path | None = None
        self._java: str | None = None
        self._archives: _cds.Archives | None = None
        # where the broker dumps its classes while this cluster trains the CDS archive (_cds.py)
        self._cds_training: Path | None = None
        self._failed = False
        self._started = False
        self.isolated_network = isolated_network
        self._network: TestNetwork | None = None

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        where = f" {self.bootstrap_servers}" if self._nodes else ""
        return f"<KafkaCluster {self.brokers} node(s) Kafka {self.kafka_version} {state}{where}>"

    def __enter__(self) -> KafkaCluster:
        return self.start()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def work_dir(self) -> Path | None:
        return self._work_dir

    @property
    def nodes(self) -> list[KafkaNode]:
        return list(self._nodes)

    def node(self, node_id: int) -> KafkaNode:
        for n in self._nodes:
            if n.node_id == node_id:
                return n
        raise ClusterControlError(
            f"no node {node_id} in this cluster (nodes: {[n.node_id for n in self._nodes]})"
        )

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...``: every node's client listener."""
        return self.bootstrap_for(CLIENT_LISTENER)

    def bootstrap_for(self, listener: str) -> str:
        """Addresses of every node on ``listener`` (``"INTERNAL"``, ``"CONTROLLER"``, an extra
        listener's name); useful to reach brokers when the client listener advertises a bogus
        host."""
        if not self._nodes:
            raise ClusterControlError("the cluster has not been started")
        try:
            return ",".join(f"{n.host}:{n.ports[listener]}" for n in self._nodes)
        except KeyError:
            raise ClusterControlError(
                f"no listener {listener!r}; listeners: {list(self._nodes[0].ports)}"
            ) from None

    def broker_address(self, node_id: int) -> str:
        return self.node(node_id).address

    def log_path(self, node_id: int) -> Path:
        return self.node(node_id).log_path

    def log_tail(self, node_id: int, lines: int = 50) -> str:
        return _process.tail_text(self.node(node_id).log_path, lines)

    def is_running(self, node_id: int) -> bool:
        return self.node(node_id).is_running()

    # -- configuration --------------------------------------------------------------------------
    def _fast_test_settings(self) -> dict[str, PropertyValue]:
        n = self.brokers
        rf, min_isr = min(3, n), min(2, n)
        props: dict[str, PropertyValue] = {
            "num.partitions": 1,
            "default.replication.factor": rf,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 3,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "share.coordinator.state.topic.num.partitions": 3,
            # Share groups (KIP-932; share.version=1 is finalized on a new 4.2+ cluster): locks,
            # sessions and heartbeats short enough that a test sees a lock expire or a member
            # go within seconds; a group may lower its lock further (share.record.lock.duration.ms
            # down to the 1 s minimum set here).
            "group.share.min.record.lock.duration.ms": 1000,
            "group.share.record.lock.duration.ms": 10000,
            "group.share.min.session.timeout.ms": 5000,
            "group.share.session.timeout.ms": 10000,
            "group.share.min.heartbeat.interval.ms": 500,
            "group.share.heartbeat.interval.ms": 1000,
            "group.share.assignment.interval.ms": 200,
            "group.initial.rebalance.delay.ms": 0,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.replica.fetchers": 1,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,  # default 128 MiB of heap
        }
        if n > 1:  # notice dead/stopped brokers within seconds
            props.update(
                {
                    "broker.heartbeat.interval.ms": 500,
                    "broker.session.timeout.ms": 3000,
                    "replica.lag.time.max.ms": 5000,
                }
            )
        return props

    def _cds_flags(self, kind: str, java: str, libs: Path) -> list[str]:
        if self._cds_training is not None:  # training: only the broker dumps, nobody maps
            return _cds.Archives.training_flags(self._cds_training) if kind == "broker" else []
        if self._archives is not None and self._archives.libs == libs:
            return self._archives.flags()
        return super()._cds_flags(kind, java, libs)

    def node_properties(self, node: KafkaNode, nodes: Sequence[KafkaNode]) -> dict[str, str]:
        """The broker properties of ``node`` (exposed for tests and for subclasses)."""
        names = [CLIENT_LISTENER, INTERNAL_LISTENER, CONTROLLER_LISTENER]
        names += [x.name for x in self.listeners]
        protocols = {CLIENT_LISTENER: "PLAINTEXT", INTERNAL_LISTENER: "PLAINTEXT"}
        protocols[CONTROLLER_LISTENER] = "PLAINTEXT"
        protocols.update({x.name: x.security_protocol for x in self.listeners})
        advertised = [name for name in names if name != CONTROLLER_LISTENER]
        voters = ",".join(f"{n.node_id}@{n.host}:{n.ports[CONTROLLER_LISTENER]}" for n in nodes)
        props: dict[str, PropertyValue] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": ",".join(f"{name}://{node.host}:{node.ports[name]}" for name in names),
            "advertised.listeners": ",".join(
                f"{name}://{node.advertised_hosts[name]}:{node.ports[name]}" for name in advertised
            ),
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "inter.broker.listener.name": INTERNAL_LISTENER,
            "controller.listener.names": CONTROLLER_LISTENER,
            "log.dirs": node.data_dir,
        }
        props.update(self._fast_test_settings())
        for extra in self.listeners:
            props.update(extra.properties)
        user = self.broker_config
        if callable(user):
            user = user(node.node_id)
        props.update(user or {})
        return {k: _prop_value(v) for k, v in props.items()}

    # -- start ----------------------------------------------------------------------------------
    def start(self) -> KafkaCluster:
        """Fetch the jars if needed, format every node and start them; returns when every node
        logged ``Kafka Server started``. Raises ClusterStartError (logs kept) otherwise."""
        if self._started:
            return self
        begin = time.monotonic()
        self._libs = jars.kafka_libs(self.kafka_version)
        self._java = jars.java_executable()
        self._archives = _cds.Archives(self._java, self._libs, self.kafka_version)
        if self._cds_training is None:
            self._archives.ensure(train_cds_archive)
        self.fetch_seconds = time.monotonic() - begin
        self._failed = False
        self._prepare_work_dir()
        _process.register(self)
        self._started = True
        try:
            if self.isolated_network:
                self._network = TestNetwork().create()
            for attempt in (1, 2):
                try:
                    self._start_once(time.monotonic() + self.startup_timeout)
                    break
                except ClusterStartError:
                    self._kill_all()
                    if attempt == 1 and self._port_clash():
                        log.info("a port was taken before Kafka bound it; retrying with new ports")
                        self._failed = False
                        continue
                    raise
        except BaseException:
            self._failed = True
            self._kill_all()
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begin
        log.info(
            "Kafka %s cluster of %d node(s) up in %.1fs at %s (work dir %s)",
            self.kafka_version,
            self.brokers,
            self.startup_seconds,
            self.bootstrap_servers,
            self._work_dir,
        )
        return self

    def _prepare_work_dir(self) -> None:
        if self._work_dir_arg is not None:
            self._work_dir = self._work_dir_arg.resolve()
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir = Path(tempfile.mkdtemp(prefix="kcore-kafka-")).resolve()
        (self._work_dir / "log4j2.properties").write_text(_NODE_LOG4J2)

    def _start_once(self, deadline: float) -> None:
        assert self._work_dir is not None
        names = [CLIENT_LISTENER, INTERNAL_LISTENER, CONTROLLER_LISTENER]
        names += [x.name for x in self.listeners]
        ports = iter(_process.reserve_ports(self.brokers * len(names)))
        nodes = []
        for i in range(1, self.brokers + 1):
            where = self._network_host(f"node{i}") if self._network is not None else None
            host = where.address if where is not None else HOST
            adv = {x.name: x.advertised_host or host for x in self.listeners}
            adv[CLIENT_LISTENER] = self.advertised_host or host
            adv[INTERNAL_LISTENER] = host
            node = KafkaNode(
                node_id=i,
                dir=self._work_dir / f"node{i}",
                ports={name: next(ports) for name in names},
                advertised_hosts=adv,
                host=host,
                network_host=where,
            )
            nodes.append(node)
        self._nodes = nodes
        self.cluster_id = _random_cluster_id()
        for node in nodes:
            shutil.rmtree(node.dir, ignore_errors=True)
            node.data_dir.mkdir(parents=True)
            props = self.node_properties(node, nodes)
            node.properties_path.write_text(
                f"# kcore.testing node {node.node_id} of cluster {self.cluster_id}\n"
                + render_properties(props)
            )
        # Format every node concurrently (one short-lived JVM each), starting each node as soon
        # as its own format is done.
        formats = {
            node.node_id: self._popen_logged(self._format_cmd(node), node.format_log_path, True)
            for node in nodes
        }
        for node in nodes:
            proc = formats[node.node_id]
            try:
                rc = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rc = None
            if rc != 0:
                for p in formats.values():
                    _process.kill(p)
                why = "timed out" if rc is None else f"exited with status {rc}"
                raise self._start_error(node, f"formatting its storage {why}", node.format_log_path)
            self._launch(node)
        self._wait_ready({n.node_id: 0 for n in nodes}, deadline)

    def _format_cmd(self, node: KafkaNode) -> list[str]:
        assert self._java and self._libs and self._work_dir and self.cluster_id
        cmd = [
            self._java,
            "-Xmx128m",
            *_TOOL_JVM_ARGS,
            *self._cds_flags("format", self._java, self._libs),
            f"-Dlog4j2.configurationFile={self._work_dir / 'log4j2.properties'}",
            *_cds.classpath_args(self._libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id,
            "-c",
            str(node.properties_path),
            *_add_scram_args(self.scram_users),
        ]
        if "controller.quorum.voters" not in read_properties(node.properties_path):
            cmd.append("--standalone")
        return cmd

    def _network_host(self, name: str) -> NetworkHost:
        """The network's host ``name``, made on first use (a start retried after a port clash
        keeps the hosts it made)."""
        assert self._network is not None
        if any(h.name == name for h in self._network.hosts):
            return self._network.host(name)
        return self._network.add_host(name)

    def _broker_cmd(self, node: KafkaNode) -> list[str]:
        assert self._java and self._libs and self._work_dir
        heap = [f"-Xmx{self.heap}"] if self.heap else []
        cmd = [
            self._java,
            *heap,
            *_BROKER_JVM_ARGS,
            *self._cds_flags("broker", self._java, self._libs),
            *self.jvm_args,
            f"-Dlog4j2.configurationFile={self._work_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.dir}",
            *self._classpath_args(),
            "kafka.Kafka",
            str(node.properties_path),
        ]
        return node.network_host.command(cmd) if node.network_host is not None else cmd

    def _classpath_args(self) -> list[str]:
        assert self._libs
        if not self.extra_classpath:
            return _cds.classpath_args(self._libs)
        # Appended after Kafka's jars: the CDS archive stays usable (the JVM allows a classpath
        # that extends the one the archive was made with).
        return ["-cp", os.pathsep.join([_cds.classpath(self._libs), *self.extra_classpath])]

    def _popen_logged(self, cmd: list[str], log_path: Path, short: bool) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            if short:  # dies before the calling thread does: no need for the spawner thread
                return _process.popen(
                    cmd, cwd=log_path.parent, stdout=out, stderr=subprocess.STDOUT
                )
            return _process.spawn(cmd, cwd=log_path.parent, stdout=out, stderr=subprocess.STDOUT)

    def _launch(self, node: KafkaNode) -> int:
        """Start ``node``'s JVM; returns the log offset from which to look for the ready line."""
        with open(node.log_path, "ab") as f:
            offset = f.tell()
            if offset:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                f.write(
                    f"\n===== kcore.testing: restarting node {node.node_id} at {stamp}\n".encode()
                )
                offset = f.tell()
        node.process = self._popen_logged(self._broker_cmd(node), node.log_path, False)
        return offset

    def _wait_ready(self, offsets: dict[int, int], deadline: float) -> None:
        """Wait until each node in ``offsets`` logged the ready line past its offset."""
        pending = dict(offsets)
        keep = len(READY_LINE)
        carry: dict[int, bytes] = {i: b"" for i in pending}
        while pending:
            for node_id in list(pending):
                node = self.node(node_id)
                with open(node.log_path, "rb") as f:
                    f.seek(pending[node_id])
                    chunk = f.read()
                pending[node_id] += len(chunk)
                window = carry[node_id] + chunk
                if READY_LINE in window:
                    del pending[node_id]
                    continue
                carry[node_id] = window[-keep:]
                assert node.process is not None
                rc = node.process.poll()
                if rc is not None:
                    raise self._start_error(node, f"exited with status {rc} before it was ready")
            if not pending:
                break
            if time.monotonic() > deadline:
                node = self.node(min(pending))
                raise self._start_error(
                    node,
                    f"did not log {READY_LINE.decode()!r} within {self.startup_timeout:g}s "
                    f"(still waiting for nodes {sorted(pending)})",
                )
            time.sleep(0.05)

    def _start_error(
        self, node: KafkaNode, what: str, log_path: Path | None = None
    ) -> ClusterStartError:
        log_path = log_path or node.log_path
        self._failed = True
        return ClusterStartError(
            f"Kafka {self.kafka_version} node {node.node_id} of {self.brokers} {what}. Logs are "
            f"kept in {self._work_dir}. Last lines of {log_path}:\n"
            f"{_process.tail_text(log_path, 40)}",
            node_id=node.node_id,
            log_path=log_path,
            work_dir=self._work_dir,
        )

    def _port_clash(self) -> bool:
        for node in self._nodes:
            if b"Address already in use" in _process.tail_text(node.log_path, 200).encode():
                return True
        return False

    # -- broker control -------------------------------------------------------------------------
    def stop_broker(self, node_id: int, timeout: float | None = None) -> None:
        """SIGTERM the node (a controlled shutdown) and wait for it to exit; SIGKILL it if it
        takes longer than ``timeout`` (default ``shutdown_timeout``)."""
        node = self.node(node_id)
        if node.process is None or not _process.signal_group(node.process, signal.SIGTERM):
            return
        try:
            node.process.wait(self.shutdown_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            log.warning("node %d did not stop on SIGTERM in time; killing it", node_id)
            _process.kill(node.process)

    def kill_broker(self, node_id: int) -> None:
        """SIGKILL the node (no controlled shutdown) and reap it."""
        node = self.node(node_id)
        if node.process is not None:
            _process.kill(node.process)

    def start_broker(self, node_id: int, timeout: float | None = None) -> None:
        """Start a stopped/killed node again with the same config and data; returns when it
        logged ``Kafka Server started`` (ClusterStartError otherwise)."""
        node = self.node(node_id)
        if not self._started:
            raise ClusterControlError("the cluster is not running; use start()")
        if node.is_running():
            return
        offset = self._launch(node)
        limit = self.startup_timeout if timeout is None else timeout
        self._wait_ready({node_id: offset}, time.monotonic() + limit)

    # -- network faults -------------------------------------------------------------------------
    @property
    def network(self) -> TestNetwork:
        """The cluster's test network (``isolated_network=True``, while it runs)."""
        if self._network is None:
            why = "is not running" if self.isolated_network else "has isolated_network=False"
            raise ClusterControlError(f"this cluster {why}: it has no test network")
        return self._network

    def _targets(self, targets: Sequence[int | NetworkHost]) -> list[NetworkHost]:
        if not targets:
            raise ValueError("name at least one node id or client host")
        network = self.network
        out = []
        for target in targets:
            if isinstance(target, NetworkHost):
                out.append(network.host(target.name))
            else:
                where = self.node(target).network_host
                assert where is not None
                out.append(where)
        return out

    def partition(self, *targets: int | NetworkHost) -> NetworkFault:
        hosts = self._targets(targets)
        for host in hosts:
            self.network.cut(host)
        names = ", ".join(h.name for h in hosts)
        log.info("partitioned %s from the test network", names)
        return NetworkFault(lambda: self.heal(*targets), f"partition of {names}")

    def throttle(self, *targets: int | NetworkHost, rate: str = "1mbit") -> NetworkFault:
        hosts = self._targets(targets)
        for host in hosts:
            self.network.throttle(host, rate)
        names = ", ".join(h.name for h in hosts)
        return NetworkFault(lambda: self.heal(*targets), f"throttle of {names} to {rate}")

    def heal(self, *targets: int | NetworkHost) -> None:
        if self._network is None:  # stopped: the network went with it
            return
        hosts = self._targets(targets) if targets else []
        self._network.heal(*hosts)
        if hosts:
            log.info("healed %s", ", ".join(h.name for h in hosts))

    def client_host(self, name: str) -> NetworkHost:
        network = self.network
        if any(h.name == name for h in network.hosts):
            return network.host(name)
        return network.add_host(name)

    # -- stop -----------------------------------------------------------------------------------
    def mark_failed(self) -> None:
        self._failed = True

    @property
    def failed(self) -> bool:
        return self._failed

    def stop(self, graceful: bool = False) -> None:
        """Stop every node and clean up: the work dir is deleted, or (keep_logs) only the data
        dirs; after a failure everything is kept. The nodes are SIGKILLed (their data is thrown
        away, their logs are complete); ``graceful=True`` SIGTERMs them all and waits up to
        ``shutdown_timeout`` first (a 3-node cluster takes several seconds for that)."""
        if not self._started:
            return
        procs = [n.process for n in self._nodes if n.process is not None]
        if graceful:
            for p in procs:
                _process.signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + self.shutdown_timeout
            for p in procs:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for p in procs:
            _process.kill(p)
        self._started = False
        _process.unregister(self)
        self._close_network()
        self._cleanup()

    def _close_network(self) -> None:
        network, self._network = self._network, None
        if network is not None:
            network.close()

    def _kill_all(self) -> None:
        for node in self._nodes:
            if node.process is not None:
                _process.kill(node.process)

    def _atexit_kill(self) -> None:
        self._kill_all()
        self._close_network()
        if self._work_dir is not None:
            print(
                f"kcore.testing: killed Kafka cluster left running at exit; logs kept in "
                f"{self._work_dir}",
                file=sys.stderr,
            )

    def _cleanup(self) -> None:
        work = self._work_dir
        if work is None or not work.exists():
            return
        if self._failed:
            print(f"kcore.testing: Kafka logs kept in {work}", file=sys.stderr)
            return
        if self.keep_logs:
            for node in self._nodes:
                shutil.rmtree(node.data_dir, ignore_errors=True)
        elif self._work_dir_arg is None:
            shutil.rmtree(work, ignore_errors=True)
        else:  # the caller's directory: remove only what we put there
            for node in self._nodes:
                shutil.rmtree(node.dir, ignore_errors=True)
            (work / "log4j2.properties").unlink(missing_ok=True)


def train_cds_archive(version: str, dump: Path, work_dir: Path) -> None:
    """How :class:`_cds.Archives` trains: a throwaway one-node cluster in ``work_dir`` whose
    broker writes the classes it loaded to ``dump`` as it stops gracefully. A start that fails
    raises with the end of the node's log (its files go when ``work_dir`` is removed, so the
    cluster claims to keep nothing)."""
    cluster = KafkaCluster(1, work_dir=work_dir, kafka_version=version, keep_logs=False)
    cluster._cds_training = dump
    try:
        cluster.start()
        cluster.stop(graceful=True)  # the node writes the archive as it exits
    except Exception as exc:
        try:
            tail = cluster.log_tail(1, 15)
        except Exception:  # noqa: BLE001 - no log to show
            tail = ""
        cluster._failed = False
        raise RuntimeError(f"{exc}\n{tail}".rstrip()) from None
    finally:
        cluster.stop()


def _split_bootstrap(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class ExternalCluster(BaseCluster):
    """A cluster someone else runs (``KCORE_BOOTSTRAP=host:port``): addresses and Kafka's CLI
    tools work, controlling brokers raises ClusterControlError."""

    def __init__(self, bootstrap_servers: str | None = None) -> None:
        value = bootstrap_servers or os.environ.get("KCORE_BOOTSTRAP", "")
        if not _split_bootstrap(value):
            raise ClusterControlError("ExternalCluster needs bootstrap servers (KCORE_BOOTSTRAP)")
        self._bootstrap = ",".join(_split_bootstrap(value))
        self.kafka_version = None
        self.startup_seconds = 0.0

    def __repr__(self) -> str:
        return f"<ExternalCluster {self._bootstrap}>"

    def __enter__(self) -> ExternalCluster:
        return self

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    @property
    def node_ids(self) -> list[int]:
        """The brokers' ids, as the cluster describes itself (asked each time: someone else
        runs it, so they may change)."""
        return [b.node_id for b in self._brokers()]

    def broker_address(self, node_id: int) -> str:
        for b in self._brokers():
            if b.node_id == node_id:
                return b.address
        raise ClusterControlError(f"{self._bootstrap} has no node {node_id}")

    def _brokers(self) -> list[Any]:
        from kcore.admin import AdminClient

        with AdminClient({"bootstrap.servers": self._bootstrap}) as admin:
            return list(admin.describe_cluster(timeout=30).brokers)

    def _cannot(self, what: str, node_id: int | str) -> ClusterControlError:
        return ClusterControlError(
            f"cannot {what} {node_id}: {self._bootstrap} is an external cluster "
            "(KCORE_BOOTSTRAP), which kcore.testing does not control. Run this test without "
            "KCORE_BOOTSTRAP to get a local cluster it can stop, start and kill."
        )
