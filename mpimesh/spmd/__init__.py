"""torch.distributed inside actors: a process mesh as a ``torchrun`` world (Monarch's ``monarch.spmd``).

``setup_torch_elastic_env(procs)`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ... on every process of
``procs``; actors there then call
``torch.distributed.init_process_group(default_backend())`` and run DDP or
FSDP code unchanged.  With ``setup_torch_elastic_env(procs, backend="mpimesh")``
(or :func:`init_mpi_process_group` in the actors) the world's collectives
run on MPI communicators of the mesh's processes instead of gloo's sockets:
a torch.distributed backend named ``"mpimesh"``.  ``SPMDActor.main`` runs a whole training script per
process instead, as ``torchrun`` does.  Importing this package does not
import torch.
"""

from ._actor import SPMDActor as SPMDActor
from ._mpi_entry import init_mpi_process_group as init_mpi_process_group
from ._mpi_entry import register_mpi_backend as register_mpi_backend
from ._setup import default_backend as default_backend
from ._setup import setup_torch_elastic_env as setup_torch_elastic_env
from ._setup import setup_torch_elastic_env_async as setup_torch_elastic_env_async

__all__ = ["SPMDActor", "default_backend", "init_mpi_process_group", "register_mpi_backend",
           "setup_torch_elastic_env", "setup_torch_elastic_env_async"]


def _fixup_module_metadata() -> None:
    # public objects name this package (shorter reprs, stable pickles), as mpimesh's own do
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("mpimesh.spmd."):
            obj.__module__ = "mpimesh.spmd"


_fixup_module_metadata()
del _fixup_module_metadata
