/* wire.h - the frame path's MPI calls, made from C (see wire.c). */
#ifndef MPIMESH_WIRE_H
#define MPIMESH_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "compat.h"

/* The most communicators one probe looks at. */
#define MPIMESH_MAX_LINKS 64

PyObject *mpimesh_wire_bind(PyObject *self, PyObject *args);
PyObject *mpimesh_wire_probe(PyObject *self, PyObject *args);
PyObject *mpimesh_wire_isend(PyObject *self, PyObject *args);

/* The communicators of a tuple of mpi4py handles into comms; returns how
 * many, or -1 with an exception set whose message starts with who. */
int mpimesh_wire_comms(const char *who, PyObject *handles, MPI_Comm *comms);

/* Receive one message of tag from any source of comms[0..n), probing as
 * wire_probe does.  Returns 1 (*index, *source and *data, a new bytes
 * reference, are set), 0 (nothing arrived), 2 (MPI error *err on link
 * *index) or -1 (a Python exception is set). */
int mpimesh_wire_receive(const MPI_Comm *comms, int n, int tag, long long spin_ns, int *index, int *source,
                         int *err, PyObject **data);

/* Start a send of len bytes and test it once (*done); returns an MPI error code. */
int mpimesh_wire_start(MPI_Comm comm, const void *buf, Py_ssize_t len, int dest, int tag, MPI_Request *req,
                       int *done);
/* Test a send (*done); returns an MPI error code. */
int mpimesh_wire_test(MPI_Request *req, int *done);
/* The class of an MPI error code. */
int mpimesh_wire_error_class(int code);
/* Raise mpi4py's MPI.Exception(code); returns NULL. */
PyObject *mpimesh_wire_error(int code);
/* Whether wire_bind() succeeded; if not, a RuntimeError is set. */
int mpimesh_wire_bound(void);
/* An mpi4py communicator handle (an int) to the communicator; 0 with an exception set if not one. */
int mpimesh_wire_handle(PyObject *obj, MPI_Comm *comm);

/* sender.post(out, frame, polls) of a Sender (post.c), called from C without a method lookup; any other
 * object's post method is called.  NULL with an exception set. */
PyObject *mpimesh_sender_post(PyObject *sender, PyObject *out, PyObject *frame, PyObject *polls);

/* The heartbeat thread (beat.c). */
PyObject *mpimesh_beat_start(PyObject *self, PyObject *args);
PyObject *mpimesh_beat_stop(PyObject *self, PyObject *args);
PyObject *mpimesh_beat_sent(PyObject *self, PyObject *args);

/* The Pump type (pump.c) and the Out and Sender types (post.c), added to the
 * module by PyInit__native. */
int mpimesh_pump_add(PyObject *module);
int mpimesh_post_add(PyObject *module);

#endif /* MPIMESH_WIRE_H */
