"""librdkafka's statistics (``statistics.interval.ms``, ``stats_cb``): every interval, a JSON
document of the client's state in the shape librdkafka's STATISTICS.md describes, given to the
application's callable. docs/observability.md lists the fields kcore fills.

Rules the reporter keeps:

* The numbers are read on the client's event loop (each part from its owner, through a small
  read-only method), into plain dicts; that is all the event loop does. Turning them into JSON
  and calling ``stats_cb`` happen on a thread of the reporter's own, so a slow callback never
  holds up the network.
* One document at a time: a document made while the callback still runs on the previous one is
  dropped, and counted (the ``stats-callbacks-dropped-total`` metric).
* An exception from the callback is logged; the reporter and the client go on.
* Closing the client stops the timer; no last document is sent (as librdkafka's clients).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kcore.cluster.connections import ConnectionPool, CoordinatorKey
from kcore.cluster.metadata import MetadataCache
from kcore.metrics import ClientMetrics

__all__ = ["StatisticsReporter", "broker_statistics"]

log = logging.getLogger("kcore.statistics")

# A part of the document, filled in on the event loop by the state's owner.
Section = Callable[[dict[str, Any]], None]

_INSTANCE_NUMBERS: dict[str, itertools.count[int]] = {}
_NUMBERS_LOCK = threading.Lock()


def _instance_name(client_id: str, role: str) -> str:
    """``<client.id>#<role>-<n>``, n counting the clients of that role in this process (as
    librdkafka's ``rdkafka#producer-1``)."""
    with _NUMBERS_LOCK:
        number = next(_INSTANCE_NUMBERS.setdefault(role, itertools.count(1)))
    return f"{client_id}#{role}-{number}"


def broker_statistics(pool: ConnectionPool, now: float) -> dict[str, dict[str, Any]]:
    """The ``brokers`` object: one entry per connection key dialled so far, by
    ``host:port/nodeid`` (a coordinator connection: ``host:port/coordinator-<nodeid>``; a
    bootstrap server: ``host:port/bootstrap``)."""
    out: dict[str, dict[str, Any]] = {}
    for view in pool.statistics():
        address = f"{view.host}:{view.port}"
        if view.key is None:  # (librdkafka names its bootstrap entries so too)
            node_id, source, name = -1, "configured", f"{address}/bootstrap"
        elif isinstance(view.key, CoordinatorKey):
            node_id, source = view.key.node_id, "logical"
            name = f"{address}/coordinator-{node_id}"
        else:
            node_id = view.key
            name, source = f"{address}/{node_id}", "configured" if node_id < 0 else "learned"
        c = view.counters
        out[name] = {
            "name": name,
            "nodeid": node_id,
            "nodename": address,
            "source": source,
            "state": c.state,
            "stateage": int((now - c.state_since) * 1_000_000),
            "waitresp_cnt": view.in_flight,
            "tx": c.tx,
            "txbytes": c.txbytes,
            "txerrs": c.txerrs,
            "req_timeouts": c.req_timeouts,
            "rx": c.rx,
            "rxbytes": c.rxbytes,
            "rxerrs": c.rxerrs,
            "connects": c.connects,
            "disconnects": c.disconnects,
            "rtt": c.rtt_us.take(),
            "throttle": c.throttle_ms.take(),
            "req": dict(c.requests),
            "toppars": {},
        }
    return out


class StatisticsReporter:
    """One client's statistics: a timer on its event loop, and a thread calling ``callback``.
    ``sections`` are added by the client's parts (producer, consumer, group) before start."""

    def __init__(
        self,
        *,
        role: str,
        client_id: str,
        interval_s: float,
        callback: Callable[[str], Any],
        pool: ConnectionPool,
        cache: MetadataCache,
        metrics: ClientMetrics,
    ) -> None:
        self.role = role
        self.client_id = client_id
        self.name = _instance_name(client_id, role)
        self.interval_s = interval_s
        self.callback = callback
        self._pool = pool
        self._cache = cache
        self._created = time.monotonic()
        self._sections: list[Section] = []
        self._timer: asyncio.Task[None] | None = None
        # The hand-over to the callback thread: one document at most, taken when it is idle.
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.dropped = 0  # documents dropped while the callback was still busy
        self.emitted = 0  # documents handed to the callback thread
        metrics.gauge("stats-callbacks-dropped-total", lambda: self.dropped)

    def add_section(self, section: Section) -> None:
        self._sections.append(section)

    # -- lifecycle (event loop) -------------------------------------------------------------------

    def start(self) -> None:
        if self._timer is None and not self._stopped:
            self._timer = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._pending = None
            self._cond.notify_all()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            await asyncio.gather(timer, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                document = self.collect()
            except Exception:  # a part that cannot be read now must not end the reporting
                log.exception("statistics of %s could not be collected", self.name)
                continue
            self._hand_over(document)

    # -- the document (event loop) ----------------------------------------------------------------

    def collect(self) -> dict[str, Any]:
        now = time.monotonic()
        brokers = broker_statistics(self._pool, now)
        document: dict[str, Any] = {
            "name": self.name,
            "client_id": self.client_id,
            "type": self.role,
            "ts": int(now * 1_000_000),
            "time": int(time.time()),
            "age": int((now - self._created) * 1_000_000),
            "tx": sum(b["tx"] for b in brokers.values()),
            "tx_bytes": sum(b["txbytes"] for b in brokers.values()),
            "rx": sum(b["rx"] for b in brokers.values()),
            "rx_bytes": sum(b["rxbytes"] for b in brokers.values()),
            "metadata_cache_cnt": len(self._cache.current.topics),
            "brokers": brokers,
        }
        for section in self._sections:
            section(document)
        # Each broker's partitions: those it leads among the document's topics.
        by_node = {b["nodeid"]: b for b in brokers.values() if b["source"] != "logical"}
        for topic, entry in document.get("topics", {}).items():
            for partition in entry["partitions"].values():
                broker = by_node.get(partition.get("leader"))
                if broker is not None:
                    broker["toppars"][f"{topic}-{partition['partition']}"] = {
                        "topic": topic,
                        "partition": partition["partition"],
                    }
        return document

    # -- the callback thread ----------------------------------------------------------------------

    def _hand_over(self, document: dict[str, Any]) -> None:
        with self._cond:
            if self._stopped:
                return
            if self._busy:
                self.dropped += 1
                return
            self._pending, self._busy = document, True
            self.emitted += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"kcore-stats-{self.name}", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                document, self._pending = self._pending, None
            assert document is not None
            try:
                self.callback(json.dumps(document, separators=(",", ":")))
            except Exception:
                log.exception("stats_cb of %s raised; statistics go on", self.name)
            finally:
                with self._cond:
                    self._busy = False
