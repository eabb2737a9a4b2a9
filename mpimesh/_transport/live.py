"""Communicators over live processes after a death, where ``MPI_Comm_create_from_group`` is unsupported.

After a death, ULFM refuses ``MPI_Comm_create_group`` on a world that holds
a dead process, even for a group without it, so the tensor engine and the
``"mpimesh"`` torch.distributed world make their communicators with
``MPI_Comm_create_from_group`` (MPI 4: the group alone, under a string tag;
``_torchmpi._world.island_comm``).  Slurm's PMIx plugin (``srun
--mpi=pmix``) has no group construct: there that call raises
``MPI_ERR_UNSUPPORTED_OPERATION``.  This process finds that out once, from
the error class, and remembers it (:func:`create_from_group`).

Where it is unsupported, the world is shrunk to its live processes instead
(ULFM's ``MPIX_Comm_shrink``, :func:`shrink`): that is collective over every
live process of ``MPI_COMM_WORLD`` (the controller, every mesh's workers, the
spares), so the controller has each of them do it after a heal or a shrink
(the ``SHRINK`` frame, :func:`announce` first).  A group of live processes is
then made with ``MPI_Comm_create_group`` on the shrunk world, which holds no
dead process (:func:`create_group`), collective over the group's members only.

The shrink has a bound of its own: a live process that neither joins it nor
dies (a frozen one) would otherwise hold every other one in it until ULFM's
detector declares it dead, and forever where the detector is off.  It runs
on a thread of its own, joined with a bound; the caller holds
:func:`~.mpi.alone` meanwhile and lets it go at the bound, so that the wire
serves again beside a shrink that still waits (what it makes, if it ends
later, is installed then).  Open MPI 5.0.11's non-blocking
``MPIX_Comm_ishrink`` fails on a world that holds a dead process
(``MPI_ERR_INTERN``, "NBC_Progress: an error 75"), which is the only world
shrunk here.

``MPIMESH_FROM_GROUP=0`` makes this process take the construct as
unsupported, as under ``srun --mpi=pmix``: the tests run the shrink under a
plain ``mpiexec`` with it.  Every process of the job must see the same value,
and all of them must be of one launch (a pool, as under srun, where nothing
is spawned): the controller shrinks its own world only, and a spawned
island's communicators after a death then wait for a shrink that never comes
(``create_group``'s error).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import cast

from .mpi import MPI, alone

__all__ = ["announce", "create_from_group", "create_group", "from_group_supported", "shrink"]

_cond = threading.Condition()
#: whether ``MPI_Comm_create_from_group`` works here: None until a call has told
_supported: list[bool] = []
#: the world shrunk to its live processes, the last time it was (None before the first shrink)
_live: list[MPI.Intracomm] = []
#: shrinks announced (:func:`announce`) and not yet done here
_pending = [0]
#: shrink threads that outlived their bound (still in MPI_Comm_shrink, or ended late)
_late: list[threading.Thread] = []


def _forced_off() -> bool:
    """``MPIMESH_FROM_GROUP=0``: take ``MPI_Comm_create_from_group`` as unsupported (the srun fallback)."""
    return os.environ.get("MPIMESH_FROM_GROUP", "1").strip().lower() in ("0", "false", "no")


def create_from_group(group: MPI.Group, tag: str) -> MPI.Intracomm | None:
    """``MPI_Comm_create_from_group(group, tag)``; None where this MPI has no group construct (remembered).

    Made by the caller under :func:`~.mpi.alone` (Open MPI's activation
    beside the wire's polling).  Every member of ``group`` runs under the
    same launcher, so all of them get None together.

    Raises:
        mpi4py.MPI.Exception: any other failure of the call.
    """
    if _supported == [False]:
        return None
    if _forced_off():
        _supported[:] = [False]
        return None
    try:
        comm = MPI.Intracomm.Create_from_group(group, tag)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_UNSUPPORTED_OPERATION:
            raise
        _supported[:] = [False]
        return None
    _supported[:] = [True]
    return comm


def from_group_supported() -> bool:
    """Whether ``MPI_Comm_create_from_group`` works here; tried once on this process alone if no call has told.

    A failure of the try other than ``MPI_ERR_UNSUPPORTED_OPERATION`` says
    nothing about the construct: it counts as working (not remembered), and
    the communicators after a death raise their own errors as before.
    """
    if not _supported:
        group = MPI.COMM_SELF.Get_group()
        try:
            with alone():
                comm = create_from_group(group, "mpimesh:from-group-probe")
        except MPI.Exception:
            return True
        finally:
            group.Free()
        if comm is not None:
            comm.Free()
    return _supported == [True]


def announce() -> None:
    """A shrink of the world comes (the ``SHRINK`` frame arrived): :func:`create_group` waits for it."""
    with _cond:
        _pending[0] += 1


def shrink(timeout: float, members: Sequence[tuple[int, int]] = (), knob: str = "MPIMESH_SPAWN_TIMEOUT") -> None:
    """Shrink ``MPI_COMM_WORLD`` to its live processes; collective over every one of them, after :func:`announce`.

    Made under :func:`~.mpi.alone`, as every communicator after a death is.
    The previous shrunk world (it may hold a process dead since) is freed,
    errors ignored.

    Args:
        timeout: seconds the shrink may take: a live process that neither
            joins nor dies holds it until then.
        members: the processes that should join it (``(island, rank)``), for the error.
        knob: the setting ``timeout`` comes from, for the error.

    Raises:
        mpi4py.MPI.Exception: the shrink failed (the waiters are released).
        TimeoutError: it did not end within ``timeout`` seconds (the waiters
            are released, and the previous shrunk world is kept).
    """
    done = threading.Event()
    failure: list[MPI.Exception] = []

    def run() -> None:
        try:
            _install(cast(MPI.Intracomm, MPI.COMM_WORLD.Shrink()))
        except MPI.Exception as exc:
            failure.append(exc)
        finally:
            done.set()

    try:
        with alone():
            thread = threading.Thread(target=run, name="mpimesh-shrink-world", daemon=True)
            thread.start()
            ended = done.wait(timeout)
    finally:
        with _cond:
            _pending[0] -= 1
            _cond.notify_all()
    if failure:
        raise failure[0]
    if not ended:
        _late.append(thread)
        who = "among " + ", ".join(f"{i}.{r}" for i, r in members) if members else "of the world"
        raise TimeoutError(
            f"mpimesh: the world's shrink to its live processes (ULFM's MPI_Comm_shrink, made where "
            f"MPI_Comm_create_from_group is unsupported) did not end within {timeout:g} s ({knob}): "
            f"a live process {who} neither joined it nor died (frozen?); communicators made after this "
            f"death will fail; end or unfreeze that process, or raise {knob} if the shrink is only slow")


def _install(live: MPI.Intracomm) -> None:
    """``live`` is the shrunk world from now on; the previous one is freed, errors ignored."""
    with _cond:
        old = _live[:]
        _live[:] = [live]
        _cond.notify_all()
    for comm in old:
        try:
            comm.Free()
        except MPI.Exception:  # it held a process that died since: nothing to free it with
            pass


def create_group(group: MPI.Group, tag: int, timeout: float) -> MPI.Intracomm:
    """The communicator of ``group`` (processes of ``MPI_COMM_WORLD``, in order), made on the shrunk world.

    Collective over the members only.  Waits (up to ``timeout`` seconds,
    outside :func:`~.mpi.alone`) for a shrink announced here to end.

    Raises:
        RuntimeError: the world was never shrunk here, or a member of
            ``group`` is not among its live processes.
    """
    with _cond:
        if not _cond.wait_for(lambda: _pending[0] == 0 and bool(_live), timeout):
            raise RuntimeError(
                "mpimesh: this MPI cannot make a communicator from a group alone (MPI_Comm_create_from_group: "
                f"MPI_ERR_UNSUPPORTED_OPERATION, e.g. srun --mpi=pmix), and the world was not shrunk to its live "
                f"processes within {timeout:g} s (the controller has every process shrink it after a heal or shrink)")
        live = _live[0]
    live_group = live.Get_group()
    try:
        within = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), live_group)
    finally:
        live_group.Free()
    if MPI.UNDEFINED in within:
        raise RuntimeError(f"mpimesh: a member of the group is not a live process of the shrunk world ({within})")
    with alone():
        return live.Create_group(group, tag=tag)
