"""The ``"mpimesh"`` torch.distributed backend (issue #28 item 3): collectives on MPI, DDP, FSDP2, DTensor, a dead peer.

Each case starts its own job (a singleton controller that spawns the
processes), so that the mesh suite, run at every world size, pays for none
of it; the checks run in actors and report back to the script, which prints
one line per check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpitest import python_cmd, run

#: The checks of one job: every collective against its reference value, DDP on the mpimesh backend against
#: DDP on gloo over the same processes, a 2x2 DeviceMesh with DTensor ops, FSDP2 against DDP.
CHECKS = '''
import torch
import torch.distributed as dist
from mpimesh import Actor, endpoint, this_host
from mpimesh.spmd import default_backend, setup_torch_elastic_env


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def train(model, params):
    opt = torch.optim.SGD(params, lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(5):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


class Checks(Actor):
    @endpoint
    def init(self) -> str:
        dist.init_process_group(default_backend())
        return type(dist.group.WORLD).__name__ + " " + dist.get_backend()

    @endpoint
    def collectives(self) -> list:
        r, n = dist.get_rank(), dist.get_world_size()
        bad = []

        def check(name, got, want):
            if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
                bad.append(f"rank {r} {name}: got {got.tolist()} want {want.tolist()}")

        ranks = torch.arange(n, dtype=torch.float32) + 1
        for op, want in ((dist.ReduceOp.SUM, ranks.sum()), (dist.ReduceOp.AVG, ranks.mean()),
                         (dist.ReduceOp.MAX, ranks.max()), (dist.ReduceOp.MIN, ranks.min()),
                         (dist.ReduceOp.PRODUCT, ranks.prod())):
            t = torch.full((5,), float(r + 1))
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op}", t, torch.full((5,), float(want)))
        for dtype in (torch.int64, torch.int32, torch.float64, torch.bfloat16, torch.float16):
            t = torch.full((3,), r + 1, dtype=dtype)
            dist.all_reduce(t)
            check(f"all_reduce {dtype}", t, torch.full((3,), n * (n + 1) // 2, dtype=dtype))
        t = torch.ones(4, 6)[:, 2]  # not contiguous: reduced in a copy, copied back
        dist.all_reduce(t)
        check("all_reduce strided", t, torch.full((4,), float(n)))
        works = [dist.all_reduce(torch.full((8,), float(r)), async_op=True) for _ in range(3)]
        for w in works:
            check("all_reduce async", w.get_future().wait()[0], torch.full((8,), float(sum(range(n)))))
        ts = [torch.full((2,), float(r)), torch.full((3,), float(2 * r))]
        dist.all_reduce_coalesced(ts)
        s = float(sum(range(n)))
        check("all_reduce_coalesced", torch.cat(ts), torch.tensor([s, s, 2 * s, 2 * s, 2 * s]))
        b = torch.full((4,), float(r))
        dist.broadcast(b, src=2)
        check("broadcast", b, torch.full((4,), 2.0))
        t = torch.full((2,), float(r + 1))
        dist.reduce(t, dst=1)
        if r == 1:
            check("reduce", t, torch.full((2,), float(ranks.sum())))
        out = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(out, torch.tensor([r, 10 * r]))
        check("all_gather", torch.stack(out), torch.tensor([[k, 10 * k] for k in range(n)]))
        flat = torch.empty(2 * n)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
        check("all_gather_into_tensor", flat, torch.arange(n, dtype=torch.float32).repeat_interleave(2))
        obj = [None] * n
        dist.all_gather_object(obj, {"rank": r})
        if obj != [{"rank": k} for k in range(n)]:
            bad.append(f"all_gather_object: {obj}")
        out1 = torch.empty(3)
        dist.reduce_scatter_tensor(out1, torch.arange(3 * n, dtype=torch.float32) * (r + 1))
        check("reduce_scatter_tensor", out1, torch.arange(3 * r, 3 * r + 3, dtype=torch.float32) * float(ranks.sum()))
        out2 = torch.empty(2)
        dist.reduce_scatter(out2, [torch.full((2,), float(k + r)) for k in range(n)], op=dist.ReduceOp.AVG)
        check("reduce_scatter avg", out2, torch.full((2,), r + (n - 1) / 2))
        a2a = torch.empty(n)
        dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32) + 100 * r)
        check("all_to_all_single", a2a, torch.tensor([100.0 * k + r for k in range(n)]))
        inp = torch.cat([torch.full((k + 1, 2), float(r)) for k in range(n)])  # k+1 rows to rank k
        outp = torch.empty((n * (r + 1), 2))
        dist.all_to_all_single(outp, inp, output_split_sizes=[r + 1] * n, input_split_sizes=[k + 1 for k in range(n)])
        check("all_to_all_single splits", outp, torch.cat([torch.full((r + 1, 2), float(k)) for k in range(n)]))
        outs = [torch.empty(1, dtype=torch.int32) for _ in range(n)]
        dist.all_to_all(outs, [torch.tensor([10 * r + k], dtype=torch.int32) for k in range(n)])
        check("all_to_all", torch.cat(outs), torch.tensor([10 * k + r for k in range(n)], dtype=torch.int32))
        g = [torch.empty(2) for _ in range(n)] if r == 0 else None
        dist.gather(torch.full((2,), float(r)), g, dst=0)
        if g is not None:
            check("gather", torch.stack(g), torch.arange(n, dtype=torch.float32)[:, None].expand(n, 2))
        sc = torch.empty(2)
        dist.scatter(sc, [torch.full((2,), float(k * 3)) for k in range(n)] if r == 3 else None, src=3)
        check("scatter", sc, torch.full((2,), float(3 * r)))
        if r == 0:
            dist.send(torch.full((3,), 7.0), dst=1)
        elif r == 1:
            p = torch.zeros(3)
            dist.recv(p, src=0)
            check("send/recv", p, torch.full((3,), 7.0))
            q = torch.zeros(1)
            if dist.recv(q) != 2:  # any source
                bad.append("recv from any source: wrong source")
        elif r == 2:
            dist.send(torch.ones(1), dst=1)
        dist.barrier()
        sub = dist.new_group([1, 3])
        if r in (1, 3):
            t = torch.full((2,), float(r))
            dist.all_reduce(t, group=sub)
            check("new_group all_reduce", t, torch.full((2,), 4.0))
        return bad

    @endpoint
    def ddp(self, backend: str) -> list:
        from torch.nn.parallel import DistributedDataParallel as DDP

        group = None if backend == "mpimesh" else dist.new_group(backend=backend)
        model = mlp()
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.0001)  # a bucket per parameter: several in flight
        train(ddp, ddp.parameters())
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()

    @endpoint
    def fsdp(self) -> list:
        from torch.distributed.fsdp import fully_shard

        model = mlp()
        for layer in (model[0], model[2], model):
            fully_shard(layer)
        train(model, model.parameters())
        return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]).tolist()

    @endpoint
    def dtensor(self) -> list:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(1)
        big = torch.randn(8, 6)
        dt = distribute_tensor(big, mesh, [Shard(0), Shard(1)])
        bad = []
        if tuple(dt.to_local().shape) != (4, 3):
            bad.append(f"local shape {tuple(dt.to_local().shape)}")
        if not torch.allclose((dt @ dt.T).full_tensor(), big @ big.T, atol=1e-5):
            bad.append("dt @ dt.T")
        re = dt.redistribute(mesh, [Replicate(), Shard(0)])
        if not torch.equal(re.to_local(), big.chunk(2, 0)[mesh.get_local_rank("tp")]):
            bad.append("redistribute")
        if not torch.allclose(dt.sum().full_tensor(), big.sum(), atol=1e-5):
            bad.append("sum")
        return bad

    @endpoint
    def done(self) -> None:
        dist.destroy_process_group()


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    setup_torch_elastic_env(procs, backend="mpimesh")
    checks = procs.spawn("checks", Checks)
    print("init:", sorted(set(checks.init.call().get(120).values())), flush=True)
    print("collectives:", [b for v in checks.collectives.call().get(120).values() for b in v] or "ok", flush=True)
    mpi = list(checks.ddp.call("mpimesh").get(120).values())
    gloo = list(checks.ddp.call("gloo").get(120).values())
    print("ddp replicas equal:", all(m == mpi[0] for m in mpi), flush=True)
    print("ddp mpimesh vs gloo:", max(abs(a - b) for a, b in zip(mpi[0], gloo[0])) < 1e-6, flush=True)
    fsdp = list(checks.fsdp.call().get(120).values())
    print("fsdp vs ddp:", max(abs(a - b) for a, b in zip(fsdp[0], mpi[0])) < 1e-6, flush=True)
    print("dtensor:", [b for v in checks.dtensor.call().get(120).values() for b in v] or "ok", flush=True)
    checks.done.call().get(60)
    procs.stop()
    print("END", flush=True)
'''

#: A collective pending on rank 0 when rank 1 is killed: it raises at once (the group's timeout is 10 minutes),
#: and the group's next collective raises without starting.
DEAD_PEER = '''
import os, signal, time
from datetime import timedelta
import mpimesh
from mpimesh import Actor, endpoint, this_host
from mpimesh.spmd import init_mpi_process_group, setup_torch_elastic_env

failures = []
mpimesh.unhandled_fault_hook = failures.append  # the dead process's failure: recorded, the script goes on


class Peer(Actor):
    @endpoint
    def init(self) -> int:
        init_mpi_process_group(timeout=timedelta(minutes=10))
        return os.getpid()

    @endpoint
    def all_reduce(self) -> str:
        import torch
        import torch.distributed as dist

        t = torch.ones(1 << 20)
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as exc:
            first = str(exc)
        else:
            return "all_reduce returned"
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as exc:
            return f"{first} | then: {exc}"
        return f"{first} | then: returned"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    setup_torch_elastic_env(procs)
    peers = procs.spawn("peers", Peer)
    pids = list(peers.init.call().get(120).values())
    pending = peers.slice(gpus=0).all_reduce.call_one()
    time.sleep(1.0)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    print("got:", pending.get(120), flush=True)
    print(f"seconds: {time.monotonic() - killed:.2f}", flush=True)
    print("END", flush=True)
'''


@pytest.mark.subprocess
def test_collectives_ddp_fsdp_dtensor(tmp_path: Path) -> None:
    """Every collective matches its reference; DDP equals gloo's, FSDP2 equals DDP; DTensor on a 2x2 DeviceMesh."""
    script = tmp_path / "mpi_backend_checks.py"
    script.write_text(CHECKS)
    result = run(python_cmd(str(script)), timeout=300)
    out = result.stdout
    assert "init: ['MPIProcessGroup mpimesh']" in out, result.stderr
    assert "collectives: ok" in out, out + result.stderr
    assert "ddp replicas equal: True" in out, out
    assert "ddp mpimesh vs gloo: True" in out, out
    assert "fsdp vs ddp: True" in out, out
    assert "dtensor: ok" in out, out + result.stderr
    assert out.rstrip().endswith("END"), result.stderr
    assert result.returncode == 0, result.stderr
    assert result.orphans == []


@pytest.mark.subprocess
def test_dead_peer_fails_the_collective(tmp_path: Path) -> None:
    """A peer killed during an all_reduce makes it raise DistBackendError within seconds, and the group's next one."""
    script = tmp_path / "mpi_backend_dead.py"
    script.write_text(DEAD_PEER)
    result = run(python_cmd(str(script)), timeout=240)
    out = result.stdout
    assert "got: mpimesh backend: allreduce on process group " in out, out + result.stderr
    assert "| then: mpimesh backend: process group " in out and " is broken: " in out, out
    seconds = float(out.split("seconds: ")[1].split()[0])
    assert seconds < 20, out
    assert out.rstrip().endswith("END"), result.stderr
    assert result.orphans == []


def test_reduce_ops_and_dtypes() -> None:
    """The reduce ops MPI applies; PREMUL_SUM and MAX of complex numbers are refused with the fix."""
    import torch
    import torch.distributed as dist

    from mpimesh._torchmpi._backend import _op

    assert _op(dist.ReduceOp.AVG, torch.float32)[1] is True
    assert _op(dist.ReduceOp.SUM, torch.float32)[1] is False
    with pytest.raises(ValueError, match="is not supported; use SUM, AVG"):
        _op(dist._make_nccl_premul_sum(2.0), torch.float32)
    with pytest.raises(ValueError, match="MPI cannot apply .* to complex tensors"):
        _op(dist.ReduceOp.MAX, torch.complex64)
