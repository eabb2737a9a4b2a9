"""The tensor engine: mesh tensors driven from the controller (issue #15).

Runtime tests (``mesh``): they run at every world size of the suite, so the
meshes below are pool ranks, spawned processes, or both (then reductions
join the islands' processes into one communicator).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from mpitest import spawning

import mpimesh
from mpimesh import Replicate, Shard, this_host

pytestmark = pytest.mark.mesh


@pytest.fixture(scope="module")
def grid() -> Iterator[Any]:
    """Four processes as ``dp=2, tp=2`` (across hosts: tests/hosts/test_hosts_tensor.py)."""
    with spawning():
        mesh = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield mesh
    mesh.stop().get(60)


def line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (for pinned controller-line reports)."""
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


# --- values, shapes, activation ----------------------------------------------------


def test_operations_run_on_every_process_over_its_local_tensor(procs: Any) -> None:
    """Each process computes with its own tensors; fetch_shard brings one process's value back."""
    with procs.activate():
        x = torch.ones(3, 4) * 2 + procs.rank_tensor("gpus")
        y = (x @ x.T).sum(dim=0)
    assert mpimesh.inspect(x, gpus=0).tolist() == [[2.0] * 4] * 3
    assert mpimesh.inspect(x, gpus=1).tolist() == [[3.0] * 4] * 3
    assert mpimesh.fetch_shard(y, gpus=1).get(60).tolist() == [108.0, 108.0, 108.0]


def test_every_argument_form_reaches_the_workers(procs: Any) -> None:
    """Keyword arguments, local tensors, lists of mesh tensors and ``out=`` (the flat and the general command)."""
    local = torch.arange(4.0)
    with procs.activate():
        a = torch.ones(4) + procs.rank_tensor("gpus")
        b = torch.add(a, local, alpha=2)  # a keyword, and a controller tensor sent with the batch
        c = torch.cat([a, b])  # a list: the general form
        d = torch.empty(4)
        torch.mul(a, 3, out=d)  # a mesh tensor by keyword
        e = a.clamp(min=1.5, max=2.5)
    assert mpimesh.inspect(b, gpus=1).tolist() == [2.0, 4.0, 6.0, 8.0]
    assert mpimesh.inspect(c, gpus=0).tolist() == [1.0] * 4 + [1.0, 3.0, 5.0, 7.0]
    assert mpimesh.inspect(d, gpus=1).tolist() == [6.0] * 4
    assert mpimesh.inspect(e, gpus=0).tolist() == [1.5] * 4 and mpimesh.inspect(e, gpus=1).tolist() == [2.0] * 4


def test_the_controller_knows_shapes_and_raises_shape_errors_at_the_line(procs: Any) -> None:
    """Results have shape, dtype and device at once; a shape error raises at the controller like local torch."""
    with procs.activate():
        a = torch.zeros(5, 3, dtype=torch.float64)
        b = a.T.unsqueeze(0)
        assert isinstance(b, mpimesh.Tensor)
        assert (b.shape, b.dtype, b.device) == (torch.Size([1, 3, 5]), torch.float64, torch.device("cpu"))
        shape_error = "a and b must have same reduction dim, but got [5, 3] X [5, 3]."
        with pytest.raises(RuntimeError, match=re.escape(shape_error)):
            a @ a
    assert repr(a) == "mpimesh.Tensor(shape=(5, 3), dtype=torch.float64, device=cpu, mesh=ProcMesh(gpus=2))"
    assert mpimesh.get_active_mesh() is None


def test_active_mesh_and_no_mesh(procs: Any) -> None:
    """activate() sets the active mesh; no_mesh.activate() makes torch local again inside it."""
    with procs.activate():
        assert mpimesh.get_active_mesh() is procs
        with mpimesh.no_mesh.activate():
            local = torch.ones(2) + 1
            assert mpimesh.get_active_mesh() is None
        assert type(local) is torch.Tensor and local.tolist() == [2.0, 2.0]


class Doubler(mpimesh.Actor):
    @mpimesh.endpoint
    def double(self, t: torch.Tensor) -> torch.Tensor:
        return t * 2


def test_values_that_cross_processes_stay_plain_tensors_inside_activate(procs: Any) -> None:
    """Inside ``activate()``, (un)pickling is not a mesh operation: fetched shards, and actor arguments and results.

    The fetch's reply was unpickled in the script's thread under the mesh's
    mode, whose ``torch.empty`` made a mesh tensor: "Attempted to set the
    storage of a tensor on device meta".
    """
    doubler = procs.spawn("doubler", Doubler)
    big = torch.ones(1 << 18)  # 1 MiB: pickled out of band, through torch operations
    with procs.activate():
        t = torch.zeros(4) + 3
        fetched = mpimesh.inspect(t, gpus=1)
        doubled = doubler.slice(gpus=0).double.call_one(big).get(60)
    assert type(fetched) is torch.Tensor and fetched.tolist() == [3.0] * 4
    assert type(doubled) is torch.Tensor and doubled.sum().item() == 2 * big.numel()
    doubler.stop().get(60)


def test_a_value_on_the_controller_needs_a_fetch(procs: Any) -> None:
    """t.item() and bool(t) would wait on a worker: they raise with the fix."""
    with procs.activate():
        t = torch.ones(())
        with pytest.raises(RuntimeError, match=r"^tensor engine: t\.item\(\) needs the value of a mesh tensor, which "
                           r"lives on the workers; fetch it: mpimesh\.inspect\(t, \*\*coords\) "
                           r"\(or mpimesh\.fetch_shard\(t, \*\*coords\)\.get\(\)\)$"):
            t.item()
    assert mpimesh.inspect(t).item() == 1.0


# --- reductions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reduction", "scatter", "expected"),
    [
        ("sum", False, [[1.0, 2.0]]),
        ("avg", False, [[0.5, 1.0]]),
        ("max", False, [[1.0, 2.0]]),
        ("min", False, [[0.0, 0.0]]),
        ("product", False, [[0.0, 0.0]]),
        ("stack", False, [[[0.0, 0.0]], [[1.0, 2.0]]]),
        ("sum", True, [[1.0, 2.0]]),  # rows [[r, 2r], [r, 2r]] summed, one row per process
    ],
)
def test_reductions_over_a_dimension(procs: Any, reduction: str, scatter: bool, expected: list[Any]) -> None:
    """reduce() is an MPI collective over the dimension; every process ends with the group's result."""
    with procs.activate():
        r = procs.rank_tensor("gpus").float()
        t = torch.stack([r, r * 2]).unsqueeze(0)  # shape (1, 2): [[r, 2r]]
        if scatter:
            t = t.expand(2, 2).contiguous()
        out = t.reduce("gpus", reduction, scatter=scatter)
    for g in range(2):
        assert mpimesh.inspect(out, gpus=g).tolist() == expected, g


def test_reduce_in_place_keeps_the_handle(procs: Any) -> None:
    """reduce_ reduces the tensor itself (MPI_IN_PLACE) and returns it."""
    with procs.activate():
        t = torch.ones(4) + procs.rank_tensor("gpus")
        same = t.reduce_("gpus", "max")
    assert same is t
    assert mpimesh.inspect(t, gpus=0).tolist() == [2.0] * 4


def test_reductions_over_one_or_several_dimensions_of_a_grid(grid: Any) -> None:
    """Groups are the processes that share the other coordinates, in mesh order."""
    with grid.activate():
        v = grid.rank_tensor("dp") * 10 + grid.rank_tensor("tp")
        over_dp = v.reduce("dp", "stack")
        over_tp = v.reduce("tp", "stack")
        both = v.reduce(("tp", "dp"), "sum")
    assert mpimesh.inspect(over_dp, dp=0, tp=1).tolist() == [1, 11]
    assert mpimesh.inspect(over_tp, dp=1, tp=0).tolist() == [10, 11]
    assert mpimesh.inspect(both, dp=1, tp=1).item() == 22


def test_a_large_reduction_is_exact(procs: Any) -> None:
    """8 MiB of float64 sums exactly across processes (MPI on the tensors' memory)."""
    with procs.activate():
        t = torch.arange(1 << 20, dtype=torch.float64) * (procs.rank_tensor("gpus") + 1)
        s = t.reduce("gpus", "sum")
    assert torch.equal(mpimesh.inspect(s, gpus=1), torch.arange(1 << 20, dtype=torch.float64) * 3)


# --- bad input ------------------------------------------------------------------------


def test_bad_reductions_raise_at_the_controller(procs: Any) -> None:
    """Unknown dimensions and reductions, dtypes MPI cannot reduce and bad shapes raise before anything is sent."""
    with procs.activate():
        t = torch.ones(3)
        with pytest.raises(ValueError, match=r"^tensor engine: ProcMesh\(gpus=2\) has no dimension 'hosts'; "
                           r"its dimensions are \['gpus'\]$"):
            t.reduce("hosts")
        with pytest.raises(ValueError, match=r"^tensor engine: unknown reduction 'mean'; use one of \['sum', 'avg', "):
            t.reduce("gpus", "mean")
        with pytest.raises(TypeError, match=r"^tensor engine: MPI cannot 'sum'-reduce a tensor of dtype "
                           r"torch\.float16; reduce a converted copy, e\.g\. t\.float\(\)\.reduce\(\.\.\.\)$"):
            t.half().reduce("gpus")
        with pytest.raises(ValueError, match=r"^tensor engine: scatter=True splits dimension 0 into 2 blocks, one per "
                           r"process of \('gpus',\), but the tensor's shape is \(3,\)$"):
            t.reduce("gpus", scatter=True)
    with pytest.raises(TypeError, match=r"^tensor engine: reduce needs an mpimesh\.Tensor \(made inside "
                       r"procs\.activate\(\)\), got Tensor$"):
        mpimesh.reduce(torch.ones(2), "gpus")


def test_tensors_of_two_meshes_do_not_mix(procs: Any, grid: Any) -> None:
    """An operation on tensors of different meshes raises, naming both."""
    with procs.activate():
        a = torch.ones(2)
    with grid.activate():
        b = torch.ones(2)
    with pytest.raises(ValueError, match=r"^tensor engine: cannot reduce a tensor of ProcMesh\(gpus=2\) over "
                       r"ProcMesh\(dp=2, tp=2\); use its own mesh$"):
        a.reduce("gpus", mesh=grid)
    with grid.activate():
        with pytest.raises(ValueError, match=r"^tensor engine: aten\.mul\.Tensor on a tensor of ProcMesh\(gpus=2\) "
                           r"inside ProcMesh\(dp=2, tp=2\)\.activate\(\); activate the tensor's own mesh, or leave "
                           r"the active one$"):
            a * 2
    with pytest.raises(ValueError, match=r"^tensor engine: aten\.add\.Tensor mixes tensors of ProcMesh\(gpus=2\) and "
                       r"ProcMesh\(dp=2, tp=2\); every tensor of one operation must live on the same mesh "
                       r"\(or slice\)$"):
        a + b


def test_arguments_that_do_not_pickle_raise_at_the_line(procs: Any) -> None:
    """A non-tensor argument that cannot travel raises at the controller, naming the fix."""

    @mpimesh.remote(propagate=lambda t, lock: t)
    def keep(t: torch.Tensor, lock: Any) -> torch.Tensor:
        return t

    with procs.activate():
        t = torch.ones(2)
        with pytest.raises(TypeError, match=r"^tensor engine: cannot send <unlocked _thread\.lock object at "
                           r"0x[0-9a-f]+> to the workers: it does not pickle \(.*\); pass tensors and plain values, "
                           r"or build the object on the workers in a @mpimesh\.remote function$"):
            keep(t, threading.Lock())


def test_fetch_shard_checks_its_arguments(procs: Any) -> None:
    """fetch_shard takes mesh tensors and the mesh's own dimensions."""
    with pytest.raises(TypeError, match=r"^fetch_shard needs an mpimesh\.Tensor \(made inside procs\.activate\(\)\), "
                       r"got Tensor; a local tensor is already here$"):
        mpimesh.fetch_shard(torch.ones(1))
    with procs.activate():
        t = torch.ones(1)
    with pytest.raises(ValueError, match=r"^fetch_shard: ProcMesh\(gpus=2\) has no dimension 'dp'; its dimensions "
                       r"are \['gpus'\]$"):
        mpimesh.fetch_shard(t, dp=0)


# --- failures -----------------------------------------------------------------------------


@mpimesh.remote(propagate=lambda t: t)
def fail_on_rank_1(t: torch.Tensor) -> torch.Tensor:
    if mpimesh.current_rank().rank == 1:
        raise ValueError("no good on this rank")
    return t * 2


def test_a_failed_operation_poisons_what_depends_on_it_and_the_mesh_goes_on(procs: Any) -> None:
    """The failure raises at the next fetch, with the issuing line and the remote traceback; the rest works."""
    with procs.activate():
        base = torch.ones(2)
        bad = fail_on_rank_1(base)  # failing-line
        worse = bad + 1
        fine = base + 1
    line = line_of("# failing-line")
    expected = (rf"^tensor engine: fail_on_rank_1 issued at {re.escape(__file__)}:{line} in "
                r"test_a_failed_operation_poisons_what_depends_on_it_and_the_mesh_goes_on failed: "
                r"ValueError: no good on this rank$")
    with pytest.raises(mpimesh.RemoteTensorError, match=expected) as info:
        mpimesh.inspect(worse, gpus=1)
    assert isinstance(info.value.__cause__, mpimesh.ActorError)
    assert "no good on this rank" in str(info.value.__cause__.__cause__)
    assert mpimesh.inspect(bad, gpus=0).tolist() == [2.0, 2.0]
    assert mpimesh.inspect(fine, gpus=1).tolist() == [2.0, 2.0]
    with procs.activate():
        poisoned_sum = bad.reduce("gpus")
        after = torch.full((2,), 7.0).reduce("gpus")
    with pytest.raises(mpimesh.RemoteTensorError, match=r"issued at .* failed: "):
        mpimesh.inspect(poisoned_sum, gpus=0)
    assert mpimesh.inspect(after, gpus=0).tolist() == [14.0, 14.0]


def test_a_repeated_operation_reports_its_own_line(procs: Any) -> None:
    """From its third repetition an operation is replayed from a cache (T1): it still fails at its line."""
    with procs.activate():
        n = torch.ones(2, dtype=torch.int64)
        results = [n // 0 for _ in range(4)]  # repeated-line
        fine = [n + 1 for _ in range(4)]
    line = line_of("# repeated-line")
    for result in results:
        with pytest.raises(mpimesh.RemoteTensorError, match=rf"issued at {re.escape(__file__)}:{line} in .*"
                                                            r"ZeroDivisionError"):
            mpimesh.inspect(result, gpus=1)
    assert len({t._id for t in fine}) == 4
    assert all(mpimesh.inspect(t, gpus=1).tolist() == [2, 2] for t in fine)


# --- remote functions -----------------------------------------------------------------


def test_remote_functions_with_and_without_propagate(procs: Any) -> None:
    """Shapes come from propagate, else from a run on meta tensors; a name is imported on the workers."""

    @mpimesh.remote
    def outer(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.outer(a, b), a.sum()

    rank_plus = mpimesh.remote(lambda t: t + mpimesh.current_rank().rank, propagate=lambda t: t)
    neg = mpimesh.remote("torch.neg", propagate=lambda t: t)
    with procs.activate():
        m, s = outer(torch.arange(3.0), torch.ones(2))
        assert (m.shape, s.shape) == (torch.Size([3, 2]), torch.Size([]))
        r = neg(rank_plus(torch.zeros(2)))
    assert mpimesh.inspect(m, gpus=1).tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert mpimesh.inspect(s).item() == 3.0
    assert mpimesh.inspect(r, gpus=1).tolist() == [-1.0, -1.0]
    assert outer(torch.ones(1), torch.ones(1))[1].item() == 1.0  # no mesh: runs here


# --- distribute, gather, autograd ----------------------------------------------------------


def test_distribute_and_gather_round_trip(grid: Any) -> None:
    """Shard splits a tensor dimension over a mesh dimension, Replicate copies; gather inverts it."""
    x = torch.arange(48.0).reshape(4, 12)
    for placements in ([Shard(0), Shard(1)], [Replicate(), Shard(1)], [Shard(1), Replicate()]):
        dt = mpimesh.distribute(x, grid, placements)
        assert mpimesh.gather(dt).get(60).equal(x)
    dt = mpimesh.distribute(x, grid, [Shard(0), Shard(1)])
    assert dt.shape == torch.Size([2, 6])
    assert mpimesh.inspect(dt, dp=1, tp=1).equal(x[2:, 6:])
    with pytest.raises(ValueError, match=r"^distribute: ProcMesh\(dp=2, tp=2\) has 2 dimensions \['dp', 'tp'\], so "
                       r"give 2 placements \(Shard\(dim\) or Replicate\(\)\), got 1$"):
        mpimesh.distribute(x, grid, [Shard(0)])
    with pytest.raises(ValueError, match=r"^distribute: Shard\(0\) over 'dp' splits size 5 into 2 equal blocks, "
                       r"which it does not divide; pad the tensor or choose another dimension$"):
        mpimesh.distribute(torch.ones(5, 2), grid, [Shard(0), Replicate()])


def test_sharded_matmul_equals_local_torch(procs: Any) -> None:
    """x @ x.T with x's columns sharded: each process multiplies its block, a sum over the mesh finishes it."""
    x = torch.randn(6, 8, dtype=torch.float64)
    dt = mpimesh.distribute(x, procs, [Shard(1)])
    with procs.activate():
        gram = (dt @ dt.T).reduce("gpus", "sum")
    assert torch.allclose(mpimesh.inspect(gram, gpus=1), x @ x.T, rtol=1e-12, atol=1e-12)


def test_data_parallel_training_matches_one_process(procs: Any) -> None:
    """loss.backward() and torch.optim.SGD run through mesh tensors; averaged gradients give full-batch training."""
    torch.manual_seed(0)
    local = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    params = [mpimesh.distribute(p.detach(), procs, [Replicate()]).requires_grad_() for p in local.parameters()]
    xs, ys = mpimesh.distribute(x, procs, [Shard(0)]), mpimesh.distribute(y, procs, [Shard(0)])
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
    w1, b1, w2, b2 = params
    for _ in range(4):
        loss = ((torch.tanh(xs @ w1.T + b1) @ w2.T + b2 - ys) ** 2).mean()
        loss.backward()
        mpimesh.reduce_([p.grad for p in params], "gpus", "avg")
        opt.step()
        opt.zero_grad()
        mesh_loss = mpimesh.inspect(loss.detach().reduce("gpus", "avg")).item()
        ref_loss = ((local(x) - y) ** 2).mean()
        ref_loss.backward()
        ref.step()
        ref.zero_grad()
        assert mesh_loss == pytest.approx(ref_loss.item(), rel=1e-5)
    assert torch.allclose(mpimesh.inspect(w2, gpus=1), local[2].weight.detach(), rtol=1e-5, atol=1e-6)


def test_adam_steps_mesh_parameters_like_local_ones(procs: Any) -> None:
    """An optimizer with scalar state (Adam) steps mesh parameters outside activate(), as it steps local ones."""
    w0 = torch.randn(3, 4)
    w = mpimesh.distribute(w0.clone(), procs, [Replicate()]).requires_grad_()
    local = w0.clone().requires_grad_()
    opt, ref = torch.optim.Adam([w], lr=0.1), torch.optim.Adam([local], lr=0.1)
    for _ in range(3):
        (w**2).sum().backward()
        opt.step()
        opt.zero_grad()
        (local**2).sum().backward()
        ref.step()
        ref.zero_grad()
    assert torch.allclose(mpimesh.inspect(w, gpus=1), local.detach(), atol=1e-6)


# --- memory ----------------------------------------------------------------------------------


def test_worker_tensors_are_freed_with_their_handles(procs: Any) -> None:
    """10,000 operations with temporaries leave the workers' tables (and memory) flat."""
    engine = mpimesh.tensor._client.client_of(procs).engine
    with procs.activate():
        acc = torch.zeros(256)
        for _ in range(2_500):  # 4 operations each, 3 of them temporaries
            acc = acc + torch.ones(256) * 2 - 1
    assert mpimesh.inspect(acc, gpus=1)[0].item() == 2_500.0
    del acc
    stats = engine.stats.call().get(60).values()
    assert all(s["tensors"] < 50 for s in stats), stats




def test_tensors_of_a_slice_are_freed_too(grid: Any) -> None:
    """Deletions go to every process, so handles on a slice free its tensors as well (their own batch)."""
    engine = mpimesh.tensor._client.client_of(grid).engine
    row = grid.slice(dp=1)
    with row.activate():
        acc = torch.zeros(16)
        for _ in range(2_000):
            acc = acc + 1
    assert mpimesh.inspect(acc, tp=1)[0].item() == 2_000.0
    del acc
    with grid.activate():
        mpimesh.inspect(torch.zeros(1) + 1, dp=0, tp=0)  # a batch to the whole mesh carries the last deletions
    stats = engine.stats.call().get(60).values()
    assert all(s["tensors"] < 20 for s in stats), stats


def test_a_fetched_value_is_not_changed_by_the_next_operations(procs: Any) -> None:
    """fetch_shard sends from the tensor's own memory; an in-place op issued right after waits for the send."""
    with procs.activate():
        t = torch.zeros(4 << 20)  # 16 MiB: out of band, in pieces
    futures = []
    for _ in range(3):
        futures.append(mpimesh.fetch_shard(t, gpus=1))
        with procs.activate():
            t.add_(1)
    for k, fut in enumerate(futures):
        value = fut.get(60)
        assert value.min().item() == value.max().item() == k


def test_reduce_results_reuse_memory_only_when_free(procs: Any) -> None:
    """A loop of new reductions gives right values each time while old results stay readable."""
    with procs.activate():
        t = torch.ones(1 << 20) * (procs.rank_tensor("gpus") + 1)
        kept = t.reduce("gpus", "sum")
        for _ in range(5):
            s = t.reduce("gpus", "sum")
            s = s * 2
    assert mpimesh.inspect(s, gpus=0)[7].item() == 6.0
    assert mpimesh.inspect(kept, gpus=1)[7].item() == 3.0


def test_a_pytree_reduces_in_one_collective_with_its_structure(procs: Any) -> None:
    """reduce/reduce_ of a list or dict of tensors: every tensor reduced, the structure kept."""
    with procs.activate():
        r = procs.rank_tensor("gpus").float() + 1
        grads = {"w": torch.ones(2, 3) * r, "b": torch.ones(4) * r * 10}
        summed = mpimesh.reduce(grads, "gpus", "sum")
        same = mpimesh.reduce_([grads["w"], grads["b"]], "gpus", "avg")
    assert set(summed) == {"w", "b"}
    assert mpimesh.inspect(summed["w"], gpus=1).tolist() == [[3.0] * 3] * 2
    assert mpimesh.inspect(summed["b"], gpus=0).tolist() == [30.0] * 4
    assert same[0] is grads["w"]
    assert mpimesh.inspect(grads["b"], gpus=1).tolist() == [15.0] * 4
    with procs.activate():
        with pytest.raises(TypeError, match=r"^tensor engine: reduce of a pytree mixes dtypes torch\.float32 and "
                           r"torch\.float64; reduce each dtype apart$"):
            mpimesh.reduce([torch.ones(1), torch.ones(1, dtype=torch.float64)], "gpus")
        with pytest.raises(ValueError, match=r"^tensor engine: 'stack' takes one tensor, not a pytree; stack each "
                           r"tensor$"):
            mpimesh.reduce([torch.ones(1)], "gpus", "stack")
