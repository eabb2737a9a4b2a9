"""``mpimesh run`` across hosts: wait on ``mpiexec`` and correct the 0 it gives after a lost host (issue #27).

When a node's PRRTE daemon is lost, PRRTE 3.0.x (Open MPI 5.0.x) ends the
whole job: every rank is SIGKILLed by its host's daemon, with no signal the
controller could catch first, and ``prterun`` exits **0**, with ULFM or
without it (measured on 2 simulated hosts; ../shared/reference/hostloss).
A batch system then records success for a job that lost a node.  No
process of the job survives to say otherwise, so the correction happens
in the one process that does: ``mpimesh run`` itself, which for a job
across hosts waits on ``mpiexec`` instead of replacing itself with it.

It hands the job a fresh, empty ``MPIMESH_STATUS_FILE`` (exported to the
ranks with ``-x``).  The controller writes 1 there as it starts and the
job's real status as it ends (``_roles.job_status``).  After ``mpiexec``
exits:

* a non-zero ``mpiexec`` status is kept as it is;
* 0 with the file still empty: the controller never wrote it, because it
  runs on a node whose ``TMPDIR`` this node does not see; ``mpiexec``'s 0
  is kept (nothing is known, so nothing is claimed);
* 0 with the file holding a status: that status (1 when the controller
  started but never reached its end: the job was cut short; the script's
  own when the controller runs on another node than ``prterun``, whose
  ``PMIx_Abort`` status PRRTE records only on its own node, see
  ``_roles.job_status``).

Signals sent to ``mpimesh run`` (SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
SIGUSR2) are passed on to ``mpiexec``, as if this process were it; SIGINT
is not (a terminal's Ctrl-C reaches mpiexec directly, in the same process
group).  A signal that ends ``mpiexec`` ends ``mpimesh run`` with the
shell's 128 + N.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from types import FrameType

__all__ = ["STATUS_FILE", "run_correcting_status"]

#: The variable the controller writes the job's status to (``_roles.job_status``).
STATUS_FILE = "MPIMESH_STATUS_FILE"

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_correcting_status(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run ``argv`` (an Open MPI ``mpiexec`` across hosts) with a status file; its status, corrected.

    Returns:
        The status to exit with: ``mpiexec``'s, unless it is 0 and the
        controller recorded another (see the module's docstring).
    """
    fd, path = tempfile.mkstemp(prefix="mpimesh-status.")
    os.close(fd)
    env = dict(environ)
    env[STATUS_FILE] = path
    # Open MPI passes no MPIMESH_* variable to the ranks of other nodes unless told to.
    cmd = [argv[0], "-x", STATUS_FILE, *argv[1:]]
    try:
        proc = subprocess.Popen(cmd, env=env)

        def forward(signum: int, frame: FrameType | None) -> None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        for signum in _FORWARDED:
            signal.signal(signum, forward)
        # Ctrl-C reaches mpiexec from the terminal itself (it is in this process group): passed on as
        # well, it would be a second SIGINT, which PRRTE takes as "kill now" instead of a clean end.
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        code = proc.wait()
        return corrected(code, _read(path))
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def corrected(code: int, recorded: int | None) -> int:
    """The job's status from ``mpiexec``'s ``code`` (negative: killed by that signal) and the controller's file."""
    if code < 0:
        return 128 - code
    if code == 0 and recorded:
        print(f"mpimesh: mpiexec exited 0, but the job's controller {_why(recorded)}: exiting {recorded}",
              file=sys.stderr, flush=True)
        return recorded
    return code


def _why(recorded: int) -> str:
    if recorded == 1:
        return ("did not finish or failed (a lost host ends the whole job under mpiexec, and PRRTE then "
                "exits 0)")
    return f"recorded status {recorded} (PRRTE takes a job's status only from a controller on its own node)"


def _read(path: str) -> int | None:
    """The status the controller wrote, or None when it wrote nothing (or something unreadable)."""
    try:
        with open(path, encoding="ascii") as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) & 0xFF if text.isdigit() else None
