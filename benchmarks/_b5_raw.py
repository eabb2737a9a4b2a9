"""B5's raw mpi4py baseline: start MPI, one round trip with 2 workers, exit.

``mpiexec -n 3 python _b5_raw.py pool`` (rank 0 pings ranks 1 and 2) or
``python _b5_raw.py spawn`` (the singleton spawns 2 children with
``MPI_Comm_spawn`` and pings them over the intercommunicator).  Prints the
same ``B5STAMP`` lines as ``_b5_child.py``.
"""

import json
import sys
import time

T_SCRIPT = time.time()

from mpi4py import MPI  # noqa: E402


def stamp(**kw: object) -> None:
    print("B5STAMP " + json.dumps(kw), flush=True)


def main(mode: str) -> None:
    if mode == "child":
        parent = MPI.Comm.Get_parent()
        msg = parent.recv(source=0, tag=1)
        parent.send(msg, dest=0, tag=1)
        parent.recv(source=0, tag=2)
        parent.Disconnect()
        return
    if mode == "spawn":
        comm = MPI.COMM_SELF.Spawn(sys.executable, args=[__file__, "child"], maxprocs=2)
        peers = [0, 1]
    else:
        comm = MPI.COMM_WORLD
        if comm.Get_rank() != 0:
            comm.send(comm.recv(source=0, tag=1), dest=0, tag=1)
            comm.recv(source=0, tag=2)
            return
        peers = [1, 2]
    for p in peers:
        comm.send((0, 1), dest=p, tag=1)
    for p in peers:
        comm.recv(source=p, tag=1)
    stamp(t_script=T_SCRIPT, t_first=time.time(), spawned=mode == "spawn", world=MPI.COMM_WORLD.Get_size(),
          mpi_library=MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip())
    t_stop0 = time.time()
    for p in peers:
        comm.send(None, dest=p, tag=2)
    if mode == "spawn":
        comm.Disconnect()
    stamp(t_stop0=t_stop0, t_stop1=time.time())


if __name__ == "__main__":
    main(sys.argv[1])
