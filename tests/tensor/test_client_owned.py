"""The tensor engine's client of a process mesh is owned by that mesh: ``stop()`` frees it (issue 26).

Runtime tests (``mesh``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mpimesh
from mpimesh import this_host
from mpimesh._core import current as _current
from mpimesh._core.owners import Kind

pytestmark = pytest.mark.mesh


def test_stop_frees_the_client() -> None:
    procs: Any = this_host().spawn_procs(per_host={"gpus": 1})
    with procs.activate():
        t = torch.ones(4) * 3
    assert mpimesh.inspect(t, gpus=0)[0].item() == 3.0
    owners = _current.current().owners
    client = mpimesh.tensor._client.client_of(procs)
    node = owners.get(procs._key)
    assert node is not None and [(c.kind, c.payload) for c in node.children] == [(Kind.ATTACHED, client)]
    procs.stop().get(60)
    assert owners.get(procs._key) is None
    assert all(c.payload is not client for c in owners.of_kind(Kind.ATTACHED))
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        mpimesh.tensor._client.client_of(procs)
