"""The package's imports point down only, counting every import.

Every ``import`` statement counts: module level, inside functions, and under
``if TYPE_CHECKING:``; a lazy import is still a dependency.  The layers, top
to bottom:

- ``__main__``: dispatches to the launcher, a worker or the controller;
- public mesh modules (``actor actor_mesh proc_mesh channel rma``, the ``debug`` and ``_dashboard``
  packages): validate,
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

``_torchmpi`` (the ``"mpimesh"`` torch.distributed backend, collectives on
MPI) sits between the public API and both its users: ``spmd`` re-exports its
entry points, and the tensor engine's global-view tensors run their
``DeviceMesh`` on it.  It needs MPI and torch only (and the public API), so
that neither user has to import the other.

``_launch`` runs before MPI is initialised and imports none of the runtime;
its pure helpers (parsing an MPI library's version string) may be used below.

No module changes another module's state: an assignment to another module's
attribute (``mod.attr = x``, ``setattr(mod, ...)``) is a dependency the import
graph cannot see, and made behaviour depend on import order.  A layer above
registers with a function of the module below (``_core.hooks``), and boot
wires the runtime in (``_core.current.install``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mpimesh"

LEAVES = {"shape", "_shape_checks", "_shape_points", "value_mesh", "future", "errors", "context", "supervision",
          "config", "_version", "transport_names", "rma_backend", "_waits", "exceptions"}
PUBLIC = {"actor", "actor_mesh", "proc_mesh", "channel", "rma", "debug", "distributed", "_dashboard"}
TOOLS = {"spmd"}
#: The MPI backend of torch.distributed: below the tensor engine and the tools, which both use it.
TORCHMPI = "_torchmpi"

#: layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "leaf": set(),
    "_transport": {"_launch", "leaf"},
    "_data": {"_transport", "_launch", "leaf"},
    "_core": {"_data", "_transport", "_launch", "leaf"},
    "_roles": {"_core", "_data", "_transport", "_launch", "leaf"},
    "public": {"_core", "_data", "leaf"},
    "tensor": {"public", "leaf", TORCHMPI},
    TORCHMPI: {"public", "leaf"},
    "_launch": {"leaf"},
    "__init__": {"public", "leaf"},
    "__main__": {"_launch", "_roles", "_core", "_transport", "leaf"},
    "tools": {"public", "leaf", TORCHMPI},
}

#: Lazy imports (inside a function) into the tensor engine from the layers below it: the
#: only way in, so that importing mpimesh never imports torch.  Edges of the graph (no cycle
#: may go through them); only the direction check lets them point up.
TENSOR_ENTRIES = {
    ("mpimesh", "mpimesh.tensor"),
    ("mpimesh.proc_mesh", "mpimesh.tensor"),
    ("mpimesh.distributed", "mpimesh.tensor"),
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

#: The MPI backend for torch.distributed runs MPI collectives on communicators of its own (MPI
#: itself, with the runtime's lock around dynamic-process calls), on CUDA memory where MPI is CUDA-aware.
TORCHMPI_BELOW = {
    ("mpimesh._torchmpi._world", "mpimesh._transport.mpi"),
    ("mpimesh._torchmpi._world", "mpimesh._transport.live"),
    ("mpimesh._torchmpi._work", "mpimesh._transport.mpi"),
    ("mpimesh._torchmpi._backend", "mpimesh._transport.mpi"),
    ("mpimesh._torchmpi._backend", "mpimesh._data.buffers"),
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
    if top == TORCHMPI:
        return TORCHMPI
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


#: Attributes of the interpreter's own modules that are meant to be set: what a launcher
#: (``-m mpimesh``, spmd's script runner) and a debugger set, and where the log's lines go.
INTERPRETER_HOOKS = {"sys.argv", "sys.stdout", "sys.stderr", "sys.breakpointhook", "pdb.set_trace"}

#: Methods that change a container in place.
MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault", "clear", "pop", "popitem", "remove", "discard"}


def module_names(name: str, tree: ast.AST, known: set[str], package: str) -> tuple[set[str], set[str]]:
    """The names that ``name``'s source binds to modules: (mpimesh modules, every module)."""
    ours: set[str] = set()
    every: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                bound = [alias.asname] if alias.asname else [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                every.update(bound)
                if alias.name.startswith("mpimesh"):
                    ours.update(bound)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    ours.add(alias.asname or alias.name)
                    every.add(alias.asname or alias.name)
    return ours, every


def module_mutations(name: str, source: str, known: set[str], *, is_package: bool = False) -> list[str]:
    """Where ``name``'s source changes another module's state, as ``"module:line: code"``.

    Counted: an assignment or deletion of a module's attribute, ``setattr`` or
    ``delattr`` on a module (any module but :data:`INTERPRETER_HOOKS`); a
    store into, or an in-place change of, a table held by an mpimesh module
    (``mod.table[k] = v``, ``mod.hooks.append(f)``).  The interpreter's own
    tables (``sys.path``, ``os.environ``) are meant to be changed.
    ``is_package``: the source is a package's ``__init__``.
    """
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    ours, every = module_names(name, tree, known, package)

    def module_attr(node: ast.AST, modules: set[str]) -> bool:
        return isinstance(node, ast.Attribute) and ast.unparse(node.value) in modules

    found: list[tuple[int, str]] = []

    def report(node: ast.AST, what: ast.AST) -> None:
        code = ast.unparse(what)
        if code not in INTERPRETER_HOOKS:
            found.append((getattr(node, "lineno", 0), code))

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if module_attr(sub, every) and isinstance(sub.ctx, (ast.Store, ast.Del)):  # type: ignore[attr-defined]
                    report(node, sub)
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)) and module_attr(
                    sub.value, ours
                ):
                    report(node, sub)
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args
                    and ast.unparse(node.args[0]) in every):
                report(node, node)
            elif isinstance(func, ast.Attribute) and func.attr in MUTATORS and module_attr(func.value, ours):
                report(node, func)
    return [f"{name}:{line}: {code}" for line, code in sorted(found)]


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
            exempt = ((name, target) == HUB or (name, target) in TENSOR_ENTRIES or (name, target) in TENSOR_BELOW
                      or (name, target) in TORCHMPI_BELOW)
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
    stale = sorted((a, b) for a, b in TENSOR_ENTRIES | TENSOR_BELOW | TORCHMPI_BELOW if b not in edges[a])
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


def test_no_module_changes_another() -> None:
    """No module assigns to another module's attribute, or changes a table another mpimesh module holds."""
    mods = modules()
    known = set(mods) | {"mpimesh._native"}
    found = [
        hit
        for name, path in sorted(mods.items())
        for hit in module_mutations(name, path.read_text(), known, is_package=path.name == "__init__.py")
    ]
    assert not found, "modules that change another module's state (register through a function instead):\n" + (
        "\n".join(found)
    )


def test_module_changes_are_caught() -> None:
    """The check above finds each kind of change, and leaves objects' attributes and the interpreter's hooks alone."""
    source = """
import sys
import mpimesh.future
from . import ports as _ports
from .. import future
from .calls import MeshRef

_ports.current = None
future._driver: object = None
mpimesh.future._driver = None
setattr(_ports, "current", None)
_ports.table[1] = 2
_ports.hooks.append(print)
del future._driver

def ok(rt):
    rt.router.every_ms = 1
    MeshRef.cls = "x"
    sys.argv = []
    sys.path.insert(0, "")
"""
    known = {"mpimesh._core.calls", "mpimesh._core.ports", "mpimesh.future"}
    found = module_mutations("mpimesh._core.example", source, known)
    assert [hit.split(": ", 1)[1] for hit in found] == [
        "_ports.current", "future._driver", "mpimesh.future._driver", "setattr(_ports, 'current', None)",
        "_ports.table[1]", "_ports.hooks.append", "future._driver",
    ], found
