/* wire.h - the frame path's MPI calls, made from C (see wire.c). */
#ifndef MPIMESH_WIRE_H
#define MPIMESH_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *mpimesh_wire_bind(PyObject *self, PyObject *args);
PyObject *mpimesh_wire_probe(PyObject *self, PyObject *args);
PyObject *mpimesh_wire_isend(PyObject *self, PyObject *args);

#endif /* MPIMESH_WIRE_H */
