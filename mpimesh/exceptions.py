"""The errors a mesh raises, under the module name Monarch's programs import them from.

``from monarch.exceptions import DeviceMeshError`` becomes
``from mpimesh.exceptions import DeviceMeshError``; the same names are in
:mod:`mpimesh` itself.
"""

from .errors import ActorError as ActorError
from .errors import DeviceMeshError as DeviceMeshError
from .errors import SupervisionError as SupervisionError
from .supervision import MeshFailure as MeshFailure

__all__ = ["ActorError", "DeviceMeshError", "MeshFailure", "SupervisionError"]
