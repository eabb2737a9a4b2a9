"""Stale PRRTE/mpimesh session directories are removed, live ones kept (pure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpimesh._roles.islands import _remove_stale_sessions


def dead_pid() -> int:
    for pid in range(32000, 1000, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no free pid")


def test_only_dead_sessions_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory named after a dead pid is removed; one of a live pid, or not a session, stays."""
    monkeypatch.setenv("PRTE_MCA_prte_tmpdir_base", str(tmp_path))
    stale = tmp_path / f"prte.{dead_pid()}"
    (stale / "sub").mkdir(parents=True)
    stale_words = tmp_path / f"mpimesh-{dead_pid()}"
    stale_words.mkdir()
    live = tmp_path / "prte.1"
    live.mkdir()
    other = tmp_path / "prte.notapid"
    other.mkdir()
    _remove_stale_sessions()
    assert not stale.exists() and not stale_words.exists()
    assert live.exists() and other.exists()
