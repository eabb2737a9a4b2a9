"""Build the optional native part, ``mpimesh._native``, with the MPI compiler wrapper.

Metadata lives in pyproject.toml; this file only exists because a C extension
must choose its compiler.  The wrapper is found as mpi4py finds it:
``$MPIMESH_MPICC``, then ``$MPICC``, then ``mpicc =`` in setup.cfg's
``[build_ext]``, then ``mpicc`` on ``PATH`` (or beside the interpreter).
``MPIMESH_MPICC=none`` skips the build: the in-place build serves one MPI, and
a second venv with another MPI must not overwrite it (scripts/bootstrap.sh).
The extension is optional: without a working wrapper (e.g. under pip's build
isolation on a machine whose MPI is installed by the same ``pip install``),
the build warns, listing all four places, and mpimesh falls back to ctypes.
"""

import os
import shlex
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """build_ext with an ``--mpicc`` option and the compiler search above; never fails the install."""

    user_options = build_ext.user_options + [("mpicc=", None, "MPI C compiler wrapper")]

    def initialize_options(self) -> None:
        """Add ``mpicc`` (settable in setup.cfg's ``[build_ext]``)."""
        super().initialize_options()
        self.mpicc = None

    def _candidates(self) -> list:
        beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
        on_path = shutil.which("mpicc") or (beside if os.access(beside, os.X_OK) else None)
        return [("$MPIMESH_MPICC", os.environ.get("MPIMESH_MPICC")), ("$MPICC", os.environ.get("MPICC")),
                ("setup.cfg [build_ext] mpicc", self.mpicc), ("mpicc on PATH", on_path)]

    def build_extensions(self) -> None:
        """Build with the first MPI compiler wrapper found, or warn and skip."""
        if os.environ.get("MPIMESH_MPICC") == "none":
            self.warn("mpimesh._native not built: MPIMESH_MPICC=none")
            return None
        tried = []
        for where, value in self._candidates():
            argv = shlex.split(value or "")
            if argv and shutil.which(argv[0]):
                self.compiler.compiler_so[:1] = argv
                self.compiler.linker_so[:1] = argv
                return super().build_extensions()
            tried.append(f"{where} = {value!r} (not found)" if value else f"{where}: none")
        self.warn("mpimesh._native not built (CUDA-aware query falls back to ctypes): no MPI compiler wrapper "
                  f"found; tried {'; '.join(tried)}; set MPIMESH_MPICC=/path/to/mpicc and reinstall")


native = Extension(
    "mpimesh._native",
    sources=["native/_native.c", "native/cuda_aware.c", "native/wire.c", "native/pump.c", "native/post.c",
             "native/beat.c"],
    depends=["native/compat.h", "native/cuda_aware.h", "native/wire.h"],
    include_dirs=["native"],
    libraries=["dl"],
    # No MPI symbol is referenced directly: drop mpicc's -lmpi (see native/cuda_aware.c).
    extra_link_args=["-Wl,--as-needed"],
    optional=True,
)

setup(ext_modules=[native], cmdclass={"build_ext": BuildExt})
