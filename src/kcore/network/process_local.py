"""What makes a blocking client safe to pickle and to use after ``os.fork()``.

A client's network thread, event loop and connections belong to the process that made them: a
forked child has a copy of the client but not its thread (and may have copies of locks that
thread held), and a pickle of them means nothing elsewhere. So a client pickles as its config
(unpickling builds a fresh client), and in a forked child every client forgets its parent's
state and rebuilds itself from its config on first use: nothing of the parent's is closed or
touched (closing a copied TLS connection would write to the parent's), and a child that never
uses the client opens no connection. This is what Spark's Python workers (forked by a daemon)
and multiprocessing's fork start method need.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

__all__ = ["ProcessLocal"]

_live: weakref.WeakSet[ProcessLocal] = weakref.WeakSet()
_rebuild_lock = threading.Lock()


class ProcessLocal:
    """Mixin for a client built as ``cls(config)``: call :meth:`_process_local` first thing in
    ``__init__``."""

    _config: Mapping[str, Any]

    def _process_local(self, config: Mapping[str, Any]) -> None:
        from kcore.config import ClientConfig

        # A copy: a caller's dict changed later must not change what a rebuild uses.
        self._config = config if isinstance(config, ClientConfig) else dict(config)
        _live.add(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._config,)

    if not TYPE_CHECKING:  # (a __getattr__ would hide every attribute typo from mypy)

        def __getattr__(self, name: str) -> Any:
            # Reached only for a missing attribute: after a fork emptied this client.
            with _rebuild_lock:
                config = self.__dict__.get("_forked_config")
                if config is not None:
                    try:
                        type(self).__init__(self, config)
                    except BaseException:  # left as it was: the next use tries again
                        self.__dict__.clear()
                        self.__dict__["_forked_config"] = config
                        raise
                    del self.__dict__["_forked_config"]
            return object.__getattribute__(self, name)


def _forget_parent_state() -> None:
    global _rebuild_lock
    _rebuild_lock = threading.Lock()  # the parent's may have been held by another thread
    for client in list(_live):
        config = client.__dict__.get("_config")
        loop = client.__dict__.get("_loop")  # (each client keeps its LoopThread as _loop)
        if loop is not None and loop.loop.is_closed():
            continue  # closed in the parent: it stays closed, nothing to rebuild
        if config is not None:
            client.__dict__.clear()
            client.__dict__["_forked_config"] = config


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_state)
