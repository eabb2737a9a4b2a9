"""The actor that gives each process of a mesh its torch.distributed (torchrun) environment."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from .._torchmpi import _world as _mpi_world
from ..actor import Actor, endpoint
from ..context import context
from ..errors import MeshInternalError
from . import _address

__all__ = ["SPMDActor", "world_env"]


def world_env(hosts: list[str], rank: int) -> dict[str, str]:
    """The torchrun variables of ``rank`` in a world whose rank ``r`` runs on ``hosts[r]`` (all but MASTER_*).

    Ranks are grouped by host in order of first appearance: ``GROUP_RANK``
    is the index of the rank's host, ``LOCAL_RANK`` its index among the
    world's ranks on that host and ``LOCAL_WORLD_SIZE`` their number.  For a
    ``host_mesh().spawn_procs(per_host={"gpus": G})`` mesh this is Monarch's
    rule (the last dimension is the local one); for a mesh of one host,
    whatever its dimensions, every rank is local (``LOCAL_RANK == RANK``), so
    that ``torch.cuda.set_device(LOCAL_RANK)`` never puts two ranks on one GPU.
    ``GROUP_WORLD_SIZE`` is the number of hosts.

    >>> world_env(["a", "a", "b", "b"], 3)["LOCAL_RANK"], world_env(["a", "a", "b", "b"], 3)["GROUP_RANK"]
    ('1', '1')
    """
    groups = list(dict.fromkeys(hosts))
    here = hosts[rank]
    local = [r for r, host in enumerate(hosts) if host == here]
    world_size = str(len(hosts))
    return {
        "RANK": str(rank),
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": str(local.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(groups.index(here)),
        "GROUP_WORLD_SIZE": str(len(groups)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world_size,
        "ROLE_NAME": "rank",
    }


def _check_master(master_addr: object, master_port: object) -> None:
    if not isinstance(master_addr, str) or not master_addr:
        raise TypeError(f"master_addr must be a non-empty str, got {master_addr!r}; e.g. '10.0.0.1'")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 0 < master_port < 65536:
        raise ValueError(f"master_port must be an int in 1..65535, got {master_port!r}; e.g. 29500")


class SPMDActor(Actor):
    """Sets torchrun's environment in its process and runs training scripts there, as ``torchrun`` would.

    The world is the process mesh the actor mesh was spawned on (a slice of
    a mesh is a world of its own): ``RANK`` is the process's rank in it,
    ``WORLD_SIZE`` its size, and ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_RANK``, ``GROUP_WORLD_SIZE`` follow the hosts the processes run
    on (see :func:`world_env`); ``ROLE_RANK``/``ROLE_WORLD_SIZE`` equal
    ``RANK``/``WORLD_SIZE`` and ``ROLE_NAME`` is ``"rank"``, as in Monarch.

    Example::

        actors = procs.spawn("spmd", SPMDActor)
        addr, port = actors.slice(gpus=0).get_host_port.call_one(None).get()
        actors.main.call(addr, port, ["train.py", "--lr", "0.01"]).get()
    """

    def __init__(self) -> None:
        me = context().actor_instance
        mesh = me.proc_mesh
        if mesh is None:
            raise MeshInternalError("internal error in mpimesh - please file a bug (SPMDActor has no proc_mesh)")
        # the hosts of the spawn mesh's processes, in its rank order
        self._env = world_env(mesh.hostnames, me.rank.rank)
        self._mesh, self._rank = mesh, me.rank.rank
        self._probe: _address.Probe | None = None

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """This host's address and a port that is free on it now.

        Args:
            use_ipaddr: None: the host name (as Monarch); ``"ipv4"`` or
                ``"ipv6"``: the host's first address of that family that is
                not loopback.

        Raises:
            ValueError: ``use_ipaddr`` is none of those.
            RuntimeError: the host has no such address.
        """
        return _address.host_address(_address.check_family(use_ipaddr)), _address.free_port()

    @endpoint
    def setup_env(self, master_addr: str, master_port: int, backend: str | None = None) -> None:
        """Set ``RANK``, ``WORLD_SIZE``, ... and ``MASTER_ADDR``/``MASTER_PORT`` in this process's environment.

        Afterwards ``torch.distributed.init_process_group(backend)`` (``init_method="env://"``,
        the default) joins the world.  ``backend="mpimesh"`` also registers
        the MPI backend here and makes ``default_backend()`` give it.

        Raises:
            TypeError, ValueError: ``master_addr`` is not a non-empty str, or ``master_port`` not a port number.
        """
        self._set_env(master_addr, master_port, backend)

    def _set_env(self, master_addr: str, master_port: int, backend: str | None = None) -> None:
        _check_master(master_addr, master_port)
        os.environ.update(self._env, MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        # the world's processes: the MPI backend watches them while a collective waits
        _mpi_world.remember(self._mesh, self._rank, backend)
        if backend == "mpimesh":
            from ._mpi_entry import register_mpi_backend

            register_mpi_backend()

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the environment (:meth:`setup_env`), then run a script in this process as ``torchrun`` would.

        ``script_args`` is ``["path/train.py", *args]`` or ``["-m", "pkg.train", *args]``:
        the script runs as ``__main__`` with ``sys.argv`` set to it (the
        module's file for ``-m``) and, for a path, the script's folder first on
        ``sys.path``; both are restored afterwards.  Blocks until the script
        returns.

        Returns:
            True once the script returned, or called ``sys.exit(0)``.

        Raises:
            ValueError: ``script_args`` names no script or module.
            RuntimeError: the script called ``sys.exit`` with another status.
            Exception: whatever the script raised (the caller gets it as ``ActorError``).
        """
        if (not isinstance(script_args, (list, tuple)) or not script_args
                or not all(isinstance(a, str) for a in script_args) or script_args[0] == "-m" and len(script_args) < 2):
            raise ValueError(
                f"script_args must be ['script.py', *args] or ['-m', 'module', *args], got {script_args!r}"
            )
        self._set_env(master_addr, master_port)
        saved_argv, saved_path = sys.argv, list(sys.path)
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *script_args[2:]]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                sys.path.insert(0, str(Path(script_args[0]).resolve().parent))
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise RuntimeError(f"script {' '.join(script_args)!r} exited with status {exc.code!r}") from exc
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
        return True

    # --- the rendezvous address probe: setup_torch_elastic_env calls these across hosts

    @endpoint
    def open_probe(self, use_ipaddr: str | None) -> tuple[list[str], int]:
        """Start listening on a spare port; returns the candidate MASTER_ADDRs of this host and that port."""
        if self._probe is not None:
            self._probe.close()
        self._probe = _address.Probe()
        return _address.candidates(use_ipaddr), self._probe.port

    @endpoint
    def reach(self, addrs: list[str], port: int) -> list[str] | None:
        """Those of ``addrs`` this host reaches at ``port``; None on all but the first process of a host."""
        if self._env["LOCAL_RANK"] != "0":
            return None
        return _address.reachable(addrs, port)

    @endpoint
    def close_probe(self) -> None:
        """Stop the listener that :meth:`open_probe` started."""
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def __cleanup__(self, exc: Exception | None) -> None:
        if self._probe is not None:
            self._probe.close()
