"""Starting and killing the broker JVMs so that none outlives the test process.

Three layers, because any one can be bypassed:

* each JVM runs in its own session (so its process group can be killed as a whole);
* on Linux, ``PR_SET_PDEATHSIG=SIGKILL`` makes the kernel kill the JVM when its parent dies,
  even from SIGKILL. The "parent" is the *thread* that forked, so every long-lived JVM is
  forked from one daemon thread that lives as long as the interpreter. The child sets it in a
  small launcher it execs first, never in a ``preexec_fn``: Python code run in a child forked
  from a thread other than the main one first drops the other threads' thread-local state,
  running its finalizers in the child, and py4j's shut down the socket a PySpark session's main
  thread shares with its JVM (the JVM then serves that thread from a new thread, without the
  session it had made active there);
* an ``atexit`` hook kills whatever is still registered.

Also what every local cluster needs around its processes: free ports on 127.0.0.1, the tail of
a log, and the processes a child started (a Spark worker's executors).
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
HOST = "127.0.0.1"


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


# Runs as ``python -I -S -c _LAUNCHER <parent pid> <program> <args...>``: sets the death signal,
# then becomes the program (same pid, environment and working directory).
_LAUNCHER = (
    "import ctypes, os, sys\n"
    f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the parent died before prctl took effect
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _with_launcher(args: list[str], env: Any) -> list[str]:
    """``args`` run through the death-signal launcher (Linux), or as they are."""
    if not sys.platform.startswith("linux") or not sys.executable or _pdeathsig_preexec() is None:
        return args
    path = None if env is None else env.get("PATH", os.defpath)
    if os.sep not in args[0] and shutil.which(args[0], path=path) is None:
        # what Popen raises for a program it cannot find, rather than the launcher's exit
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), args[0])
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *args]


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new session, killed by the kernel if this thread dies."""
    if not args:
        raise ValueError("no program to run")
    return subprocess.Popen(
        _with_launcher(list(args), kwargs.get("env")),
        start_new_session=True,
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


def reserve_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, all bound at once so none repeats."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail_text(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log (a note saying why, when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max(65536, lines * 1000)))
            data = f.read()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    text = data.decode(errors="replace").splitlines()
    return "\n".join(text[-lines:]) if lines > 0 else ""


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux ``/proc``; elsewhere none). Read before
    killing ``pid``: once it is gone, its children belong to init and cannot be told apart."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # the command name may hold spaces and parentheses: fields follow the last ')'
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGKILL ``proc``'s process group and every process it started, also those that made a
    group of their own (PySpark's worker daemon does), and reap ``proc``."""
    if proc.poll() is None:
        for pid in descendants(proc.pid):
            for kill_one in (os.killpg, os.kill):  # the group it leads, else the process
                try:
                    kill_one(pid, signal.SIGKILL)
                    break
                except (ProcessLookupError, PermissionError):
                    continue
    kill(proc, timeout)
