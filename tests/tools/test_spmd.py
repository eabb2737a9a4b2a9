"""torch.distributed inside actors (mpimesh.spmd): the torchrun environment from a mesh, and collectives over it.

Runtime tests (marker ``mesh``) work at any world size: their meshes are the
conftest's ``procs`` (``gpus=2``) and ``one_proc`` fixtures, from the launch
pool or spawned.  The pure rule (:func:`world_env`) and the import check run
under plain pytest.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from mpitest import python_cmd, run

from mpimesh import Actor, ActorError, endpoint, this_host
from mpimesh.spmd import SPMDActor, default_backend, setup_torch_elastic_env, setup_torch_elastic_env_async
from mpimesh.spmd._actor import world_env

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")

#: What a script run by SPMDActor.main does: an all_reduce, its result written next to the script.
SCRIPT = """
import os, sys
import torch
import torch.distributed as dist
from mpimesh.spmd import default_backend

out, scale = sys.argv[1], float(sys.argv[2])
if os.environ["RANK"] == "1" and "--fail" in sys.argv:
    raise KeyError("rank 1 was told to fail")
dist.init_process_group(default_backend())
t = torch.tensor([scale * (dist.get_rank() + 1)])
dist.all_reduce(t)
dist.destroy_process_group()
with open(f"{out}.{os.environ['RANK']}", "w") as f:
    f.write(f"{t.item()} {__name__} {sys.argv[0]}")
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
"""


class Torch(Actor):
    """Reads the torchrun variables and runs one all_reduce in the process group they describe."""

    @endpoint
    def env(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in KEYS}

    @endpoint
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group(default_backend())  # init_method="env://", the default
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()

    @endpoint
    def add_path(self, path: str) -> None:
        sys.path.insert(0, path)


def envs(actors: Any) -> list[dict[str, str | None]]:
    return list(actors.env.call().get(60).values())


# --- the rule, pure


def test_world_env_groups_ranks_by_host() -> None:
    """LOCAL_RANK counts a rank's host-mates in rank order; GROUP_RANK is the host's first-appearance index."""
    hosts = ["b", "b", "a", "a", "a"]
    got = [world_env(hosts, r) for r in range(5)]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) for e in got] == [
        ("0", "2", "0"), ("1", "2", "0"), ("0", "3", "1"), ("1", "3", "1"), ("2", "3", "1")]
    assert got[4] == {"RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1",
                      "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "4", "ROLE_WORLD_SIZE": "5", "ROLE_NAME": "rank"}


def test_probe_tells_reachable_addresses() -> None:
    """The probe keeps only the candidates a connection reaches, and nothing once it is closed."""
    from mpimesh.spmd._address import Probe, reachable

    probe = Probe()
    try:
        # 192.0.2.1 is TEST-NET-1 (RFC 5737): never this host, so never the probe's
        assert reachable(["192.0.2.1", "127.0.0.1", "localhost"], probe.port) == ["127.0.0.1", "localhost"]
    finally:
        probe.close()
    assert reachable(["127.0.0.1"], probe.port) == []


@pytest.mark.subprocess
def test_import_does_not_import_torch() -> None:
    """Importing mpimesh.spmd leaves torch unimported (workers' loops stay light)."""
    result = run(python_cmd("-c", "import sys, mpimesh.spmd; print('torch' in sys.modules)"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# --- on the runtime


@pytest.mark.mesh
def test_env_per_rank(procs: Any) -> None:
    """Each process of a gpus=2 mesh on one host gets its rank, both as local ranks, and loopback with one port."""
    setup_torch_elastic_env(procs)
    got = envs(procs.spawn("torch_env", Torch))
    port = got[0]["MASTER_PORT"]
    assert port is not None and 0 < int(port) < 65536
    for rank, env in enumerate(got):
        assert env == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                       "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": "2",
                       "ROLE_NAME": "rank", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}


@pytest.mark.mesh
def test_all_reduce_over_the_mesh_twice(procs: Any) -> None:
    """An all_reduce over the mesh sums on every rank; a second setup picks a new port and works again."""
    actors = procs.spawn("torch_reduce", Torch)
    ports = []
    for _ in range(2):
        setup_torch_elastic_env(procs)
        ports.append(envs(actors)[0]["MASTER_PORT"])
        assert list(actors.all_reduce.call().get(120).values()) == [3.0, 3.0]
    assert ports[0] != ports[1]


@pytest.mark.mesh
def test_sliced_mesh_is_the_world(procs: Any) -> None:
    """A slice is a world of its own: its one process is rank 0 of 1, and reduces alone."""
    setup_torch_elastic_env(procs.slice(gpus=1))
    actors = procs.spawn("torch_slice", Torch)
    second = actors.slice(gpus=1)
    env = envs(second)[0]
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1", "0", "1")
    assert second.all_reduce.call_one().get(120) == 1.0


@pytest.mark.mesh
def test_given_master_and_ipv4(procs: Any) -> None:
    """master_addr/master_port given are used as they are; use_ipaddr='ipv4' gives a non-loopback IPv4 address."""
    from mpimesh.spmd._address import addresses, free_port

    port = free_port()
    setup_torch_elastic_env(procs, master_addr="localhost", master_port=port)
    actors = procs.spawn("torch_given", Torch)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs(actors)} == {("localhost", str(port))}
    assert list(actors.all_reduce.call().get(120).values()) == [3.0, 3.0]
    if not addresses("ipv4"):
        pytest.skip("this host has no IPv4 address but loopback")
    setup_torch_elastic_env(procs, use_ipaddr="ipv4")
    addr = envs(actors)[0]["MASTER_ADDR"]
    assert addr is not None and not ipaddress.IPv4Address(addr).is_loopback
    assert list(actors.all_reduce.call().get(120).values()) == [3.0, 3.0]


@pytest.mark.mesh
def test_async_variant(procs: Any) -> None:
    """setup_torch_elastic_env_async sets the same world from a coroutine."""
    import asyncio

    asyncio.run(setup_torch_elastic_env_async(procs))
    assert [e["RANK"] for e in envs(procs.spawn("torch_async", Torch))] == ["0", "1"]


@pytest.mark.mesh
def test_main_runs_a_script_and_a_module(procs: Any, tmp_path: Path) -> None:
    """SPMDActor.main runs a script path or -m module as __main__ with sys.argv set, and returns True."""
    (tmp_path / "spmd_train.py").write_text(SCRIPT)
    spmd = procs.spawn("spmd_main", SPMDActor)
    addr, port = spmd.slice(gpus=0).get_host_port.call_one(None).get(60)
    out = str(tmp_path / "out")
    assert list(spmd.main.call("127.0.0.1", port, [str(tmp_path / "spmd_train.py"), out, "1"]).get(120).values()) \
        == [True, True]
    assert [(tmp_path / f"out.{r}").read_text() for r in range(2)] == [f"3.0 __main__ {tmp_path}/spmd_train.py"] * 2
    procs.spawn("torch_path", Torch).add_path.call(str(tmp_path)).get(60)
    _, port = spmd.slice(gpus=0).get_host_port.call_one(None).get(60)
    mod = str(tmp_path / "mod")
    assert list(spmd.main.call("127.0.0.1", port, ["-m", "spmd_train", mod, "2", "--exit", "0"]).get(120).values()) \
        == [True, True]
    assert [(tmp_path / f"mod.{r}").read_text() for r in range(2)] == [f"6.0 __main__ {tmp_path}/spmd_train.py"] * 2
    assert isinstance(addr, str) and addr


@pytest.mark.mesh
def test_main_errors_reach_the_caller(procs: Any, tmp_path: Path) -> None:
    """A script's exception reaches the caller as ActorError; a non-zero sys.exit as RuntimeError; bad args."""
    script = tmp_path / "spmd_fail.py"
    script.write_text(SCRIPT)
    spmd = procs.spawn("spmd_fail", SPMDActor)
    with pytest.raises(ActorError) as info:
        spmd.slice(gpus=1).main.call_one("127.0.0.1", 1, [str(script), "x", "1", "--fail"]).get(120)
    assert isinstance(info.value.exception, KeyError)
    assert str(info.value.exception) == "'rank 1 was told to fail'"
    with pytest.raises(ActorError) as info:
        spmd.slice(gpus=0).main.call_one("127.0.0.1", 1, ["-c", "pass"]).get(60)
    assert isinstance(info.value.exception, FileNotFoundError)
    with pytest.raises(ActorError) as info:
        spmd.slice(gpus=0).main.call_one("127.0.0.1", 1, ["-m"]).get(60)
    assert isinstance(info.value.exception, ValueError)
    assert str(info.value.exception) == ("script_args must be ['script.py', *args] or ['-m', 'module', *args], "
                                         "got ['-m']")
    exiting = tmp_path / "spmd_exit.py"
    exiting.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ActorError) as info:
        spmd.slice(gpus=0).main.call_one("127.0.0.1", 1, [str(exiting)]).get(60)
    assert isinstance(info.value.exception, RuntimeError)
    assert str(info.value.exception) == f"script '{exiting}' exited with status 3"


@pytest.mark.mesh
def test_bad_input() -> None:
    """A non-ProcMesh, a stopped mesh, a bad port or address family: each raises a pinned error before any work."""
    with pytest.raises(TypeError, match=r"^setup_torch_elastic_env expects a ProcMesh, got 'procs'; create one "
                                        r"with this_host\(\)\.spawn_procs\(per_host=\{'gpus': N\}\)$"):
        setup_torch_elastic_env("procs")  # type: ignore[arg-type]
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    with pytest.raises(ValueError, match=r"^master_port must be an int in 1\.\.65535, got 0; e\.g\. 29500$"):
        setup_torch_elastic_env(procs, master_port=0)
    with pytest.raises(TypeError, match=r"^master_addr must be a non-empty str, got ''; e\.g\. '10\.0\.0\.1'$"):
        setup_torch_elastic_env(procs, master_addr="")
    with pytest.raises(ValueError, match=r"^use_ipaddr must be None, 'ipv4' or 'ipv6', got 'ipv5'; "
                                         r"e\.g\. use_ipaddr='ipv4'$"):
        setup_torch_elastic_env(procs, use_ipaddr="ipv5")
    procs.stop().get(30)
    with pytest.raises(RuntimeError, match=r"^cannot make ProcMesh\(gpus=1\) a torch\.distributed world: it was "
                                           r"stopped; create new processes with spawn_procs\(\)$"):
        setup_torch_elastic_env(procs)
