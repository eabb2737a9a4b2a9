"""Global-view tensors through a death and a heal: the errors the controller raises, with their fixes.

A global tensor's operations are collectives over every process of its mesh,
so a death fails them all: the workers' collectives fail at once (the
``"mpimesh"`` backend watches the world's processes) and the next value the
script fetches raises :class:`~mpimesh.SupervisionError`, as a fetch from a
dead process of a per-process tensor does.  After ``heal_mesh(mesh)`` the
workers' torch.distributed world is made again over the new members on the
next use (:func:`mpimesh.tensor._dtensor._ensure_world`, by the client's
heal count), a piece that only the dead process held raises when used, and
:func:`~._broadcast.broadcast_` copies replicated tensors (parameters,
optimizer state over ``dp``) to the replacements (docs/design/tensor.md,
"Heal").
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import RemoteTensorError, SupervisionError

if TYPE_CHECKING:
    from ._client import MeshClient
    from ._mesh import ProcMesh

__all__ = ["Joined", "check_lost", "failure", "replicated_dims"]

#: Seconds a failed fetch waits for the controller to hear of the death its workers saw first.
_DEATH_NEWS_S = 2.0
#: What a collective's failure says when a member may have died: the backend's own word, or MPI's error
#: (under srun MPI often fails the collective first: a scatter's ``MPI_ERR_IN_STATUS``, 1 run in 4).
_DEATH_HINTS = ("died", "MPI_ERR_PROC_FAILED", "MPI_ERR_IN_STATUS", "MPI_ERR_REVOKED")


class Joined:
    """The workers' torch.distributed world of a mesh, attached to it (``ProcMesh.attach``).

    It follows a heal (``follow_heal``) rather than being closed by it: the
    survivors' DTensors stay, and the world is made again on the next use.

    Args:
        key: the world's key.
        leave: makes the workers leave it (the mesh stops).
    """

    def __init__(self, key: Any, leave: Any) -> None:
        self.key = key
        self.leave = leave

    def follow_heal(self, reports: dict[int, str], addrs: tuple[tuple[int, int], ...]) -> None:
        """The mesh was healed: nothing to do now (the client's heal count makes the world again on next use)."""

    def close(self) -> None:
        """The mesh stops: its processes leave the world."""
        self.leave(self.key)


def replicated_dims(t: Any) -> list[str]:
    """The mesh dimensions over which ``t`` (a global tensor) is replicated: a survivor there holds its piece."""
    labels = t._procs.view_shape.labels
    return [label for label, p in zip(labels, t.placements, strict=True) if p.is_replicate()]


def check_lost(procs: ProcMesh, client: MeshClient, tensors: Iterable[Any], what: str) -> None:
    """Raise if a global tensor among ``tensors`` lost its piece on a process that replaced a dead one.

    Raises:
        SupervisionError: naming the tensor and the fix: ``broadcast_``
            over the dimensions it is replicated on, or making it again
            where its piece lived on the dead process only.
        ValueError: the tensor was made before its mesh shrank (global
            tensors do not follow a shrink).
    """
    for t in tensors:
        if t._spec.mesh.size() != len(procs.view_shape):
            raise ValueError(
                f"tensor engine: {what}: {t!r} was placed over the mesh before it shrank, and global tensors do "
                "not follow ProcMesh.shrink(); heal the mesh instead (mpimesh.heal_mesh(mesh)), or make them "
                "again on the shrunk mesh (mpimesh.distribute(...), module_to_mesh(...))")
        try:
            client.check_use(procs, [t], what)
        except SupervisionError as exc:
            text, _, _ = str(exc).rpartition("; copy it there from a survivor first")
            dims = replicated_dims(t)
            if dims:
                fix = (f"; copy it there from a survivor first (it is replicated over {dims}): "
                       f"mpimesh.tensor.broadcast_(t, {tuple(dims)!r})")
            else:
                fix = (f"; its piece lived on the dead process only ({t.placements}): make it again, e.g. "
                       "mpimesh.distribute(local, mesh, sharding_spec=...) from a checkpoint")
            raise SupervisionError(text + fix, endpoint=what) from None


def failure(procs: ProcMesh, what: str, exc: RemoteTensorError) -> Exception:
    """The error a failed fetch of a global tensor raises: :class:`SupervisionError` when a process died.

    A collective of the mesh failed on the workers because a member died
    (the backend saw it first; the controller hears within a heartbeat):
    the script gets the same error as for a fetch from a dead process, with
    the fix.  Any other failure is ``exc`` itself.
    """
    text = str(exc)
    deadline = time.monotonic() + (_DEATH_NEWS_S if any(hint in text for hint in _DEATH_HINTS) else 0.0)
    while True:
        dead = procs.dead()
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if not dead:
        return exc
    cause = dead[min(dead)]
    return SupervisionError(
        f"tensor engine: {what}: a process of {procs!r} died during a collective of its global tensors: {cause}; "
        "heal the mesh (mpimesh.heal_mesh(mesh)) and copy replicated state to the replacements "
        "(mpimesh.tensor.broadcast_(tensors)), or go on with new processes", endpoint=what)
