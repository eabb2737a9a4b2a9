"""MPIMESH_* settings parse once, with errors naming the variable (pure)."""

from __future__ import annotations

import pytest

from mpimesh.config import Config, load


def test_defaults_and_overrides() -> None:
    """Unset variables give the defaults; set ones are parsed."""
    assert load({}) == Config()
    cfg = load({"MPIMESH_SPIN_US": "50", "MPIMESH_DEBUG": "1", "MPIMESH_SHUTDOWN_TIMEOUT": "2.5"})
    assert cfg.spin_us == 50 and cfg.debug and cfg.shutdown_timeout == 2.5


def test_bad_values_name_the_variable() -> None:
    """A value that does not parse says which variable and what to write."""
    with pytest.raises(
        ValueError,
        match=r"^MPIMESH_SPIN_US must be a number, got 'fast'; "
        r"unset it or use e.g. MPIMESH_SPIN_US=2000$",
    ):
        load({"MPIMESH_SPIN_US": "fast"})
    with pytest.raises(ValueError, match=r"^MPIMESH_SHUTDOWN_TIMEOUT must be at least 0.1, got '0'; "):
        load({"MPIMESH_SHUTDOWN_TIMEOUT": "0"})


def test_receive_warm_block_setting() -> None:
    """MPIMESH_RECV_WARM_BYTES is a size in bytes (64 MiB by default), 0 turning it off."""
    assert Config().recv_warm_bytes == 64 << 20
    assert load({"MPIMESH_RECV_WARM_BYTES": "0"}).recv_warm_bytes == 0
    assert load({"MPIMESH_RECV_WARM_BYTES": "1048576"}).recv_warm_bytes == 1 << 20


def test_batching_and_window_settings() -> None:
    """MPIMESH_BATCH_FRAMES is a count of at least 1; MPIMESH_RMA_WINDOWS a choice."""
    assert (Config().batch_frames, Config().rma_windows) == (64, "auto")
    cfg = load({"MPIMESH_BATCH_FRAMES": "1", "MPIMESH_RMA_WINDOWS": " Always "})
    assert (cfg.batch_frames, cfg.rma_windows) == (1, "always")
    with pytest.raises(ValueError, match=r"^MPIMESH_BATCH_FRAMES must be at least 1, got '0'; "):
        load({"MPIMESH_BATCH_FRAMES": "0"})
    with pytest.raises(
        ValueError,
        match=r"^MPIMESH_RMA_WINDOWS must be auto, always or never, got 'sometimes'; "
        r"unset it or use e.g. MPIMESH_RMA_WINDOWS=auto$",
    ):
        load({"MPIMESH_RMA_WINDOWS": "sometimes"})


def test_preload_setting() -> None:
    """MPIMESH_PRELOAD names modules (torch by default), ``none`` none; anything else names the variable."""
    assert Config().preload == ("torch",)
    assert load({"MPIMESH_PRELOAD": ""}).preload == ("torch",)
    assert load({"MPIMESH_PRELOAD": " None "}).preload == ()
    assert load({"MPIMESH_PRELOAD": "torch, numpy,jax.numpy"}).preload == ("torch", "numpy", "jax.numpy")
    with pytest.raises(
        ValueError,
        match=r"^MPIMESH_PRELOAD must be comma-separated module names or none, got 'torch;numpy'; "
        r"unset it or use e.g. MPIMESH_PRELOAD=torch$",
    ):
        load({"MPIMESH_PRELOAD": "torch;numpy"})


def test_spin_yield_setting() -> None:
    """MPIMESH_SPIN_YIELD: auto (the default), always or never; anything else names the variable and the fix."""
    assert Config().spin_yield == "auto"
    assert load({"MPIMESH_SPIN_YIELD": " Never "}).spin_yield == "never"
    with pytest.raises(
        ValueError,
        match=r"^MPIMESH_SPIN_YIELD must be auto, always or never, got 'yes'; "
        r"unset it or use e.g. MPIMESH_SPIN_YIELD=auto$",
    ):
        load({"MPIMESH_SPIN_YIELD": "yes"})
