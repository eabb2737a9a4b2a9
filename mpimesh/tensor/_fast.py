"""The tensor engine's fast path: a repeated operation on handles and scalars, from one lookup.

``a = a + 1`` on mesh tensors runs here from its second repetition on.
T1 (docs/design/tensor.md) counts the controller's CPU per operation
against a do-nothing ``__torch_dispatch__`` wrapper subclass (~5 us on a
quiet VM), where each Python call costs ~0.1-0.4 us: so this path makes the
handle, the command and its line in one function.  The general dispatches
(``_handle.dispatch``, ``_dtensor.dispatch``) compute an operation's
outcome and :func:`remember` it; :func:`fast` replays it.  Both handle
classes use it: a class names the attribute its handles are keyed by
(``_fast_key``: a per-process handle's metadata, a global one's spec).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from ._client import BATCH as _BATCH
from ._client import _ids
from ._commands import OPF

__all__ = ["MISS", "fast", "remember", "site"]

#: What :func:`fast` returns when it cannot replay the operation.
MISS: Any = object()

#: Entries at most in each table; cleared when full.
LIMIT = 4096

_SCALARS = frozenset((int, float, bool))
_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided

# Frames in these directories are not the line a command is reported at.
_INTERNAL = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
_inside: dict[Any, bool] = {}  # code object -> in torch or mpimesh
_sites: dict[tuple[Any, int], str] = {}  # one string per line: a batch pickles it once


def site(skip: int = 1) -> str:
    """The first caller's line outside torch and mpimesh, ``file:line in function``.

    ``skip``: frames known to be inside, from this function's caller up (the
    dispatch path passes its own depth, so the walk starts at torch).
    """
    try:
        frame = sys._getframe(skip)
    except ValueError:  # a thread that starts in C (autograd's device threads, on CUDA): no user line above
        frame = sys._getframe(1)
    known = _inside.get
    while frame.f_back is not None:
        code = frame.f_code
        inside = known(code)
        if inside is None:
            inside = _inside[code] = code.co_filename.startswith(_INTERNAL)
        if not inside:
            break
        frame = frame.f_back
    code = frame.f_code
    key = (code, frame.f_lineno)
    text = _sites.get(key)
    if text is None:
        if len(_sites) > 65536:
            _sites.clear()
        text = _sites[key] = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
    return text


def fast(func: Any, args: tuple[Any, ...], cls: type, table: dict[tuple[Any, ...], tuple[Any, ...]],
         active: Any) -> Any:
    """Replay ``func`` on ``args`` (handles of exactly ``cls`` and int/float/bool) from ``table``; else MISS.

    Replays only where the general path would give the same: every handle
    of one mesh object, the active mesh (if any) that object, and the mesh
    neither healed nor shrunk since (``client.changed``: each use is
    checked then).
    """
    first: Any = None
    parts: list[Any] = [id(func)]
    cargs: list[Any] = []
    attr = cls._fast_key  # type: ignore[attr-defined]
    for a in args:
        c = a.__class__
        if c is cls:
            if first is None:
                first = a
            elif a._procs is not first._procs:
                return MISS
            parts.append(getattr(a, attr))
            cargs.append(a._id)
        elif c in _SCALARS:
            parts.append(c)
            parts.append(a)
            cargs.append(a)
        else:
            return MISS
    if first is None:
        return MISS
    procs = first._procs
    if active is not None and active is not procs:
        return MISS
    hit = table.get(tuple(parts))
    client = first._client
    if hit is None or client.changed:
        return MISS
    name, refs, same, shape, stride, dtype, mkey, extra = hit
    t: Any
    if same is None:
        # positionally (size, strides, storage_offset, memory_format, dtype, layout, device): torch
        # parses keywords by name, ~0.8 us per call under load (torch==2.13's signature, pinned)
        t = _wrapper(cls, shape, stride, None, None, dtype, _STRIDED, mkey[4])
        tid = next(_ids)
        d = t.__dict__
        d["_procs"] = procs
        d["_client"] = client
        d["_mkey"] = mkey
        d["_id"] = tid
        if extra is not None:
            d.update(extra)
        client.young.append((t, tid))  # client.watch(t, tid), inline
    else:
        t = args[same]
        tid = t._id
    # site(), inline: the first frame above the __torch_dispatch__ that called this, outside torch and mpimesh
    try:
        frame = sys._getframe(2)
    except ValueError:  # dispatched from a thread that starts in C (autograd's, on CUDA)
        frame = sys._getframe(1)
    while frame.f_back is not None:
        code = frame.f_code
        inside = _inside.get(code)
        if inside is None:
            inside = _inside[code] = code.co_filename.startswith(_INTERNAL)
        if not inside:
            break
        frame = frame.f_back
    text = _sites.get((frame.f_code, frame.f_lineno))
    if text is None:
        text = site(2)
    command = (OPF, name, tuple(cargs), refs, None, (tid,), text)
    view = procs.view_shape
    # client.issue(view, command), inline where the batch is of this view and not full
    with client._lock:
        pending = client._pending
        if client._pending_shape is view and len(pending) < _BATCH - 1:
            pending.append(command)
            return t
        client.issue(view, command)
    return t


def remember(table: dict[tuple[Any, ...], tuple[Any, ...]], func: Any, name: str, args: tuple[Any, ...], cls: type,
             same: int | None, new: tuple[Any, ...] | None, extra: dict[str, Any] | None = None) -> None:
    """Record ``func``'s outcome on ``args`` for :func:`fast`, where the arguments qualify.

    ``same``: the position of the input it returns (in place); else ``new``
    is the new handle's (shape, stride, dtype), and ``extra`` what else its
    ``__dict__`` holds.
    """
    parts: list[Any] = [id(func)]
    refs: list[int] = []
    attr = cls._fast_key  # type: ignore[attr-defined]
    for i, a in enumerate(args):
        if a.__class__ is cls:
            parts.append(getattr(a, attr))
            refs.append(i)
        elif a.__class__ in _SCALARS:
            parts.append(a.__class__)
            parts.append(a)
        else:
            return
    if not refs:
        return
    if same is not None:
        entry: tuple[Any, ...] = (name, tuple(refs), same, None, None, None, None, None)
    elif new is not None:
        shape, stride, dtype = new
        device = args[refs[0]]._mkey[4]
        entry = (name, tuple(refs), None, shape, stride, dtype, (True, shape, tuple(stride), dtype, device), extra)
    else:
        return
    if len(table) >= LIMIT:
        table.clear()
    table[tuple(parts)] = entry
