"""Worker side of global-view tensors: each process holds a torch ``DTensor`` over a ``DeviceMesh`` of the mesh.

The controller's :mod:`._dtensor` sends these functions as ``remote``
commands of the engine (:mod:`._engine`), which resolves their tensor
arguments from its table and stores their results, so a failure here
poisons the results as any command's does.  torch's DTensor does the rest:
its per-operator sharding rules, and the collectives (all-gather,
reduce-scatter, all-to-all) that redistribution needs, over a
``torch.distributed`` process group of the mesh's processes.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication

from ..context import current_rank
from ._engine import resolve_op

__all__ = [
    "backend", "distribute_local", "full", "join_world", "leave_world", "listen", "redistribute", "run_op", "to_local",
]

#: Bytes of a store address as it travels back to the controller (a tensor of fixed shape).
ADDRESS_BYTES = 256

#: Seconds a collective may wait for its peers.  A command that fails on some processes only (a
#: value-dependent error) leaves the others in the next collective alone: they fail (and poison
#: their results) after this bound instead of torch's default 30 minutes.
COLLECTIVE_TIMEOUT = 300

#: This process's device mesh per controller mesh key, and the store rank 0 of a world serves.
_MESHES: dict[Any, DeviceMesh] = {}
_STORES: dict[Any, Any] = {}


def backend(device: str) -> str:
    """The torch.distributed backend of global-view tensors on ``device``: the one place it is chosen.

    gloo for CPU tensors, NCCL for CUDA ones (as ``mpimesh.spmd.default_backend``).
    """
    return "nccl" if device == "cuda" else "gloo"


def listen(key: Any, ranks: list[int], one_host: bool) -> torch.Tensor:
    """On the world's rank 0: serve its rendezvous store; its address as bytes (zeros elsewhere)."""
    answer = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    if ranks.index(current_rank().rank) != 0 or key in _MESHES:
        return answer
    host = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
    store = TCPStore(host, 0, len(ranks), is_master=True, wait_for_workers=False)
    _STORES[key] = store
    text = f"{host}:{store.port}".encode()
    answer[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    return answer


def join_world(key: Any, ranks: list[int], sizes: list[int], names: list[str], address: str,
               device: str) -> torch.Tensor:
    """Join the world of controller mesh ``key`` and make its device mesh (collective over the mesh).

    Raises:
        RuntimeError: this process is in another torch.distributed world already.
    """
    if key in _MESHES:
        return torch.zeros(0)
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
    dist.init_process_group(backend(device), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    mesh = torch.arange(world).view(sizes)
    _MESHES[key] = DeviceMesh(device, mesh, mesh_dim_names=tuple(names))
    # DTensor warns once per process that a reduction over two mesh dimensions takes two all-reduces
    # (every data-and-tensor-parallel gradient): a hint for SPMD scripts, noise in the controller's output.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return torch.zeros(0)


def leave_world(key: Any) -> torch.Tensor:
    """Leave the world of controller mesh ``key`` (the mesh is stopping): the process may join another."""
    if _MESHES.pop(key, None) is not None and dist.is_initialized():
        dist.destroy_process_group()
    _STORES.pop(key, None)
    return torch.zeros(0)


def distribute_local(key: Any, local: torch.Tensor, placements: tuple[Placement, ...]) -> DTensor:
    """``local`` (the same on every process) as a DTensor with ``placements``: each keeps its own piece."""
    mesh = _MESHES[key]
    return distribute_tensor(local.to(mesh.device_type), mesh, list(placements))


def run_op(name: str, *args: Any, **kwargs: Any) -> Any:
    """Operator ``name`` on DTensors: DTensor's dispatch shards it and communicates.

    Plain tensors among the arguments came from the controller and are the
    same on every process, so they count as replicated.
    """
    with implicit_replication():
        return resolve_op(name)(*args, **kwargs)


def full(t: DTensor) -> torch.Tensor:
    """The whole tensor on every process (an all-gather where it is sharded, an all-reduce where partial)."""
    return t.full_tensor()


def redistribute(t: DTensor, placements: tuple[Placement, ...]) -> DTensor:
    """``t`` with other placements, by DTensor's own redistribution."""
    return t.redistribute(t.device_mesh, list(placements))


def to_local(t: DTensor) -> torch.Tensor:
    """This process's piece of ``t``."""
    return t.to_local()
