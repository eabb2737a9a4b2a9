"""Liveness across hosts: a busy worker on the other host lives, a hung one dies (issue #14 item 11).

The controller cannot read the other host's ``/proc``: what keeps a worker
that holds the GIL in a long C call alive there is its native heartbeat
(``native/beat.c``), which sends while the process uses the CPU, and the
worker's own watch of the controller, which must not count its own stall
as the controller's silence.  A worker hung with the GIL held and no CPU
used sends nothing and is declared dead.  Same-host loads are in
tests/roles/test_liveness.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hostlib import PREAMBLE, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

TIMEOUT = 0.5

LOADED = PREAMBLE + r'''
from mpimesh._core import current


class Busy(W):
    @endpoint
    def load(self, kind):
        start = time.monotonic()
        if kind == "gil":
            3 ** 12_000_000  # one C call: the GIL held, the CPU busy
        else:
            ctypes.PyDLL(None).usleep(int(30e6))  # the GIL held, no CPU used: hung in C
        return [time.monotonic() - start, current.runtime.role.heartbeat.native_sent]


kind = sys.argv[1]
hook = mpimesh.unhandled_fault_hook = Hook()
theirs = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("w", Busy)
where = sorted(theirs.where.call().get(30).values())
one = theirs.slice(gpus=0)
pid = one.where.call_one().get(30)[1]
emit(adverb="where", value=where, host=HOST, pid=pid)
emit(adverb="load", **outcome(lambda: one.load.call_one(kind).get(60)))
emit(adverb="later", **outcome(lambda: sorted(theirs.where.call().get(10).values())))
emit(adverb="hook", failures=[f.report() for _, f in hook.failures])
print("END", flush=True)
'''


def _job(kind: str, tmp_path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    names = hosts(2)
    path = tmp_path / "job.py"
    path.write_text(LOADED)
    job = run_job(host_cmd(f"{names[0]}:1,{names[1]}:2", 3, str(path), kind), timeout=120,
                  env={"MPIMESH_HEARTBEAT_TIMEOUT": str(TIMEOUT)})
    assert not job.hung and job.ended, job.describe()
    assert job.orphans == [], job.describe()
    return job.rows, job.describe()


def test_busy_worker_on_another_host_lives(tmp_path: Path) -> None:
    """A worker on the other host holding the GIL for many heartbeat timeouts is not declared dead, nor ends itself."""
    rows, describe = _job("gil", tmp_path)
    load = rows["load"]
    assert load["type"] is None, describe
    held, native = load["value"]  # seconds the GIL was held, native heartbeats sent meanwhile
    assert held > 3 * TIMEOUT and native >= 2, describe
    assert rows["later"]["type"] is None and rows["later"]["value"] == rows["where"]["value"], describe
    assert rows["hook"]["failures"] == [], describe


def test_hung_worker_on_another_host_dies(tmp_path: Path) -> None:
    """A worker on the other host hung in C (GIL held, no CPU used) is declared dead after the timeout."""
    rows, describe = _job("hung", tmp_path)
    load = rows["load"]
    silent = rf"stopped answering: silent for \d+\.\d s \(MPIMESH_HEARTBEAT_TIMEOUT={TIMEOUT:g}\)"
    died = rf"process 0\.\d \(pid {rows['where']['pid']}\) on \S+ died: {silent}"
    assert load["type"] == "SupervisionError", describe
    gone = r"Endpoint call w\.load\(\) failed, The actor __main__\.Busy w and all its descendants have failed: "
    assert re.fullmatch(gone + died, str(load["message"])), describe
    assert load["seconds"] < TIMEOUT + 4.0, describe
