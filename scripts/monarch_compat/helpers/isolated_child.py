"""Child process of ``isolate_in_subprocess``: run one pickled test, write its outcome."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import sys
import traceback

import compat_plugin  # noqa: F401  (installs the stand-ins before the test unpickles)
import pytest


def main(fn_path: str, result_path: str) -> None:
    """Run the test pickled at ``fn_path``; pickle its outcome to ``result_path``."""
    with open(fn_path, "rb") as f:
        test_fn, args, kwargs = pickle.load(f)
    try:
        if inspect.iscoroutinefunction(test_fn):
            asyncio.run(test_fn(*args, **kwargs))
        else:
            test_fn(*args, **kwargs)
        result = {"status": "passed"}
    except pytest.skip.Exception as e:
        result = {"status": "skipped", "reason": str(e)}
    except BaseException as e:  # noqa: BLE001 - the parent reports every outcome
        result = {
            "status": "failed",
            "exc_type": type(e).__name__,
            "message": str(e),
            "traceback": traceback.format_exc(),
        }
    with open(result_path, "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
