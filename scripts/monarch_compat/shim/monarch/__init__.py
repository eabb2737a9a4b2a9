"""Monarch's package name over mpimesh, for running Monarch's own tests (scripts/monarch_compat).

Only Monarch's public modules live here (``monarch.actor``, ``monarch.rdma``,
``monarch.spmd``), each a list of imports of the mpimesh object that plays
the same part.  Nothing here has behaviour of its own.
"""
