"""Global-view tensors on the controller: :class:`DTensor` handles, one tensor sharded over a whole mesh.

Issue #28 (the brief's "it appears as a single object").  Each process of
the mesh holds a torch ``DTensor`` over a ``DeviceMesh`` of the mesh's
processes (:mod:`._dtensor_worker`); the controller holds a handle whose
``shape`` and ``dtype`` are the global tensor's.  Every torch operation on
handles is computed twice here without asking a worker: on meta tensors of
the global shapes (the result's shape, and shape errors at the line that
caused them, as local torch raises them) and by DTensor's own sharding
propagation on a ``DeviceMesh`` with no process group (the result's
placements); then it is queued for the workers, where DTensor runs it and
issues the collectives it needs.  Nothing here writes a sharding rule.

Per-process tensors (:class:`~._handle.Tensor`) stay as they were; an
operation that mixes the two raises a ``ValueError`` with the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor as _TorchDTensor
from torch.distributed.tensor import Placement
from torch.distributed.tensor import Replicate as _TorchReplicate
from torch.distributed.tensor import Shard as _TorchShard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.experimental import implicit_replication
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..errors import RemoteTensorError
from . import _dtensor_heal as _heal
from . import _dtensor_worker as _worker
from . import _mesh
from ._client import MeshClient, client_of
from ._commands import REMOTE
from ._fast import MISS, fast, remember
from ._fetch import fetch_shard
from ._handle import (
    _NEEDS_VALUE,
    Tensor,
    _flat_command,
    _meta_call,
    _new_handle,
    mesh_tensor,
    no_mesh,
    site,
    to_meta,
    unwrap,
)
from ._op_rules import by_decomposition
from ._placements import Partial, device_mesh, placements_of
from ._remote import _keys
from ._specs import contiguous_strides as _contiguous_strides
from ._specs import even_block as _even_block
from ._specs import local_shape as _local_shape

if TYPE_CHECKING:
    from ._mesh import ProcMesh

__all__ = ["DTensor", "Partial", "distribute_global", "placements_of"]

#: One remote-function key per worker function (the engine keeps functions by key).
_KEYS: dict[Any, int] = {}

#: Seconds a stopping mesh waits for its processes to leave their torch.distributed world.
_LEAVE_TIMEOUT = 30.0

#: The workers' torch.distributed worlds made so far, by key (one per mesh view and device type), each
#: with the mesh's heal count it was made at (a heal makes it again over the new members).
_WORLDS: dict[Any, int] = {}


class DTensor(Tensor):
    """A tensor sharded (or replicated) over a whole mesh, seen as one tensor.

    Made by ``mpimesh.distribute(t, mesh, sharding_spec=[...])``, by torch
    operations on such tensors, and by :func:`mpimesh.module_to_mesh`.  Its
    ``shape``, ``dtype``, indexing and operations have the global meaning
    (``dt @ dt.T`` is the product of the global matrices); torch's DTensor
    runs them on the workers with the communication they need.  They return
    at once; :meth:`full_tensor` and ``.item()`` wait for the value.
    """

    _spec: DTensorSpec
    #: what the fast path keys these handles by (_fast.fast): the spec holds shape and placements
    _fast_key = "_spec"

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"mpimesh.DTensor(shape={tuple(self.shape)}, dtype={self.dtype}, placements={self.placements}, "
                f"mesh={self._procs!r}{grad})")

    @property
    def placements(self) -> tuple[Placement, ...]:
        """One torch placement per mesh dimension (``Shard(d)``, ``Replicate()``, ``Partial()``)."""
        return self._spec.placements

    @property
    def device_mesh(self) -> ProcMesh:
        """The mesh whose processes hold the pieces."""
        return self._procs

    def full_tensor(self) -> torch.Tensor:
        """The whole tensor, here; blocks.

        Raises:
            RemoteTensorError: an operation it depends on failed.
        """
        return _fetch_full(self)

    def redistribute(self, device_mesh: Any = None, placements: Sequence[Any] | None = None) -> DTensor:
        """The same tensor with other placements (DTensor's redistribution on the workers); returns at once.

        Raises:
            ValueError: another mesh, or placements that do not fit the mesh.
        """
        if device_mesh is not None and not self._procs.same_view(device_mesh):
            raise ValueError(f"redistribute: {self!r} cannot move to another mesh {device_mesh!r}")
        chosen = self.placements if placements is None else placements_of(placements, self._procs, self.dim())
        spec = DTensorSpec(self._spec.mesh, chosen, self._spec.tensor_meta)
        return _Redistribute.apply(self, spec)  # type: ignore[no-any-return, no-untyped-call]

    def to_local(self) -> Tensor:
        """Each process's own piece, as a per-process :class:`mpimesh.Tensor`; returns at once.

        Raises:
            ValueError: the pieces differ in shape across processes (an uneven split).
        """
        shapes = {tuple(_local_shape(self._spec, r)) for r in range(len(self._procs.view_shape))}
        if len(shapes) > 1:
            raise ValueError(f"to_local: the pieces of {self!r} differ in shape ({sorted(shapes)}); "
                             "redistribute to placements that split it evenly first")
        meta = torch.empty(next(iter(shapes)), dtype=self.dtype, device="meta")
        if self._client.changed:
            _healed(self._procs, self._client, self.device, [self], "to_local")
        out = mesh_tensor(meta, self._procs, self._client, self.device)
        _call(self._procs, self._client, _worker.to_local, (self,), (out._id,))
        return out

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if not kwargs:  # a repeated operation, replayed from here (a Python call fewer: T1)
            replayed = fast(func, args, DTensor, _FAST, None)
            if replayed is not MISS:
                return replayed
        return dispatch(func, args, kwargs or {})


class _Redistribute(torch.autograd.Function):
    """Redistribution with a gradient: the gradient goes back to the input's placements, as DTensor's does."""

    @staticmethod
    def forward(ctx: Any, t: DTensor, spec: DTensorSpec) -> DTensor:
        ctx.placements = t.placements
        return _redistributed(t, spec)

    @staticmethod
    def backward(ctx: Any, grad: DTensor) -> tuple[DTensor, None]:
        back = DTensorSpec(grad._spec.mesh, ctx.placements, grad._spec.tensor_meta)
        # a Partial gradient is summed where it is replicated: never back to Partial
        placements = tuple(_TorchReplicate() if p.is_partial() else p for p in back.placements)
        return _redistributed(grad, DTensorSpec(back.mesh, placements, back.tensor_meta)), None


def _redistributed(t: DTensor, spec: DTensorSpec) -> DTensor:
    if t._client.changed:
        _healed(t._procs, t._client, t.device, [t], "redistribute")
    out = _handle(t.shape, t.stride(), t.dtype, spec, t._procs, t._client, t.device)
    _call(t._procs, t._client, _worker.redistribute, (t, spec.placements), (out._id,))
    return out


# --- commands


def _call(procs: ProcMesh, client: MeshClient, fn: Any, args: tuple[Any, ...], outs: tuple[int | None, ...],
          kwargs: dict[str, Any] | None = None) -> None:
    """Queue worker function ``fn`` (of :mod:`._dtensor_worker`, pickled by name) as a remote command."""
    key = _KEYS.get(fn)
    if key is None:
        key = _KEYS[fn] = next(_keys)
    command = (REMOTE, key, fn, tree_map(unwrap, args), tree_map(unwrap, kwargs or {}), outs, site())
    client.issue(procs.view_shape, command)


def _handle(shape: Any, stride: Any, dtype: torch.dtype, spec: DTensorSpec, procs: ProcMesh, client: MeshClient,
            device: torch.device) -> DTensor:
    # One spec object per distinct spec: the result cache's keys hold specs, and a dict lookup
    # compares the same object by identity instead of DTensorSpec's field-by-field __eq__ (~10 us).
    spec = _SPECS.setdefault(spec, spec)
    if len(_SPECS) > _RECIPES_MAX:
        _SPECS.clear()
    h = _new_handle(DTensor, shape, stride, dtype, procs, client, device)
    h.__dict__["_spec"] = spec
    return h  # type: ignore[return-value]


def _ensure_world(procs: ProcMesh, client: MeshClient, device: torch.device) -> Any:
    """The key of ``procs``'s torch.distributed world on the workers, made on first use (blocks once)."""
    shape = procs.view_shape
    key = ("mpimesh-dtensor", procs.mesh_id, shape.labels, shape.sizes, tuple(shape.ranks()), device.type)
    if _WORLDS.get(key) == client.epoch:
        return key
    members = list(shape.ranks())  # each process's index in the base mesh, in the world's rank order
    one_host = len(set(procs.hostnames)) == 1  # type: ignore[attr-defined]
    meta = torch.empty(_worker.ADDRESS_BYTES, dtype=torch.uint8, device="meta")
    answer = mesh_tensor(meta, procs, client, torch.device("cpu"))
    _call(procs, client, _worker.listen, (key, members, one_host, client.epoch), (answer._id,))
    first = shape.coordinates(0)
    address = bytes(fetch_shard(answer, first).get().tolist()).rstrip(b"\0").decode()
    done = mesh_tensor(torch.empty(0, device="meta"), procs, client, torch.device("cpu"))
    # after a heal: made again over the new members, from the group alone (a process of the job is dead)
    tag = f"mpimesh.dtensor:{procs.mesh_id}:{client.epoch}" if client.changed else ""
    _call(procs, client, _worker.join_world, (key, members, list(shape.sizes), list(shape.labels), address,
                                              device.type, client.epoch, tag, procs), (done._id,))
    fetch_shard(done, first).get()  # raises here if the world could not be made
    _WORLDS[key] = client.epoch
    # Leave the world when the mesh stops: a pool process goes back to the pool and may join another
    # one, and a spawned one with gloo's threads running did not exit within the shutdown timeout.
    procs.attach(f"mpimesh.dtensor:{key}", lambda: _heal.Joined(key, lambda k: _leave(procs, client, k)),
                 _heal.Joined.close)
    return key


def _healed(procs: ProcMesh, client: MeshClient, device: torch.device, tensors: list[Any], what: str) -> None:
    """Since the mesh was healed: a global tensor that lost its piece raises; the workers' world is made again."""
    _heal.check_lost(procs, client, [t for t in tensors if isinstance(t, DTensor)], what)
    _ensure_world(procs, client, device)


def _leave(procs: ProcMesh, client: MeshClient, key: Any) -> None:
    _WORLDS.pop(key, None)
    left = mesh_tensor(torch.empty(0, device="meta"), procs, client, torch.device("cpu"))
    _call(procs, client, _worker.leave_world, (key,), (left._id,))
    try:
        fetch_shard(left, procs.view_shape.coordinates(0)).get(_LEAVE_TIMEOUT)
    except Exception:  # noqa: S110  (a dead process: the mesh stops regardless)
        pass


def distribute_global(local: torch.Tensor, procs: Any, spec: Sequence[Any]) -> DTensor:
    """``local`` as a global-view tensor on ``procs``: see :func:`mpimesh.distribute` with ``sharding_spec``."""
    if not isinstance(local, torch.Tensor) or isinstance(local, Tensor):
        raise TypeError(f"distribute: expected a local torch.Tensor, got {type(local).__name__}")
    if not isinstance(procs, _mesh.ProcMesh):
        raise TypeError(f"distribute: expected a ProcMesh, got {type(procs).__name__}")
    if isinstance(spec, (str, Placement)):
        raise TypeError(f"distribute: expecting sharding_spec as a list, got {spec!r}; e.g. sharding_spec=['dp', None]")
    placements = placements_of(spec, procs, local.dim())
    client = client_of(procs)
    device = local.device
    key = _ensure_world(procs, client, device)
    mesh = device_mesh(procs, device)
    local = local.detach()
    tspec = DTensorSpec(mesh, placements, TensorMeta(local.shape, local.stride(), local.dtype))
    out = _handle(local.shape, local.stride(), local.dtype, tspec, procs, client, device)
    _call(procs, client, _worker.distribute_local, (key, local.cpu() if device.type != "cpu" else local,
                                                    placements), (out._id,))
    return out


def _fetch_full(t: DTensor) -> torch.Tensor:
    if t._client.changed:
        _healed(t._procs, t._client, t.device, [t], "full_tensor")
    try:
        block = _even_block(t._spec)
        if block is not None:
            return _here(_fetch_pieces(t, block), t.device)
        out = mesh_tensor(t._meta, t._procs, t._client, t.device)
        _call(t._procs, t._client, _worker.full, (t,), (out._id,))
        return _here(fetch_shard(out, t._procs.view_shape.coordinates(0)).get(), t.device)
    except RemoteTensorError as exc:  # a process died in a collective: SupervisionError, as for a dead process
        raise _heal.failure(t._procs, "full_tensor", exc) from exc


def _here(full: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``full`` (fetched to the CPU) on the tensor's own device where this process has it, as DTensor gives it."""
    if device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count():
        return full.to(device)
    return full


def _fetch_pieces(t: DTensor, block: list[int]) -> torch.Tensor:
    """The whole of a tensor split in equal blocks: each distinct block fetched here once and joined.

    Moves the tensor's bytes once, with no collective on the workers: the
    all-gather of ``full_tensor()`` on the workers made every process hold
    the whole tensor first, which cost more than the product in the brief's
    program (T5 in docs/design/tensor.md).
    """
    shape = t._procs.view_shape
    labels, placements = shape.labels, t._spec.placements
    local = _new_handle(Tensor, torch.Size(block), _contiguous_strides(block), t.dtype, t._procs, t._client, t.device)
    _call(t._procs, t._client, _worker.to_local, (t,), (local._id,))
    futures = {}
    for rank in range(len(shape)):
        coords = shape.coordinates(rank)
        if all(type(p) is _TorchShard or coords[label] == 0 for label, p in zip(labels, placements, strict=True)):
            futures[tuple(coords[label] for label in labels)] = fetch_shard(local, coords)
    values = {k: f.get() for k, f in futures.items()}

    def join(prefix: tuple[int, ...]) -> torch.Tensor:
        i = len(prefix)
        if i == len(labels):
            return values[prefix]
        p = placements[i]
        if type(p) is not _TorchShard:
            return join((*prefix, 0))
        return torch.cat([join((*prefix, c)) for c in range(shape.sizes[i])], dim=p.dim)

    with no_mesh.activate():  # the joining runs here, also inside a mesh's activate()
        return join(())


# --- dispatch


def _mixing(func: Any, leaf: Tensor) -> ValueError:
    # ValueError, as for tensors of two meshes: torch turns a TypeError under an operator (`a + b`)
    # into "unsupported operand type(s)", which would lose the fix
    return ValueError(
        f"tensor engine: {func} mixes a global tensor (mpimesh.DTensor) with a per-process tensor {leaf!r}; "
        "make both global (mpimesh.distribute(t, mesh, sharding_spec=[...])) or both per-process (dt.to_local())"
    )


def _propagate(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    def fake(x: Any) -> Any:
        if isinstance(x, DTensor):
            return _TorchDTensor(x._meta, x._spec, requires_grad=False)  # type: ignore[no-untyped-call]
        if isinstance(x, torch.Tensor):
            return to_meta(x)
        return x

    dispatcher = _TorchDTensor._op_dispatcher
    try:
        with implicit_replication():
            info = dispatcher.unwrap_to_op_info(func, tree_map(fake, args), tree_map(fake, kwargs))
        dispatcher.sharding_propagator.propagate(info)
    except NotImplementedError as exc:
        raise NotImplementedError(
            f"tensor engine: torch's DTensor has no sharding rule for {func} ({exc}); redistribute the inputs to "
            "Replicate() first, or run it per process on dt.to_local()"
        ) from None
    assert info.output_sharding is not None
    return info.output_sharding.output_spec


def _from_specs(func: Any, specs: Any, procs: ProcMesh, client: MeshClient, device: torch.device,
                ) -> tuple[Any, tuple[int | None, ...]] | None:
    """The results of an operation that returns tensors only, from DTensor's output specs; None: cannot tell.

    DTensor's propagation has already run the operator on meta tensors of
    the global shapes (and cached it): a second meta run here cost 60% of
    the controller's time per operation.
    """
    returns = [str(r.type) for r in func._schema.returns]
    if returns == ["Tensor"] and isinstance(specs, DTensorSpec) and specs.tensor_meta is not None:
        meta = specs.tensor_meta
        h = _handle(meta.shape, meta.stride, meta.dtype, specs, procs, client, device)
        return h, (h._id,)
    if not isinstance(specs, (tuple, list)) or not specs:
        return None
    if not all(isinstance(x, DTensorSpec) and x.tensor_meta is not None for x in specs):
        return None
    if returns == ["List[Tensor]"]:
        kind: type = list
    elif returns == ["Tensor"] * len(specs):
        kind = tuple
    else:
        return None
    handles = [_handle(x.tensor_meta.shape, x.tensor_meta.stride, x.tensor_meta.dtype, x, procs, client, device)
               for x in specs]
    return kind(handles), tuple(h._id for h in handles)


#: What a global operation returns, by operator and argument signature (each global tensor's
#: ``DTensorSpec``, each local tensor's metadata, each other argument's type and value): a repeated
#: operation costs a lookup instead of DTensor's propagation over fake tensors (~300 us of the
#: controller's CPU, T1 in docs/design/tensor.md).  Placements and shapes never depend on values.
#: Bounded: cleared when full.
_RECIPES: dict[Any, Any] = {}
_RECIPES_MAX = 4096
_SPECS: dict[DTensorSpec, DTensorSpec] = {}  # see _handle
_FAST: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # a repeated operation's outcome for _fast.fast
_OPS: dict[int, tuple[str, str | None, Any]] = {}  # id(OpOverload) -> its name, _NEEDS_VALUE's hint, itself
_CONTAINERS = (list, tuple, dict)


def _recipe(results: Any, leaves: list[Any]) -> list[Any] | None:
    """How to rebuild an operation's results from the next call's inputs; None: not cacheable."""
    entries: list[Any] = []
    for r in results:
        if isinstance(r, DTensor):
            for i, leaf in enumerate(leaves):
                if leaf is r:
                    entries.append(("in", i))
                    break
            else:
                entries.append(("new", r.shape, r.stride(), r.dtype, r._spec))
        elif type(r) in (int, float, bool, type(None)):
            entries.append(("val", r))
        else:
            return None
    return entries


def _rebuild(entries: list[Any], leaves: list[Any], procs: ProcMesh, client: MeshClient, device: torch.device,
             out_ids: list[int | None]) -> list[Any]:
    results: list[Any] = []
    for entry in entries:
        kind = entry[0]
        if kind == "new":
            h = _handle(entry[1], entry[2], entry[3], entry[4], procs, client, device)
            out_ids.append(h._id)
            results.append(h)
        elif kind == "in":
            same = leaves[entry[1]]
            out_ids.append(same._id)
            results.append(same)
        else:
            results.append(entry[1])
    return results


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on global-view tensors: result shapes and placements here, the operation on the workers."""
    # Written for the common case, as the per-process dispatch is (_handle.dispatch): a repeated
    # operation on handles and scalars was replayed by _fast.fast already, other arguments without containers
    # are read in one pass, and a repeated signature skips propagation.
    simple = not any(type(a) in _CONTAINERS for a in args) and not (
        kwargs and any(type(a) in _CONTAINERS for a in kwargs.values()))
    if simple:
        leaves = [*args, *kwargs.values()] if kwargs else list(args)
        shape_of_args: Any = tuple(kwargs)
    else:
        leaves, shape_of_args = tree_flatten((args, kwargs))
    known = _OPS.get(id(func))
    if known is None:  # the entry holds the operator, so its id is never reused
        name = func.name()
        known = _OPS[id(func)] = (name, _NEEDS_VALUE.get(name), func)
    name, hint, _ = known
    first: DTensor | None = None
    # only global tensors and plain values: the compact command (OPF), which calls the operator itself;
    # an operator DTensor has no rule for must run as its decomposition (run_op, ._op_rules)
    flat = simple and not by_decomposition(func)
    parts: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            if not isinstance(leaf, DTensor):
                raise _mixing(func, leaf)
            if first is None:
                first = leaf
            elif leaf._procs is not first._procs and not first._procs.same_view(leaf._procs):
                raise ValueError(f"tensor engine: {func} mixes tensors of {first._procs!r} and {leaf._procs!r}; "
                                 "every tensor of one operation must live on the same mesh")
            parts.append(leaf._spec)
        elif isinstance(leaf, torch.Tensor):
            flat = False  # a controller tensor counts as replicated: run_op's implicit_replication
            parts.append((False, leaf.shape, leaf.stride(), leaf.dtype, leaf.device))
        else:
            parts.append((type(leaf), leaf))
    if first is None:
        return func(*args, **kwargs)
    if hint is not None:
        # a value the script waits for (t.item(), bool(t)): the whole tensors, here
        return func(*tree_map(lambda x: _fetch_full(x) if isinstance(x, DTensor) else x, args),
                    **tree_map(lambda x: _fetch_full(x) if isinstance(x, DTensor) else x, kwargs))
    procs, client, device = first._procs, first._client, first.device
    if client.changed:  # the mesh was healed: a lost piece raises, the workers' world is made again
        _healed(procs, client, device, leaves, str(func))
    try:
        key: Any = (id(func), tuple(parts), shape_of_args)
        cached = _RECIPES.get(key)
    except TypeError:  # an unhashable argument: no caching
        key, cached = None, None
    out_ids: list[int | None] = []
    if cached is not None:
        entries, tree = cached
        results = _rebuild(entries, leaves, procs, client, device, out_ids)
        result = results[0] if tree is None else tree_unflatten(results, tree)
        if flat and not kwargs and tree is None and entries[0][0] != "val":
            entry = entries[0]
            remember(_FAST, func, name, args, DTensor, entry[1] if entry[0] == "in" else None, entry[1:4],
                     {"_spec": _SPECS.setdefault(entry[4], entry[4])} if entry[0] == "new" else None)
    else:
        result, out_ids = _propagated(func, args, kwargs, leaves, procs, client, device)
        if key is not None:
            out_leaves, tree = tree_flatten(result)
            entries = _recipe(out_leaves, leaves)
            if entries is not None:
                if len(_RECIPES) >= _RECIPES_MAX:
                    _RECIPES.clear()
                _RECIPES[key] = (entries, None if isinstance(result, DTensor) else tree)
    if flat:
        command = _flat_command(name, args, kwargs, tuple(out_ids))
        client.issue(procs.view_shape, command)
    else:
        _call(procs, client, _worker.run_op, (name, *args), tuple(out_ids), kwargs)
    return result


def _propagated(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], procs: ProcMesh,
                client: MeshClient, device: torch.device) -> tuple[Any, list[int | None]]:
    """The results of ``func`` (new handles, or the inputs it changed in place) by DTensor's propagation."""
    specs = _propagate(func, args, kwargs)
    fast = None if func._schema.is_mutable else _from_specs(func, specs, procs, client, device)
    if fast is not None:
        result, ids = fast
        return result, list(ids)
    # in place, or results that are not all tensors: their structure from a run on meta tensors
    out = _meta_call(func, args, kwargs)
    spec_leaves = [s for s in tree_flatten(specs)[0] if isinstance(s, DTensorSpec)]
    inputs = {id(x.__dict__.get("_meta_tensor")): x for x in leaves if isinstance(x, DTensor)}
    out_leaves, tree = tree_flatten(out)
    results: list[Any] = []
    out_ids: list[int | None] = []
    specs_left = iter(spec_leaves)
    for leaf in out_leaves:
        if not isinstance(leaf, torch.Tensor):
            results.append(leaf)
            continue
        spec = next(specs_left, None)
        same = inputs.get(id(leaf))
        if same is not None:  # in place: the input's handle, as local torch returns it
            results.append(same)
            out_ids.append(same._id)
            continue
        if spec is None:
            raise NotImplementedError(f"tensor engine: DTensor gave no placement for an output of {func}")
        handle = _handle(leaf.shape, leaf.stride(), leaf.dtype, spec, procs, client, device)
        results.append(handle)
        out_ids.append(handle._id)
    return tree_unflatten(results, tree), out_ids
