"""Monarch names that belong to Monarch's own transport and bootstrap, and what replaces them here.

Monarch starts its own agents on each host and connects to them over
channels it chooses (``enable_transport``, ``attach_to_workers``).  mpimesh
has no agents and no transport of its own: the processes are the MPI job's
ranks, and the network is the MPI library's.  These names exist so that a
Monarch program fails at the call with the replacement, not at import.
"""

from __future__ import annotations

import enum
from typing import Any, NoReturn

__all__ = ["ChannelTransport", "attach", "attach_to_workers", "enable_transport", "hosts_from_config",
           "run_worker_loop_forever"]


class ChannelTransport(enum.Enum):
    """Monarch's transports, for code that names them; :func:`enable_transport` says what replaces them."""

    TcpWithLocalhost = "tcp-localhost"
    TcpWithHostname = "tcp"
    MetaTlsWithHostname = "metatls-hostname"
    MetaTlsWithIpV6 = "metatls"
    Tls = "tls"
    Local = "local"
    Unix = "ipc"


def _refuse(call: str, instead: str) -> NoReturn:
    raise NotImplementedError(
        f"{call} is Monarch's own transport and bootstrap, which mpimesh does not have; {instead}"
    )


def enable_transport(transport: Any) -> None:
    """Not in mpimesh: the MPI library is the transport.

    Raises:
        NotImplementedError: always, naming how to choose the network instead.
    """
    _refuse(f"enable_transport({transport!r})",
            "the MPI library carries every message: choose its network there (e.g. Open MPI's "
            "`--mca btl self,sm,tcp --mca btl_tcp_if_include eth0`, or UCX)")


def attach_to_workers(*args: Any, **kwargs: Any) -> NoReturn:
    """Not in mpimesh: workers are the MPI job's ranks.

    Raises:
        NotImplementedError: always, naming the launch that replaces it.
    """
    _refuse("attach_to_workers()", "launch the workers with the job (`mpimesh run -n N script.py`, `srun`, "
            "`mpirun --host a:4,b:4`) and take their hosts with host_mesh()")


def run_worker_loop_forever(*args: Any, **kwargs: Any) -> NoReturn:
    """Not in mpimesh: every rank but 0 runs the worker loop by itself.

    Raises:
        NotImplementedError: always, naming the launch that replaces it.
    """
    _refuse("run_worker_loop_forever()", "ranks 1..N-1 of `mpirun -n N python -m mpimesh script.py` are the "
            "workers")


def attach(*args: Any, **kwargs: Any) -> NoReturn:
    """Not in mpimesh: the controller is rank 0 of the MPI job.

    Raises:
        NotImplementedError: always, naming the launch that replaces it.
    """
    _refuse("attach()", "run the script as rank 0 of the job (`mpimesh run -n N script.py`)")


def hosts_from_config(*args: Any, **kwargs: Any) -> NoReturn:
    """Not in mpimesh: the job's hosts come from the launcher.

    Raises:
        NotImplementedError: always, naming the call that replaces it.
    """
    _refuse("hosts_from_config()", "use host_mesh(), the hosts the MPI job runs on")
