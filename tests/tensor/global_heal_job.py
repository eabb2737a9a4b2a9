"""A dp worker of module_to_mesh killed during a training step, the mesh healed, training goes on (issue #28).

Run by test_global_heal.py under ``python -m mpimesh`` (spawned workers; the replacement is spawned too).
SGD with momentum (float64) on a ``dp=2`` Mesh: step 2's batch is issued, one dp replica's process is
SIGKILLed while its collectives run, and ``loss.item()`` (before ``optimizer.step()``, so that the
parameters stay whole) must raise ``SupervisionError``; the mesh is healed, the parameters and the
momentum are copied from the surviving replica (``broadcast_``), the batch is run again, and all 6 steps
must match the same model trained in this process.  A tensor sharded over dp lost its piece: using it
raises, naming the fix.  Prints one line per finding.
"""

import copy
import os
import signal
import sys
import time

import torch
from torch import nn, optim

import mpimesh
from mpimesh import Actor, endpoint
from mpimesh.distributed import Mesh
from mpimesh.tensor import broadcast_


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")  # one write: the fault hook prints from a thread
    sys.stdout.flush()


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


mpimesh.unhandled_fault_hook = lambda failure: None
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
batches = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(6)]
mesh = Mesh(shape=(2,), mesh_dim_names=("dp",))
victim = mesh.spawn("pids", Pid).pid.call().get(60).item(dp=1)
model = mpimesh.module_to_mesh(copy.deepcopy(reference), mesh)
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sharded = mpimesh.distribute(torch.arange(8.0), mesh, sharding_spec=["dp"])
local = copy.deepcopy(reference)
local_opt = optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
ours, theirs = [], []


def step(x: torch.Tensor, y: torch.Tensor, kill: bool = False) -> float:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if kill:
        os.kill(victim, signal.SIGKILL)  # while the step's collectives run on the workers
    value = loss.item()  # before the step: a failure here leaves the parameters as they were
    opt.step()
    return value


for i, (x, y) in enumerate(batches):
    try:
        ours.append(step(x, y, kill=i == 2))
    except mpimesh.SupervisionError as exc:
        say("caught:", type(exc).__name__, str(exc).splitlines()[0][:160])
        start = time.monotonic()
        mesh = mpimesh.heal_mesh(mesh)
        healed = time.monotonic()
        momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
        try:
            sharded.full_tensor()
        except mpimesh.SupervisionError as lost:
            say("lost shard:", str(lost))
        broadcast_([*model.parameters(), *momentum], "dp")
        ours.append(step(x, y))
        say(f"seconds: heal {healed - start:.3f}, restore and the step again {time.monotonic() - healed:.3f}")
    local_opt.zero_grad()
    loss = nn.functional.mse_loss(local(x), y)
    loss.backward()
    local_opt.step()
    theirs.append(loss.item())
state = model.state_dict()
drift = max((state[k] - v).abs().max().item() for k, v in local.state_dict().items())
say(f"steps {len(ours)} loss difference {max(abs(a - b) for a, b in zip(ours, theirs, strict=True)):.2e} "
    f"weight difference {drift:.2e}")
fresh = mpimesh.distribute(torch.ones(4, 2), mesh, sharding_spec=["dp", None])
say("fresh:", (fresh @ fresh.T).full_tensor().sum().item())
mesh.stop().get(60)
say("END")
