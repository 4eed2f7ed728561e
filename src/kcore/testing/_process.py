"""Starting and killing the broker JVMs so that none outlives the test process.

Three layers, because any one can be bypassed:

* each JVM runs in its own session (so its process group can be killed as a whole);
* on Linux, ``PR_SET_PDEATHSIG=SIGKILL`` makes the kernel kill the JVM when its parent dies,
  even from SIGKILL. The "parent" is the *thread* that forked, so every long-lived JVM is
  forked from one daemon thread that lives as long as the interpreter;
* an ``atexit`` hook kills whatever is still registered.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

_PR_SET_PDEATHSIG = 1


def _pdeathsig_preexec() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sig = int(signal.SIGKILL)

    def preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """Forks every long-lived child from a single daemon thread (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Future[subprocess.Popen[bytes]], Any, Any]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._pid = -1

    def _run(self) -> None:
        while True:
            fut, args, kwargs = self._queue.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(popen(args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def spawn(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run, name="kcore-testing-spawner", daemon=True
                )
                self._thread.start()
            fut: Future[subprocess.Popen[bytes]] = Future()
            self._queue.put((fut, list(args), kwargs))
        try:
            return fut.result()
        except BaseException:
            # Interrupted (Ctrl-C) while the spawner forks: the caller will never know the
            # child, so nobody would stop it. Kill it the moment it exists (or never start it).
            if not fut.cancel():
                fut.add_done_callback(_kill_orphan)
            raise


def _kill_orphan(fut: Future[subprocess.Popen[bytes]]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        kill(fut.result())


_spawner = _Spawner()


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new session, killed by the kernel if this thread dies."""
    return subprocess.Popen(
        list(args),
        start_new_session=True,
        preexec_fn=_pdeathsig_preexec(),
        stdin=subprocess.DEVNULL,
        **kwargs,
    )


def spawn(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Like :func:`popen`, but forked from the long-lived spawner thread, so the child survives
    the calling thread (it still dies with the process)."""
    return _spawner.spawn(args, **kwargs)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """Send ``sig`` to the process group of ``proc`` (its own session). False if it had exited.
    Safe against pid reuse: an exited child is not reaped before ``poll()`` sees it."""
    if proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        proc.send_signal(sig)
    return True


def kill(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGKILL the process group and reap the process."""
    signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


# Objects with a ``_atexit_kill()`` method, registered while they own running processes.
_registry: set[Any] = set()
_registry_lock = threading.Lock()


def register(owner: Any) -> None:
    with _registry_lock:
        _registry.add(owner)


def unregister(owner: Any) -> None:
    with _registry_lock:
        _registry.discard(owner)


@atexit.register
def _kill_registered() -> None:
    with _registry_lock:
        owners = list(_registry)
        _registry.clear()
    for owner in owners:
        try:
            owner._atexit_kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
