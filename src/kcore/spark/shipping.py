"""Ship the driver's kcore to Spark executors that lack it (``kcore.spark.register`` calls this).

The driver's kcore goes out as a Spark bundle (``kcore.spark.bundle``), added with ``addPyFile``
(or ``addArtifacts(pyfile=True)`` under Spark Connect), so a pipeline needs no flags.
``spark.kcore.shipToExecutors`` decides when:

* ``auto`` (default): with a local master the Python workers run here, with ``sc.pythonExec``;
  nothing is shipped if that is this interpreter or imports this very kcore, else (a kcore-less
  ``PYSPARK_PYTHON``) the bundle is. With a cluster master or Spark Connect we cannot cheaply
  know what executors have, so the bundle is always shipped. That is harmless, and right where
  another kcore version is installed: the bundle is the driver's kcore, the one that pickled the
  reader and writer objects executors run, and it comes first on workers' ``sys.path`` as every
  ``--py-files`` entry does. Its cramjam is only a fallback where none is installed.
* ``true``: always ship; ``false``: never (executors must have kcore installed).

``spark.kcore.bundle`` decides what: by default a bundle built from the installed kcore, which
holds the driver's interpreter only (the zip itself when the driver runs kcore from one). PySpark
insists on the same Python minor version on both sides, so that fits wherever executors share
the driver's platform; executors on another interpreter or platform fail to import kcore with an
ImportError that names the interpreters the bundle has and how to build one for theirs. The
setting names a prebuilt bundle to ship instead, for several interpreters, say (``bash
wheels/build.sh`` builds one for each CPython 3.10 to 3.13 it finds); it is checked here to be a
kcore bundle of the driver's kcore version that holds the driver's interpreter.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import zipimport
from pathlib import Path
from typing import Any

SHIP_CONF = "spark.kcore.shipToExecutors"
BUNDLE_CONF = "spark.kcore.bundle"
_MODES = ("auto", "true", "false")
_PROBE_TIMEOUT_S = 60.0

log = logging.getLogger("kcore.spark")
_shipped_to_connect: set[tuple[str, str]] = set()  # (session id, bundle name): one add each


def ensure_on_executors(spark: Any) -> None:
    """Make kcore importable on ``spark``'s executors, shipping the driver's if needed."""
    mode = str(spark.conf.get(SHIP_CONF, "auto")).strip().lower()
    if mode not in _MODES:
        from kcore.errors import ConfigError

        raise ConfigError(SHIP_CONF, f"{mode!r} is not one of {', '.join(_MODES)}")
    configured = str(spark.conf.get(BUNDLE_CONF, "") or "").strip()
    # Checked whatever the mode: a setting that names no usable bundle is a mistake either way.
    prebuilt = checked_bundle(configured) if configured else None
    if mode == "false":
        return
    if _is_connect(spark):
        _ship_to_connect(spark, prebuilt or local_bundle())
        return
    sc = spark.sparkContext
    if mode == "auto" and _workers_import_this_kcore(sc):
        return
    bundle = prebuilt or local_bundle()
    # addPyFile again under the same name would fail (spark-submit --py-files may have added it)
    if any(f.rsplit("/", 1)[-1] == bundle.name for f in sc.listFiles):
        return
    log.info("shipping %s to executors", bundle)
    sc.addPyFile(str(bundle))


def checked_bundle(path: str) -> Path:
    """``path`` (``spark.kcore.bundle``'s value) if it is a kcore Spark bundle that executors on
    the driver's interpreter can load, of the driver's kcore version; else a ConfigError naming
    what is wrong."""
    import kcore
    from kcore._bundle_loader import read_manifest, select_interpreter
    from kcore.errors import ConfigError

    bundle = Path(path).expanduser()
    if not bundle.is_file():
        raise ConfigError(
            BUNDLE_CONF,
            f"{path}: no such file (a kcore Spark bundle on the driver's machine, as `bash "
            f"wheels/build.sh` or `python -m kcore.spark.bundle` writes)",
        )
    if bundle.suffix != ".zip":  # Spark puts only .py, .zip and .egg files on sys.path
        raise ConfigError(BUNDLE_CONF, f"{path}: not a .zip (a kcore Spark bundle is one)")
    try:
        archive = zipimport.zipimporter(str(bundle))
    except zipimport.ZipImportError:
        raise ConfigError(BUNDLE_CONF, f"{path}: not a zip file") from None
    try:
        manifest = read_manifest(archive)
        select_interpreter(manifest, str(bundle))
    except ImportError as e:
        raise ConfigError(BUNDLE_CONF, str(e)) from None
    if manifest.get("kcore_version") != kcore.__version__:
        # Executors would run other code than the driver's, which pickled the objects they run.
        raise ConfigError(
            BUNDLE_CONF,
            f"{path} holds kcore {manifest.get('kcore_version')}, but the driver runs kcore "
            f"{kcore.__version__}: ship a bundle of the driver's version",
        )
    return bundle.resolve()


def local_bundle() -> Path:
    """The bundle of this process's kcore: the zip it runs from, or one built from the installed
    package into the per-user cache (once per content: later calls only hash the files)."""
    import kcore
    from kcore._bundle_loader import cache_dir

    from .bundle import from_installed

    loader = kcore.__spec__.loader if kcore.__spec__ else None
    if isinstance(loader, zipimport.zipimporter):
        return Path(loader.archive)
    contents = from_installed()
    target = Path(cache_dir(), "bundles", contents.digest()[:16], contents.file_name)
    if not target.exists():
        contents.write(target.parent)
    return target


def _is_connect(spark: Any) -> bool:
    # Spark Connect sessions have no SparkContext; importing their class needs grpc, so look at
    # the module name instead.
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _ship_to_connect(spark: Any, bundle: Path) -> None:
    key = (str(spark.session_id), bundle.name)
    if key in _shipped_to_connect:
        return
    log.info("adding %s to Spark Connect session %s", bundle, key[0])
    spark.addArtifacts(str(bundle), pyfile=True)
    _shipped_to_connect.add(key)


def _workers_import_this_kcore(sc: Any) -> bool:
    """Whether Python workers already import the kcore this driver runs (local masters only)."""
    if not str(sc.master).startswith("local"):  # local, local[4], local-cluster[...]
        return False
    exe = str(sc.pythonExec)
    exe = shutil.which(exe) or exe
    # Not realpath: a virtual environment's python is a symlink to the base interpreter.
    if os.path.abspath(exe) == os.path.abspath(sys.executable):
        return True
    import kcore

    env = {**os.environ, **dict(sc.environment)}
    try:
        probe = subprocess.run(
            [exe, "-c", "import kcore; print(kcore.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == kcore.__file__
