"""What runs before MPI_Init: the ``mpimesh`` command, MPI discovery, the world-size check.

Nothing here imports the runtime (``_core``) or the transport.
"""
