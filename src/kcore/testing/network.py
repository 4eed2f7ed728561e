"""A small network of this machine's own for tests: a Linux bridge and one network namespace per
host, each joined to the bridge by a veth pair, so that one host can be cut off (its link goes
down: packets are lost, as in a real partition, while its processes keep running) or throttled
(a ``tbf`` rate limit both ways) and healed again.

::

    with TestNetwork() as net:
        broker = net.add_host("node1")        # 10.x.y.11 inside namespace kcore-<pid>-<n>-node1
        proc = subprocess.Popen(broker.command(["java", ...]))
        net.cut(broker)                       # nobody reaches it, it reaches nobody
        net.restore(broker)

The test process itself stays in its own namespace and reaches every host through the bridge
(which holds the subnet's ``.1``); a client that must be cut off on its own runs in a host of
its own (:meth:`NetworkHost.command`).

Rules it keeps: addresses come from a /24 in 10.200.0.0-10.254.255.0 that no interface or route
of this machine uses; every name it creates carries this process's pid, and whatever a dead
process left behind (namespaces, bridges) is removed before a new network is made. Needs root
(or CAP_NET_ADMIN) and iproute2; without them :class:`NetworkSetupError` says so. Linux only.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import random
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ClusterError

__all__ = ["NetworkHost", "NetworkSetupError", "TestNetwork"]

_NAMESPACE_PREFIX = "kcore-"
_BRIDGE_ALIAS_PREFIX = "kcore-test-network-"
_counter = itertools.count(1)
_counter_lock = threading.Lock()


class NetworkSetupError(ClusterError):
    """The test network could not be made or changed: no ``ip``/``tc``, no permission
    (root or CAP_NET_ADMIN is needed), or a command failed; the message holds its output."""


@dataclass(frozen=True)
class NetworkHost:
    """One host of a :class:`TestNetwork`: a network namespace with one interface on the
    bridge. ``link`` is the bridge-side end of its veth pair (what cutting it takes down)."""

    name: str
    namespace: str
    address: str
    link: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``, which execs it: the
        process keeps its pid)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise NetworkSetupError(
            f"the test network needs {argv[0]!r} (iproute2), which is not on PATH"
        )
    res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        why = (res.stderr or res.stdout).strip()
        hint = ""
        if "Operation not permitted" in why or "Permission denied" in why:
            hint = " (network namespaces need root or CAP_NET_ADMIN)"
        raise NetworkSetupError(f"{' '.join(argv)} failed{hint}: {why}")
    return res


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove the namespaces and bridges that test networks of processes no longer running
    left behind (a SIGKILLed test run cannot clean up); returns their names."""
    removed: list[str] = []
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{_NAMESPACE_PREFIX}(\d+)-\d+-.+", name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    links = _ip("-o", "-d", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        m = re.search(rf"alias {_BRIDGE_ALIAS_PREFIX}(\d+)", line)
        if m and not _pid_alive(int(m.group(1))):
            bridge = line.split(":")[1].strip().split("@")[0]
            _ip("link", "delete", bridge, check=False)
            removed.append(bridge)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for argv in (["-o", "-4", "addr", "show"], ["-4", "route", "show", "table", "all"]):
        for token in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", _ip(*argv).stdout):
            try:
                used.append(ipaddress.IPv4Network(token, strict=False))
            except ValueError:
                continue
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    rng = random.Random()
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{rng.randint(200, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetworkSetupError("no free /24 in 10.200.0.0/16-10.254.255.0/24 for a test network")


class TestNetwork:
    """A bridge and the namespaces of its hosts (see the module docstring). Made on
    :meth:`create` (or entering ``with``), removed on :meth:`close`; neither raises for what
    is already gone."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self) -> None:
        with _counter_lock:
            self._tag = f"{os.getpid()}-{next(_counter)}"
        # interface names are at most 15 bytes: "kc" + 6 hex + kind + index
        self._short = f"kc{random.getrandbits(24):06x}"
        self.bridge = f"{self._short}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self._hosts: dict[str, NetworkHost] = {}
        self._cut: set[str] = set()
        self._throttled: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<TestNetwork {self.bridge} {self.subnet} hosts={list(self._hosts)}>"

    def __enter__(self) -> TestNetwork:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gateway(self) -> str:
        """The bridge's address: where this process's packets to the hosts come from."""
        if self.subnet is None:
            raise NetworkSetupError("the test network has not been created")
        return str(self.subnet.network_address + 1)

    @property
    def hosts(self) -> list[NetworkHost]:
        return list(self._hosts.values())

    def create(self) -> TestNetwork:
        if self.subnet is not None:
            return self
        sweep_stale()
        subnet = _free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.subnet = subnet
            _ip("link", "set", self.bridge, "alias", f"{_BRIDGE_ALIAS_PREFIX}{os.getpid()}")
            _ip("addr", "add", f"{self.gateway}/{subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, name: str) -> NetworkHost:
        """A new namespace joined to the bridge, with the next free address (``.11`` up)."""
        if self.subnet is None:
            self.create()
        assert self.subnet is not None
        if not re.fullmatch(r"[A-Za-z0-9_.]{1,32}", name) or name in self._hosts:
            raise ValueError(f"host name {name!r} is taken or not [A-Za-z0-9_.]{{1,32}}")
        index = len(self._hosts) + 1
        if index > 200:
            raise NetworkSetupError("a test network holds at most 200 hosts")
        host = NetworkHost(
            name=name,
            namespace=f"{_NAMESPACE_PREFIX}{self._tag}-{name}",
            address=str(self.subnet.network_address + 10 + index),
            link=f"{self._short}h{index}",
        )
        inner = f"{self._short}p{index}"
        self._hosts[name] = host  # before creating anything, so close() removes it
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.namespace)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        ns = ("-n", host.namespace)
        _ip(*ns, "link", "set", "lo", "up")
        _ip(*ns, "link", "set", inner, "name", "eth0")
        _ip(*ns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        return host

    def host(self, name: str) -> NetworkHost:
        try:
            return self._hosts[name]
        except KeyError:
            raise NetworkSetupError(
                f"no host {name!r} in this test network (hosts: {list(self._hosts)})"
            ) from None

    # -- faults ---------------------------------------------------------------------------------
    def cut(self, host: NetworkHost) -> None:
        """Take the host's link down: every packet to or from it is lost until restore()."""
        with self._lock:
            _ip("link", "set", host.link, "down")
            self._cut.add(host.name)

    def restore(self, host: NetworkHost) -> None:
        with self._lock:
            _ip("link", "set", host.link, "up")
            # Forget the failed address lookups the cut left (else connecting to the host
            # fails with "no route to host" for a few more seconds, on every side).
            _ip("neigh", "flush", "to", host.address, check=False)
            _ip("-n", host.namespace, "neigh", "flush", "all", check=False)
            for other in self._hosts.values():
                if other is not host:
                    _ip("-n", other.namespace, "neigh", "flush", "to", host.address, check=False)
            self._cut.discard(host.name)

    def is_cut(self, host: NetworkHost) -> bool:
        return host.name in self._cut

    def throttle(self, host: NetworkHost, rate: str, *, latency: str = "200ms") -> None:
        """Limit the host's traffic both ways to ``rate`` (tc units: ``"1mbit"``, ``"200kbit"``)
        with a token bucket; packets beyond ``latency`` of queue are dropped."""
        with self._lock:
            for ns, dev in ((None, host.link), (host.namespace, "eth0")):
                where = ["-n", ns] if ns else []
                _run(
                    ["tc", *where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", "32kbit", "latency", latency]
                )  # fmt: skip
            self._throttled.add(host.name)

    def unthrottle(self, host: NetworkHost) -> None:
        with self._lock:
            for ns, dev in ((None, host.link), (host.namespace, "eth0")):
                where = ["-n", ns] if ns else []
                _run(["tc", *where, "qdisc", "del", "dev", dev, "root"], check=False)
            self._throttled.discard(host.name)

    def heal(self, *hosts: NetworkHost) -> None:
        """Restore the given hosts (every host, without arguments) where they are cut and lift
        their throttles."""
        names = {h.name for h in hosts} if hosts else set(self._hosts)
        for name in sorted(names & self._cut):
            self.restore(self._hosts[name])
        for name in sorted(names & self._throttled):
            self.unthrottle(self._hosts[name])

    # -- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        """Delete every namespace (which deletes both ends of its veth) and the bridge. The
        processes still running in a namespace keep it alive until they exit: stop them
        first."""
        for host in self._hosts.values():
            _ip("netns", "delete", host.namespace, check=False)
        self._hosts.clear()
        self._cut.clear()
        self._throttled.clear()
        if self.subnet is not None:
            _ip("link", "delete", self.bridge, check=False)
            self.subnet = None
