"""Monarch's RDMA helper names: get_rdma_backend, is_ibverbs_available, is_rdma_available (pure; issue #14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mpimesh
from mpimesh import rma_backend


@pytest.fixture
def ib_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /sys/class/infiniband: an empty folder, devices added by the test."""
    monkeypatch.setattr(rma_backend, "_IB_CLASS_DIR", str(tmp_path))
    return tmp_path


def test_no_device_means_tcp(ib_dir: Path) -> None:
    """Without an ibverbs device buffers still move: Monarch's word for that is "tcp", never "none"."""
    assert mpimesh.is_ibverbs_available() is False
    assert mpimesh.get_rdma_backend() == "tcp"


def test_a_device_means_ibverbs(ib_dir: Path) -> None:
    """A device listed under /sys/class/infiniband (mlx5_0, efa_0, ...) makes the backend "ibverbs"."""
    (ib_dir / "mlx5_0").mkdir()
    assert mpimesh.is_ibverbs_available() is True
    assert mpimesh.get_rdma_backend() == "ibverbs"


def test_no_sysfs_folder_means_no_device(ib_dir: Path) -> None:
    """A host whose kernel has no RDMA class at all has no device (no error)."""
    os.rmdir(ib_dir)
    assert mpimesh.is_ibverbs_available() is False


def test_is_rdma_available_is_deprecated_as_in_monarch(ib_dir: Path) -> None:
    """is_rdma_available() answers as is_ibverbs_available() and says what replaces it."""
    (ib_dir / "mlx5_0").mkdir()
    with pytest.warns(
        DeprecationWarning,
        match=r"^is_rdma_available\(\) is deprecated, as in Monarch; "
        r"use is_ibverbs_available\(\) or get_rdma_backend\(\)$",
    ):
        assert mpimesh.is_rdma_available() is True


def test_warning_classes_are_warnings() -> None:
    """Programs that filter Monarch's RDMA warnings keep working: the three classes are Warnings."""
    for cls in (mpimesh.RDMATcpFallbackWarning, mpimesh.RDMAReadTransferWarning, mpimesh.RDMAWriteTransferWarning):
        assert issubclass(cls, Warning)
