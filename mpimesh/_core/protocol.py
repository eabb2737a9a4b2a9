"""The wire protocol: message kinds, their handlers and the MPI tags.

Every frame is a pickled tuple ``(kind, bufsizes, *fields)``.  ``bufsizes`` is
``None`` or a tuple of byte counts: that many raw buffers follow the frame on
``TAG_DATA`` from the same sender, posted atomically with it, so the receiver
takes them right after the frame (MPI does not reorder messages between one
sender and one receiver on one tag).

All kinds are listed once, here, with the name of the runtime method that
handles them (``Runtime._on_<name>``), in the manner of execnet's ``Message``.
"""

from __future__ import annotations

from typing import Any, Final

#: A frame on the wire: ``(kind, bufsizes, *fields)``.
Frame = tuple[Any, ...]
#: Job-wide unique id of an actor mesh: ``(island, rank, counter)`` of its spawner.
Key = tuple[int, int, int]

__all__ = ["CONTROLLER", "Frame", "Key", "Kind", "TAG_FRAME", "TAG_DATA", "HANDLERS", "NAMES", "Status"]

#: The controller's address ``(island, rank)``.
CONTROLLER = (0, 0)

#: Tag of pickled control frames.
TAG_FRAME = 0x6D6D
#: Tag of raw out-of-band buffers that follow a frame.
TAG_DATA = 0x6D6E


class Kind:
    """Message kinds, one per handler.

    Plain ints, not an ``IntEnum``: an enum member pickles as a reference to
    its class and costs ~1 us more to pickle and to unpickle, per frame.
    """

    #: controller -> spawned worker: (island, controller host, controller pid, sys.path)
    INIT: Final = 1
    #: worker -> controller: (host, pid)
    HELLO: Final = 2
    #: any -> worker: create an actor: (actor_key, name, point, is_async, body, reply_port, creator, sys_path)
    SPAWN: Final = 3
    #: any -> actor: (actor_key, method, args, reply_port | None, message_point[, site]); args
    #: is ``(args, kwargs)`` itself when plain data, else their pickle.  A trailing ``site``
    #: (a job-wide unique int) registers actor, method, caller and point as a call site
    #: that later calls from the same process may name instead (SITE_CALL)
    CALL: Final = 4
    #: any -> port owner: (port_id, index, status, body)
    REPLY: Final = 5
    #: any -> actor: drain, run __cleanup__, answer: (actor_key, reply_port, index)
    STOP: Final = 6
    #: controller -> worker: stop every actor, say BYE, exit: (exit_code,)
    SHUTDOWN: Final = 7
    #: worker -> controller: the worker has stopped its actors and is leaving: ()
    BYE: Final = 8
    #: any -> controller: relay the inner frame to dest: (dest, frame_bytes)
    FORWARD: Final = 9
    #: worker -> controller: allocate processes for an actor: (per_host, reply_port, owner)
    PROCS: Final = 10
    #: controller <-> worker liveness: (sequence, sent_time)
    PING: Final = 11
    #: actor's process -> its spawner's process: the actor failed: (actor_key, rank, report)
    FAULT: Final = 12
    #: controller -> every process: a process has died: (addr, report)
    DEAD: Final = 13
    #: worker -> controller: output lines: (stream 1|2, [(label, text), ...])
    LOG: Final = 14
    #: any -> any: several frames to one process in one message: ([frame_bytes, ...],)
    BATCH: Final = 15
    #: any -> actor: a CALL through a registered call site, plain positional arguments
    #: only: (site, reply_port_id, args).  It travels the same path as the CALL that
    #: registered the site, so it cannot overtake it (MPI keeps per-pair order)
    SITE_CALL: Final = 16


#: kind -> its name, for messages.
NAMES: dict[int, str] = {v: k for k, v in vars(Kind).items() if type(v) is int}

#: kind -> handler method name on the runtime (CALL, SITE_CALL and REPLY go
#: straight to the actor host and the port table instead, see Runtime).
HANDLERS: dict[int, str] = {kind: "_on_" + name.lower() for kind, name in NAMES.items()}


class Status:
    """How a REPLY body is to be read (plain ints, like :class:`Kind`)."""

    #: body is the pickled value
    OK: Final = 0
    #: body is a pickled error payload (see ``_serialize.ErrorPayload``)
    ERROR: Final = 1
    #: the sender will never answer (failed process or actor); body is a report
    FAILED: Final = 2
    #: body is the value itself, plain data pickled with the frame (see ``_serialize.plain``)
    VALUE: Final = 3
