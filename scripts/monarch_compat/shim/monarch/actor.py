"""``monarch.actor``'s public names (its ``__all__``), each mapped onto mpimesh's.

Monarch's names that mpimesh has no object for (``ProcId``, ``Uid``,
``default_bootstrap_cmd``, ``config``, ``get_meter``, ``span``, ``traced``) are
left out: the harness reports a use of one as a missing public name.
"""

from mpimesh import Accumulator as Accumulator
from mpimesh import Actor as Actor
from mpimesh import ActorError as ActorError
from mpimesh import Channel as Channel
from mpimesh import ChannelTransport as ChannelTransport
from mpimesh import Context as Context
from mpimesh import Endpoint as Endpoint
from mpimesh import Extent as Extent
from mpimesh import Future as Future
from mpimesh import HostMesh as HostMesh
from mpimesh import MeshFailure as MeshFailure
from mpimesh import Point as Point
from mpimesh import Port as Port
from mpimesh import PortReceiver as PortReceiver
from mpimesh import ProcMesh as ProcMesh
from mpimesh import ValueMesh as ValueMesh
from mpimesh import as_endpoint as as_endpoint
from mpimesh import attach as attach
from mpimesh import attach_to_workers as attach_to_workers
from mpimesh import concurrent_endpoint as concurrent_endpoint
from mpimesh import context as context
from mpimesh import current_actor_name as current_actor_name
from mpimesh import current_rank as current_rank
from mpimesh import current_size as current_size
from mpimesh import debug_controller as debug_controller
from mpimesh import enable_transport as enable_transport
from mpimesh import endpoint as endpoint
from mpimesh import get_or_spawn_controller as get_or_spawn_controller
from mpimesh import hosts_from_config as hosts_from_config
from mpimesh import run_worker_loop_forever as run_worker_loop_forever
from mpimesh import send as send
from mpimesh import shutdown_context as shutdown_context
from mpimesh import this_host as this_host
from mpimesh import this_proc as this_proc
from mpimesh import unhandled_fault_hook as unhandled_fault_hook
