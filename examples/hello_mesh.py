"""Hello, mesh: spawn actors on worker processes, call them, slice the mesh.

Run it either way:

    mpirun -n 5 python -m mpimesh examples/hello_mesh.py     # workers from the launch pool
    python examples/hello_mesh.py                             # workers spawned with MPI_Comm_spawn
    mpimesh run -n 5 examples/hello_mesh.py                   # the launcher picks mpiexec and its flags
"""

import os
import socket

from mpimesh import Actor, ActorError, current_rank, endpoint, this_host


class Greeter(Actor):
    """Says hello from wherever it runs."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.count = 0

    @endpoint
    def hello(self, name: str) -> str:
        self.count += 1
        point = dict(current_rank())
        return f"{self.greeting}, {name}, from {point} (pid {os.getpid()} on {socket.gethostname()})"

    @endpoint
    def calls(self) -> int:
        return self.count

    @endpoint
    def divide(self, x: float) -> float:
        return x / (current_rank().rank - 1)  # rank 1 divides by zero


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    print(f"processes: {procs}")
    greeters = procs.spawn("greeters", Greeter, "hello")

    # call(): every actor answers; the replies form a ValueMesh shaped like the mesh
    for point, text in greeters.hello.call("mesh").get().items():
        print(f"  {point.rank}: {text}")

    # slicing keeps or drops dimensions; call_one() needs exactly one actor
    print(greeters.slice(gpus=2).hello.call_one("slice").get())
    print("first two:", greeters.slice(gpus=slice(0, 2)).calls.call().get().values())

    # fire and forget, then observe: messages from one sender stay in order
    for _ in range(3):
        greeters.hello.broadcast("again")
    print("calls per actor:", greeters.calls.call().get().values())

    # a remote exception is caught like a local one, and the actor lives on
    try:
        greeters.divide.call(1.0).get()
    except ActorError as err:
        print(f"caught {type(err.exception).__name__} from rank {err.rank}: {err.exception}")
    print("still serving:", greeters.slice(gpus=1).calls.call_one().get())

    procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
