"""Host tensors in transparent huge pages: memory that a large Send moves at the machine's speed.

Open MPI's shared-memory transport moves a large message with one
cross-process copy (``process_vm_readv``), and the kernel pins the source's
pages one by one.  torch's CPU allocator hands out 4 KiB pages; numpy's
advises huge pages for large arrays, and a 64 MiB Send from it ran 1.2-1.6x
faster (docs/design/data.md, "Where a Send loses its speed").  Memory that
mpimesh allocates for large tensors comes from
:func:`mpimesh._transport.buffers.huge_block`; :func:`empty_fast` gives the
same to users for the tensors they send (torch's own switch for all its
large CPU allocations is ``THP_MEM_ALLOC_ENABLE=1`` in the environment
before the process starts).
"""

from __future__ import annotations

import sys
from typing import Any

from .._transport.buffers import HUGE_PAGE, huge_block

__all__ = ["HUGE_PAGE", "empty_fast", "empty_like_fast", "huge_page_advised"]


def empty_fast(*size: Any, dtype: Any = None) -> Any:
    """An uninitialised CPU tensor like ``torch.empty(*size, dtype=dtype)``, in huge pages when 2 MiB or more.

    Large tensors get their own 2 MiB-aligned mapping advised
    ``MADV_HUGEPAGE`` before it is touched (zero-filled on first touch, like
    any fresh mapping); smaller ones are plain ``torch.empty``.  The memory is
    freed when the last tensor or view over it dies.

    Args:
        *size: the shape, as integers or one tuple (as for ``torch.empty``).
        dtype: torch dtype; ``torch.get_default_dtype()`` when ``None``.
    """
    import torch

    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
    kind = torch.get_default_dtype() if dtype is None else dtype
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * torch.empty((), dtype=kind).element_size()
    if nbytes < HUGE_PAGE:
        return torch.empty(shape, dtype=kind)
    flat = torch.frombuffer(huge_block(nbytes), dtype=kind, count=numel)
    # Not ``flat.view(shape)``: a tensor of its own over the block's storage
    # (the storage keeps the block), whose ``_base`` is None as torch.empty's
    # is, so that code keeping tensors it made by ``_base`` (the tensor
    # engine's spare results) treats this one alike.
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return torch.empty((0,), dtype=kind).set_(flat.untyped_storage(), 0, shape, tuple(reversed(strides)))


def empty_like_fast(tensor: Any) -> Any:
    """:func:`empty_fast` with the shape and dtype of ``tensor`` (always on the CPU)."""
    return empty_fast(tuple(tensor.shape), dtype=tensor.dtype)


def huge_page_advised(addr: int) -> bool:
    """Whether the mapping that holds ``addr`` is advised ``MADV_HUGEPAGE`` (``hg`` in its ``VmFlags``).

    Reads ``/proc/self/smaps``; ``False`` where there is none (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return False
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, _, hi = head.partition("-")
                inside = int(lo, 16) <= addr < int(hi, 16)
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False
