"""The harness's own ``isolate_in_subprocess`` decorator, used in place of Monarch's test helper.

Monarch's helper runs a test in a fresh interpreter and carries Monarch's
runtime config there (``monarch.config``), which mpimesh has no equivalent
for.  This one keeps the contract the tests rely on (a fresh process per test,
the result or the traceback reported back, the process group killed after)
and nothing else: the test function travels by cloudpickle through a file, the
child (``isolated_child.py``) runs it and writes the outcome to another file.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The environment as the harness started, less what an MPI singleton adds for its own process.
_DROP = (
    "PMIX_",
    "OMPI_COMM_WORLD",
    "OMPI_UNIVERSE",
    "OMPI_FIRST_RANKS",
    "OMPI_APP_CTX",
    "OMPI_MCA_orte_",
    "OMPI_FILE_LOCATION",
    "PRTE_MCA_state_base_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "OMPI_NUM_APP_CTX",
    "OMPI_ARGV",
    "OMPI_COMMAND",
    "OMPI_LOCAL_RANK",
    "OMPI_NODE_RANK",
    "OMPI_WORLD",
)
_CHILD_TIMEOUT = float(os.environ.get("MONARCH_COMPAT_ISOLATED_TIMEOUT", "150"))


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def isolate_in_subprocess(test_fn: Callable[..., Any] | None = None, *, env: dict[str, str] | None = None) -> Any:
    """Run the decorated (sync or async) test in a fresh interpreter."""
    if test_fn is None:
        return functools.partial(isolate_in_subprocess, env=env)
    extra = dict(env or {})

    @functools.wraps(test_fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="monarch_compat_") as tmp:
            fn_path, result_path = os.path.join(tmp, "fn.pkl"), os.path.join(tmp, "result.pkl")
            with open(fn_path, "wb") as f:
                cloudpickle.dump((test_fn, args, kwargs), f)
            proc = subprocess.Popen(
                [sys.executable, os.path.join(_HERE, "isolated_child.py"), fn_path, result_path],
                env=_child_env(extra),
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=_CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"isolated test still running after {_CHILD_TIMEOUT:.0f} s", pytrace=False)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            if not os.path.exists(result_path):
                pytest.fail(f"isolated test's process ended with status {returncode} and no result", pytrace=False)
            with open(result_path, "rb") as f:
                result = pickle.load(f)
        if result["status"] == "skipped":
            pytest.skip(result["reason"])
        if result["status"] == "failed":
            pytest.fail(f"{result['exc_type']}: {result['message']}\n\n{result['traceback']}", pytrace=False)

    wrapper.__wrapped__ = test_fn  # type: ignore[attr-defined]
    return wrapper
