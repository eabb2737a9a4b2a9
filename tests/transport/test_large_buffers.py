"""Raw buffers of 2 GiB and more travel in pieces: MPI-3 counts are C ints (Open MPI 5 reports MPI 3.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpitest import mpiexec_cmd, python_cmd, run

from mpimesh._transport.buffers import pieces

SCRIPT = r'''
import torch
from mpimesh import Actor, endpoint, this_host


class Big(Actor):
    @endpoint
    def make(self, n):
        t = torch.zeros(n, dtype=torch.uint8)
        t[0], t[1 << 30], t[-1] = 3, 5, 7
        return t

    @endpoint
    def take(self, t):
        return t.numel(), int(t[0]), int(t[1 << 30]), int(t[-1])


big = this_host().spawn_procs(per_host={"gpus": 1}).spawn("big", Big)
n = (1 << 31) + 4099  # past the int count, not a multiple of the piece
t = big.make.call_one(n).get(600)
print("result", t.numel(), int(t[0]), int(t[1 << 30]), int(t[-1]), flush=True)
print("argument", *big.take.call_one(t).get(600), flush=True)
'''


def test_pieces_cover_the_buffer_in_order() -> None:
    """One piece up to the limit; past it, consecutive pieces of at most the limit that end at the size."""
    assert pieces(0) == [(0, 0)]
    assert pieces(10, piece=4) == [(0, 4), (4, 8), (8, 10)]
    assert pieces(8, piece=4) == [(0, 4), (4, 8)]
    assert pieces(4, piece=4) == [(0, 4)]


@pytest.mark.subprocess
def test_a_result_and_an_argument_of_over_2_gib(tmp_path: Path) -> None:
    """A tensor of 2 GiB + 4099 bytes comes back from an actor and goes to one, intact (it failed with MPI_ERR_ARG)."""
    path = tmp_path / "big.py"
    path.write_text(SCRIPT)
    result = run(mpiexec_cmd(2, *python_cmd("-m", "mpimesh", str(path))), timeout=600)
    assert result.returncode == 0, result.stderr
    n = (1 << 31) + 4099
    assert f"result {n} 3 5 7" in result.stdout, result.stdout
    assert f"argument {n} 3 5 7" in result.stdout, result.stdout
    assert result.orphans == []
