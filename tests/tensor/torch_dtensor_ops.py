"""The cases of op_cases.py on plain torch DTensor over gloo, SPMD: which operators torch itself gets wrong.

Run by hand, not by a test (it shows torch's behaviour, not mpimesh's):
``mpiexec -n 4 python tests/tensor/torch_dtensor_ops.py``.  Rank 0 prints
one line per case and layout, as dtensor_ops_job.py does; the list in
docs/design/tensor.md ("Operators without a sharding rule") comes from it.
"""

import os

import torch.distributed as dist
from mpi4py import MPI
from op_cases import CASES, difference, reference, weights
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

comm = MPI.COMM_WORLD
store = dist.TCPStore("127.0.0.1", 0, comm.size, is_master=True, wait_for_workers=False) if comm.rank == 0 else None
port = comm.bcast(store.port if store is not None else None)
if store is None:
    store = dist.TCPStore("127.0.0.1", port, comm.size, is_master=False)
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def placements(spec: list[str | None], ndim: int) -> list[Shard | Replicate]:
    out: list[Shard | Replicate] = [Replicate(), Replicate()]
    for d, name in enumerate(spec or [None] * ndim):
        if name is not None:
            out[("dp", "tp").index(name)] = Shard(d)
    return out


for case in CASES:
    expected, expected_grads = reference(case)
    for layout, specs in case.layouts.items():
        try:
            inputs = []
            for t, spec, grad in zip(case.inputs, specs, case.grad, strict=True):
                dt = distribute_tensor(t, mesh, placements(spec, t.dim()))
                inputs.append(dt.requires_grad_() if grad else dt)
            out = case.fn(*inputs)
            w = distribute_tensor(weights(expected), mesh, [Replicate(), Replicate()])
            (out * w).sum().backward()
            diffs = [difference(out.full_tensor(), expected)]
            diffs += [difference(dt.grad.full_tensor() if dt.grad is not None else None, want)
                      for dt, want in zip(inputs, expected_grads, strict=True) if want is not None]
            line = f"{case.name} | {layout}: {max(diffs):.1e} {' '.join(f'{d:.1e}' for d in diffs)}"
        except Exception as exc:
            line = f"{case.name} | {layout}: error {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if comm.rank == 0:
            print(line, flush=True)
dist.destroy_process_group()
