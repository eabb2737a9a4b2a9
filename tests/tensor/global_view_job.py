"""Global-view tensors on a 2 x 2 Mesh, checked line by line (the first section of shared_job.py)."""

import torch
from torch.distributed.tensor import Replicate as TorchReplicate
from torch.distributed.tensor import Shard as TorchShard

import mpimesh
from mpimesh import Replicate, Shard
from mpimesh.distributed import Mesh


def check(mesh: Mesh) -> None:
    """Check what a user sees on ``mesh`` (2 x 2, dp x tp)."""
    print("mesh", mesh, mesh.size(), mesh.mesh_dim_names, isinstance(mesh, mpimesh.ProcMesh))
    print("slice", type(mesh.slice(dp=0)).__name__, mesh.slice(dp=0).size())

    a = torch.arange(48.0).reshape(8, 6)
    dt = mpimesh.distribute(a, mesh, sharding_spec=["dp", "tp"])
    print("shape", tuple(dt.shape), dt.placements)
    print("matmul", torch.allclose((dt @ dt.T).full_tensor(), a @ a.T))
    print("index", torch.equal(dt[1:5, 2].full_tensor(), a[1:5, 2]))
    print("ops", (dt * 2 + 1).sum().item() == (a * 2 + 1).sum().item())
    print("mean", abs(dt.mean().item() - a.mean().item()) < 1e-6)
    r = dt.redistribute(placements=[Replicate(), TorchReplicate()])
    print("redistribute", r.placements, torch.equal(r.full_tensor(), a))
    local = dt.to_local()
    print("to_local", type(local).__name__, tuple(local.shape),
          torch.equal(mpimesh.inspect(local, dp=1, tp=0), a[4:, :3]))
    p = mpimesh.distribute(a, mesh, sharding_spec=[Shard(0), TorchShard(1)])
    print("placements", p.placements == dt.placements)
    per_process = mpimesh.distribute(a, mesh, [Shard(0), Replicate()])
    try:
        dt + per_process
    except ValueError as exc:
        print("mixing:", str(exc).split(";")[0])
    with mesh.activate():
        ones = torch.ones(6)
        try:
            dt + ones
        except ValueError as exc:
            print("mixing in activate:", str(exc).split(";")[0])
        inside = (dt + 1).full_tensor()
    print("global in activate", torch.equal(inside, a + 1))
    print("controller tensor replicated", torch.equal((dt + torch.ones(6)).full_tensor(), a + 1))
    try:
        dt @ dt
    except Exception as exc:
        print("shape error at the line:", type(exc).__name__)
    errors = 0
    for _ in range(2):  # a failing signature is never cached: the error comes at the line every time
        try:
            dt @ dt
        except RuntimeError:
            errors += 1
    r2 = dt.redistribute(placements=[Replicate(), Replicate()])
    cached = [(x + 1).placements for x in (dt, r2, dt, r2)]  # same op, other input placements: other results
    inplace = r2.clone()
    for _ in range(3):
        same = inplace.add_(1)
    print("cached", errors == 2, cached[0] == cached[2] == dt.placements, cached[1] == cached[3] == r2.placements,
          same is inplace, torch.equal(inplace.full_tensor(), a + 3))
    bad = dt[torch.tensor([100, 0])]  # out of range: only the workers can tell
    later = bad * 2
    try:
        later.full_tensor()
    except mpimesh.RemoteTensorError as exc:
        print("poisoned:", type(exc).__name__)
    print("still serving", (dt + 0).sum().item() == a.sum().item())

    engine = mpimesh.tensor._client.client_of(mesh).engine
    before = [s["tensors"] for s in engine.stats.call().get(60).values()]
    acc = mpimesh.distribute(torch.zeros(8, 6), mesh, sharding_spec=["dp", None])
    for _ in range(200):
        acc = acc + dt * 2 - 1
    print("loop", torch.equal(acc.full_tensor(), (a * 2 - 1) * 200))
    del acc
    after = [s["tensors"] for s in engine.stats.call().get(60).values()]
    print("freed", all(x <= y + 2 for x, y in zip(after, before, strict=True)), before, after)
