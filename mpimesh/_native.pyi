"""Stub of the optional C extension ``mpimesh._native`` (sources in ``native/``).

Built by ``setup.py`` with the MPI compiler wrapper when one is found; it
does not link libmpi.  Without it, ``mpimesh._data.buffers.cuda_support`` falls
back to ctypes, and ``mpimesh._transport.make_router`` puts the router
over an ``Mpi4pyWire`` instead of a ``NativeWire`` (see ``mpimesh._transport.native``).
"""

import threading
from typing import Any

def cuda_compile_time() -> int:
    """1 if the MPI headers said CUDA-aware at build time, 0 if not, -1 if they do not say."""

def built_with() -> str:
    """Vendor and version of the MPI headers the extension was built with (``"Open MPI 5.0.11"``)."""

def wire_bind(libpath: str, byte_handle: int, exc_type: type[BaseException], /) -> None:
    """Look up the frame path's MPI functions in the libmpi already loaded at ``libpath`` (see native/wire.c).

    Raises:
        OSError: the library is not loaded, or lacks a function.
    """

def wire_probe(handles: tuple[int, ...], tag: int, spin_ns: int, /) -> tuple[int, int, Any] | None:
    """Receive one message of ``tag`` from any source of the communicators ``handles``.

    Probes twice, then up to ``spin_ns`` more with the GIL released; a
    negative ``spin_ns`` probes once.

    Returns:
        None (nothing arrived), (link index, source, bytes), or (link index, -1, MPI error code).
    """

def wire_isend(handle: int, data: bytes, dest: int, tag: int, /) -> int | None:
    """Start a send on communicator ``handle`` and test it once.

    Returns:
        None when it is complete, else the request's handle (keep ``data`` alive until it completes).

    Raises:
        mpi4py.MPI.Exception: the MPI call failed.
    """

class Pump:
    """NativeWire's receive path: receive, unpickle and dispatch frames (see native/pump.c).

    Args:
        lock: held while receiving (the router's lock), released before dispatching.
        handlers: frame kind -> ``handler(source, frame, buffers)``.
        take_buffers: ``take_buffers(link index, source rank, sizes)`` -> the raw buffers that
            follow a frame, called under ``lock``.
        on_error: ``on_error(kind, source, exception)`` for a handler that raised an
            Exception; ``None`` lets it propagate.
        no_buffers: the list passed to handlers of frames without raw buffers.
        tag, batch_kind, ping_kind: the frames' MPI tag, and the kinds of BATCH and PING frames.
        max_frames: the most frames one poll receives.
    """

    #: tracked source -> when last heard from (``time.monotonic``), or None
    heard: dict[tuple[int, int], float] | None
    #: when a frame from (0, 0) last arrived, while ``heard`` is None
    heard_controller: float
    #: frames dispatched
    frames_in: int
    #: call site number -> :class:`Site` offered its SITE_CALLs first, or None
    sites: dict[int, Site] | None
    #: the SITE_CALL frame kind (-1: none)
    site_kind: int

    def __init__(
        self, lock: Any, handlers: dict[int, Any], take_buffers: Any, on_error: Any, no_buffers: list[Any],
        tag: int, batch_kind: int, ping_kind: int, max_frames: int,
    ) -> None: ...
    def set_links(self, handles: tuple[int, ...], sources: tuple[Any, ...], /) -> None:
        """The communicators to poll, and per link an ``(island, rank)`` for all its sources, or the island."""
    def poll(self, spin: float, /) -> int | tuple[int, list[tuple[int, int]]]:
        """Receive (probing up to ``spin`` s, GIL released) and dispatch; returns frames handled, not PINGs.

        With link failures: ``(handled, [(link index, MPI error code), ...])``.
        """

class Lane:
    """One sync actor as the native call sites see it, and the one call the pump took for it (see native/site.c).

    Args:
        mailbox: its mailbox (a deque): a call is run only while it is empty.
        lifecycle: its ``Lifecycle``, whose ``phase`` must be ``running``.
        running: ``Phase.RUNNING``.
        tid: its thread's id; a call is run only by that thread.
    """

    #: set by the actor's thread while it waits, idle, for mail
    armed: bool
    tid: int
    #: calls its sites ran in C (``ActorCell.calls`` adds them)
    calls: int
    #: ``(method, time.monotonic() at its start)`` while a call runs here, else None (``ActorCell.busy``)
    busy: tuple[str, float] | None

    def __init__(self, mailbox: Any, lifecycle: Any, running: Any, tid: int) -> None: ...
    def ready(self) -> bool:
        """Whether the mailbox has mail or a call was taken: the actor's idle wait's ``done()``."""
    def run(self) -> bool:
        """Run the call taken, if any: in C, or through ``Site``'s ``slow``; whether there was one."""

class Site:
    """A call site whose SITE_CALLs the pump takes for its idle actor's thread to run in C (see native/site.c).

    Args:
        lane: the actor.
        fn, var, ctx: the bound endpoint, the context variable and the site's Context.
        method, index: the method's name and the message's index.
        dest, island, rank: the caller's address, its island, and its rank on the link the reply leaves on.
        routes, routed, peers: the router's routes table, what it must map ``island`` to (the link,
            or None for the parent link), and the router's peers, which must have none to ``dest``.
        outs, sender, outbox: the link's Out table, the Sender and the Outbox (its ``polls``).
        dead: the processes known dead: their calls are left to the Python path.
        reply_kind, value_status: REPLY and VALUE.
        finish: ``finish(pid, result, exc)``: an exception, or a result not a scalar.
        hold: ``hold(data)``: a reply the sender holds for a batch.
        send_failed: ``send_failed(exc)``: ``Sender.post`` raised ``exc``.
        slow: ``slow(pid, args)``: a call taken that the Python path must make (the actor
            stopped or failed, the caller's way changed).
    """

    #: calls run in C (the others took the Python path)
    runs: int

    def __init__(
        self, *, lane: Lane, fn: Any, var: Any, ctx: Any, method: str, index: int,
        dest: tuple[int, int], island: int, rank: int, routes: dict[int, Any], routed: Any, peers: dict[Any, Any],
        outs: dict[int, Out], sender: Sender, outbox: Any, dead: dict[tuple[int, int], str], reply_kind: int,
        value_status: int, finish: Any, hold: Any, send_failed: Any, slow: Any,
    ) -> None: ...

class Out:
    """Frames waiting to leave for one process, and when it was last sent to (see native/post.c)."""

    link: Any
    rank: int
    #: pickled frames held back for a batch
    frames: list[bytes]
    #: when a frame last left for it (``time.monotonic``)
    last: float
    #: the router's poll count then
    polls: int

    def __init__(self, link: Any, rank: int) -> None: ...

#: A threading.Lock that the native part takes without a Python call (native/lock.c): acquire(blocking,
#: timeout), release(), locked() and the context manager, as threading.Lock's; typed as one.
Lock = threading.Lock

class Sender:
    """NativeWire's send path for frames that leave at once (see native/post.c).

    Args:
        lock: the router's send lock, held while sending.
        tag: the frames' MPI tag.
        batching: whether a frame in a burst is held back (returned by ``post``).
        burst: seconds after a send within which a frame with no poll in between is in a burst.
        ring_after: seconds of pause after which ``ring(out)`` is called.
        failed_classes: MPI error classes that mean a peer died (such sends are dropped).
    """

    #: ``ring(out)`` after a pause, or None
    ring: Any
    #: sends in flight
    pending: int
    #: frames sent
    frames_out: int
    #: when a frame last left (``time.monotonic``)
    sent_at: float

    def __init__(
        self, lock: Any, tag: int, batching: bool, burst: float, ring_after: float, failed_classes: tuple[int, ...],
    ) -> None: ...
    def post(self, out: Out, frame: Any, polls: int, /) -> bytes | None:
        """Send ``frame`` to ``out`` now, or return its pickle for the router to hold back.

        Raises:
            mpi4py.MPI.Exception: the MPI call failed.
        """
    def reap(self) -> int:
        """Drop the completed sends (call it holding the lock); returns those still in flight."""

class CallSite:
    """A registered call site's ``call_one`` in one C call (see native/call.c).

    Args:
        sender, out: the native wire's Sender and the actor process's Out.
        outbox: the wire's outbox (its ``polls``, for the sender's batching).
        hold: ``hold(data)``: a pickled frame the sender held back for a batch.
        failed: ``failed(future, port id, exception)``: a send raised.
        routes: the router's island routes; the site is used while ``routes[addr[0]] is out.link``.
        open, ids: the PortTable's open ports and its id counter.
        dead: the processes known dead; multicast: the runtime's (``enrolled``).
        one_type: ``OneReply``; kind: ``Kind.SITE_CALL``; number: the site's number.
        addr, shape, rank, actor: the actor's address, the view and rank called, the actor's class.
    """

    number: int
    addr: tuple[int, int]

    def __init__(
        self, sender: Sender, out: Out, outbox: Any, hold: Any, failed: Any, routes: dict[int, Any],
        open: dict[int, Any], ids: Any, dead: dict[Any, str], multicast: Any, one_type: type, kind: int,
        number: int, addr: tuple[int, int], shape: Any, rank: int, actor: str,
    ) -> None: ...
    def call(self, name: str, what: str, args: tuple[Any, ...], /) -> Any:
        """Send a SITE_CALL of ``args``: its OneReply, or None for the Python path (a death, a cast, a new route)."""

class CallOne:
    """An endpoint's ``call_one(*args)`` through a registered CallSite, without a Python frame (native/callone.c).

    Args:
        fallback: the class's ``Endpoint.call_one``, bound: every call the fast path does not take.
        mesh: the endpoint's mesh (its ``_stopped``, read on every call).
        fast: the MeshRef's ``_fast``: method -> CallSite.
        method, name, what: the method called, the future's name, the endpoint's name in errors.
        arities: the argument counts the signature check accepted (None: no check).
        atoms: the argument types that may take the fast path.
    """

    def __init__(
        self, fallback: Any, mesh: Any, fast: dict[Any, Any], method: str, name: str, what: str,
        arities: set[int] | None, atoms: frozenset[Any],
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``fast[method].call(name, what, args)`` where it may and it answers; else ``fallback(*args, **kwargs)``."""

class Replies:
    """The REPLY handler: a plain value for a OneReply nobody sleeps on settles in C (see native/call.c).

    Args:
        open: the PortTable's open ports.
        fallback: the Python handler, for every other reply.
        lazy_lock: ``future._lazy_lock``.
        one_type: ``OneReply``.
        value_status: ``Status.VALUE``.
        finished: the state of a settled future (``"FINISHED"``).
    """

    def __init__(
        self, open: dict[int, Any], fallback: Any, lazy_lock: Any, one_type: type, value_status: int, finished: str,
    ) -> None: ...
    #: the Python handler's function (``fallback``), for introspection: the dispatch table names it
    __func__: Any

    def __call__(self, src: tuple[int, int], frame: Any, buffers: list[Any], /) -> None: ...

class Spin:
    """``Progress.wait``'s spinning phase for a leader, in C (see native/call.c).

    Args:
        progress: the Progress (its ``_poll``, ``main_thread_polls`` and ``_polled_at``).
        token: the progress token; leaders: Progress's list of leading waits.
        spin: seconds without traffic after which ``wait`` gives up.
        chunk: the longest probe of one poll, in seconds.
        yield_every: yield the CPU every this many empty polls.
        main_ident: the main thread's ident.
    """

    def __init__(
        self, progress: Any, token: Any, leaders: list[object], spin: float, chunk: float, yield_every: int,
        main_ident: int,
    ) -> None: ...
    def wait(self, fut: Any, /) -> bool:
        """Poll until ``fut`` is settled (True); False where ``Progress.wait`` must go on."""
    #: statistics: calls run by ``serve``, in C
    served: int
    def serve(self, lane: Lane, /) -> bool:
        """A sync actor's idle wait as the leader, running each call its sites take (``Lane.run``) as it comes.

        Returns:
            True once the mailbox has mail; False where ``Progress.wait`` must go on (a follower, or
            ``spin`` seconds without traffic).  No call taken is left unrun.
        """
    def getter(self, fallback: Any, finished: str, /) -> Getter:
        """``Future.get`` in C over this spin (``future.set_driver`` puts it on ``Future``); ``fallback``: the rest."""

class Getter:
    """``Future.get`` without its Python frame (see native/getter.c): a method descriptor.

    ``fut.get()`` returns ``fut._result`` once ``fut._state`` is ``finished`` with no exception, after
    ``Spin.wait(fut)`` if it is not yet; a timeout, keywords, an exception, a cancelled future or the
    spin declining go to ``fallback(fut, ...)``, the Python ``Future.get``.
    """

    #: the Python method it fronts
    __wrapped__: Any
    def __init__(self, spin: Spin, fallback: Any, finished: str) -> None: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any: ...
    def __call__(self, fut: Any, *args: Any, **kwargs: Any) -> Any: ...

def fast_dumps(frame: Any, /) -> bytes | None:
    """The pickle the send path writes itself for a frame of None, bools, 64-bit ints, floats, strs and tuples.

    Returns:
        Bytes that ``pickle.loads`` reads back equal, of the same types; None for any other frame
        (``pickle.dumps`` is used then; native/fastpickle.c).
    """

def fast_loads(data: bytes, /) -> tuple[Any] | None:
    """The frame the receive path reads itself from a pickle of such scalars, as a 1-tuple.

    Returns:
        None for any other pickle, a malformed one included (``pickle.loads`` is used then).
    """

def spin_yield(flag: bool, /) -> bool:
    """Whether spinning waiters yield the CPU now and then (``_core.crowding``); returns the value before."""

def cuda_run_time(libpath: str, /) -> tuple[int, str]:
    """Ask the already loaded libmpi at ``libpath``.

    Returns:
        (1 yes, 0 no, -1 no query function, -2 library not loaded; the name of the function used).
    """

def ulfm_beat_start(libpath: str, self_handle: int, period: float, calls: int, exit_bound: float = 30.0,
                    /) -> None:
    """Start the thread that makes ``calls`` ``MPI_Iprobe`` on ``MPI_COMM_SELF`` every ``period`` s, without the GIL.

    ULFM's heartbeats while Python holds the GIL (see native/ulfm_beat.c); it ends at the
    interpreter's exit, right before mpi4py's ``MPI_Finalize``.  If its polls under way do not
    end within ``exit_bound`` seconds then, the process leaves at once with status 1 and a
    line on stderr, without ``MPI_Finalize``.

    Raises:
        OSError: the libmpi at ``libpath`` is not loaded, or lacks ``MPI_Iprobe``.
        RuntimeError: the thread runs already.
    """

def ulfm_beat_stop(bound: float = 30.0, /) -> int:
    """Stop that thread, if it runs; returns the wakes on which it polled.

    Raises:
        TimeoutError: its polls did not end within ``bound`` seconds (an ``MPI_Iprobe`` stuck); it still runs.
    """

def ulfm_beat_hold(bound: float, /) -> None:
    """No MPI call from that thread until :func:`ulfm_beat_release` (nestable); waits for its polls to end.

    Raises:
        TimeoutError: its polls did not end within ``bound`` seconds (an ``MPI_Iprobe`` stuck); not held.
    """

def ulfm_beat_release() -> None:
    """Undo one :func:`ulfm_beat_hold`."""
