"""Tests of Monarch's that the harness classifies by hand, each with the reason.

``INTERNALS``: the test checks Monarch's own machinery without touching a
private name the stand-ins would catch (its transport, its process tree, its
config defaults).  ``BY_DESIGN``: the test checks a behaviour mpimesh differs
on on purpose (README, "Monarch names").  Keys are test names as pytest
prints them after ``::``.
"""

INTERNALS: dict[str, str] = {}

BY_DESIGN: dict[str, str] = {}
