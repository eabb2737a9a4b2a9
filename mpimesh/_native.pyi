"""Stub of the optional C extension ``mpimesh._native`` (sources in ``native/``).

Built by ``setup.py`` with the MPI compiler wrapper when one is found; it
does not link libmpi.  ``mpimesh._buffers.cuda_support`` falls back to ctypes
when it is missing.
"""

def cuda_compile_time() -> int:
    """1 if the MPI headers said CUDA-aware at build time, 0 if not, -1 if they do not say."""

def built_with() -> str:
    """Vendor and version of the MPI headers the extension was built with (``"Open MPI 5.0.11"``)."""

def cuda_run_time(libpath: str, /) -> tuple[int, str]:
    """Ask the already loaded libmpi at ``libpath``.

    Returns:
        (1 yes, 0 no, -1 no query function, -2 library not loaded; the name of the function used).
    """
