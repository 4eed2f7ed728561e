"""Build the compiled codec. There is deliberately no fallback: if Cython or a C compiler is
missing the build fails, rather than shipping a wheel that silently runs slow Python."""

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("KCORE_DEBUG_BUILD") == "1"  # -O0 -g, for valgrind/ASan runs
compile_args = ["-O0", "-g"] if debug else ["-O3"]
compile_args += ["-Wno-unreachable-code"]

extensions = [
    Extension(
        "kcore._codec",
        ["src/kcore/_codec.pyx"],
        include_dirs=["src/kcore/_native"],
        depends=[str(p) for p in Path("src/kcore/_native").glob("*")],
        extra_compile_args=compile_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
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
