"""The documented wheel build produces a wheel that installs into a fresh virtual environment
and loads the compiled modules (the codec and the producer's send path) from there (not from
the source tree)."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_builds_installs_and_imports_compiled_codec(tmp_path):
    out = tmp_path / "dist"
    subprocess.run(["bash", str(ROOT / "wheels" / "build.sh"), str(out)], check=True)
    [wheel] = list(out.glob("kcore-*.whl"))
    names = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "kcore/_codec" in names and ".so" in names
    assert "kcore/producer/_sendpath.cpython" in names
    assert "kcore/_codec.pyi" in names and "kcore/producer/_sendpath.pyi" in names
    assert "kcore/_codec.pxd" in names  # for compiled modules that cimport the codec

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # With its runtime dependencies (cramjam), as a user's `pip install` would.
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
    code = (
        "import kcore, kcore._codec as c, kcore.codec as pub, kcore.producer._sendpath as s;"
        "assert c.__file__.endswith('.so'), c.__file__;"
        "assert s.__file__.endswith('.so'), s.__file__;"
        "from kcore.producer import DeliveryFuture, RecordMetadata;"
        "assert kcore.RecordMetadata is RecordMetadata and DeliveryFuture is s.DeliveryFuture;"
        "assert pub.crc32c(b'123456789') == 0xE3069283;"
        "assert pub.decompress('zstd', pub.compress('zstd', b'x' * 100)) == b'x' * 100;"
        "print(c.__file__); print(s.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(py), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert str(env_dir) in res.stdout
