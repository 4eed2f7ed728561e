"""A real Spark standalone cluster for tests: a master and N workers on 127.0.0.1, each its own
JVM started from the installed pyspark's launcher (``bin/spark-class``), the way Spark's own
``sbin`` scripts start them.

::

    with SparkCluster(workers=2) as cluster:
        spark = cluster.session("my-test", executor_python="/venvs/bare/bin/python")
        ...  # jobs run in executors the workers start, in that Python
        spark.stop()

Applications run against it either in this process (:meth:`SparkCluster.session`) or as
``spark-submit`` (:meth:`SparkCluster.submit_command`, :meth:`SparkCluster.submit`); either way
the executors run the Python each application names. PySpark needs the driver's and the
executors' Python to be of the same minor version (3.11 and 3.11), which both check up front.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _process
from .errors import ClusterControlError, ClusterError, ClusterStartError

log = logging.getLogger("kcore.testing")

__all__ = ["SparkCluster", "SparkDaemon", "spark_home"]

HOST = _process.HOST
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Daemons and short applications: a small heap, no /tmp/hsperfdata left by killed JVMs.
_DAEMON_JAVA_OPTS = "-XX:-UsePerfData -XX:+UseSerialGC"
# Read by every daemon (--properties-file). The master's REST submission server would take one
# more port (6066, not a free one); the port settings must not move to the next port when one
# is taken, or the master would not be where master_url says (start() retries instead).
_DAEMON_PROPERTIES = {
    "spark.master.rest.enabled": "false",
    "spark.port.maxRetries": "0",
    "spark.worker.cleanup.enabled": "false",
}
# What spark-submit's own JVM gets: it lives seconds, so starting fast matters more.
_SUBMIT_DRIVER_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"


def spark_home() -> Path:
    """The installed pyspark's directory: a complete Spark (``bin/``, ``jars/``)."""
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterError(
            "SparkCluster needs pyspark installed (pip install pyspark): it runs the Spark that "
            "comes with it"
        ) from exc
    return Path(pyspark.__file__).resolve().parent


def _python_version(python: str | os.PathLike[str]) -> str:
    """``major.minor`` of an interpreter, asked of it (a ClusterError when it does not run)."""
    try:
        res = subprocess.run(
            [os.fspath(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot run the Python {python}: {exc}") from None
    if res.returncode != 0:
        raise ClusterError(
            f"the Python {python} exited with status {res.returncode}: {res.stderr.strip()[-500:]}"
        )
    return res.stdout.strip()


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the variables that decide what a Python imports
    (PYTHONPATH, PYTHONHOME, ...) or which Python PySpark runs: those of the cluster's
    processes and applications are what the caller names, never inherited by accident."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    env.update(extra or {})
    return env


@dataclass
class SparkDaemon:
    """One JVM of a :class:`SparkCluster`: the master (``name`` "master") or a worker
    ("worker-1", ...)."""

    name: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SparkCluster:
    """A Spark standalone cluster on 127.0.0.1: a master and ``workers`` workers, each a JVM
    started from the installed pyspark (its package directory is a complete SPARK_HOME).

    :param workers: how many workers (each a JVM that starts one executor per application).
    :param cores_per_worker: the cores each worker offers. An application takes one on each
        worker (one executor of one core there), so the default 2 lets two applications run at
        once (a session in the tests' process and a ``spark-submit``): Spark's cores are task
        slots, not the machine's.
    :param memory_per_worker: the memory each worker offers its executors (Spark's format: 1g).
    :param daemon_heap: ``-Xmx`` of the master and worker JVMs themselves.
    :param startup_timeout: seconds for the master to be up and every worker registered.
    :param work_dir: where logs and the workers' directories go (default: a new temp dir,
        removed on a clean stop).
    :param keep_logs: keep the logs after a clean stop (default: when ``work_dir`` was given).
        After a failure everything is kept.
    :param spark_home: a Spark distribution (default: the installed pyspark's).

    Everything binds to 127.0.0.1: the master's port and web UI on free ports, the workers'
    on ports the system picks. The daemons (and so the executors and their Python workers)
    run with this process's environment minus its ``PYTHON*``/``PYSPARK*`` variables: what the
    executors import is what the application's Python has.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 2,
        memory_per_worker: str = "1g",
        daemon_heap: str = "256m",
        startup_timeout: float = 120.0,
        work_dir: str | os.PathLike[str] | None = None,
        keep_logs: bool | None = None,
        spark_home: str | os.PathLike[str] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        if cores_per_worker < 1:
            raise ValueError(f"cores_per_worker must be at least 1, not {cores_per_worker}")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.daemon_heap = daemon_heap
        self.startup_timeout = startup_timeout
        self.keep_logs = keep_logs if keep_logs is not None else work_dir is not None
        self.startup_seconds: float | None = None
        self._spark_home_arg = Path(spark_home) if spark_home is not None else None
        self._spark_home: Path | None = None
        self._work_dir_arg = Path(work_dir) if work_dir is not None else None
        self._work_dir: Path | None = None
        self._master_port: int | None = None
        self._web_port: int | None = None
        self._daemons: list[SparkDaemon] = []
        self._failed = False
        self._started = False

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        where = f" {self.master_url}" if self._master_port else ""
        return f"<SparkCluster {self.workers} worker(s) {state}{where}>"

    # -- addresses ------------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:port``: what applications give as their master."""
        if self._master_port is None:
            raise ClusterControlError("the Spark cluster has not been started")
        return f"spark://{HOST}:{self._master_port}"

    @property
    def web_url(self) -> str:
        """The master's web UI (``/json/`` there is the cluster's state)."""
        if self._web_port is None:
            raise ClusterControlError("the Spark cluster has not been started")
        return f"http://{HOST}:{self._web_port}"

    @property
    def spark_home(self) -> Path:
        if self._spark_home is None:
            self._spark_home = (self._spark_home_arg or spark_home()).resolve()
        return self._spark_home

    @property
    def work_dir(self) -> Path | None:
        return self._work_dir

    @property
    def daemons(self) -> list[SparkDaemon]:
        """The master, then the workers."""
        return list(self._daemons)

    def daemon(self, name: str) -> SparkDaemon:
        for d in self._daemons:
            if d.name == name:
                return d
        raise ClusterControlError(
            f"no Spark daemon {name!r} (daemons: {[d.name for d in self._daemons]})"
        )

    def log_tail(self, name: str, lines: int = 50) -> str:
        """The end of a daemon's log (``"master"``, ``"worker-1"``, ...)."""
        return _process.tail_text(self.daemon(name).log_path, lines)

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster: its ``/json/`` (workers, applications, ...)."""
        # No proxy: the master is on this machine, whatever http_proxy says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.web_url}/json/", timeout=10) as resp:
            state: dict[str, Any] = json.load(resp)
        return state

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> SparkCluster:
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
        self._failed = True

    @property
    def failed(self) -> bool:
        """True after a startup failure, an exception in the ``with`` block or mark_failed()."""
        return self._failed

    def start(self) -> SparkCluster:
        """Start the master, then the workers; returns once every worker registered with the
        master. Raises ClusterStartError (logs kept) otherwise."""
        if self._started:
            return self
        begin = time.monotonic()
        spark_class = self.spark_home / "bin" / "spark-class"
        if not spark_class.is_file():
            raise ClusterStartError(
                f"{self.spark_home} is not a Spark distribution: it has no bin/spark-class"
            )
        self._failed = False
        self._prepare_work_dir()
        _process.register(self)
        self._started = True
        try:
            for attempt in (1, 2):
                try:
                    self._start_once(time.monotonic() + self.startup_timeout)
                    break
                except ClusterStartError:
                    self._kill_all()
                    if attempt == 1 and self._port_clash():
                        log.info("a port was taken before Spark bound it; retrying with new ports")
                        self._failed = False
                        continue
                    raise
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begin
        log.info(
            "Spark standalone cluster of %d worker(s) up in %.1fs at %s (work dir %s)",
            self.workers,
            self.startup_seconds,
            self.master_url,
            self._work_dir,
        )
        return self

    def _prepare_work_dir(self) -> None:
        if self._work_dir_arg is not None:
            self._work_dir = self._work_dir_arg.resolve()
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir = Path(tempfile.mkdtemp(prefix="kcore-spark-")).resolve()
        conf = self._work_dir / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "daemon.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in _DAEMON_PROPERTIES.items())
        )

    def _daemon_env(self, local_dir: Path | None = None) -> dict[str, str]:
        assert self._work_dir is not None
        env = _clean_env(
            {
                "SPARK_HOME": str(self.spark_home),
                "SPARK_LOCAL_IP": HOST,
                # no spark-env.sh or log4j2.properties of the user's: Spark's defaults
                "SPARK_CONF_DIR": str(self._work_dir / "conf"),
                "SPARK_DAEMON_MEMORY": self.daemon_heap,
                "SPARK_DAEMON_JAVA_OPTS": _DAEMON_JAVA_OPTS,
            }
        )
        if local_dir is not None:  # a worker's executors keep shuffle and block files there
            env["SPARK_LOCAL_DIRS"] = str(local_dir)
        return env

    def _start_once(self, deadline: float) -> None:
        assert self._work_dir is not None
        self._master_port, self._web_port = _process.reserve_ports(2)
        props = str(self._work_dir / "conf" / "daemon.properties")
        master = SparkDaemon("master", self._work_dir / "master.log")
        self._daemons = [master]
        self._launch(
            master,
            [
                MASTER_CLASS,
                "--host",
                HOST,
                "--port",
                str(self._master_port),
                "--webui-port",
                str(self._web_port),
                "--properties-file",
                props,
            ],
            self._daemon_env(),
        )
        self._wait(deadline, "be up", lambda state: state.get("status") == "ALIVE")
        for i in range(1, self.workers + 1):
            worker = SparkDaemon(f"worker-{i}", self._work_dir / f"worker-{i}.log")
            work = self._work_dir / f"worker-{i}"
            shutil.rmtree(work, ignore_errors=True)
            (work / "local").mkdir(parents=True)
            self._daemons.append(worker)
            self._launch(
                worker,
                [
                    WORKER_CLASS,
                    "--host",
                    HOST,
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    str(self.cores_per_worker),
                    "--memory",
                    self.memory_per_worker,
                    "--work-dir",
                    str(work),
                    "--properties-file",
                    props,
                    self.master_url,
                ],
                self._daemon_env(work / "local"),
            )
        self._wait(
            deadline,
            f"have {self.workers} worker(s) registered",
            lambda state: state.get("aliveworkers") == self.workers,
        )

    def _launch(self, daemon: SparkDaemon, args: list[str], env: dict[str, str]) -> None:
        cmd = [str(self.spark_home / "bin" / "spark-class"), *args]
        with open(daemon.log_path, "ab") as out:
            daemon.process = _process.spawn(
                cmd, cwd=daemon.log_path.parent, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def _wait(self, deadline: float, what: str, done: Callable[[dict[str, Any]], bool]) -> None:
        """Poll the master's state until ``done(state)``; a daemon that exits or the deadline
        ends it with a ClusterStartError showing the log that says why."""
        last_error = ""
        while True:
            for daemon in self._daemons:
                assert daemon.process is not None
                rc = daemon.process.poll()
                if rc is not None:
                    raise self._start_error(
                        daemon, f"Spark's {daemon.name} exited with status {rc} while starting"
                    )
            try:
                if done(self.state()):
                    return
            except (OSError, ValueError) as exc:  # not listening yet, or half a page
                last_error = f" (the master's web UI answered: {exc})"
            if time.monotonic() > deadline:
                raise self._start_error(
                    self._daemons[-1],
                    f"the Spark standalone cluster did not {what} within "
                    f"{self.startup_timeout:g}s{last_error}",
                )
            time.sleep(0.2)

    def _start_error(self, daemon: SparkDaemon, what: str) -> ClusterStartError:
        self._failed = True
        logs = [daemon] if daemon.name == "master" else [daemon, self._daemons[0]]
        tails = "".join(
            f"\nLast lines of {d.log_path}:\n{_process.tail_text(d.log_path, 30)}" for d in logs
        )
        return ClusterStartError(
            f"{what}. Logs are kept in {self._work_dir}.{tails}",
            log_path=daemon.log_path,
            work_dir=self._work_dir,
        )

    def _port_clash(self) -> bool:
        return any(
            "Address already in use" in _process.tail_text(d.log_path, 200) for d in self._daemons
        )

    # -- stop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kill the workers (with their executors and those executors' Python workers) and the
        master, and clean up: the work dir is deleted, or (keep_logs) only the workers'
        directories; after a failure everything is kept."""
        if not self._started:
            return
        self._kill_all()
        self._started = False
        _process.unregister(self)
        self._cleanup()

    def _kill_all(self) -> None:
        for daemon in reversed(self._daemons):  # workers first: no relaunch of executors
            if daemon.process is not None:
                _process.kill_tree(daemon.process)

    def _atexit_kill(self) -> None:
        self._kill_all()
        if self._work_dir is not None:
            print(
                f"kcore.testing: killed Spark cluster left running at exit; logs kept in "
                f"{self._work_dir}",
                file=sys.stderr,
            )

    def _cleanup(self) -> None:
        work = self._work_dir
        if work is None or not work.exists():
            return
        if self._failed:
            print(f"kcore.testing: Spark logs kept in {work}", file=sys.stderr)
            return
        worker_dirs = [work / d.name for d in self._daemons if d.name != "master"]
        if self.keep_logs:
            for d in worker_dirs:
                shutil.rmtree(d / "local", ignore_errors=True)
        elif self._work_dir_arg is None:
            shutil.rmtree(work, ignore_errors=True)
        else:  # the caller's directory: remove only what we put there
            for d in worker_dirs:
                shutil.rmtree(d, ignore_errors=True)
            for daemon in self._daemons:
                daemon.log_path.unlink(missing_ok=True)
            shutil.rmtree(work / "conf", ignore_errors=True)

    # -- applications ---------------------------------------------------------------------------
    def application_conf(
        self,
        *,
        executor_python: str | os.PathLike[str] | None = None,
        executor_memory: str = "512m",
    ) -> dict[str, str]:
        """The Spark settings of an application on this cluster: its master, a driver bound to
        127.0.0.1, one executor of one core on each worker and the Python the executors run
        (``spark.pyspark.python``, default this interpreter)."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.executor.memory": executor_memory,
            "spark.pyspark.python": os.fspath(executor_python or sys.executable),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }

    def session(
        self,
        app_name: str = "kcore-test",
        *,
        executor_python: str | os.PathLike[str] | None = None,
        executor_memory: str = "512m",
        conf: Mapping[str, str] | None = None,
    ) -> Any:
        """A SparkSession in this process whose executors are this cluster's, running
        ``executor_python`` (default: this interpreter; the same minor version as this one).
        The caller stops it. A process has one SparkContext: one already running (of another
        master) is an error, not reused."""
        from pyspark.sql import SparkSession

        python = os.fspath(executor_python or sys.executable)
        self._check_python(python, sys.executable)
        settings = self.application_conf(executor_python=python, executor_memory=executor_memory)
        settings.update(conf or {})
        builder = SparkSession.builder.appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        # PySpark takes the executors' Python from PYSPARK_PYTHON when the context starts
        # (spark-submit sets it from spark.pyspark.python; here nobody else does); the driver's
        # JVM, if this starts it, binds where SPARK_LOCAL_IP says.
        overrides = {
            "PYSPARK_PYTHON": python,
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", HOST),
        }
        previous = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            spark = builder.getOrCreate()
        finally:
            for name, old in previous.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
        sc = spark.sparkContext
        if sc.master != self.master_url or sc.pythonExec != python:
            raise ClusterControlError(
                f"this process already runs a SparkContext (master {sc.master}, Python "
                f"{sc.pythonExec}); stop it before asking for one on {self.master_url}"
            )
        return spark

    def submit_command(
        self,
        app: str | os.PathLike[str],
        *app_args: str,
        executor_python: str | os.PathLike[str] | None = None,
        driver_python: str | os.PathLike[str] | None = None,
        py_files: Sequence[str | os.PathLike[str]] = (),
        conf: Mapping[str, str] | None = None,
        driver_memory: str = "512m",
        executor_memory: str = "512m",
    ) -> list[str]:
        """``spark-submit`` of the Python application ``app`` on this cluster (client mode:
        the driver runs where the command does): its executors run ``executor_python``, its
        driver ``driver_python`` (both default to this interpreter), ``py_files`` go to
        ``--py-files``. Run it with :meth:`submit_env` (or use :meth:`submit`)."""
        executor = os.fspath(executor_python or sys.executable)
        driver = os.fspath(driver_python or executor)
        settings = self.application_conf(executor_python=executor, executor_memory=executor_memory)
        del settings["spark.master"]
        settings["spark.pyspark.driver.python"] = driver
        settings["spark.driver.extraJavaOptions"] = _SUBMIT_DRIVER_JAVA_OPTS
        settings.update(conf or {})
        cmd = [
            str(self.spark_home / "bin" / "spark-submit"),
            "--master",
            self.master_url,
            "--driver-memory",
            driver_memory,
        ]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        if py_files:
            cmd += ["--py-files", ",".join(os.fspath(p) for p in py_files)]
        return [*cmd, os.fspath(app), *app_args]

    def submit_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for :meth:`submit_command`: this process's, minus what decides what
        a Python imports (``PYTHON*``, ``PYSPARK*``), plus SPARK_HOME, SPARK_LOCAL_IP and
        ``extra``."""
        return _clean_env(
            {"SPARK_HOME": str(self.spark_home), "SPARK_LOCAL_IP": HOST, **(extra or {})}
        )

    def submit(
        self,
        app: str | os.PathLike[str],
        *app_args: str,
        executor_python: str | os.PathLike[str] | None = None,
        driver_python: str | os.PathLike[str] | None = None,
        py_files: Sequence[str | os.PathLike[str]] = (),
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run :meth:`submit_command` to its end; the CompletedProcess (text output). Checks
        first that the driver's and executors' Pythons are of the same minor version."""
        executor = os.fspath(executor_python or sys.executable)
        driver = os.fspath(driver_python or executor)
        self._check_python(executor, driver)
        cmd = self.submit_command(
            app,
            *app_args,
            executor_python=executor,
            driver_python=driver,
            py_files=py_files,
            conf=conf,
        )
        proc = _process.popen(
            cmd,
            env=self.submit_env(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:
            # the application's driver is a child of spark-submit's JVM: kill them all
            _process.kill_tree(proc)
            proc.communicate()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise ClusterError(
                    f"spark-submit {os.fspath(app)} did not finish within {timeout:g}s"
                ) from None
            raise
        return subprocess.CompletedProcess(
            cmd, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    @staticmethod
    def _check_python(executor_python: str, driver_python: str) -> None:
        mine = _python_version(driver_python)
        theirs = _python_version(executor_python)
        if mine != theirs:
            raise ClusterError(
                f"the executors' Python {executor_python} is {theirs}, the driver's "
                f"({driver_python}) is {mine}: PySpark needs the same minor version on both"
            )
