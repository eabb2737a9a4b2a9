"""The tensor engine: torch tensors that live on every process of a mesh, driven from the controller.

Inside ``with procs.activate():`` torch calls run on every process of
``procs``, each over its own local tensors, and return :class:`Tensor`
handles at once; ``fetch_shard`` brings a value back; ``reduce`` runs MPI
collectives over mesh dimensions; autograd and optimizers work through the
handles; after ``procs.heal()``, ``broadcast_`` copies replicated tensors from a
survivor to the replacements.  Importing this package imports torch; ``import mpimesh`` does not
(its tensor names load this package on first use, and ``ProcMesh`` reaches
it through ``activate``, ``rank_tensor`` and ``rank_tensors`` only).
"""

from ._broadcast import broadcast_ as broadcast_
from ._distribute import distribute as distribute
from ._distribute import gather as gather
from ._dtensor import DTensor as DTensor
from ._fetch import fetch_shard as fetch_shard
from ._fetch import inspect as inspect
from ._fetch import rank_tensor as rank_tensor
from ._fetch import rank_tensors as rank_tensors
from ._handle import Tensor as Tensor
from ._handle import activate as activate
from ._handle import active_mesh as get_active_mesh
from ._handle import no_mesh as no_mesh
from ._module import module_to_mesh as module_to_mesh
from ._placements import Partial as Partial
from ._placements import Replicate as Replicate
from ._placements import Shard as Shard
from ._reduce import reduce as reduce
from ._reduce import reduce_ as reduce_
from ._remote import Remote as Remote
from ._remote import remote as remote

__all__ = [
    "DTensor",
    "Partial",
    "Remote",
    "Replicate",
    "Shard",
    "Tensor",
    "activate",
    "broadcast_",
    "distribute",
    "fetch_shard",
    "gather",
    "get_active_mesh",
    "inspect",
    "module_to_mesh",
    "no_mesh",
    "rank_tensor",
    "rank_tensors",
    "reduce",
    "reduce_",
    "remote",
]


#: The names ``mpimesh`` re-exports (its ``_TENSOR``): they report module ``mpimesh``, as its own do.
_REEXPORTED = (
    "DTensor", "Partial", "Remote", "Replicate", "Shard", "Tensor", "broadcast_", "distribute", "fetch_shard", "gather",
    "get_active_mesh", "inspect", "module_to_mesh", "no_mesh", "reduce", "reduce_", "remote",
)


def _fixup_module_metadata() -> None:
    for name in _REEXPORTED:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("mpimesh."):
            obj.__module__ = "mpimesh"


_fixup_module_metadata()
del _fixup_module_metadata
