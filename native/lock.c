/* lock.c - a threading.Lock that the native part takes without a Python call.
 *
 * The router's locks (NativeWire.lock, the pump's; NativeWire.send_lock,
 * Sender.post's) are taken on every frame.  Python's _thread.lock parses
 * its arguments on each acquire (tens of ns, on both legs of B1's round
 * trip, issue 30); this one is the same lock for Python code and a C call
 * for C code:
 *
 *   Lock()   acquire(blocking=True, timeout=-1) -> bool, release(),
 *       locked() -> bool, and the context manager, as threading.Lock: a
 *       blocking acquire waits with the GIL released and runs the signal
 *       handlers when a signal interrupts it (Ctrl-C reaches a thread
 *       blocked on it); release() of a lock not held raises RuntimeError.
 *
 * mpimesh_lock_take and mpimesh_lock_give (lock.h) take and give back a
 * Lock from C, and any other lock through its acquire and release methods.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include "addtype.h"
#include "clock.h"
#include "lock.h"
#include "pythread.h"

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
} Lock;

static PyTypeObject LockType;

static void lock_dealloc(Lock *self) {
    if (self->lock != NULL) {
        if (self->locked) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Lock *self;
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    self = (Lock *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "Lock: cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

/* Take the lock, waiting at most `timeout` seconds (< 0: for ever) with the GIL released; 1 taken, 0 not in
 * time, -1 with an exception set (a signal handler raised). */
static int take_timed(Lock *self, double timeout) {
    double deadline = timeout < 0 ? 0 : mpimesh_monotonic() + timeout;
    for (;;) {
        PY_TIMEOUT_T us = -1;
        PyLockStatus got;
        if (timeout >= 0) {
            double left = deadline - mpimesh_monotonic();
            us = left > 0 ? (PY_TIMEOUT_T)(left * 1e6) : 0;
        }
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock_timed(self->lock, us, 1);
        Py_END_ALLOW_THREADS
        if (got == PY_LOCK_ACQUIRED) return 1;
        if (got == PY_LOCK_FAILURE) return 0;
        /* PY_LOCK_INTR: a signal; its Python handler runs now (a KeyboardInterrupt propagates) */
        if (Py_MakePendingCalls() < 0) return -1;
        if (timeout >= 0 && mpimesh_monotonic() >= deadline)
            return PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED;
    }
}

/* acquire(blocking=True, timeout=-1) -> bool */
static PyObject *lock_acquire(Lock *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int blocking = 1, rc;
    double timeout = -1;
    PyObject *given[2] = {NULL, NULL};
    Py_ssize_t i, nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs == 0 && nkw == 0 && PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED) {
        self->locked = 1; /* the common case: free, no argument */
        Py_RETURN_TRUE;
    }
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "acquire() takes at most 2 arguments (%zd given)", nargs);
        return NULL;
    }
    for (i = 0; i < nargs; i++) given[i] = args[i];
    for (i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int at = PyUnicode_CompareWithASCIIString(name, "blocking") == 0  ? 0
                 : PyUnicode_CompareWithASCIIString(name, "timeout") == 0 ? 1
                                                                          : -1;
        if (at < 0 || given[at] != NULL) {
            PyErr_Format(PyExc_TypeError, at < 0 ? "acquire() got an unexpected keyword argument '%U'"
                                                 : "acquire() got multiple values for argument '%U'",
                         name);
            return NULL;
        }
        given[at] = args[nargs + i];
    }
    if (given[0] != NULL && (blocking = PyObject_IsTrue(given[0])) < 0) return NULL;
    if (given[1] != NULL && (timeout = PyFloat_AsDouble(given[1])) == -1 && PyErr_Occurred()) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout > (double)PY_TIMEOUT_MAX / 1e6) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    if (PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED) {
        rc = 1;
    } else if (!blocking) {
        rc = 0;
    } else {
        rc = take_timed(self, timeout);
        if (rc < 0) return NULL;
    }
    if (rc) self->locked = 1;
    return PyBool_FromLong(rc);
}

static PyObject *lock_release(Lock *self, PyObject *unused) {
    (void)unused;
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    Py_RETURN_NONE;
}

static PyObject *lock_locked(Lock *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(self->locked);
}

static PyObject *lock_exit(Lock *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    return lock_release(self, NULL);
}

static PyObject *lock_repr(Lock *self) {
    return PyUnicode_FromFormat("<%s %s object at %p>", self->locked ? "locked" : "unlocked", Py_TYPE(self)->tp_name,
                                (void *)self);
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool\n\nTake the lock, as threading.Lock.acquire."},
    {"release", (PyCFunction)lock_release, METH_NOARGS, "release()\n\nGive the lock back; RuntimeError if not held."},
    {"locked", (PyCFunction)lock_locked, METH_NOARGS, "locked() -> bool\n\nWhether the lock is held."},
    {"__enter__", (PyCFunction)(void (*)(void))lock_acquire, METH_FASTCALL | METH_KEYWORDS, "acquire()"},
    {"__exit__", (PyCFunction)(void (*)(void))lock_exit, METH_FASTCALL, "release()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Lock()\n\nA threading.Lock that the native part takes without a Python call (see native/lock.c).",
    .tp_new = lock_new,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_repr = (reprfunc)lock_repr,
    .tp_methods = lock_methods,
};

int mpimesh_lock_take(PyObject *lock, PyObject *acquire) {
    PyObject *rc;
    if (Py_IS_TYPE(lock, &LockType)) {
        Lock *self = (Lock *)lock;
        int got = PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED;
        if (!got && (got = take_timed(self, -1)) < 0) return -1;
        self->locked = 1;
        return 0;
    }
    rc = PyObject_CallNoArgs(acquire);
    if (rc == NULL) return -1;
    Py_DECREF(rc);
    return 0;
}

int mpimesh_lock_give(PyObject *lock, PyObject *release) {
    PyObject *rc;
    if (Py_IS_TYPE(lock, &LockType)) {
        rc = lock_release((Lock *)lock, NULL);
    } else {
        rc = PyObject_CallNoArgs(release);
    }
    if (rc == NULL) return -1;
    Py_DECREF(rc);
    return 0;
}

int mpimesh_lock_add(PyObject *module) {
    return mpimesh_add_type(module, "Lock", &LockType);
}
