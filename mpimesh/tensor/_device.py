"""Which CUDA device a tensor-engine worker uses: its local rank's, on a node of several GPUs.

A worker that never chooses uses ``cuda:0``, so on a node of 8 GPUs every
worker of the node shared the first.  Where the engine and the global-tensor
worker side first touch CUDA, :func:`use_local_device` sets torch's current
device to ``cuda:{local_rank % device_count}``, unless the user chose
already: ``CUDA_VISIBLE_DEVICES`` naming one device, or a current device set
by a bootstrap (``torch.cuda.set_device``).  The local rank is the launcher's
(:data:`LOCAL_RANK_VARIABLES`); without one nothing is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["LOCAL_RANK_VARIABLES", "local_device", "use_local_device"]

#: Where launchers put a process's rank among those of its node: Open MPI, MPICH and Intel MPI, Slurm.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")

_chosen = False  # use_local_device ran in this process


def local_device(environ: Mapping[str, str], device_count: int, current: int) -> int | None:
    """The index of the CUDA device this process should use, or ``None``: leave torch's as it is.

    Args:
        environ: the process's environment (the local rank, ``CUDA_VISIBLE_DEVICES``).
        device_count: the CUDA devices this process sees.
        current: torch's current device now (not 0: a bootstrap chose it).
    """
    if device_count <= 1 or current != 0:
        return None
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) == 1:
        return None
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value) % device_count
    return None


def use_local_device() -> None:
    """Set torch's current CUDA device to :func:`local_device`'s choice, once per process."""
    global _chosen
    if _chosen:
        return
    _chosen = True
    import torch

    if not torch.cuda.is_available():
        return
    # Only set_device or a CUDA call initialises CUDA: not initialised, nobody chose (and none is made here).
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0  # type: ignore[no-untyped-call]
    index = local_device(os.environ, torch.cuda.device_count(), current)
    if index is not None:
        torch.cuda.set_device(index)
