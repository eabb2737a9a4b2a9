"""Pytest plugin of the Monarch compatibility harness: resolve Monarch's imports, classify each result.

Monarch's test files import its private modules at their top
(``monarch._src...``, ``monarch._rust_bindings...``), its config
(``monarch.config``) and its job API (``monarch._src.job``, ``monarch.tools``).
A failed import would lose every test of a file, including those that never use
what it imports.  So every ``monarch.*`` module that the shim (``shim/monarch``)
does not provide imports as a stand-in: a name that Monarch itself re-exports
publicly (``monarch.actor``'s, ``monarch.rdma``'s, plus the documented
``SupervisionError`` and ``ActorMesh``) is the shim's object; any other name is
an :class:`Absent` that raises :class:`MonarchCompatGap` the moment a test
uses it (calls it, reads an attribute, enters it, ``isinstance``).  A public
module of the shim that lacks one of Monarch's public names gives an
:class:`Absent` of kind ``missing`` for it the same way.

Each test's outcome is then one of:

* ``pass``;
* ``internals``: it touched a stand-in for a private module, the job API or
  the config keys (the failure text holds ``needs Monarch internals:``);
* ``by-design``: listed in ``expectations.BY_DESIGN`` with the reason;
* ``fail``: anything else, mpimesh's fault (including ``missing public name:``).

Results go, one JSON object a line, to ``$MONARCH_COMPAT_RESULTS``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from typing import Any

#: Shim modules (real files under shim/monarch); every other monarch.* module is a stand-in.
SHIM_MODULES = ("monarch", "monarch.actor", "monarch.rdma", "monarch.spmd")

#: Names that Monarch's tests import from private paths although Monarch documents them for
#: users (its API docs name them; monarch-api.md sections 1.4 and 1.9): where mpimesh has them.
DOCUMENTED_PRIVATE = {
    "SupervisionError": ("mpimesh", "SupervisionError"),
    "ActorMesh": ("mpimesh", "ActorMesh"),
    "Shape": ("mpimesh", "Shape"),
}

INTERNAL = "needs Monarch internals"
MISSING = "missing public name"


class MonarchCompatGap(Exception):
    """A test used a Monarch name that the shim does not map (private, or public but absent)."""


class Absent:
    """Stands for a Monarch name the shim does not map; any use raises :class:`MonarchCompatGap`."""

    __slots__ = ("_kind", "_name")

    def __init__(self, kind: str, name: str) -> None:
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_name", name)

    def _gap(self, *_: Any, **__: Any) -> Any:
        raise MonarchCompatGap(f"{self._kind}: {self._name}")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        self._gap()

    # Subscripting is allowed so that annotations like PortRef[int] evaluate at definition time.
    def __getitem__(self, _: Any) -> Absent:
        return self

    def __repr__(self) -> str:
        return f"{self._kind}: {self._name}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Absent, (self._kind, self._name))

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # A test module may subclass a private class at its top (class FakeJob(LoginJob)):
        # the class statement works, making an instance raises.
        gap = MonarchCompatGap(f"{self._kind}: {self._name}")

        def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
            raise gap

        return (type(self._name.rsplit(".", 1)[-1], (), {"__new__": __new__}),)

    def __or__(self, _: Any) -> Absent:
        return self

    __ror__ = __or__
    __call__ = _gap
    __setitem__ = _gap
    __delitem__ = _gap
    __contains__ = _gap
    __len__ = _gap
    __enter__ = _gap
    __aenter__ = _gap
    __iter__ = _gap
    __instancecheck__ = _gap
    __subclasscheck__ = _gap
    __await__ = _gap


def _public_names() -> dict[str, Any]:
    names: dict[str, Any] = {}
    for module in ("monarch.rdma", "monarch.actor"):
        mod = importlib.import_module(module)
        names.update({k: v for k, v in vars(mod).items() if not k.startswith("_")})
    for name, (module, attr) in DOCUMENTED_PRIVATE.items():
        names[name] = getattr(importlib.import_module(module), attr)
    return names


class _StandIn(types.ModuleType):
    """A private Monarch module: public names resolve, others are :class:`Absent`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        public = _public_names()
        if name in public:
            return public[name]
        return Absent(INTERNAL, f"{self.__name__}.{name}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (importlib.import_module, (self.__name__,))


class _ShimLoader(importlib.abc.Loader):
    """Loads a shim module as usual, then gives it the missing-public-name hook."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        module.__getattr__ = _missing_getattr(module.__name__)  # type: ignore[method-assign]
        module.__class__ = _ShimModule


class _ShimModule(types.ModuleType):
    """A shim module: assigning one of its names assigns mpimesh's too.

    A renamed program writes ``mpimesh.unhandled_fault_hook = f`` where
    Monarch's wrote ``monarch.actor.unhandled_fault_hook = f``; the harness
    makes the one line do what the other would.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        mpimesh = sys.modules.get("mpimesh")
        if mpimesh is not None and not name.startswith("_") and hasattr(mpimesh, name):
            setattr(mpimesh, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # cloudpickle pickles plain modules by name; a subclass needs saying so.
        return (importlib.import_module, (self.__name__,))


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "monarch" or not fullname.startswith("monarch."):
            return None
        if fullname in SHIM_MODULES:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _ShimLoader(spec.loader)
            return spec
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _missing_getattr(module_name: str) -> Any:
    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Absent(MISSING, f"{module_name}.{name}")

    return __getattr__


def install() -> None:
    """Install the stand-in finder (idempotent); every process of a run does, through site_hook/sitecustomize.py."""
    if not any(type(f).__name__ == "_StandInFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, _StandInFinder())


install()


# ---------------------------------------------------------------------------
# classification


def classify(nodeid: str, outcome: str, text: str) -> tuple[str, str]:
    """(category, reason) of one test's result."""
    from expectations import BY_DESIGN, INTERNALS

    name = nodeid.split("::", 1)[-1]
    if outcome == "passed":
        return "pass", ""
    if outcome == "skipped":
        return "skipped", text.strip().splitlines()[-1][:200] if text.strip() else ""
    for marker in (INTERNAL, MISSING):
        at = text.find(marker + ":")
        if at >= 0:
            gap = text[at:].splitlines()[0][:200]
            if marker == INTERNAL:
                return "internals", gap
            return "fail", gap
    for key in (name, name.split("[", 1)[0]):  # with its parameters, then without
        if key in INTERNALS:
            return "internals", INTERNALS[key]
        if key in BY_DESIGN:
            return "by-design", BY_DESIGN[key]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if line.startswith("E ")), lines[-1] if lines else "")
    return "fail", last[:300]


def pytest_runtest_logreport(report: Any) -> None:
    """Append the classified outcome of a test's call (or failed setup/teardown) to the results file."""
    path = os.environ.get("MONARCH_COMPAT_RESULTS")
    if not path:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
    elif report.when == "teardown" and report.outcome == "failed":
        outcome = "failed"
    else:
        return
    text = report.longreprtext if outcome != "passed" else ""
    category, reason = classify(report.nodeid, outcome, text)
    with open(path, "a") as f:
        f.write(
            json.dumps({"nodeid": report.nodeid, "when": report.when, "category": category, "reason": reason}) + "\n"
        )


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Skip what Monarch's own OSS CI skips (its ``oss_skip`` marker), as Monarch's pyproject says."""
    import pytest

    for item in items:
        if item.get_closest_marker("oss_skip") is not None:
            item.add_marker(pytest.mark.skip(reason="oss_skip: Monarch's own OSS CI skips it"))
