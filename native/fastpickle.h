/* fastpickle.h - the pickles of frames of scalars, written and read without the pickle module (fastpickle.c). */
#ifndef MPIMESH_FASTPICKLE_H
#define MPIMESH_FASTPICKLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The pickle of `obj` if it is a frame of scalars (a new bytes); NULL without
 * an exception for anything else (pickle.dumps's), NULL with one on error. */
PyObject *mpimesh_fast_dumps(PyObject *obj);

/* The object of a pickle that holds only what mpimesh_fast_dumps writes (a
 * new reference); NULL without an exception for anything else
 * (pickle.loads's, malformed data included), NULL with one on error. */
PyObject *mpimesh_fast_loads(const char *data, Py_ssize_t len);

/* fast_dumps(obj) -> bytes | None and fast_loads(bytes) -> (object,) | None, for tests. */
PyObject *mpimesh_fast_dumps_py(PyObject *self, PyObject *obj);
PyObject *mpimesh_fast_loads_py(PyObject *self, PyObject *data);

#endif /* MPIMESH_FASTPICKLE_H */
