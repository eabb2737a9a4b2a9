"""The public API: __all__, __module__ and docstrings (pure)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from typing import Any

import pytest

import mpimesh


def test_all_is_importable_and_sorted() -> None:
    """Everything in __all__ exists, and nothing public is missing from it."""
    assert sorted(mpimesh.__all__) == mpimesh.__all__
    for name in mpimesh.__all__:
        assert hasattr(mpimesh, name), name
    public = {n for n in vars(mpimesh) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(mpimesh, n))}
    # the tensor engine's names load on first use (they import torch), so they need not be in vars() yet
    assert public - modules == set(mpimesh.__all__) - set(mpimesh._TENSOR) | (public & set(mpimesh._TENSOR))


def test_public_objects_are_documented_and_rehomed() -> None:
    """Every public object reports module `mpimesh` and has a docstring."""
    for name in mpimesh.__all__:
        obj = getattr(mpimesh, name)
        assert obj.__module__ == "mpimesh", name
        assert inspect.getdoc(obj), name


def test_import_mpimesh_does_not_import_torch() -> None:
    """Workers import mpimesh; torch loads only with the tensor engine's first name (its loop stays light)."""
    code = ("import sys, mpimesh; assert 'torch' not in sys.modules; "
            "mpimesh.fetch_shard; assert 'torch' in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout == "ok\n", out.stderr


@pytest.mark.parametrize(
    ("call", "instead"),
    [
        (lambda: mpimesh.enable_transport(mpimesh.ChannelTransport.Unix), "the MPI library carries every message"),
        (lambda: mpimesh.attach_to_workers(ca="trust_all_connections", workers=[]), "launch the workers with the job"),
        (lambda: mpimesh.run_worker_loop_forever(ca="x", address="tcp://a:1"), "ranks 1..N-1 of `mpirun -n N"),
        (lambda: mpimesh.attach("tcp://a:1"), "run the script as rank 0 of the job"),
        (lambda: mpimesh.hosts_from_config("x"), "use host_mesh()"),
    ],
)
def test_monarch_transport_names_say_what_replaces_them(call: Any, instead: str) -> None:
    """Monarch's transport and bootstrap calls exist, and fail at the call with the replacement."""
    with pytest.raises(NotImplementedError, match=r"^\w+\(.*\) is Monarch's own transport and bootstrap, which "
                       r"mpimesh does not have; " + re.escape(instead)):
        call()


def test_tensor_names_are_the_tensor_packages() -> None:
    """mpimesh's lazy tensor names are exactly those mpimesh.tensor re-homes."""
    import mpimesh.tensor

    assert mpimesh._TENSOR == mpimesh.tensor._REEXPORTED
