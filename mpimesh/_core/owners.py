"""The ownership tree: what each part of a process must tear down, and in which order.

One tree per runtime (``Runtime.owners``).  Its root stands for the
process itself (the controller script, or a worker's own code); under it
hangs a node for each actor of this process that made something, and
under an owner every thing it made and has not stopped: the actor meshes
and process meshes it spawned, the channels it opened, and under a
process mesh what was attached to it (the tensor engine's client).  A
node is adopted by its owner when its thing is made, and leaves the tree
when its thing is stopped, by the tree or directly (``mesh.stop()``).

Closing a node closes its subtree bottom-up, as a ``contextlib.ExitStack``
unwinds: the children last adopted close first (an actor mesh before the
process mesh it runs on), each child's own subtree before the child, and
every stop that returns a future is awaited within one deadline for the
whole subtree.  The whole tree and the end of a job are drawn in
``docs/design/ownership.md``.

Reply ports of single calls are not in the tree: each is closed by the
answer it waits for (or the death of whom it waits on), and adopting one
per call would cost every ``call_one``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from enum import Enum
from typing import Any

__all__ = ["Kind", "Node", "Owners"]

#: A node's close: given the reason, it stops its thing; a future when the stop completes later.
Close = Callable[[str], "Future[Any] | None"]


class Kind(Enum):
    """What a node of the tree stands for."""

    ROOT = "root"
    ACTOR = "actor"
    ACTOR_MESH = "actor mesh"
    PROC_MESH = "proc mesh"
    CHANNEL = "channel"
    ATTACHED = "attached"


class Node:
    """One thing that must be torn down: its owner, what it owns, and how to close it.

    Made by :meth:`Owners.adopt`; not by hand.
    """

    __slots__ = ("kind", "name", "key", "payload", "owner", "children", "_close", "_tree")

    def __init__(
        self, tree: Owners, kind: Kind, name: str, key: Any, payload: Any, close: Close | None, owner: Node | None
    ) -> None:
        self._tree = tree
        self.kind = kind
        self.name = name
        #: the thing's key in the tree's index (a mesh's key, an actor), or None
        self.key = key
        #: what the tree keeps for the thing (an actor mesh's ``failures.Owned``, an attached object)
        self.payload = payload
        self.owner = owner
        #: what this node owns, in adoption order (a dict as an ordered set: a stop forgets its node in O(1))
        self.children: dict[Node, None] = {}
        self._close = close

    def __repr__(self) -> str:
        return f"<owners.Node {self.kind.value} {self.name!r}: {len(self.children)} owned>"

    def walk(self) -> Iterator[Node]:
        """This node's subtree, every node after the nodes it owns (the order a close takes)."""
        for child in reversed(list(self.children)):  # a snapshot: closes forget their nodes
            yield from child.walk()
        yield self

    def start_close(
        self, reason: str, errors: list[BaseException] | None = None, *, itself: bool = True
    ) -> list[Future[Any]]:
        """Start closing this node's subtree bottom-up, then this node; returns at once with the stops' futures.

        Every node leaves the tree before its close runs, so a thing that
        stops itself on the way (``ProcMesh.stop``) finds nothing left to
        close.  ``itself``: False when the node's own thing is being stopped
        by its caller, which closes only what it owns.  ``errors``: where a
        close that raises goes, without its traceback (by default, it
        raises here).
        """
        stops: list[Future[Any]] = []
        for node in self.walk():
            if node.kind is Kind.ROOT or (node is self and not itself):
                continue
            self._tree.forget(node)
            if node._close is None:
                continue
            try:
                stop = node._close(reason)
            except Exception as exc:
                if errors is None:
                    raise
                errors.append(_untraced(exc))
                continue
            if stop is not None:
                stops.append(stop)
        return stops

    def close(self, reason: str, timeout: float, *, itself: bool = True) -> list[BaseException]:
        """Close this node's subtree as :meth:`start_close` does, then wait for it, at most about ``timeout`` seconds.

        Returns:
            The errors of the closes (a stop not done in time gives its ``TimeoutError``),
            without their tracebacks (see :func:`_untraced`).
        """
        deadline = time.monotonic() + timeout
        errors: list[BaseException] = []
        for stop in self.start_close(reason, errors, itself=itself):
            try:
                stop.result(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                errors.append(_untraced(exc))
        return errors


def _untraced(exc: Exception) -> Exception:
    """``exc``, and every exception chained to it, without a traceback: how a close's error is kept.

    A traceback holds the frames it went through, and each frame the frames
    that called it.  Kept in a list that one of those frames holds
    (``errors`` in :meth:`Node.close`), it made a reference cycle through the
    whole stack of whoever closed: a stopping actor's ``_cleanup_then_stop``,
    which holds the user's object (its ``__cleanup__``), so that object was
    freed by the cycle collector, late, instead of when the actor stopped.
    The closes' errors are only reported by their text.
    """
    seen: set[int] = set()
    chain: list[BaseException | None] = [exc]
    while chain:
        each = chain.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        each.__traceback__ = None
        chain += (each.__cause__, each.__context__)
    return exc


class Owners:
    """The ownership tree of one runtime, and its index by key.

    The lock covers the tree's shape only; no close runs under it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.root = Node(self, Kind.ROOT, "root", None, None, None, None)
        self._index: dict[Any, Node] = {}
        # keys of the process meshes that left the tree: nothing may be attached to them again
        # (one small key per stopped mesh, kept for the job's life)
        self._stopped: set[Any] = set()
        # make-once for attach(): not self._lock, as make() may adopt on its way
        self._attaching = threading.RLock()

    def adopt(
        self, owner: Node, kind: Kind, name: str, close: Close | None, *, key: Any = None, payload: Any = None
    ) -> Node:
        """Hang a new thing under ``owner``; ``close(reason)`` will stop it.

        ``key``: the thing's key in the index (:meth:`get`), unique in the tree.
        """
        node = Node(self, kind, name, key, payload, close, owner)
        with self._lock:
            owner.children[node] = None
            if key is not None:
                self._index[key] = node
        return node

    def readopt(self, node: Node, owner: Node) -> None:
        """Move ``node`` and its subtree under ``owner`` (a replaced process's actors, when a mesh heals)."""
        with self._lock:
            if node.owner is not None:
                node.owner.children.pop(node, None)
            node.owner = owner
            owner.children[node] = None
            if node.key is not None:
                self._index[node.key] = node

    def forget(self, node: Node) -> None:
        """Take ``node`` out of the tree without closing it (its thing stopped, or is stopping)."""
        with self._lock:
            owner = node.owner
            if owner is not None:
                owner.children.pop(node, None)
            if node.key is not None and self._index.get(node.key) is node:
                del self._index[node.key]
                if node.kind is Kind.PROC_MESH:
                    self._stopped.add(node.key)

    def take(self, key: Any) -> Node | None:
        """The node of ``key``, taken out of the tree; None if there is none (any more)."""
        node = self._index.get(key)
        if node is not None:
            self.forget(node)
        return node

    def forget_actor_meshes_on(self, addrs: Iterable[tuple[int, int]]) -> None:
        """The processes ``addrs`` are being stopped: forget the actor meshes that live only on them.

        Their actors stop with their processes.  Left in the tree, their
        owner's own stop would later send STOP to processes that are gone
        (a spawned island's route with them) and wait out the cleanup bound.
        """
        gone = set(addrs)
        for node in self.of_kind(Kind.ACTOR_MESH):
            mesh_addrs = getattr(node.payload, "addrs", None)
            if mesh_addrs and gone.issuperset(mesh_addrs):
                self.forget(node)

    def get(self, key: Any) -> Node | None:
        """The node of ``key``, if it is in the tree."""
        return self._index.get(key)

    def of_kind(self, kind: Kind) -> list[Node]:
        """Every node of ``kind`` in the index, in adoption order (a snapshot)."""
        return [node for node in list(self._index.values()) if node.kind is kind]

    def actor_of(self, node: Node) -> Any:
        """The actor of this process that owns ``node``'s thing; None for the root (the script, a worker's own code)."""
        owner = node.owner
        return owner.key if owner is not None and owner.kind is Kind.ACTOR else None

    def close_actor(self, actor: object, reason: str, timeout: float) -> list[BaseException]:
        """An actor of this process stops: close what it owns, bottom-up, within ``timeout`` seconds (Monarch's rule).

        Returns:
            The errors of the closes, as :meth:`Node.close` gives them.
        """
        node = self.take(actor)
        return [] if node is None else node.close(reason, timeout)

    def owner_of(self, actor: object | None) -> Node:
        """The node of ``actor`` of this process, adopted by the root on first use; the root for None."""
        if actor is None:
            return self.root
        node = self._index.get(actor)
        if node is not None:
            return node
        with self._lock:  # the actor's thread, or a thread of its own, may adopt at once
            node = self._index.get(actor)
            if node is None:
                node = Node(self, Kind.ACTOR, str(getattr(actor, "actor_id", actor)), actor, None, None, self.root)
                self.root.children[node] = None
                self._index[actor] = node
            return node

    def attach(self, key: Any, name: str, make: Callable[[], Any], close: Callable[[Any], None] | None) -> Any:
        """The object ``name`` kept with the node of ``key``, made by ``make()`` on first use.

        The root keeps it if no node has ``key`` (a mesh this process did
        not spawn).  ``close(obj)`` runs when that node closes (the node's thing stops,
        or the job ends).

        Raises:
            LookupError: the process mesh of ``key`` has stopped.
        """
        slot = (key, name)
        with self._attaching:
            if key in self._stopped:
                raise LookupError(f"process mesh {key} has stopped")
            node = self._index.get(slot)
            if node is not None:
                return node.payload
            obj = make()
            owner = self._index.get(key, self.root)
            self.adopt(owner, Kind.ATTACHED, name, None if close is None else (lambda _: close(obj)), key=slot,
                       payload=obj)
            return obj

    def end(self) -> None:
        """The job ends: run the closes that stay in this process (channels' ports, attached objects).

        The role's end of the job stops every actor and every process by
        itself, so the stops that would send (actor meshes, process meshes)
        are not sent again, and their nodes stay: a failure found while the
        job ends still reaches its owner (``Failures`` reads the tree).
        """
        for node in list(self.root.walk()):
            if node.kind in (Kind.CHANNEL, Kind.ATTACHED):
                self.forget(node)
                if node._close is not None:
                    try:
                        node._close("the job ends")
                    except Exception:  # the process is ending: nothing is left to tell
                        pass
