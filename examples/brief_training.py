"""The brief's second program: a training step that looks like one GPU, on a ``dp x tp`` mesh.

``module_to_mesh`` puts a small transformer's parameters on the mesh
(replicated over ``dp``, its feed-forward layers split column- then
row-wise over ``tp``); the step is the brief's, unchanged: ``model(x)``,
``loss_fn``, ``loss.backward()`` (gradients synchronized over ``dp``
automatically), ``AdamW`` with its state on the workers, ``loss.item()``.
The same model trained in this process on the whole batch gives the same
losses.

    python examples/brief_training.py                      # 8 workers spawned
    mpirun -n 9 python -m mpimesh examples/brief_training.py
"""

import copy
import os

import torch
from torch import nn, optim

import mpimesh as monarch
from mpimesh.distributed import Mesh

STEPS = int(os.environ.get("BRIEF_STEPS", "20"))
DP, TP = (int(n) for n in os.environ.get("BRIEF_MESH", "4x2").split("x"))
BATCH, SEQ, WIDTH = 8, 4, 16


class SimpleTransformer(nn.Module):
    """One pre-norm transformer block: self-attention, then a feed-forward layer, both residual."""

    def __init__(self, width: int = WIDTH, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        # no bias on q, k, v: a key's bias has no gradient at all (softmax ignores it), and Adam turns
        # the rounding noise in its zero gradient into full steps, which no two programs share
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-2, -1) / (w // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, s, w))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


def train_step(model, optimizer, loss_fn, input_data, target):
    optimizer.zero_grad()
    output = model(input_data)
    loss = loss_fn(output, target)
    loss.backward()
    optimizer.step()
    return loss.item()


torch.manual_seed(0)
reference = SimpleTransformer()
batches = [(torch.randn(BATCH, SEQ, WIDTH), torch.randn(BATCH, SEQ, WIDTH)) for _ in range(STEPS)]

mesh = Mesh(shape=(DP, TP), mesh_dim_names=("dp", "tp"))
model = monarch.module_to_mesh(copy.deepcopy(reference), mesh, plan={"up": "colwise", "down": "rowwise"})
optimizer = optim.AdamW(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()

ref_optimizer = optim.AdamW(reference.parameters(), lr=1e-2)
worst = 0.0
for step, (input_data, target) in enumerate(batches):
    mesh_loss = train_step(model, optimizer, loss_fn, input_data, target)
    ref_loss = train_step(reference, ref_optimizer, loss_fn, input_data, target)
    worst = max(worst, abs(mesh_loss - ref_loss))
    print(f"step {step}: loss {mesh_loss:.6f} (one process: {ref_loss:.6f})")

state = model.state_dict()
drifts = {k: (state[k] - v).abs().max().item() for k, v in reference.state_dict().items()}
drift = max(drifts.values())

print(f"largest loss difference {worst:.2e}, largest weight difference {drift:.2e}")
mesh.stop().get()
