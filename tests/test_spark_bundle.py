"""One Spark bundle for several interpreters: built from a kcore wheel and a cramjam wheel per
interpreter, it loads each interpreter's own compiled modules and cramjam, and an interpreter it
lacks gets an ImportError saying how to build one that has it. Real kcore wheels for two
CPythons (conftest's ``kcore_wheels``), real cramjam wheels, real interpreters; and the
builder's pairing of wheels, the loader's format check and ``spark.kcore.bundle``'s check on
small wheels and bundles made here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
import zipimport
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest
from conftest import ABSENT_PYTHON, OTHER_PYTHON, THIS_PYTHON, cpython

import kcore
from kcore import _bundle_loader
from kcore.errors import ConfigError
from kcore.spark import bundle as bundle_builder
from kcore.spark import shipping
from kcore.spark.bundle import BundleError

# What an interpreter reports after importing kcore from the bundle alone.
LOAD_PROBE = textwrap.dedent(
    """
    import json, sys

    import kcore
    import kcore._codec as codec
    import kcore.codec as pub
    import kcore.producer._sendpath as sendpath
    import kcore.protocol._decoders as decoders
    import kcore.cluster._metadata_apply as metadata_apply
    import kcore.consumer.share._acknowledge as share_acknowledge
    import kcore._metrics as metrics
    import cramjam

    data = b"kcore " * 1000
    print(json.dumps({
        "cache_tag": sys.implementation.cache_tag,
        "kcore": kcore.__file__,
        "codec": codec.__file__,
        "sendpath": sendpath.__file__,
        "decoders": decoders.__file__,
        "metadata_apply": metadata_apply.__file__,
        "share_acknowledge": share_acknowledge.__file__,
        "metrics": metrics.__file__,
        "cramjam": cramjam.__file__,
        "zstd": pub.decompress("zstd", pub.compress("zstd", data)) == data,
        "lz4": pub.decompress("lz4", pub.compress("lz4", data)) == data,
        "crc32c": pub.crc32c(b"123456789"),
    }))
    """
)


def _tag(version: str) -> str:
    return "cp" + version.replace(".", "")


def _from_bundle(python: Path, bundle: Path, cache: Path, code: str) -> subprocess.Popen:
    # -S: no site-packages, so an installed kcore or cramjam is not visible; the bundle is all.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    env |= {"PYTHONPATH": str(bundle), "KCORE_BUNDLE_CACHE": str(cache)}
    return subprocess.Popen(
        [str(python), "-S", "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_one_bundle_loads_each_interpreters_own_compiled_modules(multi_bundle, tmp_path):
    tags = sorted([_tag(THIS_PYTHON), _tag(OTHER_PYTHON)], key=lambda t: int(t[3:]))
    platform = _bundle_loader.current_tags()[1]
    assert multi_bundle.name == f"kcore-{kcore.__version__}-spark-{'.'.join(tags)}-{platform}.zip"
    with zipfile.ZipFile(multi_bundle) as zf:
        manifest = json.loads(zf.read(bundle_builder.MANIFEST))
        entries = {name: zf.read(name) for name in zf.namelist()}
    assert manifest["format"] == 2 and manifest["kcore_version"] == kcore.__version__
    assert [i["tag"] for i in manifest["interpreters"]] == tags
    # kcore's Python files once, each interpreter's compiled modules apart.
    assert [n for n in entries if n.endswith("codec.py")] == ["kcore/codec.py"]

    cache = tmp_path / "cache"
    runs = {
        _tag(v): _from_bundle(cpython(v), multi_bundle, cache, LOAD_PROBE)
        for v in (THIS_PYTHON, OTHER_PYTHON)
    }
    for tag, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        probe = json.loads(out)
        assert probe["cache_tag"] == f"cpython-{tag[2:]}"
        assert probe["kcore"] == f"{multi_bundle}/kcore/__init__.py"  # from the zip
        for key, module in (
            ("codec", "kcore._codec"),
            ("sendpath", "kcore.producer._sendpath"),
            ("decoders", "kcore.protocol._decoders"),
            ("metadata_apply", "kcore.cluster._metadata_apply"),
            ("share_acknowledge", "kcore.consumer.share._acknowledge"),
            ("metrics", "kcore._metrics"),
        ):
            path = Path(probe[key])
            # This interpreter's build, extracted as the bundle holds it.
            assert f".cpython-{tag[2:]}-" in path.name, path
            assert path.parent.parent == cache and path.parent.name.startswith(module + "-")
            [stored] = [
                n
                for n in entries
                if n.startswith(f"kcore/_bundled/{tag}/") and n.endswith("/" + path.name)
            ]
            assert path.read_bytes() == entries[stored]
        cramjam_dir = Path(probe["cramjam"]).parent
        assert cramjam_dir.parent == cache and cramjam_dir.name.startswith("cramjam-")
        assert any(f".cpython-{tag[2:]}-" in p.name for p in cramjam_dir.iterdir())
        assert probe["zstd"] and probe["lz4"]
        assert probe["crc32c"] == 0xE3069283


@pytest.mark.slow
def test_bundle_refuses_an_interpreter_it_lacks(multi_bundle, tmp_path):
    python = cpython(ABSENT_PYTHON)
    run = _from_bundle(python, multi_bundle, tmp_path / "cache", "import kcore")
    _, err = run.communicate(timeout=60)
    assert run.returncode != 0
    has = ", ".join(sorted([_tag(THIS_PYTHON), _tag(OTHER_PYTHON)], key=lambda t: int(t[3:])))
    absent = _tag(ABSENT_PYTHON)
    platform = _bundle_loader.current_tags()[1]
    assert (
        f"ImportError: {multi_bundle.name} is a kcore Spark bundle for {has} on {platform}, but "
        f"this interpreter ({python}) is {absent} on {platform}: none of the bundle's compiled "
        f"modules load here. Build a bundle that includes {absent} where Python {ABSENT_PYTHON} "
        f"is installed: `bash wheels/build.sh` in kcore's source tree"
    ) in err, err
    assert "`python -m kcore.spark.bundle` run by this interpreter" in err
    assert not (tmp_path / "cache").exists()  # refused before extracting anything


@pytest.mark.slow
def test_prebuilt_bundle_setting_is_checked(multi_bundle, tmp_path):
    assert shipping.checked_bundle(str(multi_bundle)) == multi_bundle.resolve()


# Small wheels made here: the builder only reads names and bytes, so the pairing rules are
# checked without building anything.


def _suffix(tag: str) -> str:
    return f".cpython-{tag[2:]}-x86_64-linux-gnu.so"


def _wheel(directory: Path, name: str, files: dict[str, bytes]) -> Path:
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        for file, data in files.items():
            zf.writestr(file, data)
        zf.writestr(f"{name.split('-')[0]}-{name.split('-')[1]}.dist-info/LICENSE", b"MIT")
    return path


def _kcore_wheel(
    directory: Path,
    tag: str,
    *,
    version: str = "0.1.0",
    plat: str = "manylinux_2_17_x86_64.manylinux2014_x86_64",
    suffix: str | None = None,
    codec_py: bytes = b"# codec",
) -> Path:
    python_tag = tag.rstrip("td")
    suffix = suffix or _suffix(tag)
    files = {
        "kcore/__init__.py": b"# kcore",
        "kcore/codec.py": codec_py,
        "kcore/_codec.pyx": b"# sources are left out",
        f"kcore/_codec{suffix}": f"codec {tag}".encode(),
        "kcore/producer/__init__.py": b"",
        f"kcore/producer/_sendpath{suffix}": f"sendpath {tag}".encode(),
        "kcore/protocol/__init__.py": b"",
        f"kcore/protocol/_decoders{suffix}": f"decoders {tag}".encode(),
        "kcore/cluster/__init__.py": b"",
        f"kcore/cluster/_metadata_apply{suffix}": f"metadata_apply {tag}".encode(),
        "kcore/consumer/__init__.py": b"",
        "kcore/consumer/share/__init__.py": b"",
        f"kcore/consumer/share/_acknowledge{suffix}": f"share_acknowledge {tag}".encode(),
        f"kcore/_metrics{suffix}": f"metrics {tag}".encode(),
    }
    return _wheel(directory, f"kcore-{version}-{python_tag}-{tag}-{plat}.whl", files)


def _cramjam_wheel(
    directory: Path, python_tag: str, abi: str, plat: str = "manylinux_2_28_x86_64"
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".abi3.so" if abi == "abi3" else _suffix(abi)
    files = {"cramjam/__init__.py": b"", f"cramjam/cramjam{suffix}": f"cramjam {abi}".encode()}
    return _wheel(directory, f"cramjam-2.14.0-{python_tag}-{abi}-{plat}.whl", files)


def test_wheels_for_several_interpreters_make_one_bundle(tmp_path, capsys):
    kcores = [_kcore_wheel(tmp_path, t) for t in ("cp313", "cp310", "cp312", "cp311")]
    cramjams = [_cramjam_wheel(tmp_path, t, t) for t in ("cp310", "cp311", "cp312", "cp313")]
    args = ["-o", str(tmp_path / "out")]
    for k, c in zip(kcores, cramjams, strict=True):
        args += ["--kcore-wheel", str(k), "--cramjam-wheel", str(c)]
    assert bundle_builder.main(args) == 0
    path = Path(capsys.readouterr().out.strip())
    # The OS and CPU the manylinux builds share; interpreters oldest first.
    assert path.name == "kcore-0.1.0-spark-cp310.cp311.cp312.cp313-linux_x86_64.zip"
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read(bundle_builder.MANIFEST))
        names = zf.namelist()
        for entry in manifest["interpreters"]:
            tag = entry["tag"]
            assert entry["platform_tag"] == "manylinux_2_17_x86_64.manylinux2014_x86_64"
            *kcore_natives, cramjam = entry["natives"]
            codec, sendpath, decoders, metadata_apply, share_ack, metrics = kcore_natives
            for native, content in (
                (codec, "codec"),
                (sendpath, "sendpath"),
                (decoders, "decoders"),
                (metadata_apply, "metadata_apply"),
                (share_ack, "share_acknowledge"),
                (metrics, "metrics"),
            ):
                assert zf.read(f"{native['root']}/{native['main']}") == f"{content} {tag}".encode()
            assert zf.read(f"{cramjam['root']}/cramjam{_suffix(tag)}") == f"cramjam {tag}".encode()
    assert manifest["format"] == 2 and manifest["platform"] == "linux_x86_64"
    assert [e["tag"] for e in manifest["interpreters"]] == ["cp310", "cp311", "cp312", "cp313"]
    assert names.count("kcore/codec.py") == 1 and "kcore/_codec.pyx" not in names
    assert "kcore/_bundled/licenses/cramjam-2.14.0/LICENSE" in names


def test_an_abi3_cramjam_serves_every_interpreter_from_its_version(tmp_path):
    kcores = [_kcore_wheel(tmp_path, t) for t in ("cp311", "cp312")]
    abi3 = _cramjam_wheel(tmp_path, "cp39", "abi3")
    # The same wheel downloaded once per interpreter: one wheel.
    again = _cramjam_wheel(tmp_path / "again", "cp39", "abi3")
    contents = bundle_builder.from_wheels(kcores, [abi3, again])
    roots = {e.cramjam_root for e in contents.interpreters}
    assert len(roots) == 1  # one copy, shared
    names = [name for name, _ in contents.entries()]
    assert names.count(f"{roots.pop()}/cramjam.abi3.so") == 1

    newer = _cramjam_wheel(tmp_path / "newer", "cp312", "abi3")
    with pytest.raises(BundleError, match=r"no cramjam wheel fits kcore-0\.1\.0-cp311-cp311-"):
        bundle_builder.from_wheels(kcores, [newer])
    # Neither does the stable ABI load in a free-threaded build.
    free = _kcore_wheel(tmp_path, "cp313t")
    with pytest.raises(BundleError, match=r"no cramjam wheel fits kcore-0\.1\.0-cp313-cp313t-"):
        bundle_builder.from_wheels([free], [abi3])


def test_wheel_pairing_errors(tmp_path):
    k311, k312 = (_kcore_wheel(tmp_path, t) for t in ("cp311", "cp312"))
    c311, c312 = (_cramjam_wheel(tmp_path, t, t) for t in ("cp311", "cp312"))

    with pytest.raises(
        BundleError,
        match=r"no cramjam wheel fits kcore-0\.1\.0-cp312-cp312-manylinux_2_17_x86_64\."
        r"manylinux2014_x86_64\.whl \(cp312 on linux_x86_64\) among cramjam-2\.14\.0-cp311-.*"
        r"--python-version 3\.12 cramjam",
    ):
        bundle_builder.from_wheels([k311, k312], [c311])
    abi3 = _cramjam_wheel(tmp_path, "cp38", "abi3")
    with pytest.raises(BundleError, match=r"2 cramjam wheels fit kcore-0\.1\.0-cp312-.*\(cp312\)"):
        bundle_builder.from_wheels([k312], [c312, abi3])
    with pytest.raises(BundleError, match=r"cramjam wheel cramjam-2\.14\.0-cp312-cp312-.* fits "):
        bundle_builder.from_wheels([k311], [c311, c312])
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    twin = _kcore_wheel(tmp_path, "cp311", plat="manylinux_2_28_x86_64")
    with pytest.raises(BundleError, match="two kcore wheels for cp311"):
        bundle_builder.from_wheels([k311, twin], [c311])
    arm = _cramjam_wheel(tmp_path, "cp311", "cp311", "manylinux_2_28_aarch64")
    with pytest.raises(BundleError, match="no cramjam wheel fits"):
        bundle_builder.from_wheels([k311], [arm])
    changed = _kcore_wheel(other_dir, "cp312", codec_py=b"# another codec.py")
    with pytest.raises(
        BundleError, match=r"Python files differ \(codec\.py in kcore-0\.1\.0-cp312-.*same source"
    ):
        bundle_builder.from_wheels([k311, changed], [c311, c312])
    older = _kcore_wheel(other_dir, "cp312", version="0.0.9")
    with pytest.raises(BundleError, match="kcore wheels of different versions"):
        bundle_builder.from_wheels([k311, older], [c311, c312])
    mac = _kcore_wheel(
        other_dir, "cp312", plat="macosx_11_0_arm64", suffix=".cpython-312-darwin.so"
    )
    with pytest.raises(BundleError, match=r"different platforms \(linux_x86_64, macosx_arm64\)"):
        bundle_builder.from_wheels([k311, mac], [c311, c312])
    with pytest.raises(BundleError, match="a pure-Python wheel"):
        bundle_builder.from_wheels([tmp_path / "kcore-0.1.0-py3-none-any.whl"], [c311])
    with pytest.raises(SystemExit):  # argparse: the two go together
        bundle_builder.main(["--kcore-wheel", str(k311)])


def test_platform_name():
    assert bundle_builder.platform_name("manylinux_2_17_x86_64.manylinux2014_x86_64") == (
        "linux_x86_64"
    )
    assert bundle_builder.platform_name("manylinux_2_28_aarch64") == "linux_aarch64"
    assert bundle_builder.platform_name("linux_x86_64") == "linux_x86_64"
    assert bundle_builder.platform_name("musllinux_1_2_x86_64") == "musllinux_1_2_x86_64"
    assert bundle_builder.platform_name("macosx_10_9_x86_64") == "macosx_x86_64"


def _this_interpreters_bundle(directory: Path, version: str) -> Path:
    """A bundle of small made-up files for this interpreter (never loaded: only checked)."""
    tag = _bundle_loader.interpreter_tag()
    python_tag, platform_tag = _bundle_loader.current_tags()
    directory.mkdir(parents=True, exist_ok=True)
    kcore_wheel = _kcore_wheel(
        directory, tag, version=version, plat=platform_tag, suffix=EXTENSION_SUFFIXES[0]
    )
    cramjam_wheel = _cramjam_wheel(directory, python_tag, tag, platform_tag)
    return bundle_builder.from_wheels([kcore_wheel], [cramjam_wheel]).write(directory)


def test_loader_refuses_a_format_it_does_not_know(tmp_path):
    bundle = _this_interpreters_bundle(tmp_path, kcore.__version__)
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(old, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == bundle_builder.MANIFEST:
                data = json.dumps({**json.loads(data), "format": 1}).encode()
            dst.writestr(name, data)
    with pytest.raises(
        ImportError, match=r"old\.zip: kcore Spark bundle format 1, but this loader reads format 2"
    ):
        _bundle_loader.read_manifest(zipimport.zipimporter(str(old)))


def test_prebuilt_bundle_setting_names_what_is_wrong(tmp_path):
    conf = shipping.BUNDLE_CONF
    good = _this_interpreters_bundle(tmp_path / "good", kcore.__version__)
    assert shipping.checked_bundle(str(good)) == good.resolve()

    missing = re.escape(f"{conf}: {tmp_path}/missing.zip: no such file")
    with pytest.raises(ConfigError, match=missing):
        shipping.checked_bundle(str(tmp_path / "missing.zip"))
    (tmp_path / "kcore.whl").write_bytes(good.read_bytes())
    with pytest.raises(ConfigError, match=r"not a \.zip"):
        shipping.checked_bundle(str(tmp_path / "kcore.whl"))
    (tmp_path / "text.zip").write_text("no zip")
    with pytest.raises(ConfigError, match="text.zip: not a zip file"):
        shipping.checked_bundle(str(tmp_path / "text.zip"))
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("kcore/__init__.py", b"")
    with pytest.raises(ConfigError, match=r"other\.zip is not a kcore Spark bundle"):
        shipping.checked_bundle(str(tmp_path / "other.zip"))
    older = _this_interpreters_bundle(tmp_path / "older", "0.0.1")
    with pytest.raises(ConfigError, match="holds kcore 0.0.1, but the driver runs kcore "):
        shipping.checked_bundle(str(older))
    # A bundle without the driver's interpreter.
    other = _tag(OTHER_PYTHON)
    lacking = bundle_builder.from_wheels(
        [_kcore_wheel(tmp_path, other)], [_cramjam_wheel(tmp_path, other, other)]
    ).write(tmp_path / "lacking")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"{conf}: {lacking.name} is a kcore Spark bundle for {other} on linux_x86_64, but "
            f"this interpreter ({sys.executable}) is {_bundle_loader.interpreter_tag()}"
        ),
    ):
        shipping.checked_bundle(str(lacking))
