"""Builds the Cython runtime (level storage conversions, workspaces) with -O3 and OpenMP."""
import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

COMPILE_ARGS = ["-O3", "-fopenmp", "-std=c++17", "-Wno-unused-function", "-Wno-sign-compare"]
LINK_ARGS = ["-fopenmp"]


def runtime_extensions():
    exts = []
    for pyx in sorted(glob.glob(os.path.join("scorch", "_runtime", "*.pyx"))):
        name = pyx[:-4].replace(os.sep, ".")
        exts.append(Extension(
            name, [pyx], language="c++",
            include_dirs=[numpy.get_include(), os.path.join("scorch", "_runtime")],
            extra_compile_args=COMPILE_ARGS, extra_link_args=LINK_ARGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ))
    return exts


setup(
    ext_modules=cythonize(
        runtime_extensions(),
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        nthreads=os.cpu_count() or 1,
    ),
)
