"""Builds the Cython runtime (level storage conversions, workspaces) with -O3 and OpenMP,
then compiles the standard kernels (scorch.tensor_compiler.prebuilt) so their first call pays no
compile. Set SCORCH_SKIP_PREBUILT=1 to skip the second step (kernels then compile on
first use)."""
import glob
import importlib.util
import os
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILE_ARGS = ["-O3", "-fopenmp", "-std=c++17", "-Wno-unused-function", "-Wno-sign-compare"]


def openmp_link_args():
    """``-fopenmp`` and, where torch ships a renamed copy of libgomp, that copy by path:
    one OpenMP runtime per process (``scorch/tensor_compiler/target.py``, loaded by path:
    the package itself is not importable before it is built)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scorch", "tensor_compiler",
                        "target.py")
    spec = importlib.util.spec_from_file_location("_scorch_build_target", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        return ["-fopenmp", *mod.openmp_link_flags()]
    except ImportError:               # no torch in this build environment
        return ["-fopenmp"]
    finally:
        sys.modules.pop(spec.name, None)


LINK_ARGS = openmp_link_args()


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


class build_ext_and_kernels(build_ext):
    """build_ext, then the standard kernels through the freshly built package.

    The kernel step needs torch, which pip's isolated build environment hides: it runs in
    a subprocess with pip's path overrides removed, so it sees the environment the package
    is being installed into. A failure is reported and skipped, never fatal: the kernels
    then compile on first use (and tests/test_prebuilt.py says so)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:   # the runtime extensions side by side: 98 -> 62 s on 2 cores
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        if os.environ.get("SCORCH_SKIP_PREBUILT"):
            return
        root = os.path.abspath("." if self.inplace else self.build_lib)
        dest = os.path.join(root, "scorch", "_prebuilt")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSAFEPATH")}
        env["PYTHONPATH"] = root
        cmd = [sys.executable, "-m", "scorch.tensor_compiler.prebuilt", "--dest", dest]
        print("scorch: compiling the standard kernels (about 75 modules, in 2 parallel worker "
              "processes, 2-3 minutes on 2 cores; a line per kernel follows; SCORCH_SKIP_PREBUILT=1 "
              "skips this):",
              " ".join(cmd), flush=True)
        try:
            subprocess.run(cmd, env=env, cwd=root, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"scorch: WARNING: standard kernels not prebuilt ({exc}); they will "
                  f"compile on first use", flush=True)


setup(
    cmdclass={"build_ext": build_ext_and_kernels},
    ext_modules=cythonize(
        runtime_extensions(),
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        nthreads=os.cpu_count() or 1,
    ),
)
