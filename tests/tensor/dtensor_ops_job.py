"""Every operator of op_cases.py on a 2 x 2 dp x tp Mesh against one process (run by test_dtensor_ops.py).

Prints one line per case and layout: the largest difference of the forward
result and of each input's gradient from one-process torch on the full
tensors, or the error.  Every case is issued first and the results come
back in one fetch (a round trip per case made the job three times longer);
where that fetch fails, each case is fetched alone to name the failing ones.
"""

import torch
from op_cases import CASES, difference, reference, weights

import mpimesh
from mpimesh import Replicate
from mpimesh.distributed import Mesh

mesh = Mesh(shape=(2, 2), mesh_dim_names=("dp", "tp"))
issued = []  # (label, the results on the mesh, one process's results)
for case in CASES:
    expected, expected_grads = reference(case)
    wanted = [expected] + [g for g in expected_grads if g is not None]
    for layout, specs in case.layouts.items():
        label = f"{case.name} | {layout}"
        try:
            inputs = []
            for t, spec, grad in zip(case.inputs, specs, case.grad, strict=True):
                dt = mpimesh.distribute(t, mesh, sharding_spec=spec or [None] * t.dim())
                inputs.append(dt.requires_grad_() if grad else dt)
            out = case.fn(*inputs)
            (out * weights(expected)).sum().backward()
            got = [out.detach()] + [dt.grad for dt, g in zip(inputs, expected_grads, strict=True) if g is not None]
            if any(g is None for g in got):
                raise RuntimeError("an input has no gradient")
            whole = [g.redistribute(placements=[Replicate(), Replicate()]).reshape(-1) for g in got]
            issued.append((label, whole, wanted))
        except Exception as exc:
            print(f"{label}: error {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)


def report(label: str, values: list[torch.Tensor], wanted: list[torch.Tensor]) -> None:
    diffs = [difference(v.reshape(w.shape), w) if v.numel() == w.numel() else float("inf")
             for v, w in zip(values, wanted, strict=True)]
    print(f"{label}: {max(diffs):.1e} {' '.join(f'{d:.1e}' for d in diffs)}", flush=True)


try:
    flat = torch.cat([w for _, whole, _ in issued for w in whole]).full_tensor()
except mpimesh.RemoteTensorError:
    for label, whole, wanted in issued:
        try:
            report(label, [w.full_tensor() for w in whole], wanted)
        except mpimesh.RemoteTensorError as exc:
            print(f"{label}: error {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
else:
    offset = 0
    for label, _, wanted in issued:
        values = []
        for w in wanted:
            values.append(flat[offset:offset + w.numel()])
            offset += w.numel()
        report(label, values, wanted)
mesh.stop().get()
print("done")
