"""Load kcore's compiled modules when kcore runs from a Spark bundle (a zip on ``sys.path``).

``spark-submit --py-files`` and ``addPyFile`` put zips on executors' import path, but zipimport
cannot load an extension module. The bundle (built by ``kcore.spark.bundle``) therefore carries
the compiled files as data plus a manifest, ``kcore/_bundle.json``; ``install`` checks that they
fit this interpreter and adds a finder that extracts them once, into a per-user cache directory
named by their content hash, and loads them from there. The same holds for cramjam (kcore's
compression dependency), which the bundle carries for executors that lack it: its finder sits at
the end of ``sys.meta_path``, so an installed cramjam is always preferred.

Outside a bundle ``install`` returns at once, so importing kcore normally costs nothing more.
Only the stdlib is used: this runs before the codec exists.
"""

from __future__ import annotations

import sys
import zipimport
from importlib.machinery import ModuleSpec
from typing import Any

MANIFEST = "kcore/_bundle.json"
MANIFEST_FORMAT = 1
CACHE_ENV = "KCORE_BUNDLE_CACHE"  # overrides where compiled modules are extracted


def install(spec: ModuleSpec | None) -> None:
    """Make the bundle's compiled modules importable if ``spec`` (kcore's) comes from a zip."""
    loader = spec.loader if spec is not None else None
    if not isinstance(loader, zipimport.zipimporter):
        return
    if any(isinstance(f, BundleFinder) and f.archive == loader.archive for f in sys.meta_path):
        return
    manifest = read_manifest(loader)
    check_interpreter(manifest, loader.archive)
    sys.meta_path.append(BundleFinder(loader, manifest))


def read_manifest(loader: zipimport.zipimporter) -> dict[str, Any]:
    import json

    try:
        manifest: dict[str, Any] = json.loads(loader.get_data(MANIFEST))
    except OSError:
        raise ImportError(
            f"kcore was imported from {loader.archive}, which is not a kcore Spark bundle (it has "
            f"no {MANIFEST}); build one with `python -m kcore.spark.bundle`"
        ) from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ImportError(
            f"{loader.archive}: kcore Spark bundle format {manifest.get('format')!r}, but this "
            f"loader reads format {MANIFEST_FORMAT}; rebuild it with `python -m kcore.spark.bundle`"
        )
    return manifest


def current_tags() -> tuple[str, str]:
    """(python tag, platform tag) of this interpreter, spelled as in wheel names."""
    import sysconfig

    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    python_tag = f"{impl}{sys.version_info[0]}{sys.version_info[1]}"
    return python_tag, sysconfig.get_platform().replace("-", "_").replace(".", "_")


def check_interpreter(manifest: dict[str, Any], archive: str) -> None:
    """Raise ImportError, saying what would fit, unless the bundle's compiled files can load here.

    A tagged extension suffix (``.cpython-311-x86_64-linux-gnu.so``) names the Python version,
    ABI, OS and, except on macOS, the CPU; the manifest's tags and machine cover the rest."""
    import os
    from importlib.machinery import EXTENSION_SUFFIXES

    python_tag, platform_tag = current_tags()
    suffixes = {
        name[name.index(".") :]  # module names hold no dot: the rest is the suffix
        for native in manifest["natives"]
        for name in native["files"]
        if not name.endswith(".py")
    }
    fits = all(s in EXTENSION_SUFFIXES for s in suffixes)
    if any(s in (".so", ".pyd") for s in suffixes):  # untagged: the manifest must say
        fits = fits and manifest["python_tag"] == python_tag
    machine = manifest.get("machine")
    if fits and machine and machine != "universal2" and hasattr(os, "uname"):
        fits = _same_machine(machine, os.uname().machine)
    if not fits:
        raise ImportError(
            f"{os.path.basename(archive)} is a kcore Spark bundle for {manifest['python_tag']} "
            f"on {manifest['platform_tag']}, but this interpreter ({sys.executable}) is "
            f"{python_tag} on {platform_tag}: its compiled modules cannot load here. Use a bundle "
            f"built by this interpreter (`python -m kcore.spark.bundle`), or pip-install kcore "
            f"on these machines (with kcore.spark.register, set "
            f"spark.kcore.shipToExecutors=false so the driver's bundle is not shipped)"
        )


def _same_machine(a: str, b: str) -> bool:
    aliases = {"amd64": "x86_64", "arm64": "aarch64"}
    return aliases.get(a.lower(), a.lower()) == aliases.get(b.lower(), b.lower())


class BundleFinder:
    """Meta path finder for the bundle's compiled modules (``kcore._codec``,
    ``kcore.producer._sendpath``, ``cramjam``: the manifest's ``natives``).

    Appended to the end of ``sys.meta_path``: zipimport finds no compiled kcore module in the zip,
    and an installed cramjam is found by the path finder before this one is asked."""

    def __init__(self, loader: zipimport.zipimporter, manifest: dict[str, Any]) -> None:
        self.archive = loader.archive
        self._loader = loader
        self._natives = {n["module"]: n for n in manifest["natives"]}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        native = self._natives.get(fullname)
        if native is None:
            return None
        # A submodule of another kcore (an installed one, say) is not this bundle's to serve.
        if path is not None and not any(str(p).startswith(self.archive) for p in path):
            return None
        import os
        from importlib.util import spec_from_file_location

        directory = extract(self._loader, native, cache_dir())
        location = os.path.join(directory, native["main"])
        if native.get("package"):
            return spec_from_file_location(
                fullname, location, submodule_search_locations=[directory]
            )
        return spec_from_file_location(fullname, location)


def cache_dir() -> str:
    """The per-user directory compiled modules are extracted to (created on first use).

    ``$KCORE_BUNDLE_CACHE``, else ``$XDG_CACHE_HOME/kcore/bundle`` (``~/.cache/...``), else one
    under the temp directory: executors' home directories are often missing or read-only."""
    import os
    import tempfile

    override = os.environ.get(CACHE_ENV)
    if override:
        candidates = [override]
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        uid = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
        candidates = [
            os.path.join(xdg, "kcore", "bundle"),
            os.path.join(tempfile.gettempdir(), f"kcore-bundle-{uid}"),
        ]
    for candidate in candidates:
        try:
            os.makedirs(candidate, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if _private(candidate):
            return candidate
    raise ImportError(
        f"no usable cache directory to extract kcore's compiled modules to (tried "
        f"{', '.join(candidates)}: each must be writable and owned by this user); set "
        f"{CACHE_ENV} to one"
    )


def _private(directory: str) -> bool:
    # Code is loaded from here: a directory someone else owns or can write to must not be used.
    import os
    import stat

    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    if not hasattr(os, "getuid"):
        return True
    st = os.stat(directory)
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def extract(loader: zipimport.zipimporter, native: dict[str, Any], cache: str) -> str:
    """The directory holding ``native``'s files, extracting them first if needed.

    Files are written to a fresh temporary directory, checked against the manifest's hash, then
    renamed into place in one step; a process that loses the race to another uses the winner's
    copy. So a directory under its final name is always complete, however many workers start at
    once."""
    import hashlib
    import os
    import shutil
    import tempfile

    final = os.path.join(cache, f"{native['module']}-{native['sha256'][:16]}")
    if os.path.isdir(final):
        return final
    tmp = tempfile.mkdtemp(prefix=f".{native['module']}-", dir=cache)
    try:
        digest = hashlib.sha256()
        for name in native["files"]:
            data = loader.get_data(f"{native['root']}/{name}")
            digest_file(digest, name, data)
            target = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the rename must not outlive the data after a crash
        if digest.hexdigest() != native["sha256"]:
            raise ImportError(
                f"{loader.archive}: {native['module']}'s files do not match the bundle's "
                f"manifest (a damaged or edited bundle); rebuild it"
            )
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    return final


def digest_file(digest: Any, name: str, data: bytes) -> None:
    """Feed one file into a native's content hash (shared with the bundle builder)."""
    digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0")
    digest.update(data)
