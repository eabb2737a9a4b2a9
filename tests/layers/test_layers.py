"""The package's imports point down only, counting every import.

Every ``import`` statement counts: module level, inside functions, and under
``if TYPE_CHECKING:``; a lazy import is still a dependency.  The layers, top
to bottom:

- ``__main__``: dispatches to the launcher, a worker or the controller;
- public mesh modules (``actor actor_mesh proc_mesh channel rma``, the ``debug`` package): validate,
  pickle, and hand requests to ``_core``; they never say MPI;
- ``_roles``: what differs between the controller and the workers;
- ``_core``: one process's runtime, the same on every rank;
- ``_data``: the data plane's memory, windows and copies;
- ``_transport``: frames over MPI;
- value leaves (``shape value_mesh future errors context supervision config``).

``tensor`` (the tensor engine) sits on top of the public modules and uses
them through their public methods only: it spawns actors and imports torch.
The meshes reach it only through the lazy entry points in
:data:`TENSOR_ENTRIES` (``procs.activate()``, and ``mpimesh.<tensor name>``
on first use), so that importing mpimesh never imports torch; those imports
point up, but they are edges of the graph like any other, so the engine
imports no mesh module (it names the process mesh by a protocol of its own).
Its worker half runs MPI collectives, the few imports below the public API
that needs are listed one by one in :data:`TENSOR_BELOW`.

Tools built on the public API alone sit above it, each a package of its own
(``spmd``: torch.distributed inside actors); ``mpimesh/__init__`` does not
re-export them.

``_launch`` runs before MPI is initialised and imports none of the runtime;
its pure helpers (parsing an MPI library's version string) may be used below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mpimesh"

LEAVES = {"shape", "value_mesh", "future", "errors", "context", "supervision", "config", "_version", "transport_names",
          "rma_backend"}
PUBLIC = {"actor", "actor_mesh", "proc_mesh", "channel", "rma", "debug"}
TOOLS = {"spmd"}

#: layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "leaf": set(),
    "_transport": {"_launch", "leaf"},
    "_data": {"_transport", "_launch", "leaf"},
    "_core": {"_data", "_transport", "_launch", "leaf"},
    "_roles": {"_core", "_data", "_transport", "_launch", "leaf"},
    "public": {"_core", "_data", "leaf"},
    "tensor": {"public", "leaf"},
    "_launch": {"leaf"},
    "__init__": {"public", "leaf"},
    "__main__": {"_launch", "_roles", "_core", "_transport", "leaf"},
    "tools": {"public", "leaf"},
}

#: Lazy imports (inside a function) into the tensor engine from the layers below it: the
#: only way in, so that importing mpimesh never imports torch.  Edges of the graph (no cycle
#: may go through them); only the direction check lets them point up.
TENSOR_ENTRIES = {
    ("mpimesh", "mpimesh.tensor"),
    ("mpimesh.proc_mesh", "mpimesh.tensor"),
}

#: The tensor engine's imports from below the public API, each for what no public module offers:
#: the worker half's MPI collectives (MPI itself, whether it is CUDA-aware), waiting for a lent
#: tensor's reply to leave before a batch writes to it, and the runtime's own pickler (an
#: argument that does not pickle raises at the line that passed it).
TENSOR_BELOW = {
    ("mpimesh.tensor._collectives", "mpimesh._transport.mpi"),
    ("mpimesh.tensor._collectives", "mpimesh._data.buffers"),
    ("mpimesh.tensor._engine", "mpimesh._core.current"),
    ("mpimesh.tensor._handle", "mpimesh._core.serialize"),
}

#: The largest import cycle allowed: a module and the one that boots it on first use.
MAX_CYCLE = 2

#: The one import that points up, made lazily: the hub boots an embedded
#: controller on first use (``python script.py``), and only a role can.
HUB = ("mpimesh._core.current", "mpimesh._roles.boot")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every mpimesh module that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mpimesh"):
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("mpimesh"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield sub if sub in known else target


def layer(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "__init__"
    top = parts[1]
    if top in LEAVES:
        return "leaf"
    if top in PUBLIC:
        return "public"
    if top == "tensor":
        return "tensor"
    if top in TOOLS:
        return "tools"
    if top in {"__main__", "_transport", "_data", "_core", "_roles", "_launch"}:
        return top
    if top == "_native":
        return "_transport"
    raise AssertionError(f"{name} is in no layer; add it to tests/layers/test_layers.py")


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | {"mpimesh._native"}
    edges = {name: set() for name in mods}
    for name, path in mods.items():
        for target in imports(name, path, known):
            if target != name and target in known:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    """Each module belongs to one layer, so a new one cannot slip in unchecked."""
    for name in modules():
        layer(name)


def test_imports_point_down() -> None:
    """No module imports a layer above it or beside it (function-level and TYPE_CHECKING imports count)."""
    wrong = []
    for name, targets in sorted(graph().items()):
        mine = layer(name)
        for target in sorted(targets):
            theirs = layer(target)
            exempt = (name, target) == HUB or (name, target) in TENSOR_ENTRIES or (name, target) in TENSOR_BELOW
            if theirs != mine and theirs not in ALLOWED[mine] and target != "mpimesh" and not exempt:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    """No import cycle of more than MAX_CYCLE modules, counting every import."""
    big = [c for c in cycles(graph()) if len(c) > MAX_CYCLE]
    assert not big, "import cycles:\n" + "\n".join(" -> ".join(c) for c in big)


def test_tensor_entries_are_lazy() -> None:
    """Every import of the tensor engine from below it is inside a function, never at module level."""
    mods = modules()
    for name, target in sorted(TENSOR_ENTRIES):
        tree = ast.parse(mods[name].read_text())
        for node in tree.body:  # module level only
            if isinstance(node, ast.ImportFrom) and "tensor" in (node.module or ""):
                raise AssertionError(f"{name} imports {target} at module level")
            if isinstance(node, ast.ImportFrom) and node.module is None and any(a.name == "tensor" for a in node.names):
                raise AssertionError(f"{name} imports {target} at module level")


def test_tensor_exemptions_are_imports() -> None:
    """Every exempted tensor edge is an import the code makes, so the lists shrink with the code."""
    edges = graph()
    stale = sorted((a, b) for a, b in TENSOR_ENTRIES | TENSOR_BELOW if b not in edges[a])
    assert not stale, f"exemptions for imports that no longer exist: {stale}"


def test_launch_imports_no_runtime() -> None:
    """``_launch`` runs before MPI_Init: it reaches no module that imports MPI."""
    edges = graph()
    seen: set[str] = set()
    todo = [m for m in edges if m.startswith("mpimesh._launch")]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(edges.get(m, ()))
    assert sorted(m for m in seen if layer(m) not in {"_launch", "leaf"}) == []
