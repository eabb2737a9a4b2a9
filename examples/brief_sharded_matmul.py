"""The brief's first program: a mesh of devices and a tensor sharded over it, as one object.

Only the imports differ from the brief (``monarch`` -> ``mpimesh``).  The
tensor is split by rows over ``data_parallel``; ``shape`` is the global
shape, and ``@`` multiplies the global matrices, with the communication it
needs done by torch's DTensor on the workers.

    python examples/brief_sharded_matmul.py                      # 8 workers spawned
    mpirun -n 9 python -m mpimesh examples/brief_sharded_matmul.py
"""

import torch

import mpimesh as monarch
from mpimesh.distributed import Mesh

device_mesh = Mesh(shape=(4, 2), mesh_dim_names=("data_parallel", "model_parallel"))
print(f"Mesh initialized with {device_mesh.size()} devices.")
local_tensor = torch.randn(1024, 1024)
distributed_tensor = monarch.distribute(
    local_tensor, device_mesh,
    sharding_spec=["data_parallel", None])   # shard tensor dim 0 over data_parallel
print(distributed_tensor.shape)              # the global shape: it appears as a single object
result = distributed_tensor @ distributed_tensor.T   # operations look local but execute globally

print(result.shape, result.placements)
expected = local_tensor @ local_tensor.T
print("equals the local product:", torch.allclose(result.full_tensor(), expected, atol=1e-3))
device_mesh.stop().get()
