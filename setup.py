"""Build kcore's compiled modules: the codec (kcore._codec) and the producer's send path
(kcore.producer._sendpath, which cimports the codec through src/kcore/_codec.pxd). There is
deliberately no fallback: if Cython or a C compiler is missing the build fails, rather than
shipping a wheel that silently runs slow Python."""

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

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

setup(
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
