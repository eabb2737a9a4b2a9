/* _native.c - the CPython module mpimesh._native: thin argument parsing
 * around the helpers in cuda_aware.c.  See mpimesh/_native.pyi. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cuda_aware.h"

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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mpimesh._native",
    "Native helpers of mpimesh: CUDA-aware MPI query (compile time and run time).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
