"""``distribute`` and ``gather``: a controller tensor split over mesh dimensions, and back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from .._waits import Countdown
from ..future import Future
from ..rma import empty_like_fast
from . import _mesh
from ._client import client_of
from ._commands import PUT
from ._fetch import fetch_shard
from ._handle import Tensor, mesh_tensor, site
from ._placements import Replicate, Shard

if TYPE_CHECKING:
    from ._mesh import ProcMesh

__all__ = ["Replicate", "Shard", "distribute", "gather"]


Placement = Shard | Replicate


def _check(local: Any, procs: Any, placements: Sequence[Placement]) -> tuple[Placement, ...]:
    if not isinstance(local, torch.Tensor) or isinstance(local, Tensor):
        raise TypeError(f"distribute: expected a local torch.Tensor, got {type(local).__name__}")
    if not isinstance(procs, _mesh.ProcMesh):
        raise TypeError(f"distribute: expected a ProcMesh, got {type(procs).__name__}")
    labels = procs.view_shape.labels
    placements = tuple(placements)
    if len(placements) != len(labels):
        raise ValueError(
            f"distribute: {procs!r} has {len(labels)} dimensions {list(labels)}, so give {len(labels)} "
            f"placements (Shard(dim) or Replicate()), got {len(placements)}"
        )
    for label, p in zip(labels, placements, strict=True):
        if not isinstance(p, (Shard, Replicate)):
            raise TypeError(f"distribute: placement for {label!r} must be Shard(dim) or Replicate(), got {p!r}")
        if isinstance(p, Shard):
            if not -local.dim() <= p.dim < local.dim():
                raise ValueError(f"distribute: Shard({p.dim}) for {label!r}: the tensor has {local.dim()} dimensions")
    return placements


def _piece(local: torch.Tensor, coords: dict[str, int], sizes: dict[str, int],
           placements: tuple[Placement, ...], labels: tuple[str, ...]) -> torch.Tensor:
    piece = local
    for label, p in zip(labels, placements, strict=True):
        if isinstance(p, Shard):
            n = sizes[label]
            if piece.shape[p.dim] % n:
                raise ValueError(
                    f"distribute: Shard({p.dim}) over {label!r} splits size {piece.shape[p.dim]} into {n} equal "
                    "blocks, which it does not divide; pad the tensor or choose another dimension"
                )
            piece = piece.chunk(n, dim=p.dim)[coords[label]]
    if piece.is_contiguous() or piece.device.type != "cpu":
        return piece.contiguous()
    # The copy the Send needs goes into huge pages, which it moves faster (``mpimesh.empty_fast``).
    return cast(torch.Tensor, empty_like_fast(piece).copy_(piece))


def distribute(local: torch.Tensor, procs: ProcMesh, placements: Sequence[Placement] | None = None, *,
               sharding_spec: Sequence[Any] | None = None) -> Tensor:
    """Split ``local`` over ``procs``: one placement per mesh dimension, in order; returns a mesh tensor.

    With ``sharding_spec=`` (per tensor dimension, the name of the mesh
    dimension it is split over, or None; or DTensor's placements, one per
    mesh dimension, ``Partial()`` included) the result is a global-view
    :class:`mpimesh.DTensor` instead: one tensor of ``local``'s shape whose
    operations have the global meaning (issue #28; :mod:`._dtensor`).
    Without it, each process gets its own block as a per-process tensor:

    ``Shard(d)`` along a mesh dimension of size n gives its i-th process the
    i-th of n equal blocks of tensor dimension ``d``; ``Replicate()`` gives
    each the whole.  Each process receives only its own block.  The result
    remembers its placements for :func:`gather`.

    Raises:
        TypeError: bad argument types.
        ValueError: the wrong number of placements, or a dimension that does not split evenly.
    """
    if sharding_spec is not None:
        if placements is not None:
            raise TypeError("distribute: give placements or sharding_spec=, not both")
        from ._dtensor import distribute_global

        return distribute_global(local, procs, sharding_spec)
    if placements is None:
        raise TypeError("distribute: expecting placements (one per mesh dimension) or sharding_spec=[...]")
    placements = _check(local, procs, placements)
    shape = procs.view_shape
    labels, sizes = shape.labels, dict(shape.extent)
    pieces = [_piece(local.detach(), shape.coordinates(r), sizes, placements, labels) for r in range(len(shape))]
    client = client_of(procs)
    result = mesh_tensor(torch.empty_like(pieces[0], device="meta"), procs, client, local.device)
    result._placements = placements  # type: ignore[attr-defined]
    client.flush()  # what is queued goes first: one message per process follows, in order
    where = site()
    view = client.view(shape)
    for rank in range(len(shape)):
        view.slice(**shape.coordinates(rank)).run.broadcast([(PUT, result._id, pieces[rank], where)])
    return result


def gather(t: Tensor, placements: Sequence[Placement] | None = None) -> Future[torch.Tensor]:
    """The controller tensor that ``distribute`` split: fetch every needed block and join them.

    ``placements`` defaults to those ``t`` was distributed with.

    Raises:
        ValueError: no placements are known for ``t``.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"gather: expected an mpimesh.Tensor, got {type(t).__name__}")
    known = placements if placements is not None else getattr(t, "_placements", None)
    if known is None:
        raise ValueError(f"gather: {t!r} was not made by distribute(); pass placements=[Shard(d) or Replicate(), ...]")
    shape = t._procs.view_shape
    labels = shape.labels
    chosen = _check(torch.empty(t.shape), t._procs, known)
    futures = {}
    for rank in range(len(shape)):
        coords = shape.coordinates(rank)
        if all(isinstance(p, Shard) or coords[label] == 0 for label, p in zip(labels, chosen, strict=True)):
            futures[tuple(coords[label] for label in labels)] = fetch_shard(t, coords)
    result: Future[torch.Tensor] = Future(f"gather({t!r})")

    def join() -> torch.Tensor:
        values = {k: f.get() for k, f in futures.items()}

        def assemble(prefix: tuple[int, ...]) -> torch.Tensor:
            i = len(prefix)
            if i == len(labels):
                return values[prefix]
            p = chosen[i]
            if isinstance(p, Replicate):
                return assemble((*prefix, 0))
            return torch.cat([assemble((*prefix, c)) for c in range(shape.extent[labels[i]])], dim=p.dim)

        return assemble(())

    def settle() -> None:
        try:
            result.set_result(join())
        except BaseException as exc:
            result.set_exception(exc)

    countdown = Countdown(len(futures), settle)
    for f in futures.values():
        f.add_done_callback(countdown.count)
    return result
