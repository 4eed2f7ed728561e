"""Load kcore's compiled modules when kcore runs from a Spark bundle (a zip on ``sys.path``).

``spark-submit --py-files`` and ``addPyFile`` put zips on executors' import path, but zipimport
cannot load an extension module. The bundle (built by ``kcore.spark.bundle``) therefore carries
the compiled files as data plus a manifest, ``kcore/_bundle.json``. One bundle may serve several
interpreters (CPython 3.10 to 3.13, say): it holds kcore's Python files once and, per
interpreter, kcore's compiled modules and cramjam (kcore's compression dependency, which the
bundle carries for executors that lack it). ``install`` picks the interpreter entry that fits
this one (its ABI tag, extension suffixes and machine), or raises an ImportError naming what the
bundle has and how to build one that fits, and adds a finder that extracts that entry's files
once, into a per-user cache directory named by their content hash, and loads them from there.
The finder sits at the end of ``sys.meta_path``, so an installed cramjam is always preferred.

Outside a bundle ``install`` returns at once, so importing kcore normally costs nothing more.
Only the stdlib is used: this runs before the codec exists.
"""

from __future__ import annotations

import sys
import zipimport
from importlib.machinery import ModuleSpec
from typing import Any

MANIFEST = "kcore/_bundle.json"
# Per-interpreter entries ("interpreters"), each with its own compiled files. Any other format
# is refused: rebuilding is cheap, and a loader guessing at a layout could load the wrong files.
MANIFEST_FORMAT = 2
CACHE_ENV = "KCORE_BUNDLE_CACHE"  # overrides where compiled modules are extracted


def install(spec: ModuleSpec | None) -> None:
    """Make the bundle's compiled modules importable if ``spec`` (kcore's) comes from a zip."""
    loader = spec.loader if spec is not None else None
    if not isinstance(loader, zipimport.zipimporter):
        return
    if any(isinstance(f, BundleFinder) and f.archive == loader.archive for f in sys.meta_path):
        return
    manifest = read_manifest(loader)
    interpreter = select_interpreter(manifest, loader.archive)
    sys.meta_path.append(BundleFinder(loader, interpreter["natives"]))


def read_manifest(loader: zipimport.zipimporter) -> dict[str, Any]:
    """The bundle's manifest; ImportError if the zip is no kcore bundle of a format read here."""
    import json

    try:
        manifest: dict[str, Any] = json.loads(loader.get_data(MANIFEST))
    except OSError:
        raise ImportError(
            f"{loader.archive} is not a kcore Spark bundle (it has no {MANIFEST}); build one "
            f"with `python -m kcore.spark.bundle`"
        ) from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ImportError(
            f"{loader.archive}: kcore Spark bundle format {manifest.get('format')!r}, but this "
            f"loader reads format {MANIFEST_FORMAT}; rebuild it with `python -m "
            f"kcore.spark.bundle` or `bash wheels/build.sh`"
        )
    return manifest


def current_tags() -> tuple[str, str]:
    """(python tag, platform tag) of this interpreter, spelled as in wheel names."""
    import sysconfig

    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    python_tag = f"{impl}{sys.version_info[0]}{sys.version_info[1]}"
    return python_tag, sysconfig.get_platform().replace("-", "_").replace(".", "_")


def interpreter_tag() -> str:
    """The tag a bundle files this interpreter's compiled modules under: its ABI tag as wheel
    names spell it for CPython (``cp311``; ``cp313t`` free-threaded, a ``d`` suffix for a debug
    build: each loads only its own compiled modules), else its python tag."""
    import sysconfig

    python_tag, _ = current_tags()
    if sys.implementation.name != "cpython":
        return python_tag
    free_threaded = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    debug = "d" if hasattr(sys, "gettotalrefcount") else ""
    return f"{python_tag}{free_threaded}{debug}"


def select_interpreter(manifest: dict[str, Any], archive: str) -> dict[str, Any]:
    """The manifest's interpreter entry whose compiled files load here; else an ImportError
    naming this interpreter, the ones the bundle has and how to build a bundle that fits.

    An entry fits if it is filed under this interpreter's tag, every compiled file's suffix is
    one this interpreter loads (a tagged suffix, ``.cpython-311-x86_64-linux-gnu.so``, names the
    Python version, ABI, OS and, except on macOS, the CPU) and the bundle's machine is this one.
    """
    tag = interpreter_tag()
    for entry in manifest["interpreters"]:
        if entry["tag"] == tag and _loads_here(entry, manifest.get("machine")):
            return entry
    raise ImportError(_no_interpreter_message(manifest, archive, tag))


def _loads_here(entry: dict[str, Any], machine: str | None) -> bool:
    import os
    from importlib.machinery import EXTENSION_SUFFIXES

    bases = (
        name.rpartition("/")[2]
        for native in entry["natives"]
        for name in native["files"]
        if not name.endswith(".py")
    )
    suffixes = {base[base.index(".") :] for base in bases}  # module names hold no dot
    fits = all(s in EXTENSION_SUFFIXES for s in suffixes)
    if any(s in (".so", ".pyd") for s in suffixes):  # untagged: the entry's tag must say
        fits = fits and entry["python_tag"] == current_tags()[0]
    if fits and machine and machine != "universal2" and hasattr(os, "uname"):
        fits = _same_machine(machine, os.uname().machine)
    return fits


def _no_interpreter_message(manifest: dict[str, Any], archive: str, tag: str) -> str:
    import os

    _, platform_tag = current_tags()
    has = ", ".join(entry["tag"] for entry in manifest["interpreters"]) or "no interpreter"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return (
        f"{os.path.basename(archive)} is a kcore Spark bundle for {has} on "
        f"{manifest['platform']}, but this interpreter ({sys.executable}) is {tag} on "
        f"{platform_tag}: none of the bundle's compiled modules load here. Build a bundle that "
        f"includes {tag} where Python {version} is installed: `bash wheels/build.sh` in kcore's "
        f"source tree (it builds a wheel for each CPython 3.10 to 3.13 it finds and one bundle "
        f"for all of them), or `python -m kcore.spark.bundle` run by this interpreter with kcore "
        f"installed (a bundle for {tag} alone). Or pip-install kcore on these machines and set "
        f"spark.kcore.shipToExecutors=false (with kcore.spark.register), so that no bundle is "
        f"shipped"
    )


def _same_machine(a: str, b: str) -> bool:
    aliases = {"amd64": "x86_64", "arm64": "aarch64"}
    return aliases.get(a.lower(), a.lower()) == aliases.get(b.lower(), b.lower())


class BundleFinder:
    """Meta path finder for the bundle's compiled modules (``kcore._codec``,
    ``kcore.producer._sendpath``, ``kcore.protocol._decoders``, ``kcore.cluster._metadata_apply``,
    ``kcore.consumer.share._acknowledge``, ``kcore._metrics``, ``cramjam``: the ``natives`` of
    the interpreter entry chosen).

    Appended to the end of ``sys.meta_path``: zipimport finds no compiled kcore module in the zip,
    and an installed cramjam is found by the path finder before this one is asked."""

    def __init__(self, loader: zipimport.zipimporter, natives: list[dict[str, Any]]) -> None:
        self.archive = loader.archive
        self._loader = loader
        self._natives = {n["module"]: n for n in natives}

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
