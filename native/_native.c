/* _native.c - the CPython module mpimesh._native: thin argument parsing
 * around the helpers in cuda_aware.c, and the frame path of wire.c, pump.c and post.c.  See mpimesh/_native.pyi. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "cuda_aware.h"
#include "fastpickle.h"
#include "lock.h"
#include "site.h"
#include "spin.h"
#include "wire.h"

/* MPI progress for ULFM's heartbeats, without the GIL (ulfm_beat.c). */
PyObject *mpimesh_ulfm_beat_start(PyObject *self, PyObject *args);
PyObject *mpimesh_ulfm_beat_stop(PyObject *self, PyObject *args);
PyObject *mpimesh_ulfm_beat_hold(PyObject *self, PyObject *args);
PyObject *mpimesh_ulfm_beat_release(PyObject *self, PyObject *args);

static PyObject *cuda_compile_time(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(mpimesh_cuda_compile_time());
}

static PyObject *built_with(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(mpimesh_built_with());
}

static PyObject *cuda_run_time(PyObject *self, PyObject *args) {
    const char *path;
    const char *how = "";
    int result;
    (void)self;
    if (!PyArg_ParseTuple(args, "s:cuda_run_time", &path)) return NULL;
    result = mpimesh_cuda_run_time(path, &how);
    return Py_BuildValue("(is)", result, how);
}

static PyMethodDef methods[] = {
    {"cuda_compile_time", cuda_compile_time, METH_NOARGS,
     "cuda_compile_time() -> int\n\n1 if the MPI headers said CUDA-aware at build time, 0 if not, -1 if they do not say."},
    {"built_with", built_with, METH_NOARGS,
     "built_with() -> str\n\nVendor and version of the MPI headers the extension was built with."},
    {"cuda_run_time", cuda_run_time, METH_VARARGS,
     "cuda_run_time(libpath) -> (int, str)\n\nAsk the already loaded libmpi at libpath: (1 yes, 0 no, -1 no query\n"
     "function, -2 not loaded; the function used)."},
    {"fast_dumps", mpimesh_fast_dumps_py, METH_O,
     "fast_dumps(frame) -> bytes | None\n\nThe pickle the send path writes itself for a frame of scalars;\n"
     "None: pickle.dumps's (native/fastpickle.c)."},
    {"fast_loads", mpimesh_fast_loads_py, METH_O,
     "fast_loads(data) -> (frame,) | None\n\nThe frame the receive path reads itself from such a pickle;\n"
     "None: pickle.loads's (native/fastpickle.c)."},
    {"spin_yield", mpimesh_spin_yield, METH_O,
     "spin_yield(flag) -> bool\n\nWhether spinning waiters yield the CPU every so many empty probes (native/spin.h);\n"
     "returns the setting before."},
    {"wire_bind", mpimesh_wire_bind, METH_VARARGS,
     "wire_bind(libpath, byte_handle, exc_type) -> None\n\nLook up the frame path's MPI functions in the loaded libmpi."},
    {"wire_probe", mpimesh_wire_probe, METH_VARARGS,
     "wire_probe(handles, tag, spin_ns) -> None | (index, source, bytes) | (index, -1, error_code)\n\n"
     "Receive one message of tag from any source of the communicators, probing up to spin_ns (GIL released)."},
    {"wire_isend", mpimesh_wire_isend, METH_VARARGS,
     "wire_isend(handle, data, dest, tag) -> None | request handle\n\nStart a send and test it once."},
    {"beat_start", mpimesh_beat_start, METH_VARARGS,
     "beat_start(handle, dest, tag, data, period, share) -> None\n\nStart the heartbeat thread: every period\n"
     "seconds in which the process used at least share of a core, send data to dest (no GIL needed)."},
    {"beat_stop", mpimesh_beat_stop, METH_NOARGS,
     "beat_stop() -> int\n\nStop the heartbeat thread (GIL released while it ends); the heartbeats it sent."},
    {"beat_sent", mpimesh_beat_sent, METH_NOARGS, "beat_sent() -> int\n\nHeartbeats sent so far."},
    {"ulfm_beat_start", mpimesh_ulfm_beat_start, METH_VARARGS,
     "ulfm_beat_start(libpath, self_handle, period, calls[, exit_bound]) -> None\n\nStart the thread that makes\n"
     "calls MPI_Iprobe on MPI_COMM_SELF every period seconds (no GIL): ULFM's heartbeats."},
    {"ulfm_beat_stop", mpimesh_ulfm_beat_stop, METH_VARARGS,
     "ulfm_beat_stop([bound]) -> int\n\nStop that thread (GIL released while it ends); the wakes on which it polled;\n"
     "TimeoutError, the thread still running, when its polls do not end within bound seconds."},
    {"ulfm_beat_hold", mpimesh_ulfm_beat_hold, METH_VARARGS,
     "ulfm_beat_hold(bound) -> None\n\nNo MPI call from that thread until ulfm_beat_release() (nestable);\n"
     "TimeoutError, not held, when its polls do not end within bound seconds."},
    {"ulfm_beat_release", mpimesh_ulfm_beat_release, METH_NOARGS,
     "ulfm_beat_release() -> None\n\nUndo one ulfm_beat_hold()."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mpimesh._native",
    "Native helpers of mpimesh: CUDA-aware MPI query, and the frame path's MPI calls.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (mpimesh_pump_add(m) < 0 || mpimesh_post_add(m) < 0 || mpimesh_site_add(m) < 0 ||
                      mpimesh_call_add(m) < 0 || mpimesh_callone_add(m) < 0 ||
                      mpimesh_getter_add(m) < 0 ||
                      mpimesh_lock_add(m) < 0)) Py_CLEAR(m);
    return m;
}
