"""Build kcore's compiled modules: the codec (kcore._codec) and the producer's send path
(kcore.producer._sendpath, which cimports the codec through src/kcore/_codec.pxd). There is
deliberately no fallback: if Cython or a C compiler is missing the build fails, rather than
shipping a wheel that silently runs slow Python."""

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

debug = os.environ.get("KCORE_DEBUG_BUILD") == "1"  # -O0 -g, for valgrind/ASan runs
compile_args = ["-O0", "-g"] if debug else ["-O3"]
compile_args += ["-Wno-unreachable-code"]
# What either module's C depends on: the codec's parts and its declarations.
native = [str(p) for p in sorted(Path("src/kcore/_native").glob("*"))]
codec_pxd = "src/kcore/_codec.pxd"


def extension(name: str, source: str) -> Extension:
    return Extension(
        name,
        [source],
        include_dirs=["src/kcore/_native"],
        depends=[*native, codec_pxd],
        extra_compile_args=compile_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


extensions = [
    extension("kcore._codec", "src/kcore/_codec.pyx"),
    extension("kcore.producer._sendpath", "src/kcore/producer/_sendpath.pyx"),
]

NO_COMPILER = (
    "kcore: compiling {module} failed ({error}). Building kcore from source needs a working C "
    "compiler and Python's headers; there is no pure-Python fallback. Install them (Debian/Ubuntu: "
    "apt-get install build-essential python3-dev; RHEL/Fedora: dnf install gcc python3-devel; "
    "Alpine: apk add build-base python3-dev), or install a prebuilt kcore wheel for this platform."
)


class BuildExtNeedingCompiler(build_ext):
    """build_ext whose failure to find or run the C compiler says what is needed: setuptools' own
    message (a spawn error naming 'gcc') is easy to take for a bug in kcore."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, ExecError, PlatformError) as exc:
            raise CompileError(NO_COMPILER.format(module=ext.name, error=exc)) from exc


setup(
    cmdclass={"build_ext": BuildExtNeedingCompiler},
    ext_modules=cythonize(
        extensions,
        language_level=3,
        include_path=["src"],  # `cimport kcore._codec` finds src/kcore/_codec.pxd
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
        },
        annotate=False,
    ),
)
