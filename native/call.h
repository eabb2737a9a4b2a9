/* call.h - the controller's call_one() in C: call.c's CallSite, Replies and Spin, callone.c's CallOne. */
#ifndef MPIMESH_CALL_H
#define MPIMESH_CALL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* site.call(name, what, args) of a CallSite (call.c) from C, without a method lookup; any other
 * object's call method is called.  A OneReply, None (the Python path must take the call), or NULL
 * with an exception set. */
PyObject *mpimesh_callsite_call(PyObject *site, PyObject *name, PyObject *what, PyObject *args);

/* spin.wait(fut) of a Spin (call.c) from C: True (settled), False (not covered by the spin), NULL with
 * an exception set; any other object is called. */
PyObject *mpimesh_spin_wait(PyObject *spin, PyObject *fut);

/* A Getter (getter.c): Future.get in C over spin (a Spin), fallback (Future.get) for what it does not cover. */
PyObject *mpimesh_getter_new(PyObject *spin, PyObject *fallback, PyObject *finished);

/* The types, added to the module by PyInit__native. */
int mpimesh_call_add(PyObject *module);
int mpimesh_callone_add(PyObject *module);
int mpimesh_getter_add(PyObject *module);

#endif /* MPIMESH_CALL_H */
