/* wire.c - the frame path's MPI calls, made from C.
 *
 * mpi4py's improbe/Message.recv and Isend/Test build Python objects on every
 * call (a Message, a Status, a Request, a buffer wrapper).  These three
 * functions make the same MPI calls on the raw handles mpi4py hands out
 * (`comm.handle`), and build none:
 *
 *   wire_bind(libpath, byte_handle, exc_type)  look the functions up in the
 *       libmpi mpi4py already loaded (as cuda_aware.c does: this extension
 *       never links libmpi);
 *   wire_probe(handles, tag, spin_ns)  receive one message of `tag` from
 *       any source on any of the communicators, probing for up to spin_ns
 *       with the GIL released (and yielding the CPU every 32 probes), so
 *       that a waiting thread sees a message as soon as MPI does and other
 *       threads run meanwhile;
 *   wire_isend(handle, data, dest, tag)  start a send, test it once.
 *
 * The MPI types come from the headers this was built with: the Python side
 * (mpimesh/_transport/native.py) binds only when the loaded library is of the
 * same vendor and major version; otherwise the process gets the mpi4py wire.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"
#include "spin.h"

#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "compat.h"

typedef int (*improbe_fn)(int, int, MPI_Comm, int *, MPI_Message *, MPI_Status *);
typedef int (*mrecv_fn)(void *, int, MPI_Datatype, MPI_Message *, MPI_Status *);
typedef int (*get_count_fn)(const MPI_Status *, MPI_Datatype, int *);
typedef int (*isend_fn)(const void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *);
typedef int (*test_fn)(MPI_Request *, int *, MPI_Status *);
typedef int (*error_class_fn)(int, int *);

static improbe_fn p_improbe;
static mrecv_fn p_mrecv;
static get_count_fn p_get_count;
static isend_fn p_isend;
static test_fn p_test;
static error_class_fn p_error_class;
static MPI_Datatype byte_type;
static PyObject *exc_type; /* mpi4py's MPI.Exception: exc_type(error_code) */
static int bound;

/* mpi4py's handles are unsigned Python ints: a pointer (Open MPI), or an int
 * sign-extended to 64 bits (MPICH: 0xac000000 is 0xffffffffac000000). */
#define FROM_HANDLE(type, value) ((type)(intptr_t)(value))
#define TO_HANDLE(value) PyLong_FromSize_t((size_t)(intptr_t)(value))

static int as_handle(PyObject *obj, size_t *out) {
    *out = PyLong_AsSize_t(obj);
    return !(*out == (size_t)-1 && PyErr_Occurred());
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *mpi_error(int code) {
    PyObject *exc = PyObject_CallFunction(exc_type, "i", code);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *mpimesh_wire_bind(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *byte_obj, *exc;
    size_t byte_handle;
    void *lib;
    (void)self;
    if (!PyArg_ParseTuple(args, "sOO:wire_bind", &path, &byte_obj, &exc)) return NULL;
    if (!as_handle(byte_obj, &byte_handle)) return NULL;
#ifdef RTLD_NOLOAD
    lib = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
#else
    lib = NULL;
#endif
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "wire_bind: %s is not loaded in this process", path);
        return NULL;
    }
    p_improbe = (improbe_fn)dlsym(lib, "MPI_Improbe");
    p_mrecv = (mrecv_fn)dlsym(lib, "MPI_Mrecv");
    p_get_count = (get_count_fn)dlsym(lib, "MPI_Get_count");
    p_isend = (isend_fn)dlsym(lib, "MPI_Isend");
    p_test = (test_fn)dlsym(lib, "MPI_Test");
    p_error_class = (error_class_fn)dlsym(lib, "MPI_Error_class");
    dlclose(lib); /* mpi4py keeps it loaded */
    if (!p_improbe || !p_mrecv || !p_get_count || !p_isend || !p_test) {
        bound = 0;
        PyErr_Format(PyExc_OSError, "wire_bind: %s lacks one of MPI_Improbe, MPI_Mrecv, MPI_Get_count, "
                     "MPI_Isend, MPI_Test", path);
        return NULL;
    }
    byte_type = FROM_HANDLE(MPI_Datatype, byte_handle);
    Py_XDECREF(exc_type);
    Py_INCREF(exc);
    exc_type = exc;
    bound = 1;
    Py_RETURN_NONE;
}

#define CHECK_BOUND()                                                              \
    if (!bound) {                                                                  \
        PyErr_SetString(PyExc_RuntimeError, "mpimesh._native: wire_bind() first"); \
        return NULL;                                                               \
    }

int mpimesh_wire_comms(const char *who, PyObject *handles, MPI_Comm *comms) {
    Py_ssize_t n, i;
    if (!PyTuple_Check(handles)) {
        PyErr_Format(PyExc_TypeError, "%s: handles must be a tuple of communicator handles", who);
        return -1;
    }
    n = PyTuple_GET_SIZE(handles);
    if (n > MPIMESH_MAX_LINKS) {
        PyErr_Format(PyExc_ValueError, "%s: at most %d communicators, got %zd", who, MPIMESH_MAX_LINKS, n);
        return -1;
    }
    for (i = 0; i < n; i++) {
        size_t h;
        if (!as_handle(PyTuple_GET_ITEM(handles, i), &h)) return -1;
        comms[i] = FROM_HANDLE(MPI_Comm, h);
    }
    return (int)n;
}

int mpimesh_spin_yields = 1;

PyObject *mpimesh_spin_yield(PyObject *self, PyObject *flag) {
    int before = mpimesh_spin_yields, on = PyObject_IsTrue(flag);
    (void)self;
    if (on < 0) return NULL;
    mpimesh_spin_yields = on;
    return PyBool_FromLong(before);
}

int mpimesh_wire_receive(const MPI_Comm *comms, int n, int tag, long long spin_ns, int *index, int *source,
                         int *err, PyObject **data) {
    MPI_Message msg;
    MPI_Status status;
    int i, flag = 0, hit = -1, count = 0;
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "mpimesh._native: wire_bind() first");
        return -1;
    }
    *err = MPI_SUCCESS;
    /* Two rounds with the GIL held: Open MPI often matches a message only at
     * the probe after the one whose progress pulled it in.  One round for a
     * negative spin_ns (looking for more after a message). */
    for (int round = spin_ns < 0 ? 1 : 0; round < 2 && hit < 0 && *err == MPI_SUCCESS; round++) {
        for (i = 0; i < n; i++) {
            *err = p_improbe(MPI_ANY_SOURCE, tag, comms[i], &flag, &msg, &status);
            if (*err != MPI_SUCCESS || flag) { hit = i; break; }
        }
    }
    if (hit < 0 && spin_ns > 0 && n > 0) {
        int e = MPI_SUCCESS;
        Py_BEGIN_ALLOW_THREADS
        long long end = now_ns() + spin_ns;
        for (unsigned polls = 1; hit < 0; polls++) {
            for (i = 0; i < n; i++) {
                e = p_improbe(MPI_ANY_SOURCE, tag, comms[i], &flag, &msg, &status);
                if (e != MPI_SUCCESS || flag) { hit = i; break; }
            }
            if (hit >= 0 || (polls & 7) != 0) continue;
            if (now_ns() >= end) break;
            /* let the other processes of a crowded node run */
            if ((polls & 31) == 0 && mpimesh_spin_yields) sched_yield();
        }
        Py_END_ALLOW_THREADS
        *err = e;
    }
    if (hit < 0) return 0;
    *index = hit;
    if (*err != MPI_SUCCESS) return 2;
    *err = p_get_count(&status, byte_type, &count);
    if (*err != MPI_SUCCESS) return 2;
    *data = PyBytes_FromStringAndSize(NULL, count);
    if (*data == NULL) return -1; /* the matched message is lost; out of memory anyway */
    *err = p_mrecv(PyBytes_AS_STRING(*data), count, byte_type, &msg, &status);
    if (*err != MPI_SUCCESS) {
        Py_CLEAR(*data);
        return 2;
    }
    *source = status.MPI_SOURCE;
    return 1;
}

/* wire_probe(handles, tag, spin_ns) -> None | (index, source, bytes) | (index, -1, error_code) */
PyObject *mpimesh_wire_probe(PyObject *self, PyObject *args) {
    PyObject *handles, *data = NULL;
    int tag, n, index = -1, source = -1, err = MPI_SUCCESS;
    long long spin;
    MPI_Comm comms[MPIMESH_MAX_LINKS];
    (void)self;
    CHECK_BOUND();
    if (!PyArg_ParseTuple(args, "O!iL:wire_probe", &PyTuple_Type, &handles, &tag, &spin)) return NULL;
    n = mpimesh_wire_comms("wire_probe", handles, comms);
    if (n < 0) return NULL;
    switch (mpimesh_wire_receive(comms, n, tag, spin, &index, &source, &err, &data)) {
    case 0:
        Py_RETURN_NONE;
    case 1:
        return Py_BuildValue("(iiN)", index, source, data);
    case 2:
        return Py_BuildValue("(iii)", index, -1, err);
    default:
        return NULL;
    }
}

int mpimesh_wire_start(MPI_Comm comm, const void *buf, Py_ssize_t len, int dest, int tag, MPI_Request *req,
                       int *done) {
    int err;
    *done = 0;
    if (len > INT32_MAX) return MPI_ERR_COUNT;
    err = p_isend(buf, (int)len, byte_type, dest, tag, comm, req);
    if (err == MPI_SUCCESS) err = p_test(req, done, MPI_STATUS_IGNORE);
    return err;
}

int mpimesh_wire_test(MPI_Request *req, int *done) { return p_test(req, done, MPI_STATUS_IGNORE); }

int mpimesh_wire_error_class(int code) {
    int klass = code;
    if (p_error_class != NULL && p_error_class(code, &klass) != MPI_SUCCESS) klass = code;
    return klass;
}

PyObject *mpimesh_wire_error(int code) { return mpi_error(code); }

int mpimesh_wire_bound(void) {
    if (!bound) PyErr_SetString(PyExc_RuntimeError, "mpimesh._native: wire_bind() first");
    return bound;
}

int mpimesh_wire_handle(PyObject *obj, MPI_Comm *comm) {
    size_t h;
    if (!as_handle(obj, &h)) return 0;
    *comm = FROM_HANDLE(MPI_Comm, h);
    return 1;
}

/* wire_isend(handle, data, dest, tag) -> None (sent) | request handle (keep `data` alive until it completes) */
PyObject *mpimesh_wire_isend(PyObject *self, PyObject *args) {
    PyObject *handle_obj;
    size_t handle;
    Py_buffer buf;
    int dest, tag, flag = 0, err;
    MPI_Request req;
    (void)self;
    CHECK_BOUND();
    if (!PyArg_ParseTuple(args, "Oy*ii:wire_isend", &handle_obj, &buf, &dest, &tag)) return NULL;
    if (!as_handle(handle_obj, &handle)) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (buf.len > INT32_MAX) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_OverflowError, "wire_isend: a frame over 2 GiB");
        return NULL;
    }
    err = p_isend(buf.buf, (int)buf.len, byte_type, dest, tag, FROM_HANDLE(MPI_Comm, handle), &req);
    if (err == MPI_SUCCESS) err = p_test(&req, &flag, MPI_STATUS_IGNORE);
    PyBuffer_Release(&buf);
    if (err != MPI_SUCCESS) return mpi_error(err);
    if (flag) Py_RETURN_NONE;
    return TO_HANDLE(req);
}
