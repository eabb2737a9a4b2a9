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

import itertools
import os
import sys
from typing import Any

import torch

from ._client import BATCH as _BATCH
from ._client import _ids
from ._commands import OPF

__all__ = ["MISS", "Token", "fast", "remember", "site"]

#: What :func:`fast` returns when it cannot replay the operation.
MISS: Any = object()

#: Entries at most in each table; cleared when full.
LIMIT = 4096

_SCALARS = frozenset((int, float, bool))
_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided

# Frames in these directories are not the line a command is reported at.
_INTERNAL = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
# Both tables are keyed by id(code), not by the code object: a code object's hash is computed anew at
# each call (its name, bytecode and constants: ~2 us of T1's ~47 per operation), and each value holds
# its code object, so no id in a table can be reused while its entry lives.
_inside: dict[int, tuple[bool, Any]] = {}  # id(code) -> (in torch or mpimesh, code)
# (id(code), f_lasti) -> (file:line in function, code): one string per line, which a batch pickles once;
# keyed by the instruction, since frame.f_lineno scans the code's line table from its start at each read
_sites: dict[tuple[int, int], tuple[str, Any]] = {}
_lines: dict[tuple[int, int], str] = {}  # (id(code), line) -> that string, for every instruction of the line


_tokens: dict[Any, int] = {}  # a _fast_key value -> its token
_next_token = itertools.count(1)  # never reused: a token outlives a cleared table without meaning another key


def token(key: Any) -> int:
    """The int that stands for ``key`` (a handle's ``_fast_key`` value) in :func:`fast`'s table keys."""
    found = _tokens.get(key)
    if found is None:
        if len(_tokens) >= 4 * LIMIT:
            _tokens.clear()
        found = _tokens[key] = next(_next_token)
    return found


class Token:
    """A handle's ``_fk``: the token of its ``_fast_key`` value, found once and kept in its ``__dict__``.

    The fast path keys its table by these ints rather than by the metadata
    itself: a tuple's hash is computed anew at each lookup, and hashing a
    handle's metadata (shape, strides, dtype, device; a ``DTensorSpec``
    through a Python ``__hash__``) each operation cost ~2-3 us of T1.  A
    handle's key never changes after it is made, so neither does its token.
    A non-data descriptor: the value it stores in the instance's
    ``__dict__`` is found before it from then on.
    """

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        found = obj.__dict__["_fk"] = token(getattr(obj, obj._fast_key))
        return found


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
        entry = known(id(code))
        if entry is None:
            entry = _inside[id(code)] = (code.co_filename.startswith(_INTERNAL), code)
        if not entry[0]:
            break
        frame = frame.f_back
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    hit = _sites.get(key)
    if hit is None:
        if len(_sites) > 65536:
            _sites.clear()
            _lines.clear()
        line = (id(code), frame.f_lineno)
        text = _lines.get(line)
        if text is None:
            text = _lines[line] = f"{code.co_filename}:{line[1]} in {code.co_name}"
        hit = _sites[key] = (text, code)
    return hit[0]


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
    for a in args:
        c = a.__class__
        if c is cls:
            if first is None:
                first = a
            elif a._procs is not first._procs:
                return MISS
            parts.append(a._fk)
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
    name, refs, same, shape, stride, dtype, mkey, extra, fk = hit
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
        d["_fk"] = fk
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
        entry = _inside.get(id(code))
        if entry is None:
            entry = _inside[id(code)] = (code.co_filename.startswith(_INTERNAL), code)
        if not entry[0]:
            break
        frame = frame.f_back
    known = _sites.get((id(frame.f_code), frame.f_lasti))
    text = site(2) if known is None else known[0]
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
    for i, a in enumerate(args):
        if a.__class__ is cls:
            parts.append(a._fk)  # type: ignore[attr-defined]
            refs.append(i)
        elif a.__class__ in _SCALARS:
            parts.append(a.__class__)
            parts.append(a)
        else:
            return
    if not refs:
        return
    if same is not None:
        entry: tuple[Any, ...] = (name, tuple(refs), same, None, None, None, None, None, None)
    elif new is not None:
        shape, stride, dtype = new
        device = args[refs[0]]._mkey[4]
        mkey = (True, shape, tuple(stride), dtype, device)
        attr = cls._fast_key  # type: ignore[attr-defined]
        key = extra[attr] if extra is not None and attr in extra else mkey
        entry = (name, tuple(refs), None, shape, stride, dtype, mkey, extra, token(key))
    else:
        return
    if len(table) >= LIMIT:
        table.clear()
    table[tuple(parts)] = entry
