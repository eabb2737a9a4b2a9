/* site.h - the call sites the pump runs itself (site.c). */
#ifndef MPIMESH_SITE_H
#define MPIMESH_SITE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Take the SITE_CALL `frame` for the Site `site` (see site.c), for its
 * actor's thread to run once its idle wait returns: 1 taken, 0 declined (the
 * ordinary handler takes it), -1 a Python exception is set. */
int mpimesh_site_take(PyObject *site, PyObject *frame);

/* The Lane and Site types, added to the module by PyInit__native. */
int mpimesh_site_add(PyObject *module);

#endif /* MPIMESH_SITE_H */
