"""The entry points of the ``"mpimesh"`` backend, callable without importing torch first."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

__all__ = ["MPI_BACKEND", "init_mpi_process_group", "register_mpi_backend"]

#: The backend's name: ``torch.distributed.init_process_group("mpimesh")``.
MPI_BACKEND = "mpimesh"


def register_mpi_backend() -> str:
    """Make ``"mpimesh"`` a torch.distributed backend in this process; returns ``"mpimesh"``.

    Afterwards ``torch.distributed.init_process_group("mpimesh")`` (and
    ``new_group(..., backend="mpimesh")``) run their collectives on MPI
    communicators of the world's processes.  ``setup_torch_elastic_env(procs,
    backend="mpimesh")`` calls it on every process of ``procs``; calling it
    again does nothing.  Imports torch.
    """
    from .._torchmpi import _backend

    return _backend.register()


def init_mpi_process_group(timeout: timedelta | None = None, **kwargs: Any) -> Any:
    """Join this process's torch.distributed world on the ``"mpimesh"`` (MPI) backend; returns the default group.

    Call it on every process of a mesh that ``setup_torch_elastic_env``
    made a world, in an actor (or a script run by ``SPMDActor.main``):
    it registers the backend and calls
    ``torch.distributed.init_process_group("mpimesh", timeout=timeout, **kwargs)``,
    which makes one MPI communicator among the world's processes (blocking
    until every rank has called it).  Then DDP, FSDP2, DTensor and
    DeviceMesh work as on gloo; ``destroy_process_group()`` ends it.

    Args:
        timeout: how long a collective may take before it raises
            (torch's default: 30 minutes).  A dead process of the world
            makes a pending collective raise at once, whatever the timeout.
        kwargs: passed on to ``init_process_group``.

    Raises:
        RuntimeError: this process has no torchrun environment (``RANK``
            unset); call ``setup_torch_elastic_env(procs)`` on the controller first.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("init_mpi_process_group needs RANK and WORLD_SIZE in the environment; "
                           "call mpimesh.spmd.setup_torch_elastic_env(procs) on the controller first")
    import torch.distributed as dist

    register_mpi_backend()
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(MPI_BACKEND, **kwargs)
    return dist.group.WORLD
