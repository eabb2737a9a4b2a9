"""What differs between rank 0 (the controller) and the other ranks (workers).

``base`` (what both roles share), ``controller`` and ``worker`` (the two
roles).  The controller is a thin role over ``procs`` (its table of
workers), ``pool`` (the launch pool's ranks and placement), ``islands``
(spawned processes and their links), ``hostwatchers`` (who watches the
workers of other hosts; ``hostwatch`` is the worker's side) and
``end_of_job`` (every way a job ends, in bounded steps).  ``liveness`` (the
controller's watch on its workers), ``exits`` (how a process ended),
``job_status`` (the job's exit status under ULFM), ``interactive`` (a
controller that is a Jupyter kernel or a prompt), and ``boot``, which builds
a runtime and its role and connects them.
"""
