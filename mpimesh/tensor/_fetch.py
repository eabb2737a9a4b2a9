"""Values back to the controller: ``fetch_shard``, ``inspect``, and each process's coordinates as tensors."""

from __future__ import annotations

from concurrent.futures import Future as _StdFuture
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ActorError, RemoteTensorError
from ..future import Future
from ._client import client_of
from ._commands import RANK
from ._handle import Tensor, mesh_tensor, site

if TYPE_CHECKING:
    from ._mesh import ProcMesh

__all__ = ["fetch_shard", "inspect", "rank_tensor", "rank_tensors"]


def fetch_shard(t: Any, shard: dict[str, int] | None = None, **coords: int) -> Future[torch.Tensor]:
    """A CPU copy of one process's local tensor of ``t``; returns a future at once.

    ``coords`` (or ``shard``) pick the process by its coordinates in the
    tensor's mesh; dimensions left out are 0.  Everything queued for the mesh
    is sent first.

    Raises:
        TypeError: ``t`` is not a mesh tensor.
        ValueError: unknown dimensions or coordinates out of range.

    The future raises :class:`~mpimesh.RemoteTensorError` (the remote traceback
    as its cause) if an operation ``t`` depends on failed, and
    :class:`~mpimesh.SupervisionError` if the process died.
    """
    if not isinstance(t, Tensor):
        raise TypeError(
            f"fetch_shard needs an mpimesh.Tensor (made inside procs.activate()), got {type(t).__name__}; "
            "a local tensor is already here"
        )
    where = {**(shard or {}), **coords}
    shape = t._procs.view_shape
    for label in where:
        if label not in shape.labels:
            raise ValueError(f"fetch_shard: {t._procs!r} has no dimension {label!r}; its dimensions are "
                             f"{list(shape.labels)}")
    client = t._client
    point = {label: where.get(label, 0) for label in shape.labels}
    if client.changed:  # the mesh was healed or shrunk: the value there may be lost
        rank = 0
        for label, size in zip(shape.labels, shape.sizes, strict=True):
            rank = rank * size + point[label]
        client.check_use(t._procs, [t], "fetch_shard", at=rank)
    client.flush()
    view = client.view(shape).slice(**point)
    inner: Future[torch.Tensor] = view.fetch.call_one(t._id)
    outer: Future[torch.Tensor] = Future(f"fetch_shard({t!r})")

    def settle(fut: _StdFuture[Any]) -> None:
        exc = fut.exception()
        if exc is None:
            outer.set_result(fut.result())
        elif isinstance(exc, ActorError) and isinstance(exc.exception, RemoteTensorError):
            remote = exc.exception
            error = RemoteTensorError(remote.what, remote.site, remote.error)
            error.__cause__ = exc  # the remote traceback, under the rank's header
            outer.set_exception(error)
        else:
            outer.set_exception(exc)

    inner.add_done_callback(settle)
    return outer


def inspect(t: Any, shard: dict[str, int] | None = None, **coords: int) -> torch.Tensor:
    """``fetch_shard(t, shard, **coords).get()``: blocks until the value is here."""
    return fetch_shard(t, shard, **coords).get()


def rank_tensor(procs: ProcMesh, dim: str) -> Tensor:
    """A 0-dim int64 mesh tensor: on each process, its coordinate along ``dim`` of ``procs``.

    Raises:
        ValueError: ``procs`` has no dimension ``dim``.
    """
    shape = procs.view_shape
    if dim not in shape.labels:
        raise ValueError(f"rank_tensor: {procs!r} has no dimension {dim!r}; its dimensions are {list(shape.labels)}")
    client = client_of(procs)
    result = mesh_tensor(torch.empty((), dtype=torch.int64, device="meta"), procs, client, torch.device("cpu"))
    client.issue(shape, (RANK, result._id, shape, dim, site()))
    return result


def rank_tensors(procs: ProcMesh) -> dict[str, Tensor]:
    """:func:`rank_tensor` for every dimension of ``procs``."""
    return {dim: rank_tensor(procs, dim) for dim in procs.view_shape.labels}
