"""Stub of the optional C extension ``mpimesh._native`` (sources in ``native/``).

Built by ``setup.py`` with the MPI compiler wrapper when one is found; it
does not link libmpi.  Without it, ``mpimesh._buffers.cuda_support`` falls
back to ctypes and the router (``mpimesh._wire``) to mpi4py's calls.
"""

from typing import Any

def cuda_compile_time() -> int:
    """1 if the MPI headers said CUDA-aware at build time, 0 if not, -1 if they do not say."""

def built_with() -> str:
    """Vendor and version of the MPI headers the extension was built with (``"Open MPI 5.0.11"``)."""

def wire_bind(libpath: str, byte_handle: int, exc_type: type[BaseException], /) -> None:
    """Look up the frame path's MPI functions in the libmpi already loaded at ``libpath`` (see native/wire.c).

    Raises:
        OSError: the library is not loaded, or lacks a function.
    """

def wire_probe(handles: tuple[int, ...], tag: int, spin_ns: int, /) -> tuple[int, int, Any] | None:
    """Receive one message of ``tag`` from any source of the communicators ``handles``.

    Probes twice, then up to ``spin_ns`` more with the GIL released; a
    negative ``spin_ns`` probes once.

    Returns:
        None (nothing arrived), (link index, source, bytes), or (link index, -1, MPI error code).
    """

def wire_isend(handle: int, data: bytes, dest: int, tag: int, /) -> int | None:
    """Start a send on communicator ``handle`` and test it once.

    Returns:
        None when it is complete, else the request's handle (keep ``data`` alive until it completes).

    Raises:
        mpi4py.MPI.Exception: the MPI call failed.
    """

def cuda_run_time(libpath: str, /) -> tuple[int, str]:
    """Ask the already loaded libmpi at ``libpath``.

    Returns:
        (1 yes, 0 no, -1 no query function, -2 library not loaded; the name of the function used).
    """
