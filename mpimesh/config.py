"""Runtime settings read once from ``MPIMESH_*`` environment variables.

Every knob of the runtime lives here, parsed and validated in one place.
A value that does not parse raises ``ValueError`` naming the variable and the
expected form, at import of :mod:`mpimesh`, not in the middle of a job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Config", "load", "parse_dashboard", "settings"]

# Renamed variables: old name -> new name.  Read with a warning (mpi4py's
# os_environ_get keeps the same kind of table).
_RENAMED: dict[str, str] = {}


@dataclass(frozen=True)
class Config:
    """Parsed ``MPIMESH_*`` settings.

    Attributes:
        spin_us: After a message, a waiting thread polls MPI without sleeping
            for this long (``MPIMESH_SPIN_US``).  Keeps round trips at MPI
            speed while traffic flows.
        idle_sleep_us: Longest sleep between two polls of an idle rank
            (``MPIMESH_IDLE_SLEEP_US``).  Bounds both the idle CPU cost and
            the latency of the first message after an idle period.
        deep_sleep_us: Longest sleep between two polls of a rank that has
            seen no traffic for half a second (``MPIMESH_DEEP_SLEEP_US``).
        leader_idle_ms: A thread waiting on its own event stops polling MPI
            after this long without traffic and leaves polling to the
            background thread (``MPIMESH_LEADER_IDLE_MS``).
        shutdown_timeout: Seconds the controller waits for workers to finish
            at exit before aborting the job (``MPIMESH_SHUTDOWN_TIMEOUT``).
        cleanup_timeout: Seconds an actor's ``__cleanup__`` may run at stop
            (``MPIMESH_CLEANUP_TIMEOUT``).
        spawn_timeout: Seconds to wait for spawned workers to say hello
            (``MPIMESH_SPAWN_TIMEOUT``).
        heartbeat_timeout: Seconds of silence after which the controller
            declares a worker dead (``MPIMESH_HEARTBEAT_TIMEOUT``); same-host
            deaths are seen at once, without waiting for this.  Silence
            counts only while the controller polls, and a same-host worker
            that is running or using CPU is busy, not dead (``_roles.liveness``).
        oob_threshold: Buffers of at least this many bytes inside arguments
            and results travel as raw MPI messages (``MPIMESH_OOB_THRESHOLD``).
        log_forward: Workers' Python output goes to the controller, prefixed
            with actor and rank (``MPIMESH_LOG_FORWARD``, default on).
        log_fold: Seconds the controller holds forwarded lines to print
            identical lines from many ranks once (``MPIMESH_LOG_FOLD``, 0: off).
        show_waits: Print a progress line for waits (``get()``, spawning)
            longer than this many seconds (``MPIMESH_SHOW_WAITS``, 0: off).
        debug: Trace lines tagged ``[rank N]`` on stderr (``MPIMESH_DEBUG``).
        batch_frames: Most frames to one process sent as one MPI message when
            they are sent in a burst (``MPIMESH_BATCH_FRAMES``; 1: every
            frame is its own message).  See ``_transport.router``.
        recv_warm_bytes: A worker whose controller runs on another host
            faults in a receive block of this many bytes at start, so that
            its first large argument up to that size lands in memory
            already faulted in (``MPIMESH_RECV_WARM_BYTES``, 0: off;
            ``_transport.buffers.warm``).
        rma_windows: Whether an island gets an MPI window for RDMABuffer
            (``MPIMESH_RMA_WINDOWS``): ``auto`` (only if it spans hosts;
            same-host buffers are copied with process_vm_readv), ``always``
            or ``never``.
        pmix_exit_status: The launcher takes the job's exit status from the
            controller through PMIx (``MPIMESH_PMIX_EXIT_STATUS``, set by
            ``mpimesh run`` on Open MPI 5.0.9 and later together with
            ``PRTE_MCA_state_base_error_non_zero_exit=0``; see
            ``mpimesh/_roles/job_status.py``).
        wire: Who makes the frame path's MPI calls (``MPIMESH_WIRE``):
            ``auto`` (the native part when it was built for the loaded MPI,
            else mpi4py), ``native`` (fail at start-up if it cannot) or
            ``mpi4py``.
        spawns_across_hosts: How often a job whose ranks span several
            hosts may call ``MPI_Comm_spawn`` (``MPIMESH_SPAWNS_ACROSS_HOSTS``):
            ``auto`` (once under Open MPI, whose 5.0 series fails or hangs
            a later spawn across nodes, open-mpi/ompi#12601; always under
            other MPIs) or ``always``.
        cast_fanout: Most messages a cast leaves a process as: a call to a
            view of many actors goes down a tree of this fan-out
            (``MPIMESH_CAST_FANOUT``; see ``_core.multicast``).
        cast_root_fanout: Most messages a cast down a tree leaves its
            caller as (``MPIMESH_CAST_ROOT_FANOUT``): the first processes of
            the tree forward it on, with ``cast_fanout``, and gather the
            replies, so a call to any number of actors costs the caller (the
            controller, most often) about what a call to one does.
        cast_tree_min: Casts to at least this many actors go down a tree;
            smaller ones are one message per actor (``MPIMESH_CAST_TREE_MIN``).
        cast_near_direct: A cast with at least this many bytes of buffers
            (tensors, arrays) whose actors all run on the caller's host goes
            straight to each, tree or not (``MPIMESH_CAST_NEAR_DIRECT``;
            0: never): each receiver copies its own message out of shared
            memory, in parallel, where a tree copies it once per level.
        island_links: Whether two processes of different islands that talk
            get a direct link instead of the controller's relay
            (``MPIMESH_ISLAND_LINKS``): ``auto`` (the default: under Open MPI,
            where a pending accept or connect holds up no other MPI call),
            ``always`` or ``never`` (every pair on the relay);
            docs/design/transport.md, "Direct links between islands".
        preload: Modules that a new actor's process imports while the actor
            is created, of those its creator has loaded (``MPIMESH_PRELOAD``:
            comma-separated names, default ``torch``; ``none`` for none).
            Without it, a worker imports torch at the first tensor it
            unpickles: that call takes ~1.3 s more (docs/design/hosts.md, 3.3);
            with it, every new worker of a torch program pays ``import torch``
            (2.5 s of CPU here) even if it never sees a tensor.
        spin_yield: Whether a thread spinning in MPI after traffic gives its
            CPU up every so many empty probes (``MPIMESH_SPIN_YIELD``):
            ``auto`` (the default: while the job's processes on this host
            outnumber the CPUs a process may run on, as Open MPI's
            ``mpi_yield_when_idle``), ``always`` or ``never``;
            ``mpimesh._core.crowding``.
        dashboard: Serve the job's live dashboard from the controller
            (``MPIMESH_DASHBOARD=[HOST:]PORT``; unset or empty: none; ``mpimesh
            run --dashboard`` sets it): on ``127.0.0.1`` unless a host is given,
            see :func:`parse_dashboard` and ``mpimesh.dashboard()``.
    """

    spin_us: float = 2000.0
    idle_sleep_us: float = 1000.0
    deep_sleep_us: float = 8000.0
    leader_idle_ms: float = 10.0
    shutdown_timeout: float = 10.0
    cleanup_timeout: float = 3.0
    spawn_timeout: float = 60.0
    heartbeat_timeout: float = 10.0
    oob_threshold: int = 65536
    log_forward: bool = True
    log_fold: float = 0.0
    show_waits: float = 0.0
    debug: bool = False
    batch_frames: int = 64
    recv_warm_bytes: int = 64 << 20
    rma_windows: str = "auto"
    pmix_exit_status: bool = False
    wire: str = "auto"
    spawns_across_hosts: str = "auto"
    cast_fanout: int = 8
    cast_root_fanout: int = 1
    cast_tree_min: int = 16
    cast_near_direct: int = 1 << 20
    island_links: str = "auto"
    preload: tuple[str, ...] = ("torch",)
    spin_yield: str = "auto"
    dashboard: str = ""


def _get(environ: Mapping[str, str], name: str) -> str | None:
    for old, new in _RENAMED.items():
        if new == name and old in environ and name not in environ:
            import warnings

            warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
            return environ[old]
    return environ.get(name)


def _number(environ: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = _get(environ, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}; unset it or use e.g. {name}={default:g}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum:g}, got {raw!r}; use e.g. {name}={default:g}")
    return value


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Parse the settings from ``environ`` (default: ``os.environ``).

    Raises:
        ValueError: a variable is set to something that does not parse.
    """
    env = os.environ if environ is None else environ
    return Config(
        spin_us=_number(env, "MPIMESH_SPIN_US", Config.spin_us),
        idle_sleep_us=_number(env, "MPIMESH_IDLE_SLEEP_US", Config.idle_sleep_us, minimum=1.0),
        deep_sleep_us=_number(env, "MPIMESH_DEEP_SLEEP_US", Config.deep_sleep_us, minimum=1.0),
        leader_idle_ms=_number(env, "MPIMESH_LEADER_IDLE_MS", Config.leader_idle_ms),
        shutdown_timeout=_number(env, "MPIMESH_SHUTDOWN_TIMEOUT", Config.shutdown_timeout, minimum=0.1),
        cleanup_timeout=_number(env, "MPIMESH_CLEANUP_TIMEOUT", Config.cleanup_timeout),
        spawn_timeout=_number(env, "MPIMESH_SPAWN_TIMEOUT", Config.spawn_timeout, minimum=0.1),
        heartbeat_timeout=_number(env, "MPIMESH_HEARTBEAT_TIMEOUT", Config.heartbeat_timeout, minimum=0.1),
        oob_threshold=int(_number(env, "MPIMESH_OOB_THRESHOLD", Config.oob_threshold)),
        log_forward=(_get(env, "MPIMESH_LOG_FORWARD") or "1") not in ("0", "false", "no"),
        log_fold=_number(env, "MPIMESH_LOG_FOLD", Config.log_fold),
        show_waits=_number(env, "MPIMESH_SHOW_WAITS", Config.show_waits),
        debug=(_get(env, "MPIMESH_DEBUG") or "0") not in ("", "0", "false", "no"),
        batch_frames=int(_number(env, "MPIMESH_BATCH_FRAMES", Config.batch_frames, minimum=1.0)),
        recv_warm_bytes=int(_number(env, "MPIMESH_RECV_WARM_BYTES", Config.recv_warm_bytes)),
        rma_windows=_choice(env, "MPIMESH_RMA_WINDOWS", ("auto", "always", "never")),
        pmix_exit_status=(_get(env, "MPIMESH_PMIX_EXIT_STATUS") or "0") not in ("", "0", "false", "no"),
        wire=_choice(env, "MPIMESH_WIRE", ("auto", "native", "mpi4py")),
        spawns_across_hosts=_choice(env, "MPIMESH_SPAWNS_ACROSS_HOSTS", ("auto", "always")),
        cast_fanout=int(_number(env, "MPIMESH_CAST_FANOUT", Config.cast_fanout, minimum=1.0)),
        cast_root_fanout=int(_number(env, "MPIMESH_CAST_ROOT_FANOUT", Config.cast_root_fanout, minimum=1.0)),
        cast_tree_min=int(_number(env, "MPIMESH_CAST_TREE_MIN", Config.cast_tree_min, minimum=2.0)),
        cast_near_direct=int(_number(env, "MPIMESH_CAST_NEAR_DIRECT", Config.cast_near_direct)),
        island_links=_choice(env, "MPIMESH_ISLAND_LINKS", ("auto", "always", "never")),
        preload=_modules(env, "MPIMESH_PRELOAD", Config.preload),
        spin_yield=_choice(env, "MPIMESH_SPIN_YIELD", ("auto", "always", "never")),
        dashboard=_dashboard(env),
    )


def parse_dashboard(value: str) -> tuple[str, int]:
    """``"8780"`` -> ``("127.0.0.1", 8780)``; ``"0.0.0.0:8780"`` -> ``("0.0.0.0", 8780)``; ``"[::]:0"`` as well.

    Raises:
        ValueError: ``value`` is not ``PORT`` or ``HOST:PORT`` with a port from 0 to 65535.
    """
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    if not port.isdigit() or int(port) > 65535 or (sep and not host):
        raise ValueError(f"MPIMESH_DASHBOARD must be PORT or HOST:PORT (port 0-65535), got {value!r}; "
                         "use e.g. MPIMESH_DASHBOARD=8780 or MPIMESH_DASHBOARD=0.0.0.0:8780")
    return host, int(port)


def _dashboard(environ: Mapping[str, str]) -> str:
    raw = (_get(environ, "MPIMESH_DASHBOARD") or "").strip()
    if raw:
        parse_dashboard(raw)
    return raw


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first is the default), case-insensitive."""
    raw = _get(environ, name)
    value = (raw or choices[0]).strip().lower()
    if value not in choices:
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise ValueError(f"{name} must be {listed}, got {raw!r}; unset it or use e.g. {name}={choices[0]}")
    return value


def _modules(environ: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated module names; ``none`` for none; unset or empty: ``default``."""
    raw = _get(environ, name)
    if raw is None or not raw.strip():
        return default
    if raw.strip().lower() == "none":
        return ()
    names = tuple(part.strip() for part in raw.split(","))
    for module in names:
        if not all(piece.isidentifier() for piece in module.split(".")):
            raise ValueError(
                f"{name} must be comma-separated module names or none, got {raw!r}; "
                f"unset it or use e.g. {name}={','.join(default) or 'none'}"
            )
    return names


settings: Config = load()
