"""B5's controller script: time to the first call on a 2-process mesh, then stop.

Run by ``bench_b5.py`` as ``python -m mpimesh benchmarks/_b5_child.py``
(spawned workers) or under ``mpiexec -n 3`` (launch pool).  Prints
``B5STAMP {json}`` lines with wall-clock (``time.time()``) stamps; the
driver adds the launch and exit times.
"""

import json
import time

T_SCRIPT = time.time()

import os  # noqa: E402

from mpi4py import MPI  # noqa: E402

from mpimesh import Actor, endpoint, this_host  # noqa: E402


class Ping(Actor):
    """One no-op endpoint."""

    @endpoint
    def ping(self, x: int) -> tuple[int, bool]:
        return x, MPI.Comm.Get_parent() != MPI.COMM_NULL


def stamp(**kw: object) -> None:
    print("B5STAMP " + json.dumps(kw), flush=True)


procs = this_host().spawn_procs(per_host={"gpus": 2})
mesh = procs.spawn("b5", Ping)
values = mesh.ping.call(1).get(60).values()
T_FIRST = time.time()
assert [v[0] for v in values] == [1, 1], values
stamp(t_script=T_SCRIPT, t_first=T_FIRST, spawned=any(v[1] for v in values),
      world=MPI.COMM_WORLD.Get_size(), pid=os.getpid(),
      mpi_library=MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip())
T_STOP0 = time.time()
procs.stop().get(60)
stamp(t_stop0=T_STOP0, t_stop1=time.time())
