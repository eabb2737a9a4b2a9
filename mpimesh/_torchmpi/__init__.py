"""The ``"mpimesh"`` torch.distributed backend: collectives on MPI communicators of a mesh's processes.

It depends on MPI, torch and the public mesh API only, and serves two
layers above it: ``mpimesh.spmd`` (torch.distributed inside actors, which
re-exports its entry points) and the tensor engine's global-view tensors
(a ``DeviceMesh`` over the mesh's processes).  :mod:`._world` says who a
process's world is and joins it, :mod:`._backend` is the process group,
:mod:`._work` finishes its nonblocking collectives.  Importing this package
(or :mod:`._world`) does not import torch.
"""
