"""The README's Monarch table accounts for every public name of ``monarch.actor`` (issue #14's done-when)."""

from __future__ import annotations

import re
from pathlib import Path

import mpimesh

README = Path(__file__).resolve().parents[2] / "README.md"

#: ``monarch.actor.__all__`` of Monarch 0.7.0 (github.com/meta-pytorch/monarch, python/monarch/actor/__init__.py)
MONARCH_ACTOR = (
    "Accumulator", "Actor", "ActorError", "Channel", "ChannelTransport", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcId", "ProcMesh", "Uid", "ValueMesh",
    "as_endpoint", "attach", "attach_to_workers", "concurrent_endpoint", "config", "context", "current_actor_name",
    "current_rank", "current_size", "debug_controller", "default_bootstrap_cmd", "enable_transport", "endpoint",
    "get_meter", "get_or_spawn_controller", "hosts_from_config", "run_worker_loop_forever", "send",
    "shutdown_context", "span", "this_host", "this_proc", "traced", "unhandled_fault_hook",
)


def monarch_rows() -> list[tuple[set[str], str]]:
    """Each row of the "Monarch names" table: the backticked names of its first cell, and its second cell."""
    text = README.read_text()
    table = text[text.index("### Monarch names"):]
    table = table[:table.index("\n\n", table.index("| Monarch"))]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 3 or cells[0].startswith(("Monarch", "---")):
            continue
        names = {part for m in re.findall(r"`([^`]+)`", cells[0]) for part in m.split("(")[0].split(".")}
        rows.append((names, cells[1]))
    return rows


def test_every_public_name_has_a_row_and_a_verdict() -> None:
    rows = monarch_rows()
    listed = set().union(*(names for names, _ in rows))
    assert [n for n in MONARCH_ACTOR if n not in listed] == []
    for names, verdict in rows:
        if names & set(MONARCH_ACTOR):
            assert verdict.startswith(("same", "differs", "not applicable", "`mpimesh")), (names, verdict)


def test_names_said_to_be_the_same_import_from_mpimesh() -> None:
    """A row that says "same" promises the renamed import works: ``from mpimesh import Name``."""
    for names, verdict in monarch_rows():
        if verdict == "same":
            public = names & set(MONARCH_ACTOR)
            assert [n for n in sorted(public) if not hasattr(mpimesh, n)] == [], verdict
