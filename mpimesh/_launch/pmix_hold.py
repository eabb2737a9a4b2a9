"""Keeps a Slurm step alive through a killed task: its PMIx connection outlives it (issue #28).

Under ``srun --mpi=pmix`` each task is a client of its node's slurmstepd,
whose PMIx server (openpmix ``ptl_base_sendrecv.c``, ``lost_connection``)
reports ``PMIX_ERR_LOST_CONNECTION`` (-61) when a client's socket closes
before ``PMIx_Finalize``: a killed task.  The report waits in the event
cache for PMIx's caching window (1 s) and then reaches every handler of the
server, Slurm's default one included (``src/plugins/mpi/pmix/
pmixp_client_v2.c``, ``_errhandler``), which SIGKILLs the whole step
(``slurmstepd: _errhandler: ... status = -61, source = [<ns>:<rank>]``,
then ``STEP CANCELLED``).  A raw mpi4py job whose rank kills itself is
cancelled 1.003 s later (docs/design/tensor.md, Heal); a job that ends within
that second never sees it.  ULFM's own report of the death is a different
event, dropped by ``native/pmix_notify.c``.

The server sees the socket close only when its last descriptor closes: a
small process started right after ``MPI_Init`` (:func:`start`) holds a copy
of this process's PMIx socket, reads nothing from it while this process
lives, and after its end (a pipe only this process writes reaches EOF)
drains it until the server closes it (the step's end, or its node lost).
Survivors learn of the death from MPI (ULFM), which watches its own
connections, not PMIx's.  Nothing here needs MPI: the socket is found in
``/proc`` by the server's address (``PMIX_SERVER_URI*``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["server_address", "server_socket", "start"]

#: The helper: waits for EOF on the pipe (this process ended, however), then reads the PMIx socket
#: until the server closes it; no output, no imports beyond ``os``.
_HELPER = """
import os, sys
sock, watch = int(sys.argv[1]), int(sys.argv[2])
while os.read(watch, 4096):
    pass
try:
    os.set_blocking(sock, True)  # PMIx made it non-blocking; its user is gone
    while os.read(sock, 65536):
        pass
except OSError:
    pass
"""

#: the helper and the write end of its pipe: kept for this process's life
_KEPT: list[tuple[subprocess.Popen[bytes], int]] = []


def server_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The PMIx server's TCP address from ``PMIX_SERVER_URI*`` (``<ns>;tcp4://127.0.0.1:39961``), or ``None``."""
    for name in ("PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI21",
                 "PMIX_SERVER_URI2"):
        found = re.search(r"tcp[46]?://\[?([0-9A-Fa-f.:]+?)\]?:(\d+)$", environ.get(name, ""))
        if found:
            return found[1], int(found[2])
    return None


def _hex_address(host: str, port: int) -> str | None:
    """``host:port`` as ``/proc/net/tcp`` writes a remote address (IPv4 only), else ``None``."""
    parts = host.split(".")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    return "".join(f"{int(p):02X}" for p in reversed(parts)) + f":{port:04X}"


def server_socket(environ: Mapping[str, str], proc: Path = Path("/proc/self")) -> int | None:
    """This process's descriptor of its connection to the PMIx server, or ``None`` when not found."""
    address = server_address(environ)
    want = _hex_address(*address) if address else None
    if want is None:
        return None
    inodes = set()
    try:
        for line in (proc / "net" / "tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[2] == want and fields[3] == "01":  # ESTABLISHED
                inodes.add(fields[9])
        descriptors = list((proc / "fd").iterdir())
    except OSError:
        return None
    found = []
    for fd in descriptors:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            found.append(int(fd.name))
    return found[0] if len(found) == 1 else None


def start(environ: Mapping[str, str]) -> str:
    """Start the helper that holds this process's PMIx socket past its end.

    Returns:
        ``""`` once started, else why not (no PMIx TCP connection found).
    """
    sock = server_socket(environ)
    if sock is None:
        return "no PMIx server connection found in /proc/self"
    watch, keep = os.pipe()  # keep: this process's end, never written, closed only by its end
    helper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER, str(sock), str(watch)],
                              pass_fds=(sock, watch), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, close_fds=True)
    os.close(watch)
    _KEPT.append((helper, keep))
    return ""
