/* lock.h - the native Lock (lock.c), taken and given back from C. */
#ifndef MPIMESH_LOCK_H
#define MPIMESH_LOCK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Take `lock`, waiting as long as it takes (the GIL released while it waits): a native Lock directly, any
 * other through `acquire` (its bound acquire method).  0, or -1 with an exception set. */
int mpimesh_lock_take(PyObject *lock, PyObject *acquire);

/* Give `lock` back: a native Lock directly, any other through `release`.  0, or -1 with an exception set. */
int mpimesh_lock_give(PyObject *lock, PyObject *release);

/* The Lock type, added to the module by PyInit__native. */
int mpimesh_lock_add(PyObject *module);

#endif /* MPIMESH_LOCK_H */
