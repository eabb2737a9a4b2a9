"""The debugger across ranks (``mpimesh.debug``): the ``ranks(...)`` parser, and real sessions on a pty.

The session tests drive the controller's terminal with pexpect, under
``mpimesh run -n 3`` (launch-pool workers) and under a plain ``python
script.py`` (spawned workers); the batch tests run with stdin at
``/dev/null``.  Every wait is bounded by pexpect's timeout or the job runner's.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mpitest import ROOT, base_env, leftovers, run

import mpimesh
from mpimesh import Actor, endpoint
from mpimesh.debug import parse_ranks
from mpimesh.debug._commands import Command, parse

# --- the command language (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "inside", "outside"),
    [
        ("ranks(3)", [(3, {})], [(2, {}), (4, {})]),
        ("ranks(1,3)", [(1, {}), (3, {})], [(2, {})]),
        ("ranks( 1 , 3 )", [(1, {}), (3, {})], [(0, {})]),
        ("ranks(0:8:2)", [(0, {}), (6, {})], [(1, {}), (8, {})]),
        ("ranks(2:4)", [(2, {}), (3, {})], [(4, {})]),
        ("ranks(:2)", [(0, {}), (1, {})], [(2, {})]),
        ("ranks(hosts=1,gpus=0:2)", [(5, {"hosts": 1, "gpus": 1})], [(6, {"hosts": 1, "gpus": 2}), (0, {"gpus": 0})]),
        ("ranks(gpus=3)", [(9, {"hosts": 2, "gpus": 3})], [(8, {"hosts": 2, "gpus": 2})]),
    ],
)
def test_ranks_select(spec: str, inside: list[tuple[int, dict[str, int]]],
                      outside: list[tuple[int, dict[str, int]]]) -> None:
    """Each form of ``ranks(...)`` selects the ranks Monarch's ``cast`` does: flat ranks, slices, coordinates."""
    ranks = parse_ranks(spec)
    assert all(ranks.matches(rank, coords) for rank, coords in inside)
    assert not any(ranks.matches(rank, coords) for rank, coords in outside)


_SYNTAX = re.escape("expecting ranks(<r>), ranks(<a>,<b>,...), ranks(<start>:<stop>[:<step>]) "
                    "or ranks(<dim>=<a>[:<b>],...)")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ranks()", r"^bad ranks\(\.\.\.\) syntax 'ranks\(\)': " + _SYNTAX + "$"),
        ("rank(1)", r"^bad ranks\(\.\.\.\) syntax 'rank\(1\)': " + _SYNTAX + "$"),
        ("ranks(1:x)", r"^bad rank 'x' in 'ranks\(1:x\)': " + _SYNTAX + "$"),
        ("ranks(a,b)", r"^bad rank 'a' in 'ranks\(a,b\)': " + _SYNTAX + "$"),
        ("ranks(1:2:3:4)", r"^bad ranks\(\.\.\.\) syntax 'ranks\(1:2:3:4\)': " + _SYNTAX + "$"),
        ("ranks(0:4:0)", r"^bad step 0 in 'ranks\(0:4:0\)': expecting a positive step$"),
        ("ranks(gpus=1,gpus=2)", r"^bad ranks\(\.\.\.\) syntax 'ranks\(gpus=1,gpus=2\)': " + _SYNTAX + "$"),
    ],
)
def test_bad_ranks_say_the_syntax(spec: str, message: str) -> None:
    """A malformed ``ranks(...)`` is refused with the forms it may take."""
    with pytest.raises(ValueError, match=message):
        parse_ranks(spec)


def test_commands_parse() -> None:
    """Monarch's prompt commands and their short forms parse to one verb each."""
    assert parse("  ") == Command("")
    assert parse("list") == parse("l") == Command("list")
    assert parse("continue") == parse("c") == Command("continue")
    assert parse("help") == parse("h") == Command("help")
    assert parse("detach") == Command("detach")
    assert parse("attach trainers 2") == Command("attach", actor="trainers", rank=2)
    cast = parse("cast trainers ranks(0, 2) p x + 1")
    assert (cast.verb, cast.actor, cast.pdb) == ("cast", "trainers", "p x + 1")
    assert cast.ranks is not None and cast.ranks.matches(2, {}) and not cast.ranks.matches(1, {})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("frobnicate", r"^unknown command 'frobnicate'; type help$"),
        ("attach trainers",
         r"^attach needs an actor name and a rank, got 'attach trainers'; e\.g\. attach trainers 1$"),
        ("attach trainers one", r"^expecting an integer rank, got 'one'; e\.g\. attach trainers 1$"),
        ("cast trainers p x",
         (r"^cast needs an actor name, ranks\(\.\.\.\) and a pdb command, got 'cast trainers p x'; "
          r"e\.g\. cast trainers ranks\(0,2\) p x$")),
        ("list all", r"^list takes no arguments, got 'list all'$"),
    ],
)
def test_bad_commands_say_what_is_expected(line: str, message: str) -> None:
    """A command the prompt cannot run is refused with what it expects."""
    with pytest.raises(ValueError, match=message):
        parse(line)


# --- pm() and the runtime (pure, then mesh) ------------------------------------------------------------


def test_pm_refuses_what_it_cannot_debug() -> None:
    """pm() takes an ActorError that names its actor, and says so otherwise."""
    with pytest.raises(TypeError, match=r"^pm\(\) needs an ActorError, got RuntimeError; catch the error of "
                       r"fut\.get\(\) with `except mpimesh\.ActorError as error`$"):
        mpimesh.debug.pm(RuntimeError("local"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^cannot debug this error post mortem: it names no actor$"):
        mpimesh.debug.pm(mpimesh.ActorError(RuntimeError("made here")))


class Breaker(Actor):
    """Pauses at a breakpoint, or fails, on demand."""

    @endpoint
    def work(self, x: int) -> int:
        y = x + 1
        breakpoint()
        return y

    @endpoint
    def fail(self) -> None:
        raise KeyError("lost")


@pytest.mark.mesh
def test_breakpoint_with_stdin_at_end_does_not_hang(procs: object) -> None:
    """Under the runtime, with the controller's stdin at end of input (pytest's), a breakpoint lets the call finish."""
    mesh = procs.spawn("breakers", Breaker)  # type: ignore[attr-defined]
    assert list(mesh.work.call(2).get(timeout=120).values()) == [3, 3]
    assert mpimesh.debug_controller() is mpimesh.debug_controller()
    # A rank's session ends as its pdb continues; the debug controller may hear that a moment
    # after the call's reply reached the script (another actor's mailbox): bounded wait.
    deadline = time.monotonic() + 30
    while (sessions := mpimesh.debug_controller().sessions.call_one().get(timeout=60)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions == []


@pytest.mark.mesh
def test_actor_error_names_its_actor(procs: object) -> None:
    """An endpoint's ActorError carries the actor's id, which pm() uses to find the frames."""
    mesh = procs.spawn("failers", Breaker)  # type: ignore[attr-defined]
    with pytest.raises(mpimesh.ActorError) as caught:
        mesh.slice(gpus=1).fail.call_one().get(timeout=60)
    assert re.fullmatch(r"failers\[1\]@\d+\.\d+", caught.value.actor_id)


# --- sessions on a real terminal (subprocess) ---------------------------------------------------------

ACTORS = '''
import pdb

import mpimesh
from mpimesh import Actor, endpoint


class Stepper(Actor):
    @endpoint
    def work(self, x: int) -> int:
        y = x * 10
        breakpoint()
        z = y + 1
        return z + mpimesh.current_rank().rank

    @endpoint
    def fail(self, x: int) -> int:
        secret = x + 7
        raise ValueError(f"bad {secret}")

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncStepper(Actor):
    @endpoint
    async def work(self, x: int) -> int:
        w = x + 100
        pdb.set_trace()
        w += 0
        return w + mpimesh.current_rank().rank
'''

PROMPT = "mpimesh_dbg> "
# Generous: a shared two-core machine starts MPI jobs slowly.
EXPECT_TIMEOUT = 90


def write_script(tmp_path: Path, body: str) -> Path:
    (tmp_path / "dbg_actors.py").write_text(ACTORS)
    script = tmp_path / "script.py"
    script.write_text("import mpimesh\nfrom mpimesh import this_host\nfrom dbg_actors import AsyncStepper, Stepper\n\n"
                      + textwrap.dedent(body))
    return script


@contextmanager
def terminal(cmd: list[str], **env: str) -> Iterator[object]:
    """``cmd`` on a pty (pexpect), its processes reaped at the end even if it hangs."""
    pexpect = pytest.importorskip("pexpect")
    tag = f"mpimesh-test-{uuid.uuid4().hex}"
    full = base_env(MPIMESH_TEST_TAG=tag, PYTHONPATH=str(ROOT), **env)
    full.pop("MPIMESH_TEST_EXPECT_NPROCS", None)
    child = pexpect.spawn(cmd[0], cmd[1:], env=full, cwd=str(ROOT), encoding="utf-8", timeout=EXPECT_TIMEOUT,
                          dimensions=(50, 200))
    try:
        yield child
    finally:
        child.close(force=True)
        for line in leftovers(tag):
            try:
                os.kill(int(line.split(":")[0]), 9)
            except (ProcessLookupError, ValueError):
                pass


def expect_each(child: object, texts: list[str]) -> None:
    """Wait (bounded) until every one of ``texts`` has appeared, in any order (ranks pause in any order)."""
    left = list(texts)
    while left:
        left.pop(child.expect_exact(left))  # type: ignore[attr-defined]


def finish(child: object) -> str:
    """Wait (bounded) for the job to end; its whole output."""
    import pexpect

    child.expect(pexpect.EOF)  # type: ignore[attr-defined]
    child.close()  # type: ignore[attr-defined]
    assert child.exitstatus == 0, child.before  # type: ignore[attr-defined]
    return str(child.before)  # type: ignore[attr-defined]




@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_breakpoints_under_mpimesh_run(tmp_path: Path) -> None:
    """Two ranks pause at once under ``mpimesh run``: list, cast, attach with stepping, detach, continue all."""
    script = write_script(tmp_path, """
        procs = this_host().spawn_procs(per_host={"ranks": 2})
        steppers = procs.spawn("steppers", Stepper)
        print(f"result {list(steppers.work.call(3).get(timeout=600).values())}")
    """)
    with terminal([sys.executable, "-m", "mpimesh._launch.cli", "run", "-n", "3", "--oversubscribe",
                   str(script)]) as child:
        expect_each(child, [f"actor 'steppers' rank {rank} (ranks={rank}) on " for rank in (0, 1)])
        child.expect_exact(PROMPT)
        child.sendline("list")
        child.expect(r"actor +rank +coords +host +function +line +state\s+"
                     r"steppers +0 +ranks=0 +\S+ +work +dbg_actors\.py:13 +paused\s+"
                     r"steppers +1 +ranks=1 +\S+ +work +dbg_actors\.py:13 +paused")
        child.expect_exact(PROMPT)
        child.sendline("cast steppers ranks(0:2) p y * 2")
        child.expect_exact("[steppers 0] 60\r\n[steppers 1] 60")
        child.expect_exact(PROMPT)
        child.sendline("attach steppers 1")
        child.expect_exact("-> z = y + 1")
        child.expect_exact("(Pdb) ")
        child.sendline("n")
        child.expect_exact("-> return z + mpimesh.current_rank().rank")
        child.expect_exact("(Pdb) ")
        child.sendline("p z")
        child.expect_exact("31")
        child.expect_exact("(Pdb) ")
        child.sendline("detach")
        child.expect_exact("mpimesh: detached from actor 'steppers' rank 1")
        child.expect_exact(PROMPT)
        child.sendline("list")
        child.expect(r"steppers +1 +ranks=1 +\S+ +work +dbg_actors\.py:14 +paused")
        child.expect_exact(PROMPT)
        child.sendline("continue")
        child.expect_exact("result [31, 32]")
        finish(child)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_pdb_set_trace_in_async_endpoint_spawned(tmp_path: Path) -> None:
    """``pdb.set_trace()`` in async endpoints of spawned workers; misuse is reported; continue clears breakpoints."""
    script = write_script(tmp_path, """
        procs = this_host().spawn_procs(per_host={"ranks": 2})
        asyncs = procs.spawn("asyncs", AsyncStepper)
        print(f"result {list(asyncs.work.call(1).get(timeout=600).values())}")
    """)
    with terminal([sys.executable, str(script)]) as child:
        expect_each(child, [f"actor 'asyncs' rank {rank} (ranks={rank}) on " for rank in (0, 1)])
        child.expect_exact(PROMPT)
        child.sendline("help")
        child.expect_exact("mpimesh debugger commands (sessions are keyed by actor name and rank):")
        child.expect_exact(PROMPT)
        child.sendline("attach nobody 0")
        child.expect_exact("mpimesh: no paused actor named 'nobody'; paused: asyncs")
        child.expect_exact(PROMPT)
        child.sendline("attach asyncs 7")
        child.expect_exact("mpimesh: actor 'asyncs' has no paused rank 7; paused ranks: 0, 1")
        child.expect_exact(PROMPT)
        child.sendline("cast asyncs ranks(1:x) p w")
        child.expect_exact("mpimesh: bad rank 'x' in 'ranks(1:x)': expecting ranks(<r>)")
        child.expect_exact(PROMPT)
        child.sendline("detach")
        child.expect_exact("mpimesh: not attached to any rank; `attach <actor> <rank>` first")
        child.expect_exact(PROMPT)
        child.sendline("cast asyncs ranks(ranks=1) p w")
        child.expect_exact("[asyncs 1] 101")
        child.expect_exact(PROMPT)
        child.sendline("cast asyncs ranks(0,1) !w = 7")
        child.expect_exact(PROMPT)
        child.sendline("cast asyncs ranks(0:2) b 32")
        child.expect(r"\[asyncs 0\] Breakpoint \d+ at \S+dbg_actors\.py:32\s+\[asyncs 1\] Breakpoint \d+ at ")
        child.expect_exact(PROMPT)
        child.sendline("c")  # clears the breakpoints everywhere: no rank stops at line 32
        child.expect_exact("result [7, 8]")
        finish(child)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_post_mortem_of_an_actor_error(tmp_path: Path) -> None:
    """``mpimesh.debug.pm(err)`` opens pdb on the remote frames of a caught ActorError; they go when the actor stops."""
    script = write_script(tmp_path, """
        procs = this_host().spawn_procs(per_host={"ranks": 2})
        steppers = procs.spawn("steppers", Stepper)
        try:
            steppers.slice(ranks=1).fail.call_one(5).get(timeout=60)
        except mpimesh.ActorError as err:
            print(f"caught {err.actor_id}")
            mpimesh.debug.pm(err, timeout=600)
            steppers.stop().get(timeout=60)
            try:
                mpimesh.debug.pm(err, timeout=60)
            except ValueError as again:
                print(f"again: {again}")
        try:
            mpimesh.debug.pm(RuntimeError("local"))
        except TypeError as wrong:
            print(f"wrong: {wrong}")
        print("done")
    """)
    with terminal([sys.executable, str(script)]) as child:
        child.expect(r"caught steppers\[1\]@\d+\.\d+")
        child.expect_exact("paused (post-mortem) at dbg_actors.py:19 in fail()")
        child.expect_exact('-> raise ValueError(f"bad {secret}")')
        child.expect_exact("(Pdb) ")
        child.sendline("p secret, x")
        child.expect_exact("(12, 5)")
        child.expect_exact("(Pdb) ")
        child.sendline("c")
        child.expect_exact("mpimesh: actor 'steppers' rank 1 resumed")
        child.expect(r"again: cannot debug actor steppers\[1\]@\d+\.\d+ post mortem: it has stopped")
        child.expect_exact("wrong: pm() needs an ActorError, got RuntimeError; catch the error of fut.get() with "
                           "`except mpimesh.ActorError as error`")
        child.expect_exact("done")
        finish(child)


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_paused_rank_is_not_declared_dead(tmp_path: Path) -> None:
    """A rank paused for three heartbeat timeouts stays alive, and its other actors keep answering."""
    script = write_script(tmp_path, """
        import time

        procs = this_host().spawn_procs(per_host={"ranks": 1})
        steppers = procs.spawn("steppers", Stepper)
        other = procs.spawn("other", Stepper)
        paused = steppers.work.call_one(3)
        while not mpimesh.debug_controller().sessions.call_one().get(timeout=60):
            other.ping.call_one().get(timeout=60)
        start, answered = time.monotonic(), 0
        while time.monotonic() - start < 3.0:
            answered += other.ping.call_one().get(timeout=60) == "pong"
        print(f"answered {answered} calls while paused", flush=True)
        print(f"result {paused.get(timeout=600)}")
    """)
    with terminal([sys.executable, str(script)], MPIMESH_HEARTBEAT_TIMEOUT="1") as child:
        child.expect_exact(PROMPT)
        child.expect(r"answered [1-9]\d* calls while paused")
        child.sendline("continue")
        child.expect_exact("result 31")
        out = finish(child)
    assert "stopped answering" not in out and "has failed" not in out


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_no_terminal_continues_with_a_notice(tmp_path: Path) -> None:
    """With stdin at end of input (a batch job), a breakpoint does not hang: the rank continues, with a notice."""
    script = write_script(tmp_path, """
        procs = this_host().spawn_procs(per_host={"ranks": 2})
        steppers = procs.spawn("steppers", Stepper)
        print(f"result {list(steppers.work.call(3).get(timeout=120).values())}")
        print(f"again {list(steppers.work.call(4).get(timeout=120).values())}")
    """)
    done = run([sys.executable, str(script)], timeout=180, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "result [31, 32]" in done.stdout and "again [41, 42]" in done.stdout
    assert "mpimesh: end of input on the controller's stdin: continuing every paused rank" in done.stdout
    skipped = re.findall(r"breakpoint at dbg_actors\.py:13 in work\(\) of actor 'steppers' rank \d skipped: "
                         r"the controller's stdin is closed", done.stdout + done.stderr)
    assert len(skipped) >= 2  # the second call's two breakpoints at least


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_pythonbreakpoint_0_disables_breakpoints(tmp_path: Path) -> None:
    """``PYTHONBREAKPOINT=0`` turns ``breakpoint()`` in endpoints into nothing, silently, as in plain Python."""
    script = write_script(tmp_path, """
        procs = this_host().spawn_procs(per_host={"ranks": 2})
        steppers = procs.spawn("steppers", Stepper)
        print(f"result {list(steppers.work.call(3).get(timeout=120).values())}")
    """)
    done = run([sys.executable, str(script)], timeout=180, env={"PYTHONPATH": str(ROOT), "PYTHONBREAKPOINT": "0"})
    assert done.returncode == 0, done.stderr
    assert "result [31, 32]" in done.stdout
    assert "mpimesh_dbg" not in done.stdout and "skipped" not in done.stdout + done.stderr


@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launch", ["spawned", "mpimesh run"])
def test_example_runs_without_a_terminal(launch: str) -> None:
    """``examples/debugging.py`` runs to its end with stdin at /dev/null: its breakpoints and post-mortem are skipped.

    Under a launcher rank 0's stdin never ends (prterun keeps it open), so the
    launcher's own stdin is what says there is no terminal.
    """
    example = str(ROOT / "examples" / "debugging.py")
    cmd = ([sys.executable, example] if launch == "spawned"
           else [sys.executable, "-m", "mpimesh._launch.cli", "run", "-n", "3", "--oversubscribe", example])
    done = run(cmd, timeout=180, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "losses [0.45, 0.3]" in done.stdout and "\ndone\n" in done.stdout
    why = "the controller's stdin is closed" if launch == "spawned" else "the launcher's stdin is /dev/null"
    notice = f"post-mortem at debugging.py:28 in load() of actor 'trainers' rank 1 skipped: {why}"
    assert notice in done.stdout + done.stderr  # a worker's stderr, forwarded
