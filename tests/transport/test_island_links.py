"""Direct links between islands: two spawned islands stop talking through the controller, in order.

Runs under the real entry point (``python -m mpimesh -m pytest -m mesh``): at
``-n 1`` both meshes are spawned islands; at larger sizes the first takes the
launch pool's free ranks (island 0) and the second is spawned.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from mpitest import spawning

from mpimesh import Actor, endpoint, this_host

pytestmark = pytest.mark.mesh

#: Messages each way in one exchange.
N = 1500


class Talker(Actor):
    """Sends numbered messages to a peer's listener, and, as a listener, records them in arrival order.

    Each island runs a talker and a listener (two actors, two threads): a
    talker waiting for a round trip to a peer busy talking itself would
    wait forever.
    """

    def __init__(self) -> None:
        self.heard: list[tuple[str, int]] = []

    @endpoint
    def addr(self) -> tuple[int, int]:
        from mpimesh._core.current import current

        return current().addr

    @endpoint
    def direct(self) -> list[tuple[int, int]]:
        """The processes this one sends to on a direct link."""
        from mpimesh._core.current import current

        return current().router.peers()

    @endpoint
    def hear(self, tag: str, i: int) -> None:
        self.heard.append((tag, i))

    @endpoint
    def echo(self, tag: str, i: int) -> int:
        self.heard.append((tag, i))
        return i

    @endpoint
    def talk(self, peer: Any, tag: str, n: int) -> int:
        """``n`` messages to ``peer``: one-way sends, and every 50th a round trip."""
        for i in range(n):
            if i % 50 == 49:
                assert peer.echo.call_one(tag, i).get(30) == i
            else:
                peer.hear.broadcast(tag, i)
        return n

    @endpoint
    def take(self) -> list[tuple[str, int]]:
        heard, self.heard = self.heard, []
        return heard


def relayed() -> int:
    """Frames the controller has relayed between islands so far."""
    from mpimesh._core.current import current

    return current().peers.statistics().relayed


def exchange(talkers: Any, listeners: Any, tag: str) -> None:
    """Each island's talker sends the other island's listener ``N`` messages, both at once; all heard in order."""
    (ta, tb), (la, lb) = talkers, listeners
    with ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(lambda x, y, t: x.talk.call_one(y, t, N).get(120), x, y, t)
                for x, y, t in ((ta, lb, tag + "a"), (tb, la, tag + "b"))]
        assert [s.result(180) for s in sent] == [N, N]
    # Each talk's last message was a round trip, so everything it sent has been heard.
    assert lb.take.call_one().get(30) == [(tag + "a", i) for i in range(N)]
    assert la.take.call_one().get(30) == [(tag + "b", i) for i in range(N)]


@pytest.fixture(scope="module")
def islands() -> Any:
    """Two meshes on different islands, each with a talker and a listener on its first process.

    The first mesh takes every free launch-pool rank (none at ``-n 1``), so
    the second is spawned: at ``-n 4`` the pair is a pool worker and a
    spawned one.
    """
    from mpimesh._core.current import current

    rt = current()
    role: Any = rt.role
    free = len(role.pool.free_ranks(rt.host))  # the pool's free ranks on this host
    with spawning():
        meshes = [this_host().spawn_procs(per_host={"gpus": n}) for n in (max(1, free), 1)]
    talkers = [m.spawn(f"talker{i}", Talker).slice(gpus=0)  # type: ignore[attr-defined]
               for i, m in enumerate(meshes)]
    listeners = [m.spawn(f"listener{i}", Talker).slice(gpus=0)  # type: ignore[attr-defined]
                 for i, m in enumerate(meshes)]
    yield talkers, listeners
    for m in meshes:
        m.stop().get(30)  # type: ignore[attr-defined]


def test_islands_switch_to_a_direct_link_in_order(islands: Any) -> None:
    """Two islands exchanging interleaved messages switch to a direct link with no message out of order.

    The first exchange starts on the controller's relay and switches while
    messages flow both ways; once both ends have the link, a second exchange
    costs the controller no relayed frame.
    """
    from mpimesh._transport.peers import enabled

    talkers, listeners = islands
    a, b = talkers
    addr_a, addr_b = a.addr.call_one().get(30), b.addr.call_one().get(30)
    if addr_a[0] == addr_b[0]:
        pytest.skip(f"both meshes are on island {addr_a[0]} (the launch pool had room): run at -n 1")
    if not enabled():
        pytest.skip("direct links between islands are off here (MPIMESH_ISLAND_LINKS)")
    before = relayed()
    exchange(talkers, listeners, "switch")
    assert relayed() > before  # it started on the relay
    end = time.monotonic() + 30
    while not (a.direct.call_one().get(30) == [addr_b] and b.direct.call_one().get(30) == [addr_a]):
        assert time.monotonic() < end, "no direct link between the islands within 30 s"
    before = relayed()
    exchange(talkers, listeners, "direct")
    assert relayed() == before
