"""Boot: build a process's runtime and its role, and connect them.

Three ways in, one per kind of process, each a mirror of the others (as
mpi4py.futures' ``client_sync``/``server_sync``):

* :func:`boot_controller`, rank 0 (``python -m mpimesh``), or an embedded
  controller booted on first use (:func:`boot_embedded`, ``python script.py``);
* :func:`boot_pool`, ranks 1..N-1 of the launch world, collectively with the
  controller;
* :func:`boot_spawned`, a process created by ``MPI_Comm_spawn``, which waits
  for the controller's INIT.

Each joins its island with :func:`_join_island` and installs its runtime as
the process's (``_core.current``).  :func:`main_pool` and :func:`main_spawned`
are the workers' whole lives: boot, serve, finish.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from .._core import current as _current
from .._core import protocol
from .._core.runtime import Runtime, extend_sys_path
from .._data.windows import open_island
from .._launch import boot_beat
from .._transport import native, ulfm_beat
from .._transport.buffers import warm
from .._transport.frames import CONTROLLER
from .._transport.mpi import MPI, library, loaded_libmpi
from ..config import settings
from ..errors import MeshInternalError
from .controller import Controller
from .interactive import before_kernel_shutdown, interactive_session
from .liveness import start_last_words
from .worker import Worker, run

__all__ = ["boot_controller", "boot_embedded", "boot_pool", "boot_spawned", "main_pool", "main_spawned"]

_boot_lock = threading.Lock()


def _join_island(rt: Runtime, world: MPI.Intracomm, island: int) -> MPI.Intracomm:
    # The island's own communicator, for frames and for the data plane's
    # window (collective over the island's processes).  The thread that fed
    # ULFM's detector since MPI_Init ends first: no thread may poll while
    # this one makes a communicator (_launch/boot_beat.py).
    boot_beat.stop()
    comm = world.Dup()
    rt.router.add_island(comm, island)
    open_island(rt.router, comm, island)
    return comm


def _start_ulfm_beat() -> None:
    """ULFM's heartbeats from a C thread from now on, also while Python holds the GIL (``_transport/ulfm_beat.py``).

    It runs where ULFM's detector does (:func:`.boot_beat.wanted`), in every
    kind of process: a script, or an actor, may hold the GIL for seconds.
    It needs the native part built for the loaded MPI (the thread passes
    its ``MPI_Comm``), not its wire: under ``MPIMESH_WIRE=mpi4py`` too.
    """
    if not native.bind():
        try:
            from .. import _native
        except ImportError:  # no native part: the Python pollers alone feed the detector
            return
        if not native.same_mpi(_native.built_with(), library()):
            return
    ulfm_beat.start(loaded_libmpi(), MPI.COMM_SELF.handle)


def boot_controller(world: MPI.Intracomm, *, embedded: bool = False) -> Controller:
    """Start the controller on rank 0 of ``world``; collective with :func:`boot_pool`.

    Args:
        world: the launch world.
        embedded: booted on first use by a plain ``python script.py``: the
            job ends when the interpreter exits.
    """
    rt = Runtime(CONTROLLER)
    native.announce()  # once per job: the controller is rank 0, or the singleton
    comm = _join_island(rt, world, 0)
    _start_ulfm_beat()
    infos = comm.allgather((rt.host, rt.pid))
    comm.bcast(list(sys.path), root=0)
    controller = Controller(rt, [((0, r), host, pid) for r, (host, pid) in enumerate(infos) if r > 0])
    rt.open_bell()
    _current.install(rt)
    controller.start()
    if embedded:
        atexit.register(controller.end.at_exit)
        # In a Jupyter kernel, stop the workers before ipykernel signals its children (README, "Notebooks").
        before_kernel_shutdown(lambda: controller.end.shutdown(0))
        if interactive_session():
            rt.progress.main_thread_polls = False  # an interrupt must not land between a receive and its dispatch
    return controller


def boot_embedded() -> Runtime:
    """The runtime of a ``python script.py``: an embedded controller, booted once.

    Raises:
        RuntimeError: a rank other than 0 of a multi-rank world runs the
            controller script (it was not started with ``-m mpimesh``).
    """
    with _boot_lock:
        if _current.runtime is None:
            world = MPI.COMM_WORLD
            if world.Get_size() > 1:
                raise RuntimeError(
                    f"rank {world.Get_rank()} of {world.Get_size()} runs the controller script: every rank of "
                    f"this job started it; launch it with `mpirun -n {world.Get_size()} python -m mpimesh "
                    f"{os.path.basename(sys.argv[0]) or 'script.py'}` so that rank 0 runs it and the others serve"
                )
            boot_controller(world, embedded=True)
        rt = _current.runtime
    if rt is None:
        raise MeshInternalError("the embedded controller booted without installing its runtime")
    return rt


def boot_pool(world: MPI.Intracomm) -> Worker:
    """Start a launch-pool worker; collective with :func:`boot_controller`."""
    rt = Runtime((0, world.Get_rank()))
    worker = Worker(rt)
    comm = _join_island(rt, world, 0)
    _start_ulfm_beat()
    rt.router.set_relay(0)
    infos = comm.allgather((rt.host, rt.pid))
    rt.controller_host, rt.controller_pid = infos[0]
    if rt.controller_host != rt.host:
        warm(settings.recv_warm_bytes)  # for the first large argument (docs/design/data.md)
    start_last_words(rt.controller_pid, rt.addr)
    rt.open_bell()
    extend_sys_path(comm.bcast(None, root=0))
    _current.install(rt)
    return worker


def boot_spawned(island: int) -> Worker:
    """Start a spawned worker and wait for the controller's INIT.

    Raises:
        RuntimeError: this process was not spawned by an mpimesh controller.
        TimeoutError: no INIT within ``MPIMESH_SPAWN_TIMEOUT``.
    """
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise RuntimeError("mpimesh --worker must be started by MPI_Comm_spawn from an mpimesh controller")
    world = MPI.COMM_WORLD
    rt = Runtime((island, world.Get_rank()))
    worker = Worker(rt, spawned=True)
    _join_island(rt, world, island)
    _start_ulfm_beat()
    rt.router.add_parent(parent)
    _current.install(rt)
    if not rt.wait(lambda: worker.initialized, rt.cond, settings.spawn_timeout):
        raise TimeoutError(f"spawned worker {rt.addr} got no INIT from the controller in {settings.spawn_timeout:g} s")
    start_last_words(rt.controller_pid, rt.addr)
    rt.open_bell()
    rt.send(CONTROLLER, protocol.hello(rt.host, rt.pid))
    return worker


def main_pool(world: MPI.Intracomm) -> int:
    """Entry of ranks 1..N-1 of the launch world; returns the exit status."""
    return run(lambda: boot_pool(world))


def main_spawned(island: int) -> int:
    """Entry of a process created with ``MPI_Comm_spawn``; returns the exit status."""
    return run(lambda: boot_spawned(island))
