"""Ping-pong between two actor meshes: actors call actors through mesh references.

    mpirun -n 5 python -m mpimesh examples/ping_pong.py
    python examples/ping_pong.py
"""

from mpimesh import Actor, ActorMesh, context, current_rank, endpoint, this_host


class Pong(Actor):
    @endpoint
    def pong(self, ball: int) -> str:
        me = context().actor_instance.rank["gpus"]
        return f"pong {ball} from pong[{me}]"


class Ping(Actor):
    def __init__(self, pongs: ActorMesh[Pong]) -> None:
        # The mesh arrives as a reference: each ping talks to the pong of its own rank.
        me = context().actor_instance.rank["gpus"]
        self.partner = pongs.slice(gpus=me)

    @endpoint
    def rally(self, rounds: int) -> list[str]:
        # A sync endpoint may block on another actor's reply: no deadlock.
        return [self.partner.pong.call_one(ball).get() for ball in range(rounds)]



class AsyncPing(Ping):
    """The same rally from an async endpoint: awaiting yields to the actor's event loop."""

    @endpoint
    async def rally(self, rounds: int) -> list[str]:
        return [await self.partner.pong.call_one(ball) for ball in range(rounds)]


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    pongs = procs.spawn("pong", Pong)
    pings = procs.spawn("ping", Ping, pongs)
    for point, volleys in pings.rally.call(3).get().items():
        print(f"ping[{point['gpus']}]: {volleys}")
    async_pings = procs.spawn("async_ping", AsyncPing, pongs)
    print("async:", async_pings.slice(gpus=1).rally.call_one(2).get())
    print("rank of the caller here:", dict(current_rank()))
    procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
