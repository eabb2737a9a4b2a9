"""Same-host one-sided copies: Linux cross-memory attach (CMA).

``process_vm_readv`` and ``process_vm_writev`` copy between the address
spaces of two processes of one user in a single kernel copy, without the
other process doing anything.  Open MPI's shared-memory transport uses the
same calls for its single-copy path (``smsc/cma``).  The data plane uses them
for an :class:`~mpimesh.RDMABuffer` whose owner runs on the same host,
because MPI's own one-sided operations on memory the user allocated (dynamic
windows, ``Win.Create``) are emulated with messages on the PyPI Open MPI and
MPICH stacks: they move data only while the owner polls MPI, so their speed
follows the owner's polling (figures in docs/design/data.md, "CMA against
windows").

The kernel allows these calls when the reader may ptrace the owner: same
user, and under Yama's ``ptrace_scope=1`` only if the owner said so with
``prctl(PR_SET_PTRACER)``, which :func:`allow_readers` does (Open MPI does the
same).  ``ptrace_scope=2`` or a seccomp filter that blocks the calls (some
container runtimes) make them fail with ``EPERM``/``ENOSYS``; callers fall
back to MPI then.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
from typing import Any

__all__ = ["available", "allow_readers", "prefer_huge_pages", "read", "write", "start_time", "PermissionHint"]

#: What to tell a user whose kernel refuses cross-process copies.
PermissionHint = (
    "allow same-user ptrace: `sysctl kernel.yama.ptrace_scope=1` (or 0), and in a container "
    "`--cap-add SYS_PTRACE` or a seccomp profile that permits process_vm_readv"
)


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc: ctypes.CDLL | None = None
_lock = threading.Lock()
_allowed = False


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("process_vm_readv", "process_vm_writev"):
            fn = getattr(libc, name, None)
            if fn is None:
                return None
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                           ctypes.c_ulong, ctypes.c_ulong]
        _libc = libc
    return _libc


def available() -> bool:
    """This platform has the calls (Linux with a C library that exports them)."""
    return _lib() is not None


def allow_readers() -> None:
    """Let other processes of this user read this one (Yama ``ptrace_scope=1``); once per process."""
    global _allowed
    with _lock:
        if _allowed or not sys.platform.startswith("linux"):
            return
        _allowed = True
        try:
            # PR_SET_PTRACER, PR_SET_PTRACER_ANY.  EINVAL without Yama: nothing to allow.
            ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - not Linux
            pass


# Large copies are split across threads: the kernel pins and copies 4 KiB
# pages one by one, and an idle owner leaves cores free (docs/design/data.md,
# "Threads and huge pages").
_SPLIT = 16 << 20
_THREADS = max(1, min(4, os.cpu_count() or 1))
_pool: Any = None


def _copy(name: str, pid: int, local: int, remote: int, nbytes: int) -> None:
    global _pool
    if nbytes < _SPLIT or _THREADS == 1:
        _copy_one(name, pid, local, remote, nbytes)
        return
    step = (nbytes // _THREADS + 4095) // 4096 * 4096
    parts = [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]
    with _lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="mpimesh-cma")
    futures = [_pool.submit(_copy_one, name, pid, local + off, remote + off, n) for off, n in parts[1:]]
    first: BaseException | None = None
    try:
        _copy_one(name, pid, local, remote, parts[0][1])
    except BaseException as exc:
        first = exc
    for fut in futures:
        error = fut.exception()
        if error is not None and first is None:
            first = error
    if first is not None:
        raise first


def _copy_one(name: str, pid: int, local: int, remote: int, nbytes: int) -> None:
    lib = _lib()
    if lib is None:
        raise OSError(errno.ENOSYS, f"{name} is not available on {sys.platform}")
    fn = getattr(lib, name)
    done = 0
    while done < nbytes:
        here = _Iovec(local + done, nbytes - done)
        there = _Iovec(remote + done, nbytes - done)
        n = fn(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if n < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        if n == 0:
            raise OSError(errno.EFAULT, "no progress copying between processes")
        done += n


# The kernel pins every remote page it copies, so 2 MiB pages make a copy
# cheaper.  MADV_COLLAPSE (Linux 6.1) moves a range into huge pages now,
# keeping its contents and addresses, at a one-off cost; older kernels refuse
# it (docs/design/data.md, "Threads and huge pages").
_HUGE = 2 << 20
_MADV_COLLAPSE = 25
_collapser: Any = None


def prefer_huge_pages(addr: int, nbytes: int) -> None:
    """Ask the kernel, in the background, to back ``[addr, addr + nbytes)`` with huge pages (best effort)."""
    global _collapser
    start = (addr + _HUGE - 1) // _HUGE * _HUGE
    end = (addr + nbytes) // _HUGE * _HUGE
    libc = _lib()
    if end <= start or libc is None:
        return
    with _lock:
        if _collapser is None:
            from concurrent.futures import ThreadPoolExecutor

            _collapser = ThreadPoolExecutor(1, thread_name_prefix="mpimesh-thp")
    _collapser.submit(libc.madvise, ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_COLLAPSE)


def read(pid: int, remote: int, local: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``remote`` in process ``pid`` to ``local`` here (blocks; releases the GIL).

    Raises:
        OSError: ``ESRCH`` the process is gone; ``EFAULT`` the remote range is
            not mapped; ``EPERM``/``ENOSYS`` the kernel does not allow it.
    """
    _copy("process_vm_readv", pid, local, remote, nbytes)


def write(pid: int, remote: int, local: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``local`` here to ``remote`` in process ``pid`` (see :func:`read`)."""
    _copy("process_vm_writev", pid, local, remote, nbytes)


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or ``None`` if it does not exist.

    With the pid, it names a process uniquely: a pid reused after a death
    has a later start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces and parentheses.
    return int(stat.rpartition(b")")[2].split()[19])
