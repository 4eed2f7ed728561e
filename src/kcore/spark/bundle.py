"""Build kcore's Spark bundle: one zip that ``spark-submit --py-files`` and ``addPyFile`` accept.

Spark puts only ``.py``, ``.zip`` and ``.egg`` files on executors' import path (never a wheel),
and zipimport cannot load compiled modules. The bundle holds kcore's Python files, its compiled
modules (``COMPILED_MODULES``) and cramjam (compiled, for compression) as data, with a manifest
that
``kcore._bundle_loader`` reads to extract and load them. Like a wheel it fits one Python version
and platform, named in the file name: ``kcore-0.1.0-spark-cp311-linux_x86_64.zip``.

    python -m kcore.spark.bundle [-o DIR]      # from the installed kcore and cramjam
    python -I src/kcore/spark/bundle.py --kcore-wheel K.whl --cramjam-wheel C.whl [-o DIR]

The second form (what ``wheels/build.sh`` runs) needs neither kcore nor cramjam installed: this
module imports only the stdlib at the top, and ``-I`` keeps its own directory off ``sys.path``.
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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1  # what kcore._bundle_loader reads (MANIFEST_FORMAT)
MANIFEST = "kcore/_bundle.json"
# kcore's compiled modules: each one file under kcore/, extracted and loaded on its own.
COMPILED_MODULES = ("kcore._codec", "kcore.producer._sendpath")
CRAMJAM_ROOT = "kcore/_bundled/cramjam"  # not importable as ``cramjam``: served only as a fallback
LICENSES_ROOT = "kcore/_bundled/licenses"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same inputs give the same bytes
_NATIVE_SUFFIX = (".so", ".pyd")
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)"
    r"\.whl$"
)
_MACHINE = re.compile(r"(x86_64|amd64|aarch64|arm64|i686|ppc64le|s390x|armv7l|universal2)$")


class BundleError(Exception):
    """The bundle cannot be built from what was given."""


_NOT_INSTALLED = (
    "kcore at {} is not an installed package directory with its compiled modules in it (is it "
    "running from a bundle already? then ship that bundle)"
)


@dataclass
class BundleContents:
    """What goes into a bundle. Paths are relative to the package (``kcore/``, ``cramjam/``)."""

    version: str
    python_tag: str
    platform_tag: str
    machine: str | None
    kcore_files: dict[str, bytes]
    compiled: dict[str, str]  # each of COMPILED_MODULES: its file's path, one of kcore_files
    cramjam_files: dict[str, bytes]
    licenses: dict[str, bytes] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        return f"kcore-{self.version}-spark-{self.python_tag}-{self.platform_tag}.zip"

    def manifest(self) -> dict[str, Any]:
        natives = []
        for module in COMPILED_MODULES:
            directory, _, name = f"kcore/{self.compiled[module]}".rpartition("/")
            files = {name: self.kcore_files[self.compiled[module]]}
            natives.append(_native(module, directory, files, name, package=False))
        natives.append(
            _native("cramjam", CRAMJAM_ROOT, self.cramjam_files, "__init__.py", package=True)
        )
        return {
            "format": FORMAT,
            "kcore_version": self.version,
            "python_tag": self.python_tag,
            "platform_tag": self.platform_tag,
            "machine": self.machine,
            "natives": natives,
        }

    def entries(self) -> Iterable[tuple[str, bytes]]:
        for name, data in sorted(self.kcore_files.items()):
            yield f"kcore/{name}", data
        for name, data in sorted(self.cramjam_files.items()):
            yield f"{CRAMJAM_ROOT}/{name}", data
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


def _native(
    module: str, root: str, files: dict[str, bytes], main: str, *, package: bool
) -> dict[str, Any]:
    h = hashlib.sha256()
    for name in sorted(files):
        digest_file(h, name, files[name])
    return {
        "module": module,
        "root": root,
        "files": sorted(files),
        "main": main,
        "package": package,
        "sha256": h.hexdigest(),
    }


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
    """The bundle for the kcore and cramjam this interpreter imports."""
    import importlib
    import importlib.metadata
    import platform

    import cramjam

    import kcore
    from kcore._bundle_loader import current_tags

    kcore_dir = Path(kcore.__file__).parent
    if not kcore_dir.is_dir():
        raise BundleError(_NOT_INSTALLED.format(kcore.__file__))
    kcore_files = _read_tree(kcore_dir, _keep_kcore_file)
    compiled = {}
    for module in COMPILED_MODULES:
        path = Path(importlib.import_module(module).__file__ or "")
        if not path.is_relative_to(kcore_dir):
            raise BundleError(_NOT_INSTALLED.format(kcore.__file__))
        name = path.relative_to(kcore_dir).as_posix()
        kcore_files[name] = path.read_bytes()
        compiled[module] = name
    python_tag, platform_tag = current_tags()
    licenses = {}
    for dist_file in importlib.metadata.distribution("cramjam").files or []:
        if "LICENSE" in dist_file.name.upper():
            licenses[f"cramjam/{dist_file.name}"] = Path(str(dist_file.locate())).read_bytes()
    return BundleContents(
        version=kcore.__version__,
        python_tag=python_tag,
        platform_tag=platform_tag,
        machine=platform.machine() or None,
        kcore_files=kcore_files,
        compiled=compiled,
        cramjam_files=_read_tree(Path(cramjam.__file__).parent, _keep_cramjam_file),
        licenses=licenses,
    )


def _wheel_tags(wheel: Path, name: str) -> re.Match[str]:
    m = _WHEEL.match(wheel.name)
    if not m or m["name"].lower() != name:
        raise BundleError(f"{wheel}: not a {name} wheel file name")
    if m["plat"] == "any":
        raise BundleError(f"{wheel}: a pure-Python wheel has no compiled module to bundle")
    return m


def _wheel_files(wheel: Path, package: str, keep: Any) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {
            n[len(package) + 1 :]: zf.read(n)
            for n in zf.namelist()
            if n.startswith(package + "/") and keep(n[len(package) + 1 :])
        }


def from_wheels(kcore_wheel: Path, cramjam_wheel: Path) -> BundleContents:
    """The bundle for a kcore wheel and a cramjam wheel (of the same Python and platform)."""
    k = _wheel_tags(kcore_wheel, "kcore")
    c = _wheel_tags(cramjam_wheel, "cramjam")
    if not (c["abi"] == "abi3" or c["py"] == k["py"]) or _machine_of(c["plat"]) != _machine_of(
        k["plat"]
    ):
        raise BundleError(f"{cramjam_wheel.name} does not fit {kcore_wheel.name}")
    kcore_files = _wheel_files(kcore_wheel, "kcore", lambda n: True)
    compiled = {}
    for module in COMPILED_MODULES:
        found = _compiled_files(module, kcore_files)
        if len(found) != 1:
            raise BundleError(f"{kcore_wheel}: expected one compiled {module}, found {found}")
        compiled[module] = found[0]
    natives = set(compiled.values())
    kcore_files = {n: d for n, d in kcore_files.items() if _keep_kcore_file(n) or n in natives}
    licenses = {}
    with zipfile.ZipFile(cramjam_wheel) as zf:
        for n in zf.namelist():
            top, _, rest = n.partition("/")
            base = rest.rpartition("/")[2]
            if top.endswith(".dist-info") and "LICENSE" in base.upper():
                licenses[f"cramjam/{base}"] = zf.read(n)
    return BundleContents(
        version=k["version"],
        python_tag=k["py"],
        platform_tag=k["plat"],
        machine=_machine_of(k["plat"]),
        kcore_files=kcore_files,
        compiled=compiled,
        cramjam_files=_wheel_files(cramjam_wheel, "cramjam", _keep_cramjam_file),
        licenses=licenses,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kcore.spark.bundle",
        description="Build kcore's Spark bundle (a zip for spark-submit --py-files).",
    )
    parser.add_argument("-o", "--out", default=".", help="directory to write it to (default: .)")
    parser.add_argument("--kcore-wheel", type=Path, help="build from this kcore wheel ...")
    parser.add_argument("--cramjam-wheel", type=Path, help="... and this cramjam wheel")
    args = parser.parse_args(argv)
    if (args.kcore_wheel is None) != (args.cramjam_wheel is None):
        parser.error("--kcore-wheel and --cramjam-wheel go together")
    try:
        if args.kcore_wheel is not None:
            contents = from_wheels(args.kcore_wheel, args.cramjam_wheel)
        else:
            contents = from_installed()
    except BundleError as e:
        parser.exit(1, f"error: {e}\n")
    print(contents.write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
