"""The debugger prompt's command language: ``list``, ``attach``, ``cast``, ``continue``, ``detach``, ``help``.

Pure parsing, no I/O: the console (``_console``) reads a line, :func:`parse`
turns it into a :class:`Command` or raises ``ValueError`` with the message
the prompt prints.  The syntax is Monarch's ``monarch_dbg`` one::

    cast <actor> ranks(<r> | <a>,<b>,... | <start>:<stop>[:<step>] | <dim>=<a>[:<b>],...) <pdb command>
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CONTINUE_ALL", "HELP", "Command", "Ranks", "parse", "parse_ranks"]

#: The line the console sends a paused rank for ``continue``: clear its breakpoints, then continue.
CONTINUE_ALL = "\x00continue"

HELP = """\
mpimesh debugger commands (sessions are keyed by actor name and rank):
  list                                   the paused ranks: actor, rank, coordinates, host, function, line
  attach <actor> <rank>                  a full pdb on that rank; `detach` comes back here, `continue` resumes it
  cast <actor> ranks(...) <pdb command>  run one pdb command on several paused ranks, each one's output labelled
      ranks(<r>)  ranks(<a>,<b>,...)  ranks(<start>:<stop>[:<step>])  ranks(<dim>=<a>[:<b>],...)
  continue                               clear every breakpoint and resume all paused ranks
  detach                                 leave the rank you are attached to (it stays paused)
  help                                   this text"""

_RANKS_SYNTAX = ("expecting ranks(<r>), ranks(<a>,<b>,...), ranks(<start>:<stop>[:<step>]) "
                 "or ranks(<dim>=<a>[:<b>],...)")
_INT = re.compile(r"-?\d+$")
_CAST = re.compile(r"cast\s+(?P<actor>\S+)\s+(?P<ranks>ranks\([^)]*\))\s*(?P<command>.*)$")


@dataclass(frozen=True)
class Ranks:
    """A set of ranks of one actor mesh, as ``ranks(...)`` wrote it.

    Exactly one of the three is set: ``ranks`` (explicit flat ranks),
    ``span`` (a ``range`` of flat ranks) or ``dims`` (a ``range`` per mesh
    dimension; a rank matches when each named coordinate is in its range).
    """

    ranks: frozenset[int] | None = None
    span: range | None = None
    dims: Mapping[str, range] = field(default_factory=dict)

    def matches(self, rank: int, coords: Mapping[str, int]) -> bool:
        """Whether the actor at flat ``rank`` with ``coords`` (dimension -> index) is in the set."""
        if self.ranks is not None:
            return rank in self.ranks
        if self.span is not None:
            return rank in self.span
        return all(dim in coords and coords[dim] in span for dim, span in self.dims.items())


def _int(text: str, spec: str) -> int:
    text = text.strip()
    if not _INT.match(text):
        raise ValueError(f"bad rank {text!r} in {spec!r}: {_RANKS_SYNTAX}")
    return int(text)


def _span(text: str, spec: str) -> range:
    # "a" -> range(a, a+1); "a:b" and "a:b:s" as Python slices (no open ends: ranks are counted from 0).
    parts = text.split(":")
    if len(parts) == 1:
        first = _int(parts[0], spec)
        return range(first, first + 1)
    if len(parts) > 3:
        raise ValueError(f"bad ranks(...) syntax {spec!r}: {_RANKS_SYNTAX}")
    start = _int(parts[0], spec) if parts[0].strip() else 0
    stop = _int(parts[1], spec)
    step = _int(parts[2], spec) if len(parts) == 3 and parts[2].strip() else 1
    if step <= 0:
        raise ValueError(f"bad step {step} in {spec!r}: expecting a positive step")
    return range(start, stop, step)


def parse_ranks(spec: str) -> Ranks:
    """Parse ``ranks(...)``.

    Args:
        spec: ``ranks(3)``, ``ranks(1,3)``, ``ranks(0:8:2)`` or ``ranks(hosts=0,gpus=1:3)``.

    Returns:
        The set of ranks it names.

    Raises:
        ValueError: ``spec`` is not one of those forms.
    """
    text = spec.strip()
    if not (text.startswith("ranks(") and text.endswith(")")):
        raise ValueError(f"bad ranks(...) syntax {spec!r}: {_RANKS_SYNTAX}")
    body = text[len("ranks("):-1].strip()
    if not body:
        raise ValueError(f"bad ranks(...) syntax {spec!r}: {_RANKS_SYNTAX}")
    if "=" in body:
        dims: dict[str, range] = {}
        for item in body.split(","):
            dim, eq, value = item.partition("=")
            dim = dim.strip()
            if not eq or not dim.isidentifier() or dim in dims:
                raise ValueError(f"bad ranks(...) syntax {spec!r}: {_RANKS_SYNTAX}")
            dims[dim] = _span(value, spec)
        return Ranks(dims=dims)
    if ":" in body:
        return Ranks(span=_span(body, spec))
    return Ranks(ranks=frozenset(_int(item, spec) for item in body.split(",")))


@dataclass(frozen=True)
class Command:
    """One line typed at the debugger prompt.

    ``verb`` is ``"list"``, ``"attach"``, ``"cast"``, ``"continue"``,
    ``"detach"``, ``"help"`` or ``""`` (an empty line); ``actor``,
    ``rank``, ``ranks`` and ``pdb`` are set as the verb needs.
    """

    verb: str
    actor: str = ""
    rank: int = -1
    ranks: Ranks | None = None
    pdb: str = ""


_VERBS = {"list": "list", "l": "list", "continue": "continue", "c": "continue", "detach": "detach",
          "help": "help", "h": "help", "?": "help"}


def parse(line: str) -> Command:
    """Parse one line typed at the debugger prompt.

    Raises:
        ValueError: an unknown command, or one with missing or malformed arguments.
    """
    text = line.strip()
    if not text:
        return Command("")
    words = text.split()
    verb = words[0]
    if verb in _VERBS:
        if len(words) > 1:
            raise ValueError(f"{_VERBS[verb]} takes no arguments, got {text!r}")
        return Command(_VERBS[verb])
    if verb in ("attach", "a"):
        if len(words) != 3:
            raise ValueError(f"attach needs an actor name and a rank, got {text!r}; e.g. attach trainers 1")
        if not _INT.match(words[2]):
            raise ValueError(f"expecting an integer rank, got {words[2]!r}; e.g. attach {words[1]} 1")
        return Command("attach", actor=words[1], rank=int(words[2]))
    if verb == "cast":
        found = _CAST.match(text)
        if found is None or not found["command"]:
            raise ValueError(f"cast needs an actor name, ranks(...) and a pdb command, got {text!r}; "
                             "e.g. cast trainers ranks(0,2) p x")
        return Command("cast", actor=found["actor"], ranks=parse_ranks(found["ranks"]), pdb=found["command"])
    raise ValueError(f"unknown command {verb!r}; type help")
