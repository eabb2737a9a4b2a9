"""Tests of Monarch's that the harness classifies by hand, each with the reason.

The stand-ins catch a test that touches a private name.  These tests check
Monarch's own machinery without such a name, or a behaviour mpimesh differs on
on purpose (README, "Monarch names"), so their failure says nothing about
mpimesh's compatibility.  A listed test that passes still counts as a pass.
Keys are test names as pytest prints them after ``::`` (parameters included).
"""

_ACCUMULATE_UNIT = (
    "a unit test of Monarch's Accumulator class: it mocks the endpoint (MagicMock) and builds futures with "
    "the private Future._from_coro"
)

_TEST_BIN = "runs test_bin, a binary of Monarch's Buck build found with importlib.resources"

INTERNALS: dict[str, str] = {
    "test_accumulate_folds_with_combine": _ACCUMULATE_UNIT,
    "test_accumulate_empty_stream_returns_identity": _ACCUMULATE_UNIT,
    "test_accumulate_folds_left_to_right": _ACCUMULATE_UNIT,
    "test_accumulate_forwards_args_to_stream": _ACCUMULATE_UNIT,
    "test_flush_logs_fast_exit": _TEST_BIN,
    "test_instance_name": (
        "checks the actor prefix Monarch's logging handler adds to log records, switched by the config key "
        "prefix_python_logs_with_actor"
    ),
    "test_proc_mesh_bootstrap_error": _TEST_BIN,
    "test_actor_mesh_supervision_controller_dead": (
        "pins the text of Monarch's controller watchdog ('timed out reaching controller ... for mesh'), a timeout of "
        "its own mesh-controller actors; mpimesh's SupervisionError says the mesh was stopped by its owner"
    ),
    "test_python_actor_process_cleanup": _TEST_BIN,
}

_TRANSPORT = (
    "attach_to_workers: Monarch's own transport and worker bootstrap; mpimesh's workers are the MPI job's ranks "
    "(README: not applicable, raises NotImplementedError naming mpimesh run / srun / mpirun --host)"
)

BY_DESIGN: dict[str, str] = {
    "test_rdma_concurrent_2gb_writes_in_order": (
        "relies on Monarch's lazy futures: read_into() and write_from() start when awaited, so awaiting the write "
        "first orders it before the read; mpimesh's Future is a concurrent.futures.Future and the transfer starts at "
        "the call (README: 'one Future class')"
    ),
    "test_simple_bootstrap": _TRANSPORT,
    "test_fd_bootstrap": _TRANSPORT,
}
