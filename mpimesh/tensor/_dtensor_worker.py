"""Worker side of global-view tensors: each process holds a torch ``DTensor`` over a ``DeviceMesh`` of the mesh.

The controller's :mod:`._dtensor` sends these functions as ``remote``
commands of the engine (:mod:`._engine`), which resolves their tensor
arguments from its table and stores their results, so a failure here
poisons the results as any command's does.  torch's DTensor does the rest:
its per-operator sharding rules, and the collectives (all-gather,
reduce-scatter, all-to-all) that redistribution needs, over a
``torch.distributed`` process group of the mesh's processes: on CPU the
``"mpimesh"`` backend (MPI communicators of those processes, with the
job's failure detection), NCCL on CUDA; ``MPIMESH_DTENSOR_BACKEND`` names
another (e.g. ``gloo``).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication

from .._torchmpi import _backend as _mpi
from .._torchmpi import _world as _mpi_world
from ..context import current_rank
from ._device import use_local_device
from ._engine import resolve_op
from ._op_rules import by_decomposition, decomposed

__all__ = [
    "BACKEND_VARIABLE", "backend", "bucket_finish", "bucket_start", "contiguous_stride", "distribute_local",
    "from_local", "full",
    "join_world", "leave_world", "listen", "redistribute", "run_op", "to_local",
]

#: The environment variable that names the backend of global-view tensors instead (read on each worker).
BACKEND_VARIABLE = "MPIMESH_DTENSOR_BACKEND"

#: Bytes of a store address as it travels back to the controller (a tensor of fixed shape).
ADDRESS_BYTES = 256

#: Seconds a collective may wait for its peers.  A command that fails on some processes only (a
#: value-dependent error) leaves the others in the next collective alone: they fail (and poison
#: their results) after this bound instead of torch's default 30 minutes.
COLLECTIVE_TIMEOUT = 300

#: This process's device mesh per controller mesh key, the store rank 0 of a world serves, and the
#: world's processes as the MPI backend watches them (the controller's mesh view).
_MESHES: dict[Any, DeviceMesh] = {}
_STORES: dict[Any, Any] = {}
_MEMBERS: dict[Any, Any] = {}
#: The heals of each controller mesh this process's world was made after (:func:`join_world`).
_GENERATION: dict[Any, int] = {}
#: Gradient buckets whose all-reduce runs: the flat tensor's id -> its work and the mesh dimensions left.
_BUCKETS: dict[int, tuple[Any, list[int]]] = {}


def backend(device: str) -> str:
    """The torch.distributed backend of global-view tensors on ``device``: the one place it is chosen.

    ``MPIMESH_DTENSOR_BACKEND`` where set (``gloo``, ``nccl``, ``mpimesh``);
    else NCCL for CUDA tensors where torch has it, and the ``"mpimesh"``
    backend (MPI) for the rest: 1.2-4.5x faster than gloo for 4 KiB to
    1 MiB, and a dead process fails a pending collective at once.
    """
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip()
    if not chosen:
        chosen = "nccl" if device == "cuda" and dist.is_nccl_available() else _mpi.BACKEND
    if chosen == _mpi.BACKEND:
        _mpi.register()
    return chosen


def listen(key: Any, ranks: list[int], one_host: bool, generation: int) -> torch.Tensor:
    """On the world's rank 0: serve its rendezvous store; its address as bytes (zeros elsewhere).

    ``generation`` counts the heals of the mesh: a world made before the
    last heal is made again (:func:`join_world`), with a store of its own.
    """
    answer = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    if ranks.index(current_rank().rank) != 0 or _GENERATION.get(key) == generation:
        return answer
    host = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
    store = TCPStore(host, 0, len(ranks), is_master=True, wait_for_workers=False)
    _STORES[key] = store
    text = f"{host}:{store.port}".encode()
    answer[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    return answer


def join_world(key: Any, ranks: list[int], sizes: list[int], names: list[str], address: str,
               device: str, generation: int, tag: str, procs: Any) -> torch.Tensor:
    """Join the world of controller mesh ``key`` and make its device mesh (collective over the mesh).

    After a heal (``generation`` is new here) the survivors leave the world
    they were in, whose communicators hold a dead process, and every process
    joins a new one over the mesh's members now; ``tag`` (not empty after a
    death) has the communicators made from the group alone.  A survivor's
    device mesh stays the same object, its process groups replaced by the
    new world's, so the DTensors it holds go on over the new members.
    ``procs`` (the controller's mesh view as it is now, world rank ``r`` its
    rank ``r``) is what the MPI backend watches: a dead member fails the
    pending collectives (this process's own reference to the mesh still
    names the dead processes after a heal).

    Raises:
        RuntimeError: this process is in another torch.distributed world already.
    """
    if _GENERATION.get(key) == generation:
        return torch.zeros(0)
    old = _MESHES.get(key)
    if old is not None:
        _leave_broken(key)
    rank, world = ranks.index(current_rank().rank), len(ranks)
    if dist.is_initialized():
        raise RuntimeError(
            f"global-view tensors: this process already belongs to a torch.distributed world of size "
            f"{dist.get_world_size()}, and a process can be in one only; put global tensors on a mesh of new "
            "processes (mpimesh.distributed.Mesh(...))"
        )
    host, _, port = address.rpartition(":")
    store = _STORES.get(key)
    if store is None:
        store = TCPStore(host, int(port), world, is_master=False)
    _mpi_world.remember(procs, rank, None, tag)
    _MEMBERS[key] = procs
    use_local_device()  # NCCL and the device mesh use the current device
    dist.init_process_group(backend(device), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    mesh = DeviceMesh(device, torch.arange(world).view(sizes), mesh_dim_names=tuple(names))
    if old is not None:
        # DTensors hold their device mesh, which finds its process groups by name at each use:
        # the survivor's mesh object takes the new world's groups, and its DTensors follow.
        old._dim_group_names = mesh._dim_group_names
        old._pg_registry = mesh._pg_registry
        mesh = old
    _MESHES[key] = mesh
    _GENERATION[key] = generation
    # DTensor warns once per process that a reduction over two mesh dimensions takes two all-reduces
    # (every data-and-tensor-parallel gradient): a hint for SPMD scripts, noise in the controller's output.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return torch.zeros(0)


def leave_world(key: Any) -> torch.Tensor:
    """Leave the world of controller mesh ``key`` (the mesh is stopping): the process may join another."""
    _GENERATION.pop(key, None)
    if _MESHES.pop(key, None) is not None:
        _leave_broken(key)
    _STORES.pop(key, None)
    return torch.zeros(0)


def _leave_broken(key: Any) -> None:
    """Destroy this process's world of ``key``, which may hold a dead process: nothing here waits for the others."""
    _BUCKETS.clear()  # their all-reduces ran on the old groups: failed, or never waited for now
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: S110  (a communicator with a dead member may not free: the world is gone anyway)
            pass
    members = _MEMBERS.pop(key, None)
    if members is not None:
        _mpi_world.forget(members)


def distribute_local(key: Any, local: torch.Tensor, placements: tuple[Placement, ...]) -> DTensor:
    """``local`` (the same on every process) as a DTensor with ``placements``: each keeps its own piece."""
    mesh = _MESHES[key]
    return distribute_tensor(local.to(mesh.device_type), mesh, list(placements))


def run_op(name: str, *args: Any, **kwargs: Any) -> Any:
    """Operator ``name`` on DTensors: DTensor's dispatch shards it and communicates.

    Plain tensors among the arguments came from the controller and are the
    same on every process, so they count as replicated.
    """
    op = resolve_op(name)
    with implicit_replication():
        if by_decomposition(op):  # no DTensor rule: its kernel would see the pieces' shapes (._op_rules)
            return decomposed(op, *args, **kwargs)
        return op(*args, **kwargs)


def from_local(key: Any, local: torch.Tensor, placements: tuple[Placement, ...], shape: torch.Size,
               stride: tuple[int, ...]) -> DTensor:
    """This process's piece ``local`` as its share of a DTensor of ``shape`` (``broadcast_`` of a global tensor)."""
    return DTensor.from_local(local, _MESHES[key], list(placements), run_check=False, shape=shape, stride=stride)


def full(t: DTensor) -> torch.Tensor:
    """The whole tensor on every process (an all-gather where it is sharded, an all-reduce where partial)."""
    return t.full_tensor()


def redistribute(t: DTensor, placements: tuple[Placement, ...]) -> DTensor:
    """``t`` with other placements, by DTensor's own redistribution."""
    return t.redistribute(t.device_mesh, list(placements))


def to_local(t: DTensor) -> torch.Tensor:
    """This process's piece of ``t``."""
    return t.to_local()


def bucket_start(grads: list[DTensor], dims: list[int]) -> torch.Tensor:
    """Start summing a bucket of gradients, partial over mesh dimensions ``dims``, without waiting (DDP's bucket).

    The gradients' local pieces are copied one after another into one flat
    tensor, which is all-reduced in place over the first dimension's process
    group (``async_op=True``): the engine runs the rest of the backward pass
    meanwhile.  Returns the flat tensor, for :func:`bucket_finish`.
    """
    flat = torch.cat([g._local_tensor.reshape(-1) for g in grads])
    group = grads[0].device_mesh.get_group(dims[0])
    _BUCKETS[id(flat)] = (dist.all_reduce(flat, group=group, async_op=True), dims[1:])
    return flat


def bucket_finish(flat: torch.Tensor, grads: list[DTensor], placements: list[tuple[Placement, ...]]) -> list[DTensor]:
    """Wait for a bucket's sum (:func:`bucket_start`); each gradient, summed, as a DTensor with ``placements``.

    The gradients are views of the flat tensor (DDP's ``gradient_as_bucket_view``): no copy back.

    Raises:
        RuntimeError: the bucket's all-reduce was never started here, or failed.
    """
    started = _BUCKETS.pop(id(flat), None)
    if started is None:
        raise RuntimeError("gradient bucket: its all-reduce was not started on this process")
    work, rest = started
    work.wait()
    mesh = grads[0].device_mesh
    for dim in rest:  # a second data-parallel dimension: summed in turn, as DTensor's redistribution does
        dist.all_reduce(flat, group=mesh.get_group(dim))
    out, offset = [], 0
    for grad, placement in zip(grads, placements, strict=True):
        local = grad._local_tensor
        piece = flat[offset:offset + local.numel()].view(local.shape)
        offset += local.numel()
        out.append(DTensor.from_local(piece, mesh, placement, run_check=False, shape=grad.shape,
                                      stride=contiguous_stride(grad.shape)))
    return out


def contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (a bucket's gradients are, whatever the backward gave)."""
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))
