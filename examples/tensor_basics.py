"""The tensor engine: torch on every process of a mesh, driven from this script.

Run it either way:

    mpirun -n 5 python -m mpimesh examples/tensor_basics.py
    python examples/tensor_basics.py                          # workers spawned
"""

import torch

import mpimesh
from mpimesh import Replicate, Shard, this_host

procs = this_host().spawn_procs(per_host={"gpus": 4})

# Inside activate(), torch calls run on every process, each on its own tensors.
with procs.activate():
    rank = procs.rank_tensor("gpus")  # each process's coordinate, as a tensor
    x = torch.ones(2, 3) * (rank + 1)
    total = x.reduce("gpus", "sum")  # MPI_Allreduce over the "gpus" dimension
    everyone = rank.reduce("gpus", "stack")  # MPI_Allgather
    print("shape known here at once:", tuple(total.shape), total.dtype)
print("x on gpus=2:", mpimesh.inspect(x, gpus=2)[0].tolist())
print("sum over gpus:", mpimesh.inspect(total, gpus=0)[0].tolist())
print("stacked ranks:", mpimesh.fetch_shard(everyone, gpus=3).get().tolist())


# A remote function runs on every process over its local tensors.
@mpimesh.remote(propagate=lambda t: t)
def scale_by_rank(t: torch.Tensor) -> torch.Tensor:
    return t * (mpimesh.current_rank().rank + 1)


with procs.activate():
    y = scale_by_rank(torch.ones(3))
print("remote on gpus=3:", mpimesh.inspect(y, gpus=3).tolist())

# distribute() shards a tensor of this script over the mesh: x @ x.T with x's
# columns split over the processes is a local product and a sum over the mesh.
a = torch.randn(6, 8, dtype=torch.float64)
da = mpimesh.distribute(a, procs, [Shard(1)])
with procs.activate():
    gram = (da @ da.T).reduce("gpus", "sum")
print("sharded a @ a.T equals local torch:", torch.allclose(mpimesh.inspect(gram), a @ a.T))
print("gather(distribute(a)) == a:", mpimesh.gather(mpimesh.distribute(a, procs, [Replicate()])).get().equal(a))

# A failed operation poisons what depends on it; the error shows at the next fetch.
@mpimesh.remote(propagate=lambda t: t)
def fails_on_rank_2(t: torch.Tensor) -> torch.Tensor:
    if mpimesh.current_rank().rank == 2:
        raise ValueError("rank 2 does not like this tensor")
    return t


with procs.activate():
    z = fails_on_rank_2(torch.ones(2)) + 1
    try:
        torch.ones(2, 3) @ torch.ones(2, 3)  # shapes are checked here, before anything is sent
    except RuntimeError as exc:
        print("shape error at the controller:", exc)
try:
    mpimesh.inspect(z, gpus=2)
except mpimesh.RemoteTensorError as exc:
    print("caught on gpus=2:", exc.error)
print("gpus=0 is fine:", mpimesh.inspect(z, gpus=0).tolist())
procs.stop().get()
print("done")
