"""``@mpimesh.remote``: a function run on every process of a mesh over its local tensors."""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ._client import client_of
from ._commands import REMOTE
from ._handle import Tensor, _mesh_of, active_mesh, mesh_tensor, site, to_meta, unwrap

__all__ = ["Remote", "remote"]

_keys = itertools.count(1)


def _import(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"remote: {path!r} is not a qualified function name; use 'package.module.function'")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


class _Imported:
    """A function that workers import by name rather than receive pickled."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.__qualname__ = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _import(self.path)(*args, **kwargs)


class Remote:
    """A function that, called with mesh tensors or inside ``activate()``, runs on the mesh.

    Each process calls it with its local tensors; the call returns mesh
    tensors at once.  Their shapes come from ``propagate`` (called with meta
    tensors, returning tensors of the result's shapes and dtypes) or, without
    it, from running the function itself on meta tensors.  Called with no
    mesh tensor and no active mesh, it runs here, on local tensors.
    """

    def __init__(self, fn: Callable[..., Any] | str, propagate: Callable[..., Any] | None = None) -> None:
        self._fn: Callable[..., Any] = _Imported(fn) if isinstance(fn, str) else fn
        self._propagate = propagate
        self._key = next(_keys)
        self._sent: set[Any] = set()  # the clients that have the function already
        functools.update_wrapper(self, self._fn, updated=())

    def __repr__(self) -> str:
        return f"mpimesh.remote({getattr(self._fn, '__qualname__', self._fn)!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, _ = tree_flatten((args, kwargs))
        procs = _mesh_of(leaves, repr(self)) or active_mesh()
        if procs is None:
            return self._fn(*args, **kwargs)
        meta_args, meta_kwargs = tree_map(to_meta, args), tree_map(to_meta, kwargs)
        with _disable_current_modes():
            try:
                out = (self._propagate or self._fn)(*meta_args, **meta_kwargs)
            except Exception as exc:
                raise RuntimeError(
                    f"tensor engine: {self!r} failed on meta tensors, which is how the controller learns the shapes "
                    f"of its results ({type(exc).__name__}: {exc}); give it propagate=fn returning tensors of "
                    "the right shapes and dtypes"
                ) from exc
        device = next((leaf.device for leaf in leaves if isinstance(leaf, Tensor)), torch.device("cpu"))
        client = client_of(procs)
        out_leaves, spec = tree_flatten(out)
        results: list[Any] = []
        out_ids: list[int | None] = []
        for leaf in out_leaves:
            if isinstance(leaf, torch.Tensor):
                handle = mesh_tensor(leaf.to("meta"), procs, client, device)
                results.append(handle)
                out_ids.append(handle._id)
            else:
                results.append(leaf)
        if client.changed:
            client.check_use(procs, [leaf for leaf in leaves if isinstance(leaf, Tensor)], repr(self))
        sent = (client, client.epoch)  # it travels pickled once per mesh, and again to a healed one
        first = sent not in self._sent
        if first:
            self._sent.add(sent)
        command = (REMOTE, self._key, self._fn if first else None, tree_map(unwrap, args), tree_map(unwrap, kwargs),
                   tuple(out_ids), site())
        client.issue(procs.view_shape, command)
        return tree_unflatten(results, spec)


def remote(fn: Callable[..., Any] | str | None = None, *, propagate: Callable[..., Any] | None = None) -> Any:
    """Make ``fn`` a :class:`Remote` function: ``@remote``, ``@remote(propagate=f)`` or ``remote("pkg.mod.fn")``.

    A function given by name is imported by each worker (it need not pickle).

    Raises:
        TypeError: ``fn`` is neither callable nor a qualified name.
    """
    if fn is None:
        return lambda f: remote(f, propagate=propagate)
    if not (callable(fn) or isinstance(fn, str)):
        raise TypeError(f"remote: expected a function or 'package.module.function', got {fn!r}")
    return Remote(fn, propagate)
