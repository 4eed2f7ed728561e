"""The documented build (``bash wheels/build.sh``) on every CPython from 3.10 to 3.13 the
machine has: an sdist, a manylinux wheel per interpreter (auditwheel's policy check agreeing
with its tag), each installed with pip into a fresh virtual environment of its own interpreter,
where the codec's compatibility tests run against the installed wheel and a real-broker round
trip goes through the producer's compiled send path and the consumer. An interpreter the machine
lacks is named (the build's stderr, a warning here, and ``.ci/run``'s output), never skipped in
silence; one it has but cannot build or run for fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile

import pytest
from conftest import ROOT, KcoreDist, build_interpreters, clean_env

pytestmark = pytest.mark.slow

INTERPRETERS, MISSING = build_interpreters()
if MISSING:
    warnings.warn(
        f"no CPython {', '.join(MISSING)} on this machine: no wheel built or tested for it",
        stacklevel=1,
    )

# What the codec tests import besides kcore: the peers they compare against (oracles only).
# Besides pytest and the peers the codec tests compare against (tests/codec-peers.txt).
CODEC_TEST_DEPS = ["-r", str(ROOT / "tests" / "codec-peers.txt"), "pytest-timeout", "hypothesis"]
CODEC_TESTS = ["tests/test_codec_basics.py", "tests/test_codec_compat.py"]


def test_every_interpreter_found_has_a_wheel(kcore_dist: KcoreDist) -> None:
    assert INTERPRETERS, "wheels/build.sh found no CPython 3.10-3.13 at all"
    assert set(kcore_dist.wheels) == set(INTERPRETERS)
    for version in MISSING:
        assert f"no CPython {version} found" in kcore_dist.log
    names = sorted(p.name for p in kcore_dist.directory.iterdir())
    assert len(names) == len(INTERPRETERS) + 2, names  # the wheels, the sdist, the bundle


@pytest.mark.parametrize("version", sorted(INTERPRETERS))
def test_wheel_is_manylinux_by_auditwheels_policy(kcore_dist: KcoreDist, version: str) -> None:
    wheel = kcore_dist.wheels[version]
    tag = "cp" + version.replace(".", "")
    platforms = wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    assert wheel.name.split("-")[2:4] == [tag, tag]
    assert all(p.startswith("manylinux") for p in platforms), wheel.name
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # auditwheel wraps its lines; the policy it names must be one the file name carries.
    policy = re.search(r'consistent with the\s+following platform tag:\s+"([^"]+)"', shown)
    assert policy, shown
    assert policy.group(1) in platforms, (policy.group(1), wheel.name)

    names = zipfile.ZipFile(wheel).namelist()
    assert f"kcore/_codec.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names, names
    assert f"kcore/producer/_sendpath.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names
    assert f"kcore/protocol/_decoders.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names
    assert f"kcore/cluster/_metadata_apply.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names
    assert f"kcore/consumer/share/_acknowledge.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names
    assert f"kcore/_metrics.cpython-{tag[2:]}-x86_64-linux-gnu.so" in names
    assert {
        "kcore/_codec.pyi",
        "kcore/producer/_sendpath.pyi",
        "kcore/protocol/_decoders.pyi",
        "kcore/cluster/_metadata_apply.pyi",
        "kcore/consumer/share/_acknowledge.pyi",
        "kcore/_metrics.pyi",
        "kcore/_codec.pxd",
        "kcore/protocol/_decoders.pxd",
    } <= set(names)
    assert not [n for n in names if n.endswith((".c", ".pyx"))]


def test_sdist_carries_the_sources_not_generated_c(kcore_dist: KcoreDist) -> None:
    """Every wheel above was built from this sdist (wheels/build.sh builds them so)."""
    with tarfile.open(kcore_dist.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for source in (
        "setup.py",
        "pyproject.toml",
        "src/kcore/_codec.pyx",
        "src/kcore/_codec.pxd",
        "src/kcore/producer/_sendpath.pyx",
        "src/kcore/protocol/_decoders.pyx",
        "src/kcore/protocol/_decode_runtime.pxi",
        "src/kcore/protocol/_decoders.pxd",
        "src/kcore/cluster/_metadata_apply.pyx",
        "src/kcore/consumer/share/_acknowledge.pyx",
        "src/kcore/_metrics.pyx",
        "src/kcore/_native/crc32c.h",
    ):
        assert source in names
    assert not [n for n in names if n.endswith((".c", ".so"))]


def test_sdist_without_a_c_compiler_says_one_is_needed(kcore_dist: KcoreDist, tmp_path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), kcore_dist.sdist],
        capture_output=True,
        text=True,
        env=clean_env(CC="/nonexistent/cc", PATH=os.environ["PATH"]),
    )
    assert build.returncode != 0
    assert "needs a working C" in build.stdout + build.stderr, build.stdout + build.stderr
    assert not list(tmp_path.glob("*.whl"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", sorted(INTERPRETERS))
def test_wheel_in_a_fresh_venv_of_its_interpreter(
    kcore_dist: KcoreDist, kafka_cluster, tmp_path, version: str
) -> None:
    """pip installs the wheel (and cramjam from the index, as a user's install would) into a
    new virtual environment of that interpreter; there the codec's compatibility tests and a
    real-broker round trip run against the installed wheel, not this source tree."""
    env_dir = tmp_path / "venv"
    subprocess.run([str(INTERPRETERS[version]), "-m", "venv", str(env_dir)], check=True)
    py = str(env_dir / "bin" / "python")
    env = clean_env()
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(kcore_dist.wheels[version]), *CODEC_TEST_DEPS], check=True, env=env)

    where = subprocess.run(
        [
            py,
            "-c",
            "import sys, kcore, kcore._codec as c, kcore.producer._sendpath as s;"
            "import kcore.protocol._decoders as d, kcore.cluster._metadata_apply as m;"
            "print(sys.version_info[:2], c.__file__, s.__file__, d.__file__, m.__file__)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout
    assert f"({version.replace('.', ', ')})" in where
    assert where.count(str(env_dir)) == 4 and where.count(".so") == 4, where

    # From this tree's root, for its pytest settings: `python -m pytest` puts the root on
    # sys.path, not src/, so the tests import the installed kcore (checked above for python -c).
    tests = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CODEC_TESTS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert tests.returncode == 0, tests.stdout[-5000:] + tests.stderr[-2000:]
    assert re.search(r"\d+ passed", tests.stdout), tests.stdout[-2000:]

    roundtrip = subprocess.run(
        [
            py,
            str(ROOT / "examples" / "roundtrip.py"),
            "--records",
            "20000",
            "--compression",
            "zstd",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(KCORE_BOOTSTRAP=kafka_cluster.bootstrap_servers),
        timeout=300,
    )
    assert roundtrip.returncode == 0, roundtrip.stdout + roundtrip.stderr
    assert "consumed 20,000 records" in roundtrip.stdout, roundtrip.stdout
