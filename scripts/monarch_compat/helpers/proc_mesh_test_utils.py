"""The harness's ``proc_mesh_test_utils``, used in place of Monarch's test helper.

Monarch's autouse fixture stops, after each test, the process meshes the
test left running (through private state and config keys).  Monarch's public
``shutdown_context()`` does that here.
"""

import pytest
from monarch.actor import shutdown_context


@pytest.fixture(autouse=True)
def stop_all_proc_meshes():
    """Stop the process meshes a test left running."""
    yield
    shutdown_context().get(timeout=60)
