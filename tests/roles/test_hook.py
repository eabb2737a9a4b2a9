"""The default unhandled fault hook's contract, without a job (pure).

The hook returns to handle a failure and raises to leave it unhandled
(Monarch's contract); the controller runs it and ends the job when it raises
(tests/roles/test_faults.py pins the whole job's behaviour).
"""

from __future__ import annotations

import pytest

from mpimesh.supervision import MeshFailure, Unhandled, default_unhandled_fault_hook


def test_default_hook_reports_then_raises_system_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The default hook prints the report on stderr and raises Unhandled, a SystemExit with status 1."""
    failure = MeshFailure("w", [0], "process 0.1 (pid 7) on node3 died: killed by SIGKILL", "train.W", [{"gpus": 0}],
                          points=["{'gpus': 0/2}"])
    with pytest.raises(Unhandled) as raised:
        default_unhandled_fault_hook(failure)
    assert isinstance(raised.value, SystemExit) and raised.value.code == 1
    assert capsys.readouterr().err == (
        "mpimesh: unhandled failure, ending the job:\n"
        "MeshFailure of actor mesh 'w' (train.W): rank=0 (gpus=0) failed, crashed_ranks=[0]: The actor train.W "
        "w{'gpus': 0/2} and all its descendants have failed:\n"
        "  process 0.1 (pid 7) on node3 died: killed by SIGKILL\n"
    )
