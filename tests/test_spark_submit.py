"""kcore reaches Spark executors that do not have it installed: as the Spark bundle on
``spark-submit --py-files``, and shipped by ``kcore.spark.register`` itself. Executors here are
the Python workers of a ``local[2]`` master running a virtual environment without kcore or
cramjam (pyspark, pyarrow and numpy linked in from this interpreter's site-packages, so that
nothing is downloaded). Also: the bundle's extraction under concurrent workers, and its refusal
to load on an interpreter it was not built for."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pyspark
import pytest
from conftest import OTHER_PYTHON, PROBE, check_executor_probe, clean_env, cpython

import kcore
from kcore import _bundle_loader
from kcore.spark import bundle as bundle_builder

pytestmark = pytest.mark.slow

SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"

PY_FILES_APP = (
    PROBE
    + """
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
from kcore.spark import shipping

# What register() does first: the driver's kcore is the --py-files bundle, already shipped.
assert shipping._workers_import_this_kcore(spark.sparkContext)  # workers: this very python
files = spark.sparkContext.listFiles
shipping.ensure_on_executors(spark)
assert spark.sparkContext.listFiles == files, (files, spark.sparkContext.listFiles)
assert shipping.local_bundle().name in files[0], (shipping.local_bundle(), files)
run_probes(spark, data_source=False)
spark.stop()
"""
)

# For a driver on this interpreter: it runs the kcore these tests import (the source tree, say),
# not whichever one its site-packages holds. Only the driver: workers do not run the script.
DRIVER_KCORE = f"import sys\nsys.path.insert(0, {str(Path(kcore.__file__).parent.parent)!r})\n"

REGISTER_APP = (
    DRIVER_KCORE
    + PROBE
    + """
from pyspark.sql import SparkSession

import kcore.spark

from kcore.errors import ConfigError
from kcore.spark import shipping

spark = SparkSession.builder.getOrCreate()
assert not shipping._workers_import_this_kcore(spark.sparkContext)  # they lack kcore
spark.conf.set(shipping.SHIP_CONF, "sometimes")
try:
    kcore.spark.register(spark)
except ConfigError as e:
    assert shipping.SHIP_CONF in str(e), e
else:
    raise AssertionError("a bad shipToExecutors value was accepted")
spark.conf.set(shipping.SHIP_CONF, "false")
kcore.spark.register(spark)
assert not spark.sparkContext.listFiles, spark.sparkContext.listFiles
spark.conf.set(shipping.SHIP_CONF, "auto")
kcore.spark.register(spark)
kcore.spark.register(spark)  # twice is harmless
print("FILES " + json.dumps(spark.sparkContext.listFiles))
run_probes(spark)
spark.stop()
"""
)

PREBUILT_APP = (
    DRIVER_KCORE
    + PROBE
    + """
from pyspark.sql import SparkSession

import kcore.spark

from kcore.errors import ConfigError
from kcore.spark import shipping

spark = SparkSession.builder.getOrCreate()
prebuilt = spark.conf.get(shipping.BUNDLE_CONF)  # spark-submit --conf spark.kcore.bundle=...
spark.conf.set(shipping.BUNDLE_CONF, prebuilt + ".gone")
try:
    kcore.spark.register(spark)
except ConfigError as e:
    assert shipping.BUNDLE_CONF in str(e) and "no such file" in str(e), e
else:
    raise AssertionError("a missing bundle was accepted")
assert not spark.sparkContext.listFiles, spark.sparkContext.listFiles
spark.conf.set(shipping.BUNDLE_CONF, prebuilt)
kcore.spark.register(spark)
print("FILES " + json.dumps(spark.sparkContext.listFiles))
run_probes(spark)
spark.stop()
"""
)


def _spark_submit(app: str, tmp_path: Path, env: dict[str, str], *args: str) -> dict:
    script = tmp_path / "app.py"
    script.write_text(app)
    cmd = [
        str(SPARK_SUBMIT),
        "--master",
        "local[2]",
        "--driver-memory",
        "512m",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        # C1 only and a small heap's GC: a JVM that lives seconds starts faster
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        *args,
        str(script),
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-6000:]
    lines = res.stdout.splitlines()
    out = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if key in ("PROBES", "FILES"):
            out[key] = json.loads(value)
    assert "PROBES" in out, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_py_files_bundle_runs_compiled_codec_on_executors(spark_bundle, bare_python, tmp_path):
    cache = tmp_path / "cache"
    env = clean_env(
        PYSPARK_PYTHON=str(bare_python),
        PYSPARK_DRIVER_PYTHON=str(bare_python),
        KCORE_BUNDLE_CACHE=str(cache),
    )
    out = _spark_submit(PY_FILES_APP, tmp_path, env, "--py-files", str(spark_bundle))
    probes = out["PROBES"]
    assert len(probes["rdd"]) == 2
    for raw in probes["rdd"] + [probes["driver"]]:
        check_executor_probe(raw, cache, spark_bundle.name, bare_python)


def test_register_ships_the_drivers_kcore_to_executors_without_it(bare_python, tmp_path):
    # The real case: kcore pip-installed where the driver runs, not where executors do.
    cache = tmp_path / "cache"
    env = clean_env(
        PYSPARK_PYTHON=str(bare_python),
        PYSPARK_DRIVER_PYTHON=sys.executable,
        KCORE_BUNDLE_CACHE=str(cache),
    )
    out = _spark_submit(REGISTER_APP, tmp_path, env)
    [shipped] = [f for f in out["FILES"] if f.endswith(".zip")]  # once, though registered twice
    name = shipped.rsplit("/", 1)[-1]
    [built] = list((cache / "bundles").glob(f"*/{name}"))  # built from the installed kcore
    probes = out["PROBES"]
    assert len(probes["rdd"]) == 2 and len(probes["source"]) == 1
    for raw in probes["rdd"] + probes["source"]:
        check_executor_probe(raw, cache, built.name, bare_python)
    driver = json.loads(probes["driver"])
    assert driver["python"] == sys.executable
    assert ".zip" not in driver["kcore"]  # the driver keeps its installed kcore


def test_register_ships_a_prebuilt_bundle_for_several_interpreters(
    multi_bundle, bare_python, tmp_path
):
    # spark.kcore.bundle names the bundle to ship (here the one of conftest's kcore wheels, for
    # this interpreter and another) instead of one built from the installed kcore.
    cache = tmp_path / "cache"
    env = clean_env(
        PYSPARK_PYTHON=str(bare_python),
        PYSPARK_DRIVER_PYTHON=sys.executable,
        KCORE_BUNDLE_CACHE=str(cache),
    )
    out = _spark_submit(PREBUILT_APP, tmp_path, env, "--conf", f"spark.kcore.bundle={multi_bundle}")
    [shipped] = [f for f in out["FILES"] if f.endswith(".zip")]
    assert shipped.rsplit("/", 1)[-1] == multi_bundle.name
    assert not (cache / "bundles").exists()  # none built from the installed kcore
    probes = out["PROBES"]
    assert len(probes["rdd"]) == 2 and len(probes["source"]) == 1
    for raw in probes["rdd"] + probes["source"]:
        check_executor_probe(raw, cache, multi_bundle.name, bare_python)


def _import_from_bundle(bundle: Path, cache: Path, code: str, python: str = sys.executable):
    # -S: no site-packages, so neither the installed kcore nor cramjam is visible.
    env = clean_env(PYTHONPATH=str(bundle), KCORE_BUNDLE_CACHE=str(cache))
    return subprocess.Popen(
        [python, "-S", "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_workers_extract_once(spark_bundle, tmp_path):
    cache = tmp_path / "cache"
    start = time.time() + 1.5  # all import at once, after their interpreters are up
    code = (
        f"import time; time.sleep(max(0, {start} - time.time()))\n"
        "import kcore.codec as pub, kcore._codec as c\n"
        "assert pub.decompress('zstd', pub.compress('zstd', b'x' * 999)) == b'x' * 999\n"
        "print(c.__file__)"
    )
    procs = [_import_from_bundle(spark_bundle, cache, code) for _ in range(6)]
    results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert all(rc == 0 for rc, _, _ in results), results
    assert len({out for _, out, _ in results}) == 1  # all loaded the same file
    entries = sorted(p.name for p in cache.iterdir())
    # One directory per compiled module, no temporary leftovers from the losers of the race.
    assert [e.split("-")[0] for e in entries] == ["cramjam", "kcore._codec"], entries
    [so] = list(cache.glob("kcore._codec-*/*"))
    tag = _bundle_loader.interpreter_tag()
    with zipfile.ZipFile(spark_bundle) as zf:
        assert so.read_bytes() == zf.read(f"kcore/_bundled/{tag}/kcore/{so.name}")


def _retagged(bundle: Path, out: Path, tag: str) -> Path:
    """``bundle`` as if built for CPython ``tag`` (e.g. "399"): its compiled files renamed."""
    current = sys.implementation.cache_tag.split("-")[1]

    def rename(name: str) -> str:
        name = name.replace(f"/_bundled/cp{current}/", f"/_bundled/cp{tag}/")
        return name.replace(f".cpython-{current}-", f".cpython-{tag}-")

    target = out / bundle.name.replace(f"-cp{current}-", f"-cp{tag}-")
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(target, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == bundle_builder.MANIFEST:
                manifest = json.loads(data)
                [interpreter] = manifest["interpreters"]
                interpreter["tag"] = interpreter["python_tag"] = f"cp{tag}"
                for native in interpreter["natives"]:
                    native["root"] = rename(native["root"])
                    native["files"] = [rename(n) for n in native["files"]]
                    native["main"] = rename(native["main"])
                data = json.dumps(manifest).encode()
            dst.writestr(rename(name), data)
    return target


def test_bundle_refuses_a_mismatching_interpreter(spark_bundle, tmp_path):
    other = _retagged(spark_bundle, tmp_path, "399")
    proc = _import_from_bundle(other, tmp_path / "cache", "import kcore")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    python_tag, platform_tag = _bundle_loader.current_tags()
    assert f"is a kcore Spark bundle for cp399 on {platform_tag}" in err, err
    assert f"this interpreter ({sys.executable}) is {python_tag}" in err, err
    assert not (tmp_path / "cache").exists()  # refused before extracting anything


def test_bundle_refuses_another_python_version(spark_bundle, tmp_path):
    # A real other CPython: the bundle of the installed kcore holds this interpreter's only.
    other = str(cpython(OTHER_PYTHON))
    proc = _import_from_bundle(spark_bundle, tmp_path / "cache", "import kcore", python=other)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    python_tag, _ = _bundle_loader.current_tags()
    assert (
        f"ImportError: {spark_bundle.name} is a kcore Spark bundle for {python_tag} on " in err
    ), err
    assert f"({other}) is cp{OTHER_PYTHON.replace('.', '')} on " in err, err


def test_bundle_from_wheels_matches_installed(spark_bundle, tmp_path):
    # wheels/build.sh builds from the kcore and cramjam wheels; the same files make the same
    # compiled payloads as a bundle of the installed packages.
    installed = bundle_builder.from_installed()
    [interpreter] = installed.interpreters
    python_tag, platform_tag = _bundle_loader.current_tags()
    tags = f"{python_tag}-{interpreter.tag}-{platform_tag}"
    kwheel = tmp_path / f"kcore-{installed.version}-{tags}.whl"
    cwheel = tmp_path / f"cramjam-2.99.0-{tags}.whl"
    with zipfile.ZipFile(kwheel, "w") as zf:
        for name, data in [*installed.kcore_files.items(), *interpreter.compiled.values()]:
            zf.writestr(f"kcore/{name}", data)
        zf.writestr("kcore/_codec.pyx", b"# sources are left out")
    with zipfile.ZipFile(cwheel, "w") as zf:
        for name, data in interpreter.cramjam_files.items():
            zf.writestr(f"cramjam/{name}", data)
        zf.writestr("cramjam/lz4.pyi", b"")
        zf.writestr("cramjam-2.99.0.dist-info/licenses/", b"")
        zf.writestr("cramjam-2.99.0.dist-info/licenses/LICENSE", b"MIT")
    from_wheels = bundle_builder.from_wheels([kwheel], [cwheel])
    assert from_wheels.manifest()["interpreters"] == installed.manifest()["interpreters"]
    assert from_wheels.kcore_files == installed.kcore_files
    assert from_wheels.licenses == {"cramjam-2.99.0/LICENSE": b"MIT"}
    assert from_wheels.file_name == spark_bundle.name


def test_builder_and_loader_hash_files_alike():
    data = os.urandom(100)
    a, b = hashlib.sha256(), hashlib.sha256()
    bundle_builder.digest_file(a, "x.so", data)
    _bundle_loader.digest_file(b, "x.so", data)
    assert a.hexdigest() == b.hexdigest()
