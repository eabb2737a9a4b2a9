"""One process's ``Forwarder`` and ``Multicast``, without MPI: frames given by hand, sends recorded.

A cast that reaches a process twice, up its tree and resent around a dead
forwarder.  When a forwarder dies holding a call, the caller resends the call
to the forwarder's subtree with replies sent straight back (``RESEND``).  A
process of that subtree can also get the call from another forwarder that
went around the dead one, with replies gathered up the tree (``GATHER``).
Which copy comes first depends on the network; the process runs the call
once, and the relay of the copy it does not run must still answer its
parent, or the parent's relay (and every one above it, up to the caller)
waits for ever.  That race failed a CI run across two simulated hosts
(``tests/hosts/test_hosts_trees.py``); here it is played in both orders.

A child the caller cannot reach: the call goes around it, to its subtree's
parts, and the child is tried once, not once more on the way around.
"""

from __future__ import annotations

from typing import Any

from mpimesh._core import protocol
from mpimesh._core.entries import Entries, pack
from mpimesh._core.forwarder import Forwarder
from mpimesh._core.multicast import Multicast
from mpimesh._core.ports import PortTable
from mpimesh._core.protocol import Frame, Kind, Status
from mpimesh._core.trees import DIRECT, GATHER, RESEND, split
from mpimesh.config import settings

Addr = tuple[int, int]

CALLER: Addr = (0, 0)
FORWARDER: Addr = (0, 3)
HERE: Addr = (0, 4)
KEY = (0, 1)
CALLER_PORT = (CALLER, 5)
FORWARDER_PORT = (FORWARDER, 7)


class Router:
    def __init__(self) -> None:
        self.sent: list[tuple[Addr, Frame]] = []
        #: every send tried, reachable or not
        self.tried: list[Addr] = []
        self.unreachable: set[Addr] = set()

    def send(self, dest: Addr, frame: Frame, buffers: list[Any] = []) -> None:  # noqa: B006
        self.tried.append(dest)
        if dest in self.unreachable:
            raise ConnectionError(f"process {dest} is unreachable")
        self.sent.append((dest, frame))


class Runtime:
    """What ``Forwarder``, ``Multicast`` and the relays use of a process's runtime; CALLs are recorded, not run."""

    addr = HERE
    host = "here"

    def __init__(self) -> None:
        self.dead: dict[Addr, str] = {}
        self.router = Router()
        self.ports = PortTable()
        self.calls: list[Frame] = []
        self.dispatch = {Kind.CALL: lambda src, frame, buffers: self.calls.append(frame)}
        self.forwarder = Forwarder(self)  # type: ignore[arg-type]

    def reply(self, port: Any, index: int, status: int, value: Any) -> None:
        self.router.send(port[0], protocol.reply(None, port[1], index, status, value))


def cast(port: tuple[Addr, int], gather: int, number: int = 1) -> Frame:
    """Call ``add(3)`` at rank 3 of a 4-actor view, this process's entry numbered ``number`` by the caller."""
    return protocol.cast(None, CALLER, KEY, "add", (3,), port, ("gpus",), (4,), 1, gather, None,
                         pack([(3, HERE, number)]))


def answer(rt: Runtime, call: Frame) -> None:
    """This process's actor answers ``call`` into its port, here or elsewhere."""
    (owner, pid), index = call[5], call[6][0]
    frame = protocol.reply(None, pid, index, Status.VALUE, [1, 2, 3])
    if owner == HERE:
        rt.ports.on_reply(HERE, frame, [])
    else:
        rt.router.send(owner, frame)


def to(rt: Runtime, dest: Addr) -> list[Frame]:
    return [frame for addr, frame in rt.router.sent if addr == dest]


def test_the_resend_comes_first_and_the_tree_copy_answers_its_parent_with_nothing() -> None:
    rt = Runtime()
    mc = rt.forwarder
    mc.on_cast(CALLER, cast(CALLER_PORT, RESEND), [])
    assert [c[5] for c in rt.calls] == [CALLER_PORT]
    mc.on_cast(FORWARDER, cast(FORWARDER_PORT, GATHER), [])
    assert len(rt.calls) == 1, "the call ran twice"
    # the forwarder's relay hears from this process at once: no replies of its own
    assert to(rt, FORWARDER) == [(Kind.REPLY, None, 7, -1, Status.MANY, [])]
    assert len(rt.ports) == 0, "the unused relay's port stayed open"
    answer(rt, rt.calls[0])
    assert [f[3:] for f in to(rt, CALLER)] == [(3, Status.VALUE, [1, 2, 3])]


def test_the_tree_copy_comes_first_and_answers_both_ways() -> None:
    rt = Runtime()
    mc = rt.forwarder
    mc.on_cast(FORWARDER, cast(FORWARDER_PORT, GATHER), [])
    mc.on_cast(CALLER, cast(CALLER_PORT, RESEND), [])
    assert len(rt.calls) == 1, "the call ran twice"
    assert rt.calls[0][5][0] == HERE  # into this process's relay
    answer(rt, rt.calls[0])
    item = (3, Status.VALUE, [1, 2, 3], 0, HERE)
    assert to(rt, FORWARDER) == [(Kind.REPLY, None, 7, -1, Status.MANY, [(3, [[1, 2, 3]])])]
    assert to(rt, CALLER) == [(Kind.REPLY, None, 5, -1, Status.MANY, [item])]
    assert len(rt.ports) == 0


def test_both_copies_wait_for_an_earlier_message_and_the_first_one_held_runs() -> None:
    rt = Runtime()
    mc = rt.forwarder
    mc.on_cast(CALLER, cast(CALLER_PORT, RESEND, number=2), [])
    mc.on_cast(FORWARDER, cast(FORWARDER_PORT, GATHER, number=2), [])
    assert rt.calls == []
    assert mc.statistics().held == 1
    assert to(rt, FORWARDER) == [(Kind.REPLY, None, 7, -1, Status.MANY, [])]
    mc.on_cast(CALLER, cast(CALLER_PORT, GATHER, number=1), [])
    # message 1 into its own relay, then the held resend, replies straight to the caller
    assert [c[5][0] for c in rt.calls] == [HERE, CALLER]
    assert mc.statistics().held == 0


def test_a_copy_of_a_call_run_long_ago_is_dropped_without_running_it() -> None:
    rt = Runtime()
    mc = rt.forwarder
    mc.on_cast(CALLER, cast(CALLER_PORT, GATHER), [])
    answer(rt, rt.calls[0])
    sent = len(rt.router.sent)
    mc.on_cast(FORWARDER, cast(FORWARDER_PORT, GATHER), [])
    assert len(rt.calls) == 1
    assert rt.router.sent[sent:] == [(FORWARDER, (Kind.REPLY, None, 7, -1, Status.MANY, []))]


def test_a_child_that_cannot_be_reached_is_tried_once_and_the_call_goes_around_it() -> None:
    rt = Runtime()
    rt.addr = CALLER  # type: ignore[misc]
    mc = Multicast(rt)  # type: ignore[arg-type]
    addrs = [(0, r) for r in range(1, 6)]
    rt.router.unreachable.add((0, 1))
    failed = mc.cast(KEY, "add", (3,), None, [], None, range(5), addrs, ("gpus",), (5,), None, DIRECT)
    assert failed == [((0, 1), "process (0, 1) is unreachable")]
    # around the head (tried once): its other entries, in parts of the fan-out, each to its first
    parts = [[addrs[e[0]] for e in part] for part in split([(r, a, 1) for r, a in enumerate(addrs)][1:],
                                                          settings.cast_fanout)]
    assert rt.router.tried == [(0, 1)] + [part[0] for part in parts]
    sent = [[e[1] for e in Entries(frame[-1])] for _, frame in rt.router.sent]
    assert sent == parts
