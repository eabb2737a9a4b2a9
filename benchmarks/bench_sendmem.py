"""Where a 64 MiB ``Send`` loses its speed: the sender's memory, A/B alternated.

Run (raw mpi4py only, no mpimesh)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python benchmarks/bench_sendmem.py

Rank 0 allocates one 64 MiB source buffer per *kind* (how the memory was
obtained), rank 1 receives every one of them into the same faulted-in buffer.
Per repeat, each kind in turn: 2 warm-up ``Send``s, then ``--sends`` timed
ones, each acknowledged by one byte (sender's clock, Send to ack).  The kinds
alternate inside every repeat, so that a noisy neighbour hits all alike.

For each kind the JSON line also gives what the kernel did with its pages:
the address modulo 2 MiB and how many of its 4 KiB pages belong to a
transparent huge page (from ``/proc/self/pagemap`` + ``/proc/kpageflags``
as root, else the ``AnonHugePages`` of the mappings that hold it).

Kinds (``--kinds``, comma-separated; default: all):

* ``numpy``: ``np.empty`` + fill (numpy madvises ``MADV_HUGEPAGE`` on
  allocations of 4 MiB and more).
* ``numpy_nohuge``: the same with numpy's madvise turned off.
* ``torch``: ``torch.empty`` + fill (no madvise).
* ``torch_randn``: ``torch.randn`` (B4's tensor).
* ``torch_madv_late``: ``torch.empty``, filled, then ``MADV_HUGEPAGE``
  (pages already faulted: nothing changes until khugepaged gets to them).
* ``torch_madv``: ``torch.empty``, ``MADV_HUGEPAGE`` on its whole pages, then fill.
* ``torch_collapse``: ``torch`` memory, filled, then ``MADV_COLLAPSE``.
* ``mmap_huge`` / ``mmap_4k``: a 2 MiB-aligned anonymous mapping with
  ``MADV_HUGEPAGE`` / ``MADV_NOHUGEPAGE``, then fill.
* ``numpy_off64``: ``numpy`` memory 64 bytes in (huge pages, other alignment).
* ``fast``: ``mpimesh``'s allocation helper (``empty_fast``), then fill.

``--recv-align sender`` (default) puts the receive view at the sender's
address modulo 4 KiB; ``fixed`` always at the same address.  ``--recv-kind``
(any kind above, default ``numpy``) says how the one receive buffer is
allocated.  Prints one JSON line (rank 0).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI

N = 64 * 1024 * 1024
TAG = 87
PAGE = 4096
#: bytes sent: 64 MiB less two pages, so that the receive view can sit at any offset in a page
M = N - 2 * PAGE
#: what mpiexec itself exports to its ranks
LAUNCHER_SET = {"OMPI_MCA_PREFIXES", "OMPI_MCA_num_procs", "OMPI_MCA_initial_wdir", "OMPI_MCA_cpu_type"}
HUGE = 2 * 1024 * 1024
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
KINDS = ["numpy", "torch", "numpy_nohuge", "torch_randn", "torch_madv_late", "torch_madv",
         "torch_collapse", "mmap_huge", "mmap_4k", "numpy_off64", "fast"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def madvise(addr: int, nbytes: int, advice: int) -> int:
    """``madvise`` on the whole pages inside ``[addr, addr + nbytes)``; 0 or errno."""
    start = -(-addr // PAGE) * PAGE
    end = (addr + nbytes) // PAGE * PAGE
    rc = _libc.madvise(start, end - start, advice)
    return 0 if rc == 0 else ctypes.get_errno()


def huge_pages(addr: int, nbytes: int) -> dict[str, Any]:
    """How much of ``[addr, addr + nbytes)`` sits in transparent huge pages."""
    first, last = addr // PAGE, (addr + nbytes - 1) // PAGE
    try:
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            pm.seek(first * 8)
            raw = np.frombuffer(pm.read((last - first + 1) * 8), np.uint64)
            pfns = raw & np.uint64((1 << 55) - 1)
            present = (raw >> np.uint64(63)) & np.uint64(1)
            if present.any() and not pfns[present.astype(bool)].any():
                raise PermissionError("no PFNs without CAP_SYS_ADMIN")
            thp = 0
            for pfn, ok in zip(pfns.tolist(), present.tolist(), strict=True):
                if not ok:
                    continue
                kf.seek(pfn * 8)
                flags = int.from_bytes(kf.read(8), "little")
                thp += (flags >> 22) & 1  # KPF_THP
            return {"pages": int(last - first + 1), "present": int(present.sum()), "thp_pages": thp,
                    "thp_fraction": round(thp / (last - first + 1), 3)}
    except OSError:
        pass
    anon_huge = 0
    with open("/proc/self/smaps") as f:
        overlap = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                overlap = lo < addr + nbytes and hi > addr
            elif overlap and head == "AnonHugePages:":
                anon_huge += int(line.split()[1]) * 1024
    return {"anon_huge_bytes_of_its_mappings": anon_huge}


def make(kind: str, keep: list[Any]) -> np.ndarray:
    """A filled uint8 array of ``N`` bytes obtained the ``kind`` way (``keep`` holds its owner)."""
    if kind in ("numpy", "numpy_off64"):
        a = np.empty(N + 64, np.uint8)
        a = a[64:] if kind == "numpy_off64" else a[:N]
    elif kind == "numpy_nohuge":
        from numpy._core.multiarray import _set_madvise_hugepage

        old = _set_madvise_hugepage(False)
        try:
            a = np.empty(N, np.uint8)
        finally:
            _set_madvise_hugepage(old)
    elif kind.startswith("torch"):
        import torch

        if kind == "torch_randn":
            t = torch.randn(N // 4)
            keep.append(t)
            return t.view(torch.uint8).numpy()
        t = torch.empty(N, dtype=torch.uint8)
        keep.append(t)
        a = t.numpy()
        if kind == "torch_madv":
            madvise(a.ctypes.data, N, MADV_HUGEPAGE)
    elif kind.startswith("mmap"):
        m = mmap.mmap(-1, N + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        keep.append(m)
        whole = np.frombuffer(m, np.uint8)
        start = (-whole.ctypes.data) % HUGE
        a = whole[start:start + N]
        madvise(a.ctypes.data, N, MADV_HUGEPAGE if kind == "mmap_huge" else MADV_NOHUGEPAGE)
    elif kind == "fast":
        import torch

        from mpimesh import empty_fast

        t = empty_fast((N,), dtype=torch.uint8)
        keep.append(t)
        a = t.numpy()
    else:
        raise ValueError(f"unknown kind {kind!r}")
    keep.append(a)
    a[:] = 1
    if kind == "torch_madv_late":
        madvise(a.ctypes.data, N, MADV_HUGEPAGE)
    elif kind == "torch_collapse":
        t0 = time.perf_counter()
        rc = madvise(a.ctypes.data, N, MADV_COLLAPSE)
        keep.append(("collapse", rc, time.perf_counter() - t0))
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sends", type=int, default=8)
    ap.add_argument("--recv-align", choices=["sender", "fixed"], default="sender")
    ap.add_argument("--recv-kind", default="numpy")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    kinds = args.kinds.split(",")
    ack = np.empty(1, np.uint8)
    if rank == 0:
        keep: list[Any] = []
        bufs = {k: make(k, keep) for k in kinds}
        info = {k: {"addr_mod_2MiB": b.ctypes.data % HUGE, "addr_mod_4KiB": b.ctypes.data % PAGE,
                    **huge_pages(b.ctypes.data, N)} for k, b in bufs.items()}
        for item in keep:
            if isinstance(item, tuple) and item[0] == "collapse":
                info["torch_collapse"].update(collapse_errno=item[1], collapse_ms=round(item[2] * 1e3, 1))
        offsets = np.array([bufs[k].ctypes.data % PAGE for k in kinds], np.int64)
        world.Send(offsets, 1, TAG)
        per: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for k in kinds:
                secs = []
                for i in range(args.sends + 2):
                    t0 = time.perf_counter()
                    world.Send(bufs[k][:M], 1, TAG)
                    world.Recv(ack, 1, TAG)
                    if i >= 2:
                        secs.append(time.perf_counter() - t0)
                per[k].append(statistics.median(secs))
        # the same pages after the timing (khugepaged may have collapsed some meanwhile)
        for k, b in bufs.items():
            info[k]["after"] = huge_pages(b.ctypes.data, N)
        out: dict[str, Any] = {"bench": "sendmem", "label": args.label,
                               "what": "64 MiB Send rank 0 -> rank 1 from memory allocated several ways, "
                               "A/B alternated",
                               "repeats": args.repeats, "sends": args.sends, "recv_align": args.recv_align,
                               "thp_enabled": open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
                               "env": {k: v for k, v in os.environ.items()
                                       if k.startswith("OMPI_MCA_") and k not in LAUNCHER_SET
                                       or k == "THP_MEM_ALLOC_ENABLE"},
                               "loadavg_1m": os.getloadavg()[0], "kinds": {}}
        for k in kinds:
            ms = [s * 1e3 for s in per[k]]
            med = statistics.median(ms)
            out["kinds"][k] = {"median_ms": round(med, 3), "gbps": round(M / med / 1e6, 2),
                               "range_gbps": [round(M / max(ms) / 1e6, 2), round(M / min(ms) / 1e6, 2)],
                               "repeat_ms": [round(v, 3) for v in ms], **info[k]}
        out["recv_kind"] = args.recv_kind
        out["recv_pages"] = world.recv(source=1, tag=TAG)
        out["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip("\x00 ")
        print(json.dumps(out), flush=True)
    else:
        offsets = np.empty(len(kinds), np.int64)
        world.Recv(offsets, 0, TAG)
        keep = []
        whole = make(args.recv_kind, keep)
        # views at the sender's offset within a page: the last page's worth is cut off
        base = (-whole.ctypes.data) % PAGE
        views = {k: whole[base + (int(o) if args.recv_align == "sender" else 0):][:M]
                 for k, o in zip(kinds, offsets, strict=True)}
        for _ in range(args.repeats):
            for k in kinds:
                for _ in range(args.sends + 2):
                    world.Recv(views[k], 0, TAG)
                    world.Send(ack, 0, TAG)
        world.send(huge_pages(whole.ctypes.data, N), 0, TAG)


if __name__ == "__main__":
    main()
