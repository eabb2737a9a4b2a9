"""A killed task's PMIx socket outlives it under Slurm (issue #28): ``_launch.pmix_hold``.

Slurm's PMIx plugin cancels the step 1 s after a client's socket closes
before ``PMIx_Finalize``; the helper keeps a copy open past the process's
end and lets go once the server closes it.  Here the "server" is a plain TCP
listener on the loopback, named the way srun names its PMIx server.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpimesh._launch import pmix_hold

ROOT = Path(__file__).resolve().parents[2]


def _uri(port: int) -> dict[str, str]:
    return {"PMIX_SERVER_URI41": f"pmix-server.8111;tcp4://127.0.0.1:{port}"}


def test_the_server_address_comes_from_the_newest_uri() -> None:
    assert pmix_hold.server_address(_uri(39961)) == ("127.0.0.1", 39961)
    assert pmix_hold.server_address({"PMIX_SERVER_URI2": "slurm.pmix.1.0;tcp4://10.0.0.5:4000"}) == ("10.0.0.5", 4000)
    assert pmix_hold.server_address({"PMIX_SERVER_URI2": "pmix-server.1;usock:/tmp/x"}) is None
    assert pmix_hold.server_address({}) is None


def test_the_socket_to_the_server_is_found_and_no_other() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("127.0.0.1", 0)) as other:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as mine, \
                socket.create_connection(("127.0.0.1", other.getsockname()[1])):
            assert pmix_hold.server_socket(_uri(port)) == mine.fileno()
        assert pmix_hold.server_socket(_uri(port)) is None  # closed: nothing established


CHILD = """
import os, sys
from mpimesh._launch import pmix_hold
import socket
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
assert pmix_hold.start({"PMIX_SERVER_URI41": "x;tcp4://127.0.0.1:" + sys.argv[1]}) == ""
print(pmix_hold._KEPT[0][0].pid, flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.subprocess
def test_the_connection_outlives_a_killed_process_until_the_server_closes_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        child = subprocess.run([sys.executable, "-c", CHILD, str(port)], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        assert child.returncode == -9, child.stderr
        helper = int(child.stdout.split()[0])
        conn, _ = server.accept()
        with conn:
            readable, _, _ = select.select([conn], [], [], 1.0)
            assert not readable, "the connection closed with the killed process"  # no EOF: still held
            assert Path(f"/proc/{helper}").exists()
        deadline = time.monotonic() + 10
        while _running(helper):
            assert time.monotonic() < deadline, "the helper outlived the server's end of the connection"
            time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
