"""Every CUDA path of mpimesh on one GPU, checked line by line (run by test_cuda_job.py; needs a CUDA device).

Each check prints ``<name> ok <detail>`` or ``<name> FAIL <error>`` and the job
goes on, so that one run on a lent GPU machine shows every path at once:
whether the loaded MPI is CUDA-aware, CUDA tensors as endpoint arguments and
results (staged through page-locked host memory where MPI is not CUDA-aware),
per-process engine tensors on the GPU with an MPI reduction over the mesh,
global tensors (DTensor) on the GPU, a ``module_to_mesh`` training step on the
GPU against one process, and ``mpimesh.spmd`` with NCCL.  All workers share
the machine's GPUs (``cuda:0`` with one), so the global tensors' backend is
the MPI one (NCCL refuses two ranks on one GPU).
"""

import copy
import os
import sys
import time
import traceback
from collections.abc import Callable

import torch
from torch import nn, optim

import mpimesh
from mpimesh import Actor, endpoint, this_host
from mpimesh._data.buffers import cuda_support
from mpimesh.distributed import Mesh

#: ``cpu`` checks this script's own logic on a machine without a GPU (the paths then are not CUDA's).
DEVICE = os.environ.get("CUDA_JOB_DEVICE", "cuda")
FAILED: list[str] = []


def check(name: str, fn: Callable[[], str]) -> None:
    """Run one check and print its line; a failure is printed with its traceback on stderr."""
    t0 = time.perf_counter()
    try:
        detail = fn()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, and the job goes on
        FAILED.append(name)
        print(f"{name} FAIL {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        traceback.print_exc()
        return
    print(f"{name} ok {detail} ({time.perf_counter() - t0:.2f} s)", flush=True)


class Gpu(Actor):
    """Endpoints that take and give CUDA tensors."""

    @endpoint
    def double(self, t: torch.Tensor) -> tuple[str, torch.Tensor]:
        return str(t.device), t * 2

    @endpoint
    def make(self, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32, device=DEVICE)

    @endpoint
    def nccl(self) -> float:
        import torch.distributed as dist

        from mpimesh.spmd import default_backend

        backend = default_backend()
        dist.init_process_group(backend)
        try:
            t = torch.full((1024,), float(dist.get_rank() + 1), device=DEVICE)
            dist.all_reduce(t)
            return float(t[0])
        finally:
            dist.destroy_process_group()


def awareness() -> str:
    support = cuda_support()
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"aware={support.aware} how={support.how!r} gpus={torch.cuda.device_count()} name={name!r} "
            f"torch={torch.__version__}")


def main() -> None:
    os.environ.setdefault("MPIMESH_DTENSOR_BACKEND", "mpimesh")
    check("awareness", awareness)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    gpu = procs.spawn("gpu", Gpu)
    one = gpu.slice(gpus=0)

    def arguments() -> str:
        t = torch.randn(1 << 20, device=DEVICE)
        device, doubled = one.double.call_one(t).get(120)
        assert device == str(t.device), device
        assert doubled.device.type == DEVICE and torch.equal(doubled, t * 2)
        made = one.make.call_one(1000).get(60)
        assert made.device.type == DEVICE and made[-1].item() == 999.0
        return f"worker saw {device}, results back on {doubled.device}"

    check("arguments", arguments)

    def engine() -> str:
        with procs.activate():
            x = torch.ones(256, 256, device=DEVICE) * (1 + procs.rank_tensor("gpus").to(DEVICE))
            y = x @ x
            total = y.reduce("gpus", "sum")
        assert total.device.type == DEVICE, total.device
        got = mpimesh.inspect(total, gpus=1)  # a CPU copy of one process's tensor, as Monarch's
        want = torch.full((256, 256), 256.0 * (1 + 4))  # 256 * 1 * 1 + 256 * 2 * 2
        assert torch.allclose(got, want), (got[0, :4], want[0, :4])
        return f"reduce over gpus of {total.device} tensors"

    check("engine", engine)

    def global_tensors() -> str:
        mesh = Mesh(shape=(2,), mesh_dim_names=("dp",))
        try:
            a = torch.randn(64, 32, device=DEVICE, dtype=torch.float64)
            dt = mpimesh.distribute(a, mesh, sharding_spec=["dp", None])
            product = (dt @ dt.T).full_tensor()
            assert product.device.type == DEVICE, product.device
            assert torch.allclose(product, a @ a.T), (product - a @ a.T).abs().max()
            mean = dt.mean().item()
            assert abs(mean - a.mean().item()) < 1e-9
            return f"dt @ dt.T on {product.device}, shape {tuple(dt.shape)}"
        finally:
            mesh.stop().get(60)

    check("global", global_tensors)

    def training() -> str:
        torch.manual_seed(0)
        reference = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).double().to(DEVICE)
        batches = [(torch.randn(16, 32, device=DEVICE, dtype=torch.float64),
                    torch.randn(16, 8, device=DEVICE, dtype=torch.float64)) for _ in range(10)]
        mesh = Mesh(shape=(2,), mesh_dim_names=("dp",))
        try:
            models = (mpimesh.module_to_mesh(copy.deepcopy(reference), mesh), copy.deepcopy(reference))
            runs = [(m, optim.AdamW(m.parameters(), lr=1e-3)) for m in models]
            worst = 0.0
            steps = []
            for x, y in batches:
                losses = []
                for model, opt in runs:
                    t0 = time.perf_counter()
                    opt.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                    steps.append(time.perf_counter() - t0)
                worst = max(worst, abs(losses[0] - losses[1]))
            states = [m.state_dict() for m in models]
            drift = max((states[0][k].to(v.device) - v).abs().max().item() for k, v in states[1].items())
            assert worst < 1e-9 and drift < 1e-9, (worst, drift)
            mesh_step = sorted(steps[2::2])[len(steps[2::2]) // 2] * 1e3
            local_step = sorted(steps[3::2])[len(steps[3::2]) // 2] * 1e3
            return (f"10 AdamW steps match one process (loss {worst:.1e}, weights {drift:.1e}); "
                    f"step {mesh_step:.1f} ms on the mesh, {local_step:.1f} ms in one process")
        finally:
            mesh.stop().get(60)

    check("training", training)

    def nccl() -> str:
        single = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            spmd = single.spawn("nccl", Gpu)
            from mpimesh.spmd import setup_torch_elastic_env

            setup_torch_elastic_env(single)
            value = spmd.nccl.call_one().get(120)
            assert value == 1.0, value
            return "NCCL all_reduce on a 1-process spmd world"
        finally:
            single.stop().get(60)

    check("nccl", nccl)
    procs.stop().get(60)
    print("failed:", ",".join(FAILED) or "none")
    print("done")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
