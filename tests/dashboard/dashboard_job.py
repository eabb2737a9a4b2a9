"""The job the dashboard's browser test watches (run by ``mpimesh run -n 4 --dashboard=0``).

Three trainers log a ``loss`` curve from inside an endpoint, the controller
logs ``lr``; trainer 0 then sits in an endpoint (``stuck_in_here``) until
the test is done.  The test kills trainer 2's process: the hook below keeps
the job going (the page must show the failure).  The job ends when the
file ``<dir>/done`` appears.
"""

import json
import os
import sys
import time
from pathlib import Path

import mpimesh
from mpimesh import Actor, endpoint, this_host

here = Path(sys.argv[1])
mpimesh.unhandled_fault_hook = lambda failure: print(f"hook {failure.mesh_name} {failure.crashed_ranks}",
                                                     flush=True)


class Trainer(Actor):
    @endpoint
    def train(self, steps: int) -> int:
        for step in range(steps):
            mpimesh.log_metric("loss", 1.0 / (step + 1), step=step)
        print(f"trained {steps} steps", flush=True)
        return os.getpid()

    @endpoint
    def stuck_in_here(self, flag: str) -> None:
        while not os.path.exists(flag):
            time.sleep(0.05)


procs = this_host().spawn_procs(per_host={"gpus": 3})
trainers = procs.spawn("trainers", Trainer)
pids = trainers.train.call(8).get().values()
for step in range(4):
    mpimesh.log_metric("lr", 0.1 / (step + 1), step=step)
stuck = trainers.slice(gpus=0).stuck_in_here.call_one(str(here / "done"))
print("URL", mpimesh.dashboard(), flush=True)  # started by --dashboard: the same URL
print("PIDS", json.dumps(pids), flush=True)
while not (here / "done").exists():
    time.sleep(0.05)
stuck.get(30)
procs.stop().get(30)
print("END", flush=True)
