"""Which controllers are interactive sessions (``mpimesh._roles.interactive``)."""

from __future__ import annotations

import pytest
from mpitest import python_cmd, run

pytestmark = pytest.mark.subprocess

PROBE = ("from mpimesh._roles.interactive import before_kernel_shutdown, interactive_session; "
         "print('PROBE', interactive_session(), before_kernel_shutdown(lambda: None))")


@pytest.mark.parametrize(("flags", "interactive"), [((), False), (("-i",), True)])
def test_interactive_session(flags: tuple[str, ...], interactive: bool) -> None:
    """A script is not an interactive session; ``python -i`` is; neither is a Jupyter kernel to hook."""
    result = run(python_cmd(*flags, "-c", PROBE), timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"PROBE {interactive} False" in result.stdout, result.stdout
