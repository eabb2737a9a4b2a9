"""Where torch.distributed meets: this host's addresses, a free port, and a reachability probe.

``MASTER_ADDR`` must be an address of rank 0's host that every process of
the world can connect to.  A host name may resolve to a loopback address
(Debian's ``127.0.1.1`` line in ``/etc/hosts``) and a host may have
addresses no other host can reach (a container bridge such as ``docker0``),
so the candidates are tried from the other hosts before one is chosen: rank
0's actor listens on a spare port (:class:`Probe`) while one process per
other host connects to each candidate (:func:`reachable`).

Linux only for the interface list (``SIOCGIFADDR``, ``/proc/net/if_inet6``);
elsewhere only the host name's addresses are candidates.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import threading
from pathlib import Path

__all__ = ["Probe", "candidates", "check_family", "free_port", "host_address", "reachable"]

#: ``use_ipaddr`` values: which address family to give as ``MASTER_ADDR``.
FAMILIES = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}

#: ioctl that reads an interface's IPv4 address (linux/sockios.h).
_SIOCGIFADDR = 0x8915

#: Seconds one connection attempt of the probe may take.
CONNECT_TIMEOUT = 2.0


def check_family(use_ipaddr: object) -> str | None:
    """``use_ipaddr`` as a key of :data:`FAMILIES`, or None.

    Accepts ``None``, ``"ipv4"``/``"ipv6"`` in any case, or an enum member
    with such a name (Monarch's ``AddrType.IPv4``).

    Raises:
        ValueError: anything else.
    """
    if use_ipaddr is None:
        return None
    name = getattr(use_ipaddr, "name", use_ipaddr)
    if isinstance(name, str) and name.lower() in FAMILIES:
        return name.lower()
    raise ValueError(f"use_ipaddr must be None, 'ipv4' or 'ipv6', got {use_ipaddr!r}; e.g. use_ipaddr='ipv4'")


def free_port() -> int:
    """A TCP port that is free on every interface of this host now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _is_public(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def _name_addresses(family: socket.AddressFamily) -> list[str]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


def _interface_ipv4() -> list[str]:
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append(socket.inet_ntoa(raw[20:24]))
    return found


def _interface_ipv6() -> list[str]:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return []
    # each line: 32 hex digits, interface index, prefix length, scope, flags, name
    return [str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))) for line in lines if line.split()]


def addresses(family: str) -> list[str]:
    """This host's addresses of ``family`` that other hosts may reach: the host name's first, then each interface's.

    Loopback and link-local addresses are left out; no duplicates.
    """
    af = FAMILIES[family]
    found = _name_addresses(af) + (_interface_ipv4() if af == socket.AF_INET else _interface_ipv6())
    return list(dict.fromkeys(a for a in found if _is_public(a)))


def host_address(use_ipaddr: str | None) -> str:
    """This host's name (``use_ipaddr=None``, as Monarch gives it) or its first address of that family.

    Raises:
        RuntimeError: the host has no address of that family but loopback.
    """
    if use_ipaddr is None:
        return socket.gethostname()
    found = addresses(use_ipaddr)
    if not found:
        raise RuntimeError(
            f"host {socket.gethostname()!r} has no {use_ipaddr} address but loopback; "
            "pass master_addr= to setup_torch_elastic_env, or use_ipaddr= of the other family"
        )
    return found[0]


def candidates(use_ipaddr: str | None) -> list[str]:
    """What rank 0's host may give as ``MASTER_ADDR``, best first.

    ``use_ipaddr=None``: the host name, then its IPv4 and IPv6 addresses;
    otherwise the addresses of that family only.
    """
    if use_ipaddr is not None:
        return addresses(use_ipaddr)
    return [socket.gethostname(), *addresses("ipv4"), *addresses("ipv6")]


def _listener() -> socket.socket:
    """A TCP listener on a spare port of every interface: IPv4 and IPv6 where the host has both."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError:  # IPv6 turned off on this host (sysctl)
            pass
    return socket.create_server(("", 0))


class Probe:
    """A listener on a spare port of every interface that accepts and drops connections until closed.

    Runs one daemon thread; :meth:`close` stops it within a fraction of a
    second.  The port is not the one given as ``MASTER_PORT``: closing the
    probe leaves nothing behind on that one.
    """

    def __init__(self) -> None:
        self._sock = _listener()
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="mpimesh-spmd-probe", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        """Stop accepting and free the port (bounded: the thread wakes every 0.1 s)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._sock.close()


def reachable(addrs: list[str], port: int) -> list[str]:
    """Those of ``addrs`` that this process can open a TCP connection to at ``port`` (each try bounded)."""
    ok = []
    for addr in addrs:
        try:
            with socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT):
                ok.append(addr)
        except OSError:
            continue
    return ok
