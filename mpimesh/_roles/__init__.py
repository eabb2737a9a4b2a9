"""What differs between rank 0 (the controller) and the other ranks (workers).

``base`` (what both roles share), ``controller`` and ``worker`` (the two
roles), ``liveness`` (the controller's watch on its workers), ``job_status``
(the job's exit status under ULFM), ``interactive`` (a controller that is a
Jupyter kernel or a prompt), and ``boot``, which builds a runtime and its
role and connects them.
"""
