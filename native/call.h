/* call.h - the controller's call_one() in C: call.c's CallSite, Replies and Spin, callone.c's CallOne. */
#ifndef MPIMESH_CALL_H
#define MPIMESH_CALL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* site.call(name, what, args) of a CallSite (call.c) from C, without a method lookup; any other
 * object's call method is called.  A OneReply, None (the Python path must take the call), or NULL
 * with an exception set. */
PyObject *mpimesh_callsite_call(PyObject *site, PyObject *name, PyObject *what, PyObject *args);

/* The types, added to the module by PyInit__native. */
int mpimesh_call_add(PyObject *module);
int mpimesh_callone_add(PyObject *module);

#endif /* MPIMESH_CALL_H */
