"""``monarch.spmd``'s public names (its ``__all__``), each mapped onto mpimesh's."""

from mpimesh.spmd import SPMDActor as SPMDActor
from mpimesh.spmd import setup_torch_elastic_env as setup_torch_elastic_env
from mpimesh.spmd import setup_torch_elastic_env_async as setup_torch_elastic_env_async
