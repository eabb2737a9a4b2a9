"""One job, one 2 x 2 dp x tp Mesh, three checks: global_view_job, module_sgd_job, module_buckets_job.

Each check ran as a job of its own, each paying for a controller and four spawned workers that import
torch.  Here each is a section: ``== NAME`` opens it, ``== NAME ok``, or a traceback and ``== NAME FAILED``,
close it, and a failed section does not stop the ones after it (tests/tensor/shared_job_run.py
hands each test its own section).  The global view goes first, on fresh processes as before: it pins
what a cold tensor engine does (its caches, poison, freeing).  ``done`` ends the job.
"""

import sys
import traceback

import global_view_job
import module_buckets_job
import module_sgd_job

from mpimesh.distributed import Mesh

mesh = Mesh(shape=(2, 2), mesh_dim_names=("dp", "tp"))
for section in (global_view_job, module_sgd_job, module_buckets_job):
    print("==", section.__name__, flush=True)
    try:
        section.check(mesh)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        print("==", section.__name__, "FAILED", flush=True)
    else:
        print("==", section.__name__, "ok", flush=True)
mesh.stop().get()
print("done")
