"""Kafka clients kept for the life of an executor's Python worker process and reused by its
tasks, as the JVM connector caches its producers and consumers: a task needs no new connections,
metadata fetch or producer id.

Two context managers, each keyed by the client's config (a dict of kcore/Java config keys):

* ``get_producer(config)`` lends the process's one ``kcore.Producer`` for that config. It is
  shared: tasks running at once in the process use it together (Producer is thread-safe).
  Do not close it; wait for your own records (flush / their futures) before returning.
* ``get_consumer(config)`` lends a ``kcore.Consumer`` to one user at a time (an idle one for the
  config, or a new one). Assign and seek as needed: a consumer comes back with no assignment
  (it is unassigned on return, so it fetches nothing while idle). If the ``with`` block raises,
  the consumer is closed rather than lent again, as its state is unknown; a ``GeneratorExit``
  (a generator holding the lease closed early) is a normal end.

A client that no task has used for ``idle_timeout_s`` (the JVM connector's defaults: 10 min for
producers, 5 for consumers) is closed by a daemon thread; everything left is closed at exit.
``stats()`` counts what the process made and lent (tests use it to see the reuse).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import kcore

__all__ = ["ClientPool", "get_consumer", "get_producer", "stats"]

log = logging.getLogger("kcore.spark.clients")

C = TypeVar("C")

EVICT_INTERVAL_S = 60.0


def config_key(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A hashable key for a config (values by repr: some are callables or lists)."""
    return tuple(sorted((str(k), repr(v)) for k, v in config.items()))


@dataclass
class _Entry(Generic[C]):
    client: C
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


class ClientPool(Generic[C]):
    """Clients by config. ``shared``: one client per config, lent to any number of users at
    once; otherwise each client is lent to one user at a time, and a new one made when all
    are lent."""

    def __init__(
        self,
        make: Callable[[dict[str, Any]], C],
        *,
        shared: bool,
        idle_timeout_s: float,
        on_return: Callable[[C], None] | None = None,
    ) -> None:
        self._make = make
        self._shared = shared
        self.idle_timeout_s = idle_timeout_s
        self._on_return = on_return
        self._lock = threading.Lock()
        self._entries: dict[Any, list[_Entry[C]]] = {}
        # How many clients were made and lent, by config key (what ``stats`` reports).
        self.created: Counter[Any] = Counter()
        self.lent: Counter[Any] = Counter()
        self._evictor_pid = 0
        _pools.add(self)

    @contextmanager
    def lease(self, config: Mapping[str, Any]) -> Iterator[C]:
        key = config_key(config)
        entry = self._take(key, config)
        failed = False
        try:
            yield entry.client
        except GeneratorExit:
            # A reader closed early (Spark's limit/take): raised at the reader's yield, between
            # two calls to the client, so it is in the state a finished read leaves it in.
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self._give_back(key, entry, failed)

    def _take(self, key: Any, config: Mapping[str, Any]) -> _Entry[C]:
        self._start_evictor()
        with self._lock:
            entries = self._entries.setdefault(key, [])
            for entry in entries:
                if self._shared or entry.users == 0:
                    entry.users += 1
                    self.lent[key] += 1
                    return entry
        # Made outside the lock: bootstrapping may take a while and must not hold up others.
        entry = _Entry(self._make(dict(config)), users=1)
        with self._lock:
            self.created[key] += 1
            self.lent[key] += 1
            entries = self._entries.setdefault(key, [])
            if self._shared and entries:  # another task made one meanwhile: use that
                extra, entry = entry, entries[0]
                entry.users += 1
                self.created[key] -= 1
                _close(extra.client)
            else:
                entries.append(entry)
            return entry

    def _give_back(self, key: Any, entry: _Entry[C], failed: bool) -> None:
        broken = failed and not self._shared  # a shared producer outlives one task's failure
        if not broken and self._on_return is not None:
            try:
                self._on_return(entry.client)
            except Exception as exc:
                log.warning("kcore client could not be reset for reuse, closing it: %s", exc)
                broken = True
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            if broken:
                self._remove(key, entry)
        if broken:
            _close(entry.client)

    def _remove(self, key: Any, entry: _Entry[C]) -> None:
        entries = self._entries.get(key, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self._entries.pop(key, None)

    def evict_idle(self, now: float | None = None) -> int:
        """Close the clients unused for ``idle_timeout_s``; returns how many."""
        now = time.monotonic() if now is None else now
        idle: list[_Entry[C]] = []
        with self._lock:
            for key, entries in list(self._entries.items()):
                for entry in list(entries):
                    if entry.users == 0 and now - entry.last_used >= self.idle_timeout_s:
                        self._remove(key, entry)
                        idle.append(entry)
        for entry in idle:
            _close(entry.client)
        return len(idle)

    def close_all(self) -> None:
        with self._lock:
            entries = [e for es in self._entries.values() for e in es]
            self._entries.clear()
        for entry in entries:
            _close(entry.client)

    def _start_evictor(self) -> None:
        # Once per process: a forked child has the pool but not the parent's thread.
        with self._lock:
            if self._evictor_pid == os.getpid():
                return
            self._evictor_pid = os.getpid()

        def run() -> None:
            while True:
                time.sleep(min(EVICT_INTERVAL_S, self.idle_timeout_s))
                self.evict_idle()

        threading.Thread(target=run, name="kcore-spark-evictor", daemon=True).start()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(es) for es in self._entries.values())


_pools: weakref.WeakSet[ClientPool[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_pools):
        pool._lock = threading.Lock()  # the parent's may have been held by another thread


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception as exc:  # closing is best effort; the records were waited for already
        log.warning("closing a cached kcore client failed: %s", exc)


def _unassign(consumer: kcore.Consumer) -> None:
    consumer.assign([])


_producers: ClientPool[kcore.Producer] = ClientPool(
    kcore.Producer, shared=True, idle_timeout_s=600.0
)


def _ready_consumer(config: Mapping[str, Any]) -> kcore.Consumer:
    """A consumer whose cluster has answered: an unreachable one fails the task with its
    BootstrapError at default.api.timeout.ms (poll alone would wait quietly, as Java's)."""
    consumer = kcore.Consumer(config)
    try:
        consumer.wait_until_ready()
    except BaseException:
        consumer.close()
        raise
    return consumer


_consumers: ClientPool[kcore.Consumer] = ClientPool(
    _ready_consumer, shared=False, idle_timeout_s=300.0, on_return=_unassign
)


def get_producer(config: Mapping[str, Any]) -> AbstractContextManager[kcore.Producer]:
    """``with get_producer(config) as producer:`` the process's producer for ``config``."""
    return _producers.lease(config)


def get_consumer(config: Mapping[str, Any]) -> AbstractContextManager[kcore.Consumer]:
    """``with get_consumer(config) as consumer:`` a consumer of one's own for the block."""
    return _consumers.lease(config)


def stats(config: Mapping[str, Any] | None = None) -> dict[str, int]:
    """What this process made and lent (for ``config``'s key only, if given), and holds now."""

    def count(counter: Counter[Any]) -> int:
        return counter[config_key(config)] if config is not None else sum(counter.values())

    return {
        "pid": os.getpid(),
        "producers_created": count(_producers.created),
        "producers_lent": count(_producers.lent),
        "producers": len(_producers),
        "consumers_created": count(_consumers.created),
        "consumers_lent": count(_consumers.lent),
        "consumers": len(_consumers),
    }


@atexit.register
def _close_everything() -> None:
    _producers.close_all()
    _consumers.close_all()
