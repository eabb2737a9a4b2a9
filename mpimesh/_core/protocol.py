"""The frame protocol: one table of message kinds, one constructor per kind.

Every frame is a pickled tuple ``(kind, bufsizes, *fields)`` (see
``mpimesh._transport.frames``).  Each kind is declared once, below, in the
manner of execnet's ``Message`` table: its code, its fields by name, the one
function that builds it, and who handles it.  Senders build frames only with
these constructors; handlers unpack them by name on their first line::

    _, _, key, method, args, reply_port, point, *site = frame

Frames stay plain tuples when sent (a class would cost a pickle of its
reference per frame); the constructors are what keeps their layouts in one
place.  A kind's fields are documented on its constructor.  Code that reads
one field of a frame away from its handler reads it by name, with the
positions below the table (``CALL_METHOD``, ``CAST_FANOUT``, ...), and a
frame made from another (a CAST for another subtree, or resent) is made by
the functions next to them: no module but this one knows where a field sits.
The kinds the transport opens itself (``BATCH``, ``FORWARD``, ``LINK``,
``MARK``, ``PULL``) have their constructors in ``mpimesh._transport.frames``,
re-exported here.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from .._transport.frames import (
    BATCH,
    BUFSIZES,
    CONTROLLER,
    FORWARD,
    KIND,
    LINK,
    MARK,
    PING,
    PULL,
    TAG_DATA,
    TAG_FRAME,
    Addr,
    Frame,
)
from .._transport.frames import batch as batch
from .._transport.frames import forward as forward
from .._transport.frames import link as link
from .._transport.frames import mark as mark
from .._transport.frames import pull as pull

#: Job-wide unique id of an actor mesh: ``(island, rank, counter)`` of its spawner.
Key = tuple[int, int, int]
#: A reply port's address: ``(owner's address, port id)``.
PortRef = tuple[Addr, int]

__all__ = [
    "BUFSIZES", "CALL_METHOD", "CALL_POINT", "CALL_REPLY_PORT", "CAST_FANOUT", "CAST_GATHER", "CAST_METHOD",
    "CAST_REPLY_PORT", "CONTROLLER", "Frame", "KIND", "Key", "KINDS", "Kind", "NAMES", "PortRef", "Spec", "Status",
    "TAG_DATA", "TAG_FRAME", "batch", "bye", "call", "cast", "cast_again", "dead", "debug", "describe", "fault",
    "forward", "hello", "init", "link", "log", "mark", "ping", "part", "reply", "seq", "sequenced",
    "shutdown", "site_call", "spawn", "stop", "subtree",
    "allocate", "job_hosts", "named_actor", "release", "unreachable",
]


class Kind:
    """Message kinds (plain ints: an ``IntEnum`` member pickles as a class reference, per frame)."""

    INIT: Final = 1
    HELLO: Final = 2
    SPAWN: Final = 3
    CALL: Final = 4
    REPLY: Final = 5
    STOP: Final = 6
    SHUTDOWN: Final = 7
    BYE: Final = 8
    FORWARD: Final = FORWARD
    ALLOCATE: Final = 10
    PING: Final = PING
    FAULT: Final = 12
    DEAD: Final = 13
    LOG: Final = 14
    BATCH: Final = BATCH
    SITE_CALL: Final = 16
    DEBUG: Final = 17
    CAST: Final = 18
    SEQ: Final = 19
    PART: Final = 20
    LINK: Final = LINK
    MARK: Final = MARK
    PULL: Final = PULL
    WATCH: Final = 24
    EXITED: Final = 25
    JOB_HOSTS: Final = 26
    NAMED_ACTOR: Final = 27
    RELEASE: Final = 28
    UNREACHABLE: Final = 29
    SHRINK: Final = 30


class Status:
    """How a REPLY body is to be read (plain ints, like :class:`Kind`)."""

    #: body is the pickled value
    OK: Final = 0
    #: body is a pickled error payload (see ``serialize.ErrorPayload``)
    ERROR: Final = 1
    #: the sender will never answer (failed process or actor); body is a report
    FAILED: Final = 2
    #: body is the value itself, plain data pickled with the frame (see ``serialize.plain``)
    VALUE: Final = 3
    #: body is a list of replies ``(index, status, body, buffer count, address)``, their
    #: buffers one after the other: a subtree's replies to a cast (``_core.relays``)
    MANY: Final = 4


class Spec(NamedTuple):
    """One row of the protocol table."""

    name: str
    #: the frame's fields after ``(kind, bufsizes)``, in order
    fields: tuple[str, ...]
    #: who handles it, as ``"module.Class.method"`` under ``mpimesh``; a kind that
    #: both roles receive names each role's handler, separated by ``" | "``
    handler: str


# --- the table: kind, fields, constructor, handler ------------------------------------------------

_INIT, _HELLO, _SPAWN, _CALL, _REPLY, _STOP = Kind.INIT, Kind.HELLO, Kind.SPAWN, Kind.CALL, Kind.REPLY, Kind.STOP
_SHUTDOWN, _BYE, _FAULT, _DEAD, _LOG = Kind.SHUTDOWN, Kind.BYE, Kind.FAULT, Kind.DEAD, Kind.LOG
_SITE_CALL, _DEBUG, _CAST, _SEQ, _PART = Kind.SITE_CALL, Kind.DEBUG, Kind.CAST, Kind.SEQ, Kind.PART

KINDS: dict[int, Spec] = {}


def _declare(kind: int, name: str, fields: str, handler: str) -> None:
    KINDS[kind] = Spec(name, tuple(fields.split()), handler)


_declare(_INIT, "INIT", "island controller_host controller_pid sys_path", "_roles.worker.Worker.on_init")


def init(island: int, controller_host: str, controller_pid: int, sys_path: list[str]) -> Frame:
    """Controller -> a freshly spawned worker: its island, the controller's host and pid, ``sys.path``."""
    return (_INIT, None, island, controller_host, controller_pid, sys_path)


_declare(_HELLO, "HELLO", "host pid", "_roles.controller.Controller.on_hello")


def hello(host: str, pid: int) -> Frame:
    """Worker -> controller, once at start: where the worker runs."""
    return (_HELLO, None, host, pid)


_declare(_SPAWN, "SPAWN", "key name point is_async body reply_port creator sys_path", "_core.actors.ActorHost.on_spawn")


def spawn(bufsizes: tuple[int, ...] | None, key: Key, name: str, point: Any, is_async: bool, body: bytes,
          reply_port: PortRef, creator: tuple[str, Addr], sys_path: list[str]) -> Frame:
    """Any -> worker: create one actor of mesh ``key`` at ``point`` from the pickled ``body``.

    ``creator`` is ``(creating actor's id, spawning process)``; the actor's
    failures go to the second.  The actor answers on ``reply_port`` once its
    ``__init__`` has run.
    """
    return (_SPAWN, bufsizes, key, name, point, is_async, body, reply_port, creator, sys_path)


_declare(_CALL, "CALL", "key method args reply_port point site?", "_core.actors.ActorHost.on_call")


def call(bufsizes: tuple[int, ...] | None, key: Key, method: str, args: Any, reply_port: PortRef | None,
         point: Any) -> Frame:
    """Any -> actor: call ``method`` of the actor of mesh ``key`` at ``point``.

    ``args`` is ``(args, kwargs)`` itself when plain data (see
    ``serialize.plain``), else their pickle.  ``reply_port`` is ``None`` for a
    broadcast.  ``point`` is the message's ``(rank, extent)`` in the mesh the
    caller addressed (``context().message_rank``).
    """
    return (_CALL, bufsizes, key, method, args, reply_port, point)


def call_registering(bufsizes: tuple[int, ...] | None, key: Key, method: str, args: Any, reply_port: PortRef,
                     point: Any, site: int) -> Frame:
    """A CALL that also registers a call site for later SITE_CALLs from the same caller.

    ``site`` is a job-wide unique int naming (actor, method, caller, point),
    so that later calls name it instead of repeating them.
    """
    return (_CALL, bufsizes, key, method, args, reply_port, point, site)


_declare(_REPLY, "REPLY", "port_id index status body", "_core.ports.PortTable.take_reply")


def reply(bufsizes: tuple[int, ...] | None, port_id: int, index: int, status: int, body: Any) -> Frame:
    """Any -> port owner: the ``index``-th answer on port ``port_id``, read as ``status`` says."""
    return (_REPLY, bufsizes, port_id, index, status, body)


_declare(_STOP, "STOP", "key reply_port index reason", "_core.actors.ActorHost.on_stop")


def stop(key: Key | None, reply_port: PortRef | None, index: int, reason: str) -> Frame:
    """Any -> worker: drain the actor of mesh ``key`` (every actor when ``None``), run ``__cleanup__``, answer."""
    return (_STOP, None, key, reply_port, index, reason)


_declare(_SHUTDOWN, "SHUTDOWN", "exit_code deaths", "_roles.worker.Worker.on_shutdown")


def shutdown(exit_code: int, deaths: bool) -> Frame:
    """Controller -> worker: stop every actor, say BYE, exit with ``exit_code``.

    ``deaths``: a process of the job has died, maybe before this worker was
    spawned (so it skips ``MPI_Finalize``, see ``_roles.worker.finish``).
    """
    return (_SHUTDOWN, None, exit_code, deaths)


_declare(_BYE, "BYE", "stuck", "_roles.controller.Controller.on_bye")


def bye(stuck: int) -> Frame:
    """Worker -> controller: the worker is leaving; ``stuck`` sends could not complete."""
    return (_BYE, None, stuck)


# Any -> controller: relay the pickled inner frame to ``dest`` (between islands); made by ``frames.forward``.
_declare(FORWARD, "FORWARD", "dest frame_bytes", "_roles.controller.Controller.on_forward")


# A worker's requests to the controller about processes; each is answered on ``reply_port``.

_declare(Kind.ALLOCATE, "ALLOCATE", "per_host hosts reply_port", "_roles.controller.Controller.on_allocate")


def allocate(per_host: int, hosts: list[str], reply_port: PortRef) -> Frame:
    """Worker -> controller: ``per_host`` processes on each of ``hosts`` for a new mesh; answered ``[(addr, host)]``."""
    return (Kind.ALLOCATE, None, per_host, hosts, reply_port)


_declare(Kind.JOB_HOSTS, "JOB_HOSTS", "reply_port", "_roles.controller.Controller.on_job_hosts")


def job_hosts(reply_port: PortRef) -> Frame:
    """Worker -> controller: the job's hosts in launch order, please."""
    return (Kind.JOB_HOSTS, None, reply_port)


_declare(Kind.NAMED_ACTOR, "NAMED_ACTOR", "name body reply_port", "_roles.controller.Controller.on_named_actor")


def named_actor(name: str, body: bytes, reply_port: PortRef) -> Frame:
    """Worker -> controller: the singleton actor mesh ``name``, spawned from the pickled ``body`` if new."""
    return (Kind.NAMED_ACTOR, None, name, body, reply_port)


_declare(Kind.RELEASE, "RELEASE", "addrs reason reply_port", "_roles.controller.Controller.on_release")


def release(addrs: list[Addr], reason: str, reply_port: PortRef) -> Frame:
    """Worker -> controller: stop every actor on ``addrs`` and take the processes back; answered once done."""
    return (Kind.RELEASE, None, addrs, reason, reply_port)


_declare(PING, "PING", "sequence", "_roles.worker.Worker.on_ping | _roles.controller.Controller.on_ping")


def ping(sequence: int) -> Frame:
    """Controller <-> worker heartbeat; the worker echoes it."""
    return (PING, None, sequence)


_declare(_FAULT, "FAULT", "key rank report", "_core.failures.Failures.on_fault")


def fault(key: Key, rank: int, report: str) -> Frame:
    """Actor's process -> its spawner's process: the actor at ``rank`` of mesh ``key`` failed."""
    return (_FAULT, None, key, rank, report)


_declare(_DEAD, "DEAD", "addr report", "_core.failures.Failures.on_dead")


def dead(addr: Addr, report: str) -> Frame:
    """Controller -> every process: the process at ``addr`` has died."""
    return (_DEAD, None, addr, report)


_declare(Kind.UNREACHABLE, "UNREACHABLE", "addr report", "_core.failures.Failures.on_unreachable")


def unreachable(addr: Addr, report: str) -> Frame:
    """Controller -> the sender of a FORWARD it could not pass on: ``addr`` is gone (its island stopped).

    Unlike DEAD, it says nothing of a death: the sender fails its waits on
    ``addr`` at once, as the controller's own send there would have failed.
    """
    return (Kind.UNREACHABLE, None, addr, report)


_declare(_LOG, "LOG", "stream lines", "_roles.controller.Controller.on_log")


def log(stream: int, lines: list[tuple[str, str]]) -> Frame:
    """Worker -> controller: output lines ``(label, text)`` of stream 1 (stdout) or 2 (stderr)."""
    return (_LOG, None, stream, lines)


# Any -> any: several pickled frames to one process in one message; made by ``frames.batch``.
_declare(BATCH, "BATCH", "frames", "_core.runtime.Runtime.on_batch")


_declare(_SITE_CALL, "SITE_CALL", "site port_id args", "_core.actors.ActorHost.on_site_call")


def site_call(site: int, port_id: int, args: tuple[Any, ...]) -> Frame:
    """Any -> actor: a CALL through a registered call site, plain positional arguments only.

    It travels the path of the CALL that registered ``site``, so it cannot
    overtake it (MPI keeps per-pair order).
    """
    return (_SITE_CALL, None, site, port_id, args)


_declare(_DEBUG, "DEBUG", "op arg", "debug._worker.Agent.on_debug")


def debug(op: str, arg: Any) -> Frame:
    """Any -> any: a request of the debugger (``mpimesh.debug``), e.g. ``"pm"`` ``(actor id, reply port)``."""
    return (_DEBUG, None, op, arg)


_declare(_CAST, "CAST", "sender key method args reply_port labels extent fanout gather stream entries",
         "_core.forwarder.Forwarder.on_cast")


def cast(bufsizes: tuple[int, ...] | None, sender: Addr, key: Key, method: str, args: Any, reply_port: PortRef | None,
         labels: tuple[str, ...], extent: tuple[int, ...], fanout: int, gather: int | bytes,
         stream: tuple[int, tuple[int, ...]] | None, entries: bytes) -> Frame:
    """Any -> actors down a tree: one CALL for each of ``entries``, ``(rank, address, sequence)``, packed.

    The first entry is the receiver's own; it forwards the others, split in
    at most ``fanout`` parts (see ``_core.multicast``, ``_core.forwarder``).
    ``labels`` and ``extent`` are the addressed view's, so each entry's message point is
    ``(rank, labels, extent)``.  ``gather``: how replies travel to
    ``reply_port``, each straight there (0), up the tree (1, see
    ``_core.relays``), straight there for a resend (2), or folded on the
    way up (a pickled ``_core.folds.Fold``).  ``stream``:
    ``None`` when the raw buffers ride with this frame, else ``(cast id,
    buffer sizes)``: they follow in PART frames.  ``entries`` (packed by
    ``_core.entries``) comes last: each subtree's frame is :func:`subtree`'s copy with its own
    entries; a forwarder that gathers sends :func:`cast_again`'s, its relay as ``reply_port``.
    """
    return (_CAST, bufsizes, sender, key, method, args, reply_port, labels, extent, fanout, gather, stream, entries)


_declare(_PART, "PART", "sender cast index offset", "_core.forwarder.Forwarder.on_part")


def part(bufsizes: tuple[int], sender: Addr, cast: int, index: int, offset: int) -> Frame:
    """Any -> a cast's tree: ``bufsizes[0]`` bytes of raw buffer ``index`` of cast ``cast``, from ``offset`` on.

    The bytes ride as this frame's one raw buffer; each process forwards
    them to the processes it forwarded the cast to, so a large argument is
    pipelined down the tree instead of crossing it one hop after another.
    """
    return (_PART, bufsizes, sender, cast, index, offset)


_declare(_SEQ, "SEQ", "sender sequence inner", "_core.forwarder.Forwarder.on_seq")


def seq(bufsizes: tuple[int, ...] | None, sender: Addr, sequence: int, inner: Frame | None) -> Frame:
    """Any -> any: ``inner``, number ``sequence`` of the actor messages from ``sender`` to here.

    Sent once the receiver got a cast from ``sender`` through a tree, so that
    messages on both paths are delivered in the order sent.  ``inner`` is
    ``None`` for a number skipped (a broadcast lost with its relay).
    """
    return (_SEQ, bufsizes, sender, sequence, inner)


def sequenced(sender: Addr, sequence: int, inner: Frame) -> Frame:
    """``inner`` in a SEQ envelope (see :func:`seq`); its raw buffers travel with the envelope."""
    return seq(inner[BUFSIZES], sender, sequence, inner)


_declare(Kind.WATCH, "WATCH", "peers", "_roles.worker.Worker.on_watch")


def watch(peers: list[tuple[Addr, int]]) -> Frame:
    """Controller -> a worker on another host: watch these workers of your host (address, pid), report their exits.

    The controller reads a same-host worker's exit through a pidfd; on
    another host one worker does it for the others (``_roles.hostwatch``).
    """
    return (Kind.WATCH, None, peers)


_declare(Kind.SHRINK, "SHRINK", "", "_roles.worker.Worker.on_shrink")


def shrink() -> Frame:
    """Controller -> every live worker of its world: shrink ``MPI_COMM_WORLD`` to its live processes, with me.

    Sent after a heal or a shrink where ``MPI_Comm_create_from_group`` is
    unsupported (``_transport.live``).
    """
    return (Kind.SHRINK, None)


_declare(Kind.EXITED, "EXITED", "addr cause", "_roles.controller.Controller.on_exited")


def exited(addr: Addr, cause: str) -> Frame:
    """Worker -> controller: a worker of my host that I watch has exited, and why (its wait status, its last words)."""
    return (Kind.EXITED, None, addr, cause)


_declare(LINK, "LINK", "op peer port", "_transport.peers.Peers.on_link")
_declare(MARK, "MARK", "sender", "_transport.peers.Peers.on_mark")
_declare(PULL, "PULL", "token nbytes tag", "_data.pulls.Pulls.on_pull")


# --- fields by name ---------------------------------------------------------------------------------
# A handler unpacks its whole frame on its first line; code that reads one
# field of a frame it holds (a call refused before its actor ran, a logged
# cast resent) reads it at these positions, taken from the table.

def _at(kind: int, field: str) -> int:
    return 2 + KINDS[kind].fields.index(field)


#: Positions in a CALL frame (``KIND`` and ``BUFSIZES`` are every frame's first two).
CALL_METHOD: Final = _at(_CALL, "method")
CALL_REPLY_PORT: Final = _at(_CALL, "reply_port")
CALL_POINT: Final = _at(_CALL, "point")
#: Positions in a CAST frame.
CAST_METHOD: Final = _at(_CAST, "method")
CAST_REPLY_PORT: Final = _at(_CAST, "reply_port")
CAST_FANOUT: Final = _at(_CAST, "fanout")
CAST_GATHER: Final = _at(_CAST, "gather")
#: (the last: :func:`subtree` keeps the fields before it)
_CAST_ENTRIES: Final = _at(_CAST, "entries")


def subtree(frame: Frame, entries: bytes) -> Frame:
    """The CAST ``frame`` for another subtree: the same call, with ``entries`` (packed) as its destinations."""
    return (*frame[:_CAST_ENTRIES], entries)


def cast_again(frame: Frame, reply_port: PortRef | None, gather: int | bytes) -> Frame:
    """The call of CAST ``frame``, its replies to ``reply_port`` as ``gather`` says; no entries yet (:func:`subtree`).

    A forwarder that gathers a subtree's replies sends the call on with its
    relay's port; a caller resends a logged cast with its replies straight back.
    """
    _, bufsizes, sender, key, method, args, _, labels, extent, fanout, _, stream, _ = frame
    return cast(bufsizes, sender, key, method, args, reply_port, labels, extent, fanout, gather, stream, b"")


#: kind -> its name, for messages.
NAMES: dict[int, str] = {kind: spec.name for kind, spec in KINDS.items()}


def describe(frame: Frame) -> str:
    """A frame with its fields named, for traces and internal errors."""
    spec = KINDS.get(frame[0])
    if spec is None:
        return f"unknown frame {frame!r}"
    fields = ", ".join(f"{name.rstrip('?')}={value!r}" for name, value in zip(spec.fields, frame[2:], strict=False))
    return f"{spec.name}({fields})"

