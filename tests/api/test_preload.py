"""A new actor imports its creator's torch while it is created, not at its first tensor argument.

Workers never import torch by themselves; before this, the first call that
carried a tensor paid for ``import torch`` on the worker (~1.3 s against
milliseconds, docs/design/hosts.md 3.3).  Each case is a singleton job whose
workers are spawned fresh, so no earlier test has imported anything there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpitest import python_cmd, run

pytestmark = pytest.mark.subprocess

JOB = """
import sys
{imports}
from mpimesh import Actor, endpoint, this_host

class Probe(Actor):
    def __init__(self):
        self.at_init = "torch" in sys.modules

    @endpoint
    def seen(self):
        return self.at_init

procs = this_host().spawn_procs(per_host={{"gpus": 1}})
print("AT_INIT", procs.spawn("probe", Probe).seen.call_one().get(120), flush=True)
procs.stop().get(60)
"""


@pytest.mark.parametrize(("imports", "preload", "expect"), [
    ("import torch", "", "True"),  # the default (scripts/test.sh runs the other jobs under MPIMESH_PRELOAD=none)
    ("", "", "False"),
    ("import torch", "none", "False"),
])
def test_torch_travels_with_a_new_actor_only_if_the_creator_has_it(tmp_path: Path, imports: str, preload: str,
                                                                    expect: str) -> None:
    """... and MPIMESH_PRELOAD (default torch) names it; ``none``: a worker imports torch when it needs it."""
    path = tmp_path / "job.py"
    path.write_text(JOB.format(imports=imports))
    done = run(python_cmd("-m", "mpimesh", str(path)), timeout=180, env={"MPIMESH_PRELOAD": preload})
    assert done.returncode == 0, done.stderr
    assert f"AT_INIT {expect}" in done.stdout.splitlines(), done.stdout + done.stderr
    assert not done.orphans
