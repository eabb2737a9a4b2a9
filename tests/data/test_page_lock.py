"""``page_lock`` without a GPU: a no-op where there is no CUDA, and a refused registration leaves no error set.

The CUDA runtime keeps the error of a failed call as its last error, which the
next unrelated CUDA call (torch checks it after each kernel launch) would
report: a refused ``cudaHostRegister`` must be followed by ``cudaGetLastError``.
The runtime here is a stand-in passed to ``page_lock``, as the real one
(:func:`mpimesh._data.buffers._cudart`) is where torch has CUDA.
"""

from __future__ import annotations

import pytest

from mpimesh._data import buffers as _buffers

#: cudaErrorHostMemoryAlreadyRegistered: a refusal, as is any code but cudaSuccess (0)
REFUSED = 712


class Runtime:
    """A CUDA runtime that records its calls and answers ``cudaHostRegister`` with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.last_error = 0
        self.calls: list[str] = []

    def cudaHostRegister(self, addr: int, nbytes: int, flags: int) -> int:  # noqa: N802 (the runtime's names)
        self.calls.append("register")
        self.last_error = self.code
        return self.code

    def cudaHostUnregister(self, addr: int) -> int:  # noqa: N802
        self.calls.append("unregister")
        return 0

    def cudaGetLastError(self) -> int:  # noqa: N802
        self.calls.append("get_last_error")
        error, self.last_error = self.last_error, 0
        return error


@pytest.fixture(autouse=True)
def no_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no block known (a stand-in's answers must not stay for the next)."""
    monkeypatch.setattr(_buffers, "_locked", {})


def test_without_cuda_a_large_block_stays_pageable() -> None:
    """No CUDA in this torch (or no torch): nothing is registered, and nothing raises."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    assert not _buffers.page_lock(_buffers.recv_buffer(8 << 20))


def test_a_refused_registration_clears_the_runtimes_last_error() -> None:
    """cudaHostRegister refused: False, the last error read back to cudaSuccess, and no second try."""
    runtime = Runtime(REFUSED)
    block = _buffers.recv_buffer(8 << 20)
    assert not _buffers.page_lock(block, runtime)
    assert runtime.calls == ["register", "get_last_error"] and runtime.last_error == 0
    assert not _buffers.page_lock(block[4096:], runtime)  # the same block: its answer is known
    assert runtime.calls == ["register", "get_last_error"]


def test_a_registration_that_succeeds_touches_no_error() -> None:
    """cudaHostRegister accepted: True, and the runtime's last error is not read."""
    runtime = Runtime(0)
    assert _buffers.page_lock(_buffers.recv_buffer(8 << 20), runtime)
    assert runtime.calls == ["register"]
