"""An actor's call to an actor on an island that has gone fails at once, naming it.

A frame between two islands with no direct link travels through the
controller (a ``FORWARD``).  When the destination's island has gone (its
processes stopped), the controller cannot pass it on: the sender must hear
so at once, with the error the controller itself gets for such a call,
and not wait out its own timeout; the controller's relay keeps working.

Runs under the real entry point: the caller's mesh takes the launch pool's
free ranks (a spawned island at ``-n 1``), the callee's is spawned.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from mpitest import spawning

from mpimesh import Actor, SupervisionError, endpoint, this_host

pytestmark = pytest.mark.mesh

#: How long the caller's call may wait; the failure must come well before it.
CALL_TIMEOUT = 30.0


class Callee(Actor):
    """Answers where it runs."""

    @endpoint
    def where(self) -> tuple[int, int]:
        from mpimesh._core.current import current

        return current().addr


class Caller(Actor):
    """Calls another actor and reports how that went."""

    @endpoint
    def where(self) -> tuple[int, int]:
        from mpimesh._core.current import current

        return current().addr

    @endpoint
    def call(self, other: Any, every: bool = False) -> tuple[str, str, float]:
        """``other.where`` once (of every actor of ``other`` if ``every``): ``(outcome, text, seconds)``.

        The outcome is ``"ok"`` or the exception's type name.
        """
        start = time.monotonic()
        try:
            where = other.where
            got = (where.call() if every else where.call_one()).get(CALL_TIMEOUT)
        except Exception as exc:  # the outcome is the test's to judge
            return type(exc).__name__, str(exc), time.monotonic() - start
        return "ok", repr(got), time.monotonic() - start


def test_a_call_to_an_actor_whose_island_is_gone_fails_at_once() -> None:
    """A's call to B, whose processes were stopped, raises SupervisionError naming B at once, not after its timeout.

    Before: the controller's relay raised "no route ... its island is gone"
    on its polling thread and dropped the frame; A waited out its timeout.
    """
    from mpimesh._core.current import current

    role: Any = current().role
    free = len(role.pool.free_ranks(current().host))
    with spawning():
        here_mesh = this_host().spawn_procs(per_host={"gpus": max(1, free)})
        gone_mesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        caller = here_mesh.spawn("fwd_caller", Caller).slice(gpus=0)
        callees = gone_mesh.spawn("fwd_callee", Callee)
        callee = callees.slice(gpus=0)
        island_a = caller.where.call_one().get(30)[0]
        island_b = callee.where.call_one().get(30)[0]
        if island_a == island_b or island_b == 0:
            pytest.skip(f"caller on island {island_a}, callee on {island_b}: no relay between two islands")
        gone_mesh.stop().get(30)

        outcome, text, seconds = caller.call.call_one(callee).get(CALL_TIMEOUT + 30)
        assert outcome == SupervisionError.__name__, (outcome, text)
        assert text.startswith("Endpoint call fwd_callee.where() failed, The actor "), text
        assert "fwd_callee" in text and f"process ({island_b}, 0)" in text and "its island is gone" in text, text
        assert seconds < 5.0, f"the call failed after {seconds:.1f} s, not at once"

        # A call of every actor of the gone mesh (a cast, down a tree where the settings say so) fails as soon.
        outcome, text, seconds = caller.call.call_one(callees, True).get(CALL_TIMEOUT + 30)
        assert outcome == SupervisionError.__name__, (outcome, text)
        assert "fwd_callee" in text and "its island is gone" in text, text
        assert seconds < 5.0, f"the call failed after {seconds:.1f} s, not at once"

        # The controller's relay and polling thread still work: a new island is reached through them.
        with spawning():
            other_mesh = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            other = other_mesh.spawn("fwd_other", Callee)
            outcome, text, _ = caller.call.call_one(other).get(CALL_TIMEOUT + 30)
            assert outcome == "ok", (outcome, text)
        finally:
            other_mesh.stop().get(30)
    finally:
        here_mesh.stop().get(30)
        gone_mesh.stop().get(30)
