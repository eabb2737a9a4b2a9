"""Mesh tensors on the controller: ``mpimesh.Tensor`` handles and the dispatch that turns torch calls into commands.

A :class:`Tensor` is a ``torch.Tensor`` wrapper subclass (as DTensor is):
it has a shape, a dtype and a device but no data on the controller.  Every
torch operation that reaches it through ``__torch_dispatch__`` (below
autograd, so ``loss.backward()`` and optimizers work unchanged) is run once
on *meta* tensors, which gives the result's shape and dtype at once and
raises shape errors at the line that caused them, and is queued as a command
for every process of the tensor's mesh.  Inside ``procs.activate()``, torch
factory functions (``torch.rand``, ``torch.zeros``...) make mesh tensors too.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .._core import serialize as _serialize
from ._client import MeshClient, client_of, next_id
from ._commands import OP, OPF, Ref
from ._fast import MISS, Token, fast, remember, site

if TYPE_CHECKING:
    from ._mesh import ProcMesh

__all__ = ["Tensor", "activate", "active_mesh", "mesh_tensor", "no_mesh", "site", "to_meta", "unwrap"]

_active: contextvars.ContextVar[ProcMesh | None] = contextvars.ContextVar("mpimesh_active_mesh", default=None)

#: Operators that need a value on the controller: they would make the script wait on a worker.
_NEEDS_VALUE = {
    "aten::_local_scalar_dense": "t.item()",
    "aten::is_nonzero": "bool(t)",
    "aten::equal": "torch.equal",
}


class Tensor(torch.Tensor):
    """A tensor that lives on every process of a mesh, one local tensor per process.

    Made by torch calls inside ``procs.activate()``, by ``@mpimesh.remote``
    functions, ``reduce``, ``rank_tensor`` and ``distribute``.  Its shape,
    dtype and device are those of each process's local tensor and are known
    on the controller without asking a worker; ``mpimesh.fetch_shard(t,
    **coords)`` gets a value.  Operations on it return at once.
    """

    _id: int
    _procs: ProcMesh
    _client: MeshClient
    _mkey: tuple[Any, ...]
    #: what the fast path keys these handles by (_fast.fast)
    _fast_key = "_mkey"
    _fk = Token()

    @staticmethod
    def __new__(cls, meta: torch.Tensor | None, procs: ProcMesh, client: MeshClient, device: torch.device,
                id: int | None = None, *, like: tuple[torch.Size, tuple[int, ...], torch.dtype] | None = None,
                ) -> Tensor:
        shape, stride, dtype = like if meta is None else (meta.shape, meta.stride(), meta.dtype)  # type: ignore[misc]
        return _new_handle(cls, shape, stride, dtype, procs, client, device, id, meta)

    @property
    def _meta(self) -> torch.Tensor:
        # The meta tensor the controller computes with, made on first use (one per handle: in-place
        # results are found by its identity).
        meta = self.__dict__.get("_meta_tensor")
        if meta is None:
            meta = self.__dict__["_meta_tensor"] = torch.empty_strided(
                self.shape, self.stride(), dtype=self.dtype, device="meta")
        return meta

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"mpimesh.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}, "
                f"mesh={self._procs!r}{grad})")

    @property
    def mesh(self) -> ProcMesh:
        """The process mesh (or slice) whose processes hold this tensor."""
        return self._procs

    def slice_mesh(self, **coords: int | slice) -> Tensor:
        """This tensor on a slice of its mesh: the same local tensors, on fewer processes.

        Operations on the result run only on the slice's processes.  It keeps
        this handle alive (the local tensors are freed when both are gone).

        Raises:
            ValueError: an unknown dimension or a coordinate out of range.
        """
        procs = self._procs.slice(**coords)
        view = Tensor(self._meta, procs, self._client, self.device, id=self._id)
        view._parent = self  # type: ignore[attr-defined]
        return view

    def reduce(self, dims: str | tuple[str, ...] | list[str], reduction: str = "sum", scatter: bool = False,
               mesh: Any = None, out: Any = None) -> Tensor:
        """Reduce over mesh dimensions ``dims`` with an MPI collective; see :func:`mpimesh.reduce`."""
        from ._reduce import reduce

        result: Tensor = reduce(self, dims, reduction, scatter=scatter, mesh=mesh, out=out)
        return result

    def reduce_(self, dims: str | tuple[str, ...] | list[str], reduction: str = "sum",
                scatter: bool = False, mesh: Any = None) -> Tensor:
        """Reduce in place over mesh dimensions ``dims``; see :func:`mpimesh.reduce_`."""
        from ._reduce import reduce_

        result: Tensor = reduce_(self, dims, reduction, scatter=scatter, mesh=mesh)
        return result

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if not kwargs:  # a repeated operation, replayed from here (a Python call fewer: T1)
            result = fast(func, args, Tensor, _FAST, None)
            if result is not MISS:
                return result
        return dispatch(func, args, kwargs or {}, None)


_wrapper = torch.Tensor._make_wrapper_subclass


def _new_handle(cls: type[Tensor], shape: Any, stride: Any, dtype: torch.dtype, procs: ProcMesh, client: MeshClient,
                device: torch.device, id: int | None = None, meta: torch.Tensor | None = None) -> Tensor:
    # Tensor.__new__'s work, callable without it (the dispatch path makes one handle per operation).
    t: Tensor = _wrapper(cls, shape, strides=stride, dtype=dtype, device=device, requires_grad=False)
    d = t.__dict__
    if meta is not None:
        d["_meta_tensor"] = meta
    d["_procs"] = procs
    d["_client"] = client
    # what the result cache keys this handle by (see dispatch), known here without asking torch again
    d["_mkey"] = (True, shape, tuple(stride), dtype, device)
    if id is None:
        id = next_id()
        client.watch(t, id)
    d["_id"] = id
    return t


def to_meta(x: Any) -> Any:
    """``x`` as the controller computes with it: mesh tensors and local tensors become meta tensors."""
    if isinstance(x, Tensor):
        return x._meta
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


_PLAIN = (int, float, bool, str, bytes, type(None), complex, torch.dtype, torch.device, torch.Size, torch.layout,
          torch.memory_format, slice, type(Ellipsis))
_PLAIN_TYPES = frozenset(_PLAIN)


def unwrap(x: Any) -> Any:
    """``x`` as a command carries it: mesh tensors become :class:`Ref`, local tensors travel detached.

    Raises:
        TypeError: ``x`` does not pickle (checked here, so the error points at the line that passed it).
    """
    if type(x) in _PLAIN_TYPES:
        return x
    if isinstance(x, Tensor):
        return Ref(x._id)
    if isinstance(x, torch.Tensor):
        return x.detach()
    if not isinstance(x, _PLAIN):
        try:
            _serialize.dumps(x)
        except Exception as exc:
            raise TypeError(
                f"tensor engine: cannot send {x!r} to the workers: it does not pickle ({exc}); "
                "pass tensors and plain values, or build the object on the workers in a @mpimesh.remote function"
            ) from exc
    return x


def _mesh_of(leaves: list[Any], what: Any) -> ProcMesh | None:
    procs: ProcMesh | None = None
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            if procs is None:
                procs = leaf._procs
            elif not procs.same_view(leaf._procs):
                raise ValueError(
                    f"tensor engine: {what} mixes tensors of {procs!r} and {leaf._procs!r}; "
                    "every tensor of one operation must live on the same mesh (or slice)"
                )
    return procs


def _device_of(leaves: list[Any], kwargs: dict[str, Any]) -> torch.device:
    device = kwargs.get("device") if kwargs else None
    if device is not None:
        return torch.device(device)
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            return leaf._mkey[4]  # type: ignore[no-any-return]
    return torch.device("cpu")


def mesh_tensor(meta: torch.Tensor, procs: ProcMesh, client: MeshClient, device: torch.device) -> Tensor:
    """A new handle for a result whose metadata is ``meta``."""
    return Tensor(meta, procs, client, device)


#: Result metadata by operator and argument metadata: computing it on meta tensors costs ~100 us, a
#: lookup ~2 us (shapes never depend on values).  Bounded: cleared when full.
_RESULTS: dict[Any, Any] = {}
_RESULTS_MAX = 4096
_NAMES: dict[int, tuple[str, str | None, Any]] = {}  # id(OpOverload) -> its name, _NEEDS_VALUE's hint, itself
_CONTAINERS = (list, tuple, dict)


def _result_spec(out: Any, inputs: list[Any]) -> Any:
    """How to rebuild ``out`` from the inputs' handles: a tensor, or a tuple of tensors; None: no caching."""
    if isinstance(out, torch.Tensor):
        for i, t in enumerate(inputs):
            if isinstance(t, Tensor) and t.__dict__.get("_meta_tensor") is out:
                return ("in", i)
        return ("new", out.shape, out.stride(), out.dtype)
    if type(out) is tuple and all(isinstance(o, torch.Tensor) for o in out):
        specs = tuple(_result_spec(o, inputs) for o in out)
        return ("tuple", specs)
    return None


def _build(spec: Any, inputs: list[Any], procs: ProcMesh, client: MeshClient, device: torch.device,
           out_ids: list[int | None]) -> Any:
    kind = spec[0]
    if kind == "in":
        same = inputs[spec[1]]
        out_ids.append(same._id)
        return same
    if kind == "new":
        handle = _new_handle(Tensor, spec[1], spec[2], spec[3], procs, client, device)
        out_ids.append(handle._id)
        return handle
    return tuple(_build(s, inputs, procs, client, device, out_ids) for s in spec[1])


_MAKES_TENSORS: dict[Any, bool] = {}


def _makes_tensors(func: Any) -> bool:
    """Whether the operator returns tensors (a factory, inside ``activate()``)."""
    known = _MAKES_TENSORS.get(func)
    if known is None:
        known = _MAKES_TENSORS[func] = any("Tensor" in str(r.type) for r in func._schema.returns)
    return known


def _on_meta(kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "meta"


#: A repeated operation's outcome for _fast.fast, filled from _RESULTS' entries.
_FAST: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], active: ProcMesh | None) -> Any:
    """Run ``func`` on mesh tensors: compute the result's metadata here, queue the operation for the mesh."""
    # This runs for every torch operation on a mesh tensor (T1 in docs/design/tensor.md) that the
    # __torch_dispatch__ calling it could not replay (_fast.fast); it is written for the common case
    # too (tensors and scalars as arguments, no containers): one pass over the arguments.
    simple = True
    for a in args:
        if type(a) in _CONTAINERS:
            simple = False
            break
    if simple and kwargs:
        for a in kwargs.values():
            if type(a) in _CONTAINERS:
                simple = False
                break
    leaves = ([*args, *kwargs.values()] if kwargs else list(args)) if simple else tree_flatten((args, kwargs))[0]
    # by id, as an OpOverload hashes in Python; the entry holds the operator, so its id is never reused
    known = _NAMES.get(id(func))
    if known is None:
        name = func.name()  # "aten::add.Tensor"
        known = _NAMES[id(func)] = (name, _NEEDS_VALUE.get(name), func)
    name, hint, _ = known
    first: Tensor | None = None
    parts: list[Any] = []  # the result cache's key: one part per leaf, a handle's from _new_handle
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            if leaf.__class__ is not Tensor:
                # a global-view tensor (_dtensor.DTensor): its own dispatch, inside activate() too
                return leaf.__class__.__torch_dispatch__(func, (), args, kwargs)
            if first is None:
                first = leaf
            elif leaf._procs is not first._procs:
                _mesh_of(leaves, func)  # raises if the meshes differ
            parts.append(leaf._mkey)
        elif isinstance(leaf, torch.Tensor):
            parts.append((False, leaf.shape, leaf.stride(), leaf.dtype, leaf.device))
        else:
            parts.append((type(leaf), leaf))
    if first is None:
        if active is None or not _makes_tensors(func) or _on_meta(kwargs):
            # no mesh tensor in, no tensor out (e.g. the profiler's record_function), or a meta tensor
            # (the controller's own shape computations inside activate()): a local call
            return func(*args, **kwargs)
        procs = active
        client = client_of(procs)
    else:
        procs, client = first._procs, first._client
        # ``is`` first: inside ``activate()`` the tensors are nearly always of the active mesh object itself
        if active is not None and active is not procs and not active.same_view(procs):
            raise ValueError(
                f"tensor engine: {func} on a tensor of {procs!r} inside {active!r}.activate(); "
                "activate the tensor's own mesh, or leave the active one"
            )
    if client.changed:  # the mesh was healed or shrunk: a tensor may be lost, or a view stale
        client.check_use(procs, [leaf for leaf in leaves if isinstance(leaf, Tensor)], str(func))
    if hint is not None:
        raise RuntimeError(
            f"tensor engine: {hint} needs the value of a mesh tensor, which lives on the workers; "
            "fetch it: mpimesh.inspect(t, **coords) (or mpimesh.fetch_shard(t, **coords).get())"
        )
    device = _device_of(leaves, kwargs) if kwargs or first is None else first._mkey[4]
    try:
        key: Any = (name, tuple(parts), tuple(kwargs) if simple else tree_flatten((args, kwargs))[1])
        spec = _RESULTS.get(key)
    except TypeError:
        key, spec = None, None
    out_ids: list[int | None] = []
    if spec is not None:
        result = _build(spec, leaves, procs, client, device, out_ids)
        if not kwargs and spec[0] != "tuple" and (active is None or active is procs):
            remember(_FAST, func, name, args, Tensor, spec[1] if spec[0] == "in" else None, spec[1:])
    else:
        out = _meta_call(func, args, kwargs)
        spec = _result_spec(out, leaves)
        if spec is not None:
            if key is not None:
                if len(_RESULTS) >= _RESULTS_MAX:
                    _RESULTS.clear()
                _RESULTS[key] = spec
            result = _build(spec, leaves, procs, client, device, out_ids)
        else:
            result = _wrap_any(out, leaves, procs, client, device, out_ids)
    if simple:
        command = _flat_command(name, args, kwargs, tuple(out_ids))
    else:
        command = (OP, name, tree_map(unwrap, args), tree_map(unwrap, kwargs), tuple(out_ids), site())
    client.issue(procs.view_shape, command)
    return result


#: Frames from site()'s caller up that are always ours on the flat path: _flat_command, dispatch, and
#: the __torch_dispatch__ (the mode's or Tensor's) that called dispatch.
_FLAT_DEPTH = 4


def _flat_command(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], outs: tuple[int | None, ...],
                  ) -> tuple[Any, ...]:
    """The command for arguments without containers: mesh tensors travel as bare ids at known positions.

    A batch of such commands holds only builtin types (and local tensors),
    so it pickles without a Python call per argument, and the worker reads
    it without walking a tree.
    """
    cargs: list[Any] = []
    refs: list[int] = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            refs.append(i)
            cargs.append(a._id)
        else:
            cargs.append(unwrap(a))
    if not kwargs:
        return (OPF, name, tuple(cargs), tuple(refs), None, outs, site(_FLAT_DEPTH))
    ckwargs: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, Tensor):  # a mesh tensor by keyword (out=...): the general form
            return (OP, name, tuple(unwrap(a) for a in args), {k: unwrap(v) for k, v in kwargs.items()}, outs,
                    site())
        ckwargs[k] = unwrap(v)
    return (OPF, name, tuple(cargs), tuple(refs), ckwargs, outs, site(_FLAT_DEPTH))


def _meta_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    meta_kwargs = tree_map(to_meta, kwargs)
    if "device" in meta_kwargs:
        meta_kwargs["device"] = "meta"
    try:
        return func(*tree_map(to_meta, args), **meta_kwargs)
    except NotImplementedError as exc:
        raise NotImplementedError(
            f"tensor engine: {func} has no meta implementation, so the controller cannot know its result's "
            f"shape ({exc}); run it in a @mpimesh.remote function with a propagate= function"
        ) from None


def _wrap_any(out: Any, leaves: list[Any], procs: ProcMesh, client: MeshClient, device: torch.device,
              out_ids: list[int | None]) -> Any:
    # Results other than a tensor or a tuple of tensors (lists, scalars), uncached.
    inputs = {id(t.__dict__.get("_meta_tensor")): t for t in leaves if isinstance(t, Tensor)}
    out_leaves, spec = tree_flatten(out)
    results: list[Any] = []
    for leaf in out_leaves:
        if isinstance(leaf, torch.Tensor):
            same = inputs.get(id(leaf))
            handle = same if same is not None else Tensor(leaf, procs, client, device)
            results.append(handle)
            out_ids.append(handle._id)
        else:
            results.append(leaf)
    return tree_unflatten(results, spec)


class _MeshMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """While a mesh is active: factory functions and operations on mesh tensors run on the mesh."""

    def __init__(self, procs: ProcMesh) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.procs = procs

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says no: four
        # Python frames per operation (~2 us against T1's floor of ~5 on a quiet VM).  The wrapper
        # keeps torch.compile from tracing into the mode; mesh tensors do not compile anyway.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        procs = self.procs
        if not kwargs:  # a repeated operation, replayed from here (a Python call fewer: T1)
            result = fast(func, args, Tensor, _FAST, procs)
            if result is not MISS:
                return result
        return dispatch(func, args, kwargs or {}, procs)


@contextmanager
def activate(procs: ProcMesh) -> Iterator[ProcMesh]:
    """Make ``procs`` the active mesh: torch calls in the block run on its processes.

    Leaving the block sends what is still queued; it does not wait for it.
    """
    client = client_of(procs)
    token = _active.set(procs)
    try:
        with _MeshMode(procs):
            yield procs
    finally:
        _active.reset(token)
        client.flush()


def active_mesh() -> ProcMesh | None:
    """The mesh of the innermost ``activate()`` block, or None."""
    return _active.get()


class _NoMesh:
    """``with mpimesh.no_mesh.activate():`` torch calls in the block run on the controller again."""

    def __repr__(self) -> str:
        return "mpimesh.no_mesh"

    @contextmanager
    def activate(self) -> Iterator[None]:
        """Leave the active mesh for the block (mesh tensors still run on their own mesh)."""
        token = _active.set(None)
        try:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                yield None
        finally:
            _active.reset(token)


no_mesh = _NoMesh()
