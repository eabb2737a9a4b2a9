"""A device mesh by shape and dimension names: ``Mesh(shape=(4, 2), mesh_dim_names=("dp", "tp"))``.

The product brief's entry point (``from monarch.distributed import Mesh``):
a :class:`Mesh` is a :class:`~mpimesh.ProcMesh` of the job's processes laid
out in the given shape, so it spawns actors, activates and slices as any
process mesh does.  Tensors placed on it with ``sharding_spec=`` or
placements (:func:`distribute`, :class:`DTensor`) appear as one global
tensor, and :func:`module_to_mesh` puts a ``torch.nn.Module`` on it; those
names load the tensor engine (and torch) on first use, as ``mpimesh``'s own
tensor names do, so importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._core import calls as _calls
from .proc_mesh import ProcMesh
from .shape import Shape

# the names but Mesh load on first use (__getattr__ below)
__all__ = ["DTensor", "Mesh", "Partial", "Replicate", "Shard", "distribute", "module_to_mesh"]  # noqa: F822

#: The names this module takes from the tensor engine on first use (they import torch).
_TENSOR = ("DTensor", "Partial", "Replicate", "Shard", "distribute", "module_to_mesh")


class Mesh(ProcMesh):
    """The job's processes as a mesh of ``shape`` with dimensions ``mesh_dim_names``; blocks until ready.

    ``Mesh(shape=(4, 2), mesh_dim_names=("dp", "tp"))`` takes 8 processes:
    the launch pool's free ranks first, spawned ones for the rest, as
    :meth:`HostMesh.spawn_procs` does.  When the job spans several hosts and
    their number divides the first dimension, each host gets an equal block
    of it (``dp`` rows 0-1 on the first host, 2-3 on the second: a
    data-parallel group's tensor-parallel peers share a host); otherwise all
    processes are on the controller's host.  It is a :class:`ProcMesh`:
    ``spawn``, ``activate``, ``slice`` and ``stop`` work as on any, and its
    slices are plain process meshes.

    Args:
        shape: the size of each dimension, e.g. ``(4, 2)``.
        mesh_dim_names: one name per dimension, e.g. ``("dp", "tp")``;
            None: ``dim0``, ``dim1``, ...

    Raises:
        TypeError: ``shape`` is not a sequence of ints, or a name is not a str.
        ValueError: a size below 1, names that repeat or do not match ``shape``.
        RuntimeError: the pool has no room and MPI could not spawn processes.
    """

    def __init__(self, shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None) -> None:
        sizes, names = _check(shape, mesh_dim_names)
        total = math.prod(sizes)
        hosts = _calls.job_hosts()
        if len(hosts) > 1 and sizes[0] % len(hosts) == 0:
            key, addrs, where = _calls.allocate_procs(total // len(hosts), list(hosts))
        else:
            key, addrs, where = _calls.allocate_procs(total, [hosts[0]])
        super().__init__(Shape.row_major(names, sizes), tuple(addrs), tuple(where), key=key, owned=True)
        _calls.own_procs(key, repr(self), self.stop)

    def __repr__(self) -> str:
        return f"Mesh({self._sizes_repr()})"

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The dimension names, in order (as ``torch.distributed.DeviceMesh.mesh_dim_names``)."""
        return self._shape.labels

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._shape.labels)


def _check(shape: object, names: object) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"Mesh: expecting shape as a tuple of ints, got {shape!r}; e.g. Mesh(shape=(4, 2))")
    sizes = tuple(shape)
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"Mesh: expecting sizes of at least 1, got shape={sizes!r}")
    if names is None:
        return sizes, tuple(f"dim{i}" for i in range(len(sizes)))
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"Mesh: expecting mesh_dim_names as a tuple of str, got {names!r}; e.g. mesh_dim_names=('dp', 'tp')"
        )
    labels = tuple(names)
    if len(labels) != len(sizes):
        raise ValueError(f"Mesh: expecting {len(sizes)} mesh_dim_names for shape {sizes!r}, got {len(labels)}")
    if len(set(labels)) != len(labels) or not all(labels):
        raise ValueError(f"Mesh: expecting distinct non-empty mesh_dim_names, got {labels!r}")
    return sizes, labels


def __getattr__(name: str) -> object:
    # PEP 562, as mpimesh's own: the global-view tensor names import torch, so they load on first use.
    if name in _TENSOR:
        from . import tensor

        return getattr(tensor, name)
    raise AttributeError(f"module 'mpimesh.distributed' has no attribute {name!r}")
