"""mpimesh: program a whole MPI job from one Python script.

Rank 0 runs your script as the controller; the other ranks host actors.
Launch with ``mpirun -n N python -m mpimesh script.py``, or run
``python script.py`` and let ``spawn_procs`` create workers with
``MPI_Comm_spawn``.  The API follows Monarch's ``monarch.actor``.
"""

from . import debug as debug
from ._dashboard import dashboard as dashboard
from ._dashboard import log_metric as log_metric
from ._version import __version__ as __version__
from .actor import Actor as Actor
from .actor import concurrent_endpoint as concurrent_endpoint
from .actor import endpoint as endpoint
from .actor_mesh import Accumulator as Accumulator
from .actor_mesh import ActorMesh as ActorMesh
from .actor_mesh import Endpoint as Endpoint
from .actor_mesh import as_endpoint as as_endpoint
from .actor_mesh import send as send
from .channel import Channel as Channel
from .channel import Port as Port
from .channel import PortReceiver as PortReceiver
from .context import Context as Context
from .context import Instance as Instance
from .context import context as context
from .context import current_actor_name as current_actor_name
from .context import current_rank as current_rank
from .context import current_size as current_size
from .debug import debug_controller as debug_controller
from .distributed import Mesh as Mesh
from .errors import ActorError as ActorError
from .errors import DeviceMeshError as DeviceMeshError
from .errors import MeshInternalError as MeshInternalError
from .errors import RemoteException as RemoteException
from .errors import RemoteTensorError as RemoteTensorError
from .errors import RemoteTraceback as RemoteTraceback
from .errors import SupervisionError as SupervisionError
from .future import Future as Future
from .proc_mesh import HostMesh as HostMesh
from .proc_mesh import ProcMesh as ProcMesh
from .proc_mesh import get_or_spawn_controller as get_or_spawn_controller
from .proc_mesh import heal_mesh as heal_mesh
from .proc_mesh import host_mesh as host_mesh
from .proc_mesh import shutdown_context as shutdown_context
from .proc_mesh import this_host as this_host
from .proc_mesh import this_proc as this_proc
from .rma import RDMAAction as RDMAAction
from .rma import RDMABuffer as RDMABuffer
from .rma import empty_fast as empty_fast
from .rma import empty_like_fast as empty_like_fast
from .rma_backend import RDMAReadTransferWarning as RDMAReadTransferWarning
from .rma_backend import RDMATcpFallbackWarning as RDMATcpFallbackWarning
from .rma_backend import RDMAWriteTransferWarning as RDMAWriteTransferWarning
from .rma_backend import get_rdma_backend as get_rdma_backend
from .rma_backend import is_ibverbs_available as is_ibverbs_available
from .rma_backend import is_rdma_available as is_rdma_available
from .shape import Extent as Extent
from .shape import Point as Point
from .shape import Shape as Shape
from .supervision import MeshFailure as MeshFailure
from .supervision import unhandled_fault_hook as unhandled_fault_hook
from .transport_names import ChannelTransport as ChannelTransport
from .transport_names import attach as attach
from .transport_names import attach_to_workers as attach_to_workers
from .transport_names import enable_transport as enable_transport
from .transport_names import hosts_from_config as hosts_from_config
from .transport_names import run_worker_loop_forever as run_worker_loop_forever
from .value_mesh import ValueMesh as ValueMesh

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "ChannelTransport",
    "Context",
    "DTensor",
    "DeviceMeshError",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "Mesh",
    "MeshFailure",
    "MeshInternalError",
    "Partial",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "Remote",
    "RemoteException",
    "RemoteTensorError",
    "RemoteTraceback",
    "Replicate",
    "Shape",
    "Shard",
    "SupervisionError",
    "Tensor",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "broadcast_",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "dashboard",
    "debug_controller",
    "distribute",
    "empty_fast",
    "empty_like_fast",
    "enable_transport",
    "endpoint",
    "fetch_shard",
    "gather",
    "get_active_mesh",
    "get_or_spawn_controller",
    "get_rdma_backend",
    "heal_mesh",
    "host_mesh",
    "hosts_from_config",
    "inspect",
    "is_ibverbs_available",
    "is_rdma_available",
    "log_metric",
    "module_to_mesh",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

#: The tensor engine's names (mpimesh.tensor): they import torch, so they load on first use.
_TENSOR = (
    "DTensor", "Partial", "Remote", "Replicate", "Shard", "Tensor", "broadcast_", "distribute", "fetch_shard", "gather",
    "get_active_mesh", "inspect", "module_to_mesh", "no_mesh", "reduce", "reduce_", "remote",
)


def __getattr__(name: str) -> object:
    # PEP 562: only the tensor engine's names, so that workers never import torch by importing mpimesh.
    if name in _TENSOR:
        from . import tensor

        return getattr(tensor, name)
    raise AttributeError(f"module 'mpimesh' has no attribute {name!r}")


def _fixup_module_metadata() -> None:
    # Public objects report `mpimesh` as their module (trio's
    # fixup_module_metadata): shorter reprs, and stable names in pickles.
    for name in __all__:
        if name in _TENSOR:
            continue
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("mpimesh."):
            obj.__module__ = "mpimesh"


_fixup_module_metadata()
del _fixup_module_metadata
