"""Remote errors survive pickling between ranks, with their text fallback (pure)."""

from __future__ import annotations

import pickle
import threading

from mpimesh import ActorError, RemoteException, RemoteTraceback, SupervisionError
from mpimesh._core.serialize import error_payload, raise_payload


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


def test_error_payload_round_trip() -> None:
    """An exception crosses as a payload and comes back inside ActorError."""
    try:
        raise ValueError("bad")
    except ValueError as exc:
        payload = error_payload(exc, "### rank 2 (gpus=2) on node", 2, {"gpus": 2}, "node")
    err = raise_payload(pickle.loads(pickle.dumps(payload)))
    assert isinstance(err, ActorError) and isinstance(err.exception, ValueError)
    assert err.rank == 2 and err.coords == {"gpus": 2} and err.host == "node"
    assert isinstance(err.exception.__cause__, RemoteTraceback)
    assert "### rank 2 (gpus=2) on node" in str(err.exception.__cause__)
    assert "raise ValueError" in err.exception_formatted


def test_unpicklable_exception_falls_back_to_text() -> None:
    """An exception that cannot be pickled arrives as RemoteException with its type and text."""
    payload = error_payload(Unpicklable(), "### h", 0, {}, "h")
    assert payload.exception is None
    err = raise_payload(payload)
    assert isinstance(err.exception, RemoteException)
    assert str(err.exception) == "test_errors.Unpicklable: holds a lock"


def test_errors_pickle() -> None:
    """ActorError, SupervisionError and RemoteException pickle with their fields."""
    err = pickle.loads(pickle.dumps(ActorError(KeyError("k"), "tb", "### rank 1", rank=1, coords={"a": 1}, host="h")))
    assert isinstance(err.exception, KeyError) and err.rank == 1 and err.coords == {"a": 1}
    sup = pickle.loads(pickle.dumps(SupervisionError("rank 3 died", endpoint="m.f")))
    assert str(sup) == "rank 3 died" and sup.endpoint == "m.f"
    rem = pickle.loads(pickle.dumps(RemoteException("pkg.E", "msg")))
    assert str(rem) == "pkg.E: msg"
