/* site.h - the call sites the pump runs itself (site.c). */
#ifndef MPIMESH_SITE_H
#define MPIMESH_SITE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Take the SITE_CALL `frame` for the Site `site` (see site.c), for its
 * actor's thread to run once its idle wait returns: 1 taken, 0 declined (the
 * ordinary handler takes it), -1 a Python exception is set. */
int mpimesh_site_take(PyObject *site, PyObject *frame);

/* A Lane's idle wait, served in C by Spin.serve (call.c): whether `obj` is a
 * Lane; set its `armed`; whether it holds a call taken and not yet run; its
 * mailbox's length (-1 with an exception set); run the call taken (Lane.run:
 * a new reference to True or False, NULL with an exception set). */
int mpimesh_lane_check(PyObject *obj);
void mpimesh_lane_arm(PyObject *lane, int armed);
int mpimesh_lane_taken(PyObject *lane);
Py_ssize_t mpimesh_lane_mail(PyObject *lane);
PyObject *mpimesh_lane_run(PyObject *lane);

/* The Lane and Site types, added to the module by PyInit__native. */
int mpimesh_site_add(PyObject *module);

#endif /* MPIMESH_SITE_H */
