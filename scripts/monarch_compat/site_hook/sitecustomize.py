"""Installs the harness's stand-ins for Monarch's private modules in every process of a run.

The harness puts this folder on ``PYTHONPATH``, so the controller, its
isolated test processes and the workers they spawn (which import the test
modules to unpickle actor classes) all resolve ``monarch._src...`` alike.
"""

import compat_plugin  # noqa: F401
