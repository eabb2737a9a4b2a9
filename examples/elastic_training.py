"""Elastic data-parallel training with the tensor engine: a whole host is lost mid-run, and training goes on.

Run it on one host (two groups of workers stand for the two hosts) or on two:

    mpimesh run -n 7 examples/elastic_training.py            # 2 x 2 workers + 2 spares (launch pool, ULFM)
    mpimesh run -n 7 examples/elastic_training.py --shrink   # go on with the surviving host instead
    mpiexec --with-ft ulfm --host a:5,b:2 -n 7 python -m mpimesh examples/elastic_training.py

A small MLP is trained data-parallel on a ``(hosts=2, gpus=2)`` mesh: the
parameters are replicated, each step's batch (the same every run: drawn
from a generator seeded with the step) is split over every process,
``loss.backward()`` runs on each, and the gradients are averaged over the
whole mesh with one ``reduce_`` (so the update is that of the whole batch).
At step 5 the example SIGKILLs every worker of the second host (or, with
``--external``, prints ``KILLHOST <host> <pids>`` and waits for someone
else to).  The step fails (``DeviceMeshError`` or, when a collective ran
into the dead processes, ``RemoteTensorError``), and the script:

* heals the mesh (default): the dead workers are replaced by spares
  (``procs.heal()``); the replacements hold no tensor, so the replicated
  state (parameters, momentum) is copied there from a survivor with
  ``mpimesh.tensor.broadcast_``;
* or shrinks it (``--shrink``): ``procs.shrink()`` gives the surviving host's
  mesh, the parameters' handles follow it with their values, and each step's
  batch is split over fewer processes.

Either way the step runs again, training finishes, and its final loss is
compared with the same training on this process without any failure: they
agree within 1e-5 (``final loss ... OK``).
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import time

import torch

import mpimesh
from mpimesh import (
    Actor,
    DeviceMeshError,
    MeshFailure,
    RemoteTensorError,
    Replicate,
    Shard,
    endpoint,
    host_mesh,
    this_host,
)
from mpimesh.tensor import broadcast_

GPUS = 2
STEPS = 12
KILL_AT = 5
BATCH = 24  # splits evenly over 4, 3 or 2 processes
LR = 0.1


class Worker(Actor):
    """What the example asks of each process besides tensors: its pid, and to die."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def log(line: str) -> None:
    """One whole line (the fault hook runs on another thread than the loop)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def on_failure(failure: MeshFailure) -> None:
    """The fault hook: report, and let the loop recover (the default would end the job)."""
    log(f"supervision: {failure.mesh_name} lost rank(s) {failure.crashed_ranks}")


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: the same in every run."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 8, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()


def to_mesh(module: torch.nn.Module, procs: mpimesh.ProcMesh) -> torch.nn.Module:
    """Replace every parameter by a copy replicated on each process of ``procs``."""
    every = [Replicate()] * len(procs.view_shape.labels)
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(mpimesh.distribute(p.detach(), procs, every)))
    return module


def spawn_mesh() -> mpimesh.ProcMesh:
    """``(hosts=2, gpus=GPUS)``: on two hosts when the job has them, else two groups of this host's processes."""
    hosts = host_mesh()
    if len(hosts) >= 2:
        return hosts.slice(hosts=slice(0, 2)).spawn_procs(per_host={"gpus": GPUS})
    return this_host().spawn_procs(per_host={"hosts": 2, "gpus": GPUS})


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, procs: mpimesh.ProcMesh, step: int) -> float:
    """One step over the whole batch; returns its loss.  The loss is fetched before the update, so a
    step that fails leaves the parameters (and the optimizer's state) as they were before it."""
    dims = procs.view_shape.labels
    x, y = batch(step)
    xs = mpimesh.distribute(x, procs, [Shard(0)] * len(dims))
    ys = mpimesh.distribute(y, procs, [Shard(0)] * len(dims))
    loss = torch.nn.functional.mse_loss(model(xs), ys)  # each process: the loss of its part
    loss.backward()
    mpimesh.reduce_([p.grad for p in model.parameters()], dims, "avg")  # the whole batch's gradient
    value = mpimesh.inspect(loss.detach().reduce(dims, "avg")).item()  # a death shows here at the latest
    opt.step()
    opt.zero_grad()
    return value


def host_to_lose(procs: mpimesh.ProcMesh) -> int:
    """The ``hosts`` coordinate to lose: one the controller is not on, else the second."""
    for rank, name in enumerate(procs.hostnames):
        if name != os.uname().nodename:
            return procs.view_shape.coordinates(rank)["hosts"]
    return 1


def wait_for_deaths(procs: mpimesh.ProcMesh, timeout: float = 30.0) -> dict[int, str]:
    """The dead processes of ``procs`` once no more are found for a moment (a host's go together)."""
    deadline = time.monotonic() + timeout
    dead = procs.dead()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = procs.dead()
        if now and len(now) == len(dead):
            return now
        dead = now
    return dead


def main() -> None:
    shrink = "--shrink" in sys.argv[1:]
    external = "--external" in sys.argv[1:]
    mpimesh.unhandled_fault_hook = on_failure
    procs = spawn_mesh()
    workers = procs.spawn("workers", Worker)
    lost_at = host_to_lose(procs)
    lost = workers.slice(hosts=lost_at)
    log(f"training on {procs!r} over {sorted(set(procs.hostnames))}")

    reference = make_model()
    model = to_mesh(copy.deepcopy(reference), procs)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    step, loss, recoveries = 0, float("nan"), 0
    while step < STEPS:
        if step == KILL_AT and recoveries == 0:
            pids = list(lost.pid.call().get(60).values())  # type: ignore[attr-defined]
            host = procs.hostnames[lost_at * GPUS]  # rank (hosts=lost_at, gpus=0)
            if external:  # someone else kills the host (a test kills its processes)
                log(f"KILLHOST {host} {' '.join(map(str, pids))}")
                while len(procs.dead()) < len(pids):
                    time.sleep(0.05)
            else:
                log(f"step {step}: killing every worker of host {lost_at} ({host}, pids {pids}) with SIGKILL")
                lost.crash.broadcast()  # type: ignore[attr-defined]
        try:
            loss = train_step(model, opt, procs, step)
        except (DeviceMeshError, RemoteTensorError) as exc:
            dead = wait_for_deaths(procs)
            if not dead:
                raise
            recoveries += 1
            first = str(exc).splitlines()[0]
            log(f"step {step} failed ({type(exc).__name__}): {first[:160]}")
            opt.zero_grad()  # the failed step's gradients are gone with it
            start = time.monotonic()
            if shrink:
                procs = procs.shrink()  # the parameters, gradients and momentum follow the survivors
                log(f"shrunk to {procs!r} in {time.monotonic() - start:.2f} s; repeating step {step}")
            else:
                procs = procs.heal()
                state = [t for s in opt.state.values() for t in s.values() if isinstance(t, mpimesh.Tensor)]
                broadcast_([*model.parameters(), *state])  # replicated state, from a survivor to the spares
                log(f"healed {procs!r} (rank(s) {sorted(dead)} replaced) in {time.monotonic() - start:.2f} s; "
                    f"repeating step {step}")
            continue
        if step % 4 == 0 or step == STEPS - 1:
            log(f"step {step}: loss {loss:.10f}")
        step += 1

    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for i in range(STEPS):
        x, y = batch(i)
        expected = torch.nn.functional.mse_loss(reference(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = abs(loss - expected.item())
    ok = diff <= 1e-5 and recoveries > 0
    log(f"final loss {loss:.10f}, without the failure {expected.item():.10f}: difference {diff:.1e} after "
        f"{recoveries} recovery(ies) on {procs!r} {'OK' if ok else 'WRONG'}")
    procs.stop().get(60)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
