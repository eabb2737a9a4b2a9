"""Make a process mesh a torch.distributed world: ``setup_torch_elastic_env`` and the backend to use."""

from __future__ import annotations

import asyncio
from typing import Any

from .._torchmpi._world import backend_choice
from ..proc_mesh import ProcMesh
from ..value_mesh import ValueMesh
from ._actor import SPMDActor, _check_master
from ._address import check_family

__all__ = ["default_backend", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]

#: Seconds each step of the setup (an actor call) may take.
SETUP_TIMEOUT = 300.0

#: MASTER_ADDR of a world on one host: no name resolution, no firewall.
LOOPBACK = "127.0.0.1"


def default_backend() -> str:
    """``"cpu:gloo,cuda:nccl"`` where CUDA is available in this process, else ``"gloo"``; or the world's backend.

    As ``torch.distributed.init_process_group()`` with no backend picks:
    gloo for CPU tensors and nccl for CUDA ones, so that a script's CPU
    collectives still work on a GPU node (plain ``"nccl"`` refuses CPU
    tensors).  On a process that
    ``setup_torch_elastic_env(procs, backend="mpimesh")`` set up, it is
    ``"mpimesh"`` (collectives on MPI).  Imports torch.
    """
    chosen = backend_choice()
    if chosen is not None:
        return chosen
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def _check_mesh(proc_mesh: object) -> ProcMesh:
    if not isinstance(proc_mesh, ProcMesh):
        raise TypeError(
            f"setup_torch_elastic_env expects a ProcMesh, got {proc_mesh!r}; "
            "create one with this_host().spawn_procs(per_host={'gpus': N})"
        )
    if proc_mesh.stopped:
        raise RuntimeError(
            f"cannot make {proc_mesh!r} a torch.distributed world: it was stopped; "
            "create new processes with spawn_procs()"
        )
    return proc_mesh


def _master_addr(actors: Any, first: Any, proc_mesh: ProcMesh, family: str | None) -> str:
    """An address of rank 0's host that every process of the mesh reaches."""
    hosts = proc_mesh.host_mesh.hostnames
    if len(hosts) == 1:
        if family is None:
            return LOOPBACK
        addr, _ = first.get_host_port.call_one(family).get(SETUP_TIMEOUT)
        return str(addr)
    candidates, port = first.open_probe.call_one(family).get(SETUP_TIMEOUT)
    try:
        reached: ValueMesh[list[str] | None] = actors.reach.call(candidates, port).get(SETUP_TIMEOUT)
    finally:
        first.close_probe.call_one().get(SETUP_TIMEOUT)
    everywhere = [a for a in candidates if all(a in r for r in reached.values() if r is not None)]
    if not everywhere:
        raise RuntimeError(
            f"no address of rank 0's host {hosts[0]!r} is reachable from every host of {proc_mesh!r} "
            f"(tried {candidates}); pass master_addr= to setup_torch_elastic_env"
        )
    return str(everywhere[0])


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
    *,
    backend: str | None = None,
) -> None:
    """Make every process of ``proc_mesh`` a rank of one torch.distributed world, as ``torchrun`` would.

    Spawns an :class:`SPMDActor` on each process, sets ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` in their environment, and stops the
    actors again.  Afterwards an actor on those processes joins the world
    with ``torch.distributed.init_process_group(default_backend())``.  Blocks
    until every process is set up; calling it again (after
    ``destroy_process_group()``) gives a new port.

    The world is ``proc_mesh`` as given: a slice is a world of its own,
    ranked in the slice's order.  ``LOCAL_RANK`` counts the world's
    processes on the same host (for ``host_mesh()`` meshes: the last
    dimension, as in Monarch).

    Args:
        proc_mesh: the processes; rank 0 of the world is its first one.
        master_addr: where rank 0's rendezvous listens.  None: on one host,
            ``127.0.0.1``; across hosts, the first of rank 0's host name and
            addresses (loopback and link-local left out) that a process on
            every other host can connect to, tried then and there.
        master_port: None: a port free on rank 0's host.
        use_ipaddr: None, ``"ipv4"`` or ``"ipv6"``: give an address of that
            family rather than a name (on one host too).
        backend: what :func:`default_backend` gives on those processes:
            None (nccl or gloo by device), or a backend's name; ``"mpimesh"``
            also registers the MPI backend there, so that
            ``init_process_group("mpimesh")`` runs the world's collectives
            on MPI communicators of the mesh's processes (see
            :func:`init_mpi_process_group`).

    Raises:
        TypeError: ``proc_mesh`` is not a ProcMesh, ``master_addr`` or ``backend`` is not a str.
        ValueError: ``master_port`` or ``use_ipaddr`` is out of range.
        RuntimeError: ``proc_mesh`` was stopped, or no address of rank 0's
            host is reachable from every host.
    """
    mesh = _check_mesh(proc_mesh)
    family = check_family(use_ipaddr)
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise TypeError(f"backend must be None or a backend's name, got {backend!r}; e.g. 'mpimesh' or 'gloo'")
    if master_addr is not None or master_port is not None:
        _check_master("x" if master_addr is None else master_addr, 1 if master_port is None else master_port)
    actors: Any = mesh.spawn("_SPMDActor", SPMDActor)
    try:
        first = actors.slice(**dict.fromkeys(mesh.extent.labels, 0))
        if master_addr is None:
            master_addr = _master_addr(actors, first, mesh, family)
        if master_port is None:
            _, master_port = first.get_host_port.call_one(family).get(SETUP_TIMEOUT)
        actors.setup_env.call(master_addr, master_port, backend).get(SETUP_TIMEOUT)
    finally:
        actors.stop().get(SETUP_TIMEOUT)


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
    *,
    backend: str | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for ``async`` code: the event loop runs on meanwhile.

    The setup runs in a worker thread of the loop; same arguments, same errors.
    """
    await asyncio.to_thread(setup_torch_elastic_env, proc_mesh, master_addr, master_port, use_ipaddr,
                            backend=backend)
