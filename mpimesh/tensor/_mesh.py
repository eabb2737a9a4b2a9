"""The process mesh as the tensor engine uses it: public methods of :class:`mpimesh.ProcMesh` only.

The engine sits above the meshes and ``proc_mesh`` reaches it lazily
(``procs.activate()``), so it names the mesh by what it calls rather than
importing it: no import circle, and no reach into a mesh's privates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..shape import Shape

__all__ = ["ProcMesh"]

T = TypeVar("T")


@runtime_checkable
class ProcMesh(Protocol):
    """A process mesh or a view of one (:class:`mpimesh.ProcMesh`)."""

    @property
    def mesh_id(self) -> tuple[int, int, int]:
        """The job-wide id of the processes of the mesh, the same for its views."""

    @property
    def view_shape(self) -> Shape:
        """This view's shape."""

    @property
    def addresses(self) -> list[tuple[int, int]]:
        """Each process's ``(MPI world, rank)``, in rank order."""

    def same_view(self, other: Any) -> bool:
        """Whether ``other`` is the same processes in the same shape."""

    def base_mesh(self) -> ProcMesh:
        """Every process of the mesh, flat."""

    def dead(self) -> dict[int, str]:
        """The processes known dead, by rank."""

    def slice(self, **dims: Any) -> ProcMesh:
        """A view along dimensions."""

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:
        """Actors on every process."""

    def attach(self, name: str, make: Callable[[], T], close: Callable[[T], None] | None = None) -> T:
        """The object ``name`` kept with these processes until the mesh stops."""
