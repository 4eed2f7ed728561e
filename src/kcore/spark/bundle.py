"""Build kcore's Spark bundle: one zip that ``spark-submit --py-files`` and ``addPyFile`` accept.

Spark puts only ``.py``, ``.zip`` and ``.egg`` files on executors' import path (never a wheel),
and zipimport cannot load compiled modules. The bundle holds kcore's Python files once and, for
each interpreter it was built for, kcore's compiled modules (``COMPILED_MODULES``) and cramjam
(compiled, for compression) as data, with a manifest that ``kcore._bundle_loader`` reads to pick
the interpreter's files, extract and load them. Its file name names every interpreter and the
platform: ``kcore-0.1.0-spark-cp310.cp311.cp312.cp313-linux_x86_64.zip``.

    python -m kcore.spark.bundle [-o DIR]      # this interpreter's, from the installed packages
    python -I src/kcore/spark/bundle.py -o DIR \\
        --kcore-wheel K1.whl --kcore-wheel K2.whl ... --cramjam-wheel C1.whl --cramjam-wheel C2.whl

The second form (what ``wheels/build.sh`` runs) takes a kcore wheel per interpreter and the
cramjam wheels that fit them (one per interpreter, or an abi3 one serving several), and needs
neither kcore nor cramjam installed: this module imports only the stdlib at the top, and ``-I``
keeps its own directory off ``sys.path``. Both print the bundle's path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 2  # what kcore._bundle_loader reads (MANIFEST_FORMAT)
MANIFEST = "kcore/_bundle.json"
# kcore's compiled modules: each one file under kcore/, extracted and loaded on its own.
COMPILED_MODULES = (
    "kcore._codec",
    "kcore.producer._sendpath",
    "kcore.protocol._decoders",
    "kcore.cluster._metadata_apply",
    "kcore.consumer.share._acknowledge",
    "kcore._metrics",
)
# Compiled files and cramjam, stored as data: nothing under it is imported from the zip (no
# __init__.py), and cramjam there is not importable as ``cramjam``, served only as a fallback.
BUNDLED_ROOT = "kcore/_bundled"
LICENSES_ROOT = f"{BUNDLED_ROOT}/licenses"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same inputs give the same bytes
_NATIVE_SUFFIX = (".so", ".pyd")
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)"
    r"\.whl$"
)
_MACHINE = re.compile(r"(x86_64|amd64|aarch64|arm64|i686|ppc64le|s390x|armv7l|universal2)$")
_MANYLINUX = re.compile(r"^manylinux(?:_\d+_\d+|1|2010|2014)_(?P<arch>.+)$")
_MACOSX = re.compile(r"^macosx_\d+_\d+_(?P<arch>.+)$")
_CPYTHON = re.compile(r"^cp(?P<major>\d)(?P<minor>\d+)$")


class BundleError(Exception):
    """The bundle cannot be built from what was given."""


_NOT_INSTALLED = (
    "kcore at {} is not an installed package directory with its compiled modules in it (is it "
    "running from a bundle already? then ship that bundle)"
)


@dataclass
class InterpreterBuild:
    """One interpreter's part of a bundle: kcore's compiled modules and cramjam, built for it."""

    tag: str  # what kcore._bundle_loader.interpreter_tag() says there: the ABI tag, cp311
    python_tag: str
    platform_tag: str  # of its kcore build: a wheel's (manylinux_2_17_x86_64...) or sysconfig's
    compiled: dict[str, tuple[str, bytes]]  # each of COMPILED_MODULES: (path under kcore/, data)
    cramjam_files: dict[str, bytes]  # paths under cramjam/

    @property
    def cramjam_root(self) -> str:
        # Named by content: interpreters sharing one cramjam build (abi3) share its one copy.
        return f"{BUNDLED_ROOT}/cramjam-{_files_digest(self.cramjam_files)[:16]}"

    def compiled_entries(self) -> Iterable[tuple[str, bytes]]:
        for path, data in self.compiled.values():
            yield f"{BUNDLED_ROOT}/{self.tag}/kcore/{path}", data

    def manifest(self) -> dict[str, Any]:
        natives = []
        for module in COMPILED_MODULES:
            path, data = self.compiled[module]
            directory, _, name = f"{BUNDLED_ROOT}/{self.tag}/kcore/{path}".rpartition("/")
            natives.append(_native(module, directory, {name: data}, name, package=False))
        natives.append(
            _native("cramjam", self.cramjam_root, self.cramjam_files, "__init__.py", package=True)
        )
        return {
            "tag": self.tag,
            "python_tag": self.python_tag,
            "platform_tag": self.platform_tag,
            "natives": natives,
        }


@dataclass
class BundleContents:
    """What goes into a bundle. Paths are relative to the package (``kcore/``, ``cramjam/``)."""

    version: str
    platform: str  # the file name's platform part: see platform_name
    machine: str | None
    kcore_files: dict[str, bytes]  # the Python files, which every interpreter shares
    interpreters: list[InterpreterBuild]  # oldest first
    licenses: dict[str, bytes] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        tags = ".".join(i.tag for i in self.interpreters)
        return f"kcore-{self.version}-spark-{tags}-{self.platform}.zip"

    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kcore_version": self.version,
            "platform": self.platform,
            "machine": self.machine,
            "interpreters": [i.manifest() for i in self.interpreters],
        }

    def entries(self) -> Iterable[tuple[str, bytes]]:
        for name, data in sorted(self.kcore_files.items()):
            yield f"kcore/{name}", data
        cramjam_roots = {}
        for interpreter in self.interpreters:
            yield from sorted(interpreter.compiled_entries())
            cramjam_roots[interpreter.cramjam_root] = interpreter.cramjam_files
        for root, files in sorted(cramjam_roots.items()):
            for name, data in sorted(files.items()):
                yield f"{root}/{name}", data
        for name, data in sorted(self.licenses.items()):
            yield f"{LICENSES_ROOT}/{name}", data
        yield MANIFEST, json.dumps(self.manifest(), indent=1, sort_keys=True).encode()

    def digest(self) -> str:
        """Hash of everything the bundle holds: names cached copies of it."""
        h = hashlib.sha256()
        for name, data in self.entries():
            digest_file(h, name, data)
        return h.hexdigest()

    def write(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the bundle into ``out_dir`` (atomically: a reader never sees half a zip)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kcore-bundle-", suffix=".zip", dir=out)
        try:
            with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w") as zf:
                for name, data in self.entries():
                    info = zipfile.ZipInfo(name, _EPOCH)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = 0o644 << 16
                    zf.writestr(info, data)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a cluster's other users
            os.replace(tmp, out / self.file_name)
        except BaseException:
            os.unlink(tmp)
            raise
        return out / self.file_name


def digest_file(digest: Any, name: str, data: bytes) -> None:
    # The same framing as kcore._bundle_loader.digest_file (which checks what this wrote); kept
    # in two places so that this module runs without kcore installed. A test compares them.
    digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0")
    digest.update(data)


def _files_digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        digest_file(h, name, files[name])
    return h.hexdigest()


def _native(
    module: str, root: str, files: dict[str, bytes], main: str, *, package: bool
) -> dict[str, Any]:
    return {
        "module": module,
        "root": root,
        "files": sorted(files),
        "main": main,
        "package": package,
        "sha256": _files_digest(files),
    }


def platform_name(platform_tag: str) -> str:
    """The platform part of a bundle's file name, for a wheel's or sysconfig's platform tag.

    One bundle holds builds whose tags differ in their glibc floor (kcore's manylinux_2_17,
    cramjam's manylinux_2_28) or macOS deployment target, so the name keeps only what every one
    of them shares, the OS and CPU: ``linux_x86_64``, which is also what sysconfig says on any
    glibc Linux and so how a bundle built from an installed kcore is named. Each build's full tag
    is in the manifest, and the loader checks what it loads by its extension suffix."""
    first = platform_tag.split(".")[0]
    m = _MANYLINUX.match(first)
    if m:
        return f"linux_{m['arch']}"
    m = _MACOSX.match(first)
    if m:
        return f"macosx_{m['arch']}"
    return first  # linux_x86_64, musllinux_1_2_x86_64 (musl is not glibc), win_amd64, ...


def _interpreter_order(tag: str) -> tuple[str, int, str]:
    m = re.match(r"^([a-z]+)(\d)(\d*)(.*)$", tag)
    if not m:
        return (tag, 0, "")
    return (m[1], int(m[2]) * 1000 + int(m[3] or 0), m[4])


def _keep_kcore_file(name: str) -> bool:
    # Python sources only (not the .pyx/.pxd/.c/.h the source tree holds); the compiled
    # modules are added apart.
    return name.endswith(".py") and "__pycache__" not in name.split("/")


def _compiled_files(module: str, names: Iterable[str]) -> list[str]:
    """The compiled files of ``module`` (one of COMPILED_MODULES) among ``names``, paths
    relative to kcore/: ``producer/_sendpath.cpython-311-x86_64-linux-gnu.so``, say."""
    package, _, stem = module.split(".", 1)[1].rpartition(".")
    directory = package.replace(".", "/") + "/" if package else ""
    return [
        n
        for n in names
        if n.startswith(f"{directory}{stem}.")
        and "/" not in n[len(directory) :]
        and n.endswith(_NATIVE_SUFFIX)
    ]


def _keep_cramjam_file(name: str) -> bool:
    return name.endswith((".py", *_NATIVE_SUFFIX)) and "__pycache__" not in name.split("/")


def _machine_of(platform_tag: str) -> str | None:
    m = _MACHINE.search(platform_tag)
    return m.group(1) if m else None


def _read_tree(root: Path, keep: Any) -> dict[str, bytes]:
    files = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and keep(name):
            files[name] = path.read_bytes()
    return files


def from_installed() -> BundleContents:
    """The bundle for the kcore and cramjam this interpreter imports: this interpreter only."""
    import importlib
    import importlib.metadata
    import platform

    import cramjam

    import kcore
    from kcore._bundle_loader import current_tags, interpreter_tag

    kcore_dir = Path(kcore.__file__).parent
    if not kcore_dir.is_dir():
        raise BundleError(_NOT_INSTALLED.format(kcore.__file__))
    compiled = {}
    for module in COMPILED_MODULES:
        path = Path(importlib.import_module(module).__file__ or "")
        if not path.is_relative_to(kcore_dir):
            raise BundleError(_NOT_INSTALLED.format(kcore.__file__))
        compiled[module] = (path.relative_to(kcore_dir).as_posix(), path.read_bytes())
    python_tag, platform_tag = current_tags()
    cramjam_dist = importlib.metadata.distribution("cramjam")
    licenses = {}
    for dist_file in cramjam_dist.files or []:
        if "LICENSE" in dist_file.name.upper():
            licenses[f"cramjam-{cramjam_dist.version}/{dist_file.name}"] = Path(
                str(dist_file.locate())
            ).read_bytes()
    interpreter = InterpreterBuild(
        tag=interpreter_tag(),
        python_tag=python_tag,
        platform_tag=platform_tag,
        compiled=compiled,
        cramjam_files=_read_tree(Path(cramjam.__file__).parent, _keep_cramjam_file),
    )
    return BundleContents(
        version=kcore.__version__,
        platform=platform_name(platform_tag),
        machine=platform.machine() or None,
        kcore_files=_read_tree(kcore_dir, _keep_kcore_file),
        interpreters=[interpreter],
        licenses=licenses,
    )


@dataclass
class _Wheel:
    path: Path
    version: str
    python_tags: list[str]
    abi_tags: list[str]
    platform_tag: str

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def platform(self) -> str:
        return platform_name(self.platform_tag)


def _parse_wheel(wheel: Path, name: str) -> _Wheel:
    m = _WHEEL.match(wheel.name)
    if not m or m["name"].lower() != name:
        raise BundleError(f"{wheel}: not a {name} wheel file name")
    if m["plat"] == "any":
        raise BundleError(f"{wheel}: a pure-Python wheel has no compiled module to bundle")
    if not wheel.is_file():
        raise BundleError(f"{wheel}: no such file")
    return _Wheel(wheel, m["version"], m["py"].split("."), m["abi"].split("."), m["plat"])


def _distinct(wheels: Iterable[_Wheel]) -> list[_Wheel]:
    """``wheels`` with each file name once: the same abi3 wheel, downloaded for each interpreter,
    is one wheel. Two different files under one name are an error."""
    by_name: dict[str, _Wheel] = {}
    for wheel in wheels:
        seen = by_name.setdefault(wheel.name, wheel)
        if seen is not wheel and seen.path.read_bytes() != wheel.path.read_bytes():
            raise BundleError(f"{seen.path} and {wheel.path}: two different files of one name")
    return list(by_name.values())


def _kcore_interpreter(wheel: _Wheel) -> str:
    """The interpreter a kcore wheel is for, as kcore._bundle_loader.interpreter_tag() says it."""
    if len(wheel.python_tags) != 1 or len(wheel.abi_tags) != 1:
        raise BundleError(f"{wheel.name}: a kcore wheel is built for one interpreter")
    [python_tag], [abi_tag] = wheel.python_tags, wheel.abi_tags
    if abi_tag in ("none", "abi3"):
        raise BundleError(f"{wheel.name}: kcore's compiled modules are built per interpreter")
    return abi_tag if abi_tag.startswith("cp") else python_tag


def _cramjam_fits(cramjam: _Wheel, interpreter: str, kcore: _Wheel) -> bool:
    if cramjam.platform != kcore.platform:
        return False
    if "abi3" in cramjam.abi_tags:
        # The stable ABI: loads in every CPython at or after the wheel's python tag, but not in
        # a free-threaded or debug build (whose tags carry a suffix).
        version = _CPYTHON.match(interpreter)
        floors = [_CPYTHON.match(t) for t in cramjam.python_tags]
        return version is not None and any(
            f is not None
            and (int(f["major"]), int(f["minor"])) <= (int(version["major"]), int(version["minor"]))
            for f in floors
        )
    return kcore.python_tags[0] in cramjam.python_tags and interpreter in cramjam.abi_tags


def _download_hint(kcore: _Wheel) -> str:
    m = _CPYTHON.match(kcore.python_tags[0])
    if not m:
        return ""
    return (
        f" (`pip download --only-binary=:all: --no-deps --python-version "
        f"{m['major']}.{m['minor']} cramjam`, say)"
    )


def _wheel_files(wheel: Path, package: str, keep: Any) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {
            n[len(package) + 1 :]: zf.read(n)
            for n in zf.namelist()
            if n.startswith(package + "/") and keep(n[len(package) + 1 :])
        }


def _cramjam_licenses(wheel: _Wheel) -> dict[str, bytes]:
    licenses = {}
    with zipfile.ZipFile(wheel.path) as zf:
        for n in zf.namelist():
            top, _, rest = n.partition("/")
            base = rest.rpartition("/")[2]
            if top.endswith(".dist-info") and "LICENSE" in base.upper():
                licenses[f"cramjam-{wheel.version}/{base}"] = zf.read(n)
    return licenses


def _differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))


def from_wheels(kcore_wheels: Sequence[Path], cramjam_wheels: Sequence[Path]) -> BundleContents:
    """The bundle for kcore wheels, one per interpreter, and the cramjam wheels that fit them:
    for each kcore wheel exactly one of the same Python, ABI (or abi3 of an older or equal
    Python) and platform. Every cramjam wheel must serve one of them."""
    kcores = _distinct(_parse_wheel(w, "kcore") for w in kcore_wheels)
    cramjams = _distinct(_parse_wheel(w, "cramjam") for w in cramjam_wheels)
    if not kcores:
        raise BundleError("no kcore wheel given")
    by_interpreter: dict[str, _Wheel] = {}
    for wheel in kcores:
        interpreter = _kcore_interpreter(wheel)
        if interpreter in by_interpreter:
            raise BundleError(
                f"two kcore wheels for {interpreter}: {by_interpreter[interpreter].name} and "
                f"{wheel.name} (give one per interpreter)"
            )
        by_interpreter[interpreter] = wheel
    first = kcores[0]
    for wheel in kcores[1:]:
        if wheel.version != first.version:
            raise BundleError(f"kcore wheels of different versions: {first.name} and {wheel.name}")
        if wheel.platform != first.platform:
            raise BundleError(
                f"kcore wheels for different platforms ({first.platform}, {wheel.platform}): "
                f"{first.name} and {wheel.name}; a bundle serves one platform"
            )

    interpreters: list[InterpreterBuild] = []
    licenses: dict[str, bytes] = {}
    python_files: dict[str, bytes] | None = None
    used: set[str] = set()
    for interpreter in sorted(by_interpreter, key=_interpreter_order):
        kcore = by_interpreter[interpreter]
        fitting = [c for c in cramjams if _cramjam_fits(c, interpreter, kcore)]
        if not fitting:
            raise BundleError(
                f"no cramjam wheel fits {kcore.name} ({interpreter} on {kcore.platform}) among "
                f"{', '.join(c.name for c in cramjams) or 'none given'}: give one with "
                f"--cramjam-wheel{_download_hint(kcore)}"
            )
        if len(fitting) > 1:
            raise BundleError(
                f"{len(fitting)} cramjam wheels fit {kcore.name} ({interpreter}): "
                f"{', '.join(c.name for c in fitting)}; give one per interpreter"
            )
        [cramjam] = fitting
        used.add(cramjam.name)
        files = _wheel_files(kcore.path, "kcore", lambda n: True)
        compiled = {}
        for module in COMPILED_MODULES:
            found = _compiled_files(module, files)
            if len(found) != 1:
                raise BundleError(f"{kcore.path}: expected one compiled {module}, found {found}")
            compiled[module] = (found[0], files[found[0]])
        kcore_python = {n: d for n, d in files.items() if _keep_kcore_file(n)}
        if python_files is None:
            python_files = kcore_python
        elif kcore_python != python_files:
            differing = _differing(python_files, kcore_python)
            raise BundleError(
                f"the kcore wheels' Python files differ ({', '.join(differing[:5])}"
                f"{', ...' if len(differing) > 5 else ''} in {kcore.name} against "
                f"{by_interpreter[interpreters[0].tag].name}): build every wheel from the same "
                f"source"
            )
        interpreters.append(
            InterpreterBuild(
                tag=interpreter,
                python_tag=kcore.python_tags[0],
                platform_tag=kcore.platform_tag,
                compiled=compiled,
                cramjam_files=_wheel_files(cramjam.path, "cramjam", _keep_cramjam_file),
            )
        )
        licenses.update(_cramjam_licenses(cramjam))
    unused = [c.name for c in cramjams if c.name not in used]
    if unused:
        raise BundleError(
            f"cramjam wheel {', '.join(unused)} fits none of the kcore wheels "
            f"({', '.join(sorted(by_interpreter, key=_interpreter_order))} on {first.platform})"
        )
    assert python_files is not None
    return BundleContents(
        version=first.version,
        platform=first.platform,
        machine=_machine_of(first.platform_tag),
        kcore_files=python_files,
        interpreters=interpreters,
        licenses=licenses,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kcore.spark.bundle",
        description=(
            "Build kcore's Spark bundle (a zip for spark-submit --py-files): from the installed "
            "kcore and cramjam for this interpreter, or from wheels for several interpreters."
        ),
    )
    parser.add_argument("-o", "--out", default=".", help="directory to write it to (default: .)")
    parser.add_argument(
        "--kcore-wheel",
        type=Path,
        action="append",
        default=[],
        help="build from this kcore wheel (repeat: one per interpreter) ...",
    )
    parser.add_argument(
        "--cramjam-wheel",
        type=Path,
        action="append",
        default=[],
        help="... and the cramjam wheels that fit them (repeat: one per interpreter, or abi3)",
    )
    args = parser.parse_args(argv)
    if bool(args.kcore_wheel) != bool(args.cramjam_wheel):
        parser.error("--kcore-wheel and --cramjam-wheel go together")
    try:
        if args.kcore_wheel:
            contents = from_wheels(args.kcore_wheel, args.cramjam_wheel)
        else:
            contents = from_installed()
    except BundleError as e:
        parser.exit(1, f"error: {e}\n")
    print(contents.write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
