"""``python -m mpimesh script.py [args]`` (or ``-m module``, ``-c code``).

Under ``mpirun -n N``, rank 0 runs the script as ``__main__`` (the
controller) and ranks 1..N-1 serve actors.  Started alone, the process is the
controller and ``spawn_procs`` spawns workers.  The job's exit status is the
script's; an uncaught exception prints its traceback once and ends every rank
with status 1.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Callable

_USAGE = """usage: python -m mpimesh script.py [args...]
       python -m mpimesh -m module [args...]
       python -m mpimesh -c code [args...]
Run under `mpirun -n N` (rank 0 runs the script, ranks 1..N-1 serve actors),
or alone (workers are spawned on demand)."""


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _parse(argv: list[str]) -> tuple[str, str, list[str]]:
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(_USAGE if argv else f"mpimesh: no script given\n{_USAGE}")
    if argv[0] in ("-m", "-c"):
        if len(argv) < 2:
            raise SystemExit(f"mpimesh: {argv[0]} needs an argument\n{_USAGE}")
        return argv[0], argv[1], argv[2:]
    if argv[0].startswith("-"):
        raise SystemExit(f"mpimesh: unknown option {argv[0]!r}\n{_USAGE}")
    return "path", argv[0], argv[1:]


def _run(kind: str, target: str, args: list[str], failed: Callable[[], bool] = lambda: False) -> int:
    """Run the script; returns its exit status.

    ``failed()`` says whether an unhandled failure interrupted it: the
    KeyboardInterrupt it gets then means status 1, and the failure's report
    has been printed already.
    """
    try:
        if kind == "path":
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
        elif kind == "-m":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt:
        if failed():
            print("mpimesh: the script was interrupted by the unhandled failure above", file=sys.stderr, flush=True)
            return 1
        traceback.print_exc()
        return 130
    except BaseException:
        try:
            traceback.print_exc()
        except KeyboardInterrupt:
            # The interrupt of an unhandled failure (EndOfJob._after_unhandled) landed while an exception of
            # the same failure was printed (seen under srun: the SupervisionError first, the hook's SIGINT a moment
            # later).  Escaping here it would skip leave(): the interpreter's exit then hangs in MPI_Finalize.
            print("\nmpimesh: the script was interrupted by the unhandled failure above", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m mpimesh``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        from ._roles.boot import main_spawned

        return main_spawned(int(argv[2]))
    kind, target, args = _parse(argv)
    # What Python itself puts first on sys.path, so that modules beside the
    # script import (on workers too: the controller sends its sys.path).
    if kind == "path":
        if not os.path.exists(target):
            raise SystemExit(f"mpimesh: can't open file {target!r}: no such file")
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    else:
        sys.path[0] = os.getcwd()

    from ._launch.world_check import check_world_size
    from ._transport.mpi import MPI

    world = MPI.COMM_WORLD
    try:
        check_world_size(world.Get_size(), os.environ)
    except (RuntimeError, ValueError) as exc:
        if world.Get_rank() == 0:
            print(f"mpimesh: {exc}", file=sys.stderr, flush=True)
        return 1
    if world.Get_rank() != 0:
        from ._roles.boot import main_pool

        return main_pool(world)

    from ._roles.boot import boot_controller

    controller = boot_controller(world)
    code = _run(kind, target, args, lambda: controller.failed_unhandled)
    sys.stdout.flush()
    return controller.leave(code)


if __name__ == "__main__":
    sys.exit(main())
