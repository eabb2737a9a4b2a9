"""The actor that checks, after each module, that a shared process mesh still answers (tests/conftest.py)."""

from __future__ import annotations

import os

from mpimesh import Actor, endpoint


class Probe(Actor):
    """Answers with its process id: every process of the mesh is alive and serving."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()
