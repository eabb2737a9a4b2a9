/* getter.c - Future.get() of a future that a reply settles while the caller spins, without a Python frame.
 *
 * B1 (issue 30) ends in fut.get(): Future.get's Python frame reads the
 * state, calls the spin in C (Spin.wait, call.c), reads the state again and
 * returns the result.  A Getter does the same in C for the common case and
 * calls the Python method for everything else:
 *
 *   Getter(spin, fallback, finished)   a method descriptor (Future.get)
 *       get(fut) -> the result: fut._result when fut._state is `finished`
 *           and fut._exception is None, after spin.wait(fut) when it is not
 *           yet (True: settled).  Anything else (a timeout or keywords, the
 *           spin declining, an exception, a cancelled future) is
 *           fallback(fut, ...), Future.get itself, which does all of it.
 *
 * Py_TPFLAGS_METHOD_DESCRIPTOR: fut.get() calls it with fut first, binding
 * nothing; fut.get as an attribute is a bound method as usual.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <structmember.h>

#include "addtype.h"
#include "call.h"

static PyObject *s_state, *s_exception, *s_result;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *spin, *fallback, *finished;
} Getter;

static int getter_traverse(Getter *self, visitproc visit, void *arg) {
    Py_VISIT(self->spin);
    Py_VISIT(self->fallback);
    Py_VISIT(self->finished);
    return 0;
}

static int getter_clear(Getter *self) {
    Py_CLEAR(self->spin);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->finished);
    return 0;
}

static void getter_dealloc(Getter *self) {
    PyObject_GC_UnTrack(self);
    getter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether fut._state is `finished`: 1, 0, or -1 with an exception set. */
static int finished(Getter *self, PyObject *fut) {
    PyObject *state = PyObject_GetAttr(fut, s_state);
    int rc;
    if (state == NULL) return -1;
    rc = state == self->finished ? 1 : PyObject_RichCompareBool(state, self->finished, Py_EQ);
    Py_DECREF(state);
    return rc;
}

/* fut._result if fut finished without an exception (new reference); NULL, no exception set, if not. */
static PyObject *result(Getter *self, PyObject *fut) {
    PyObject *exc;
    int done = finished(self, fut);
    if (done <= 0) return NULL;
    exc = PyObject_GetAttr(fut, s_exception);
    if (exc == NULL) return NULL;
    Py_DECREF(exc);
    return exc == Py_None ? PyObject_GetAttr(fut, s_result) : NULL;
}

static PyObject *getter_vectorcall(Getter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Getter: never initialised");
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL) {
        PyObject *fut = args[0], *got = result(self, fut);
        if (got != NULL || PyErr_Occurred()) return got;
        got = mpimesh_spin_wait(self->spin, fut);
        if (got == NULL) return NULL;
        Py_DECREF(got);
        if (got == Py_True) {
            got = result(self, fut);
            if (got != NULL || PyErr_Occurred()) return got;
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *getter_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int getter_init(Getter *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"spin", "fallback", "finished", NULL};
    PyObject *spin, *fallback, *done;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOU:Getter", names, &spin, &fallback, &done)) return -1;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Getter: fallback must be callable (Future.get)");
        return -1;
    }
    getter_clear(self);
    self->spin = Py_NewRef(spin);
    self->fallback = Py_NewRef(fallback);
    self->finished = Py_NewRef(done);
    self->vectorcall = (vectorcallfunc)getter_vectorcall;
    return 0;
}

static PyMemberDef getter_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Getter, fallback), READONLY, "the Python method it fronts (Future.get)"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *getter_get_doc(Getter *self, void *closure) {
    (void)closure;
    if (self->fallback == NULL) Py_RETURN_NONE;
    return PyObject_GetAttrString(self->fallback, "__doc__");
}

static PyGetSetDef getter_getset[] = {
    {"__doc__", (getter)getter_get_doc, NULL, "the Python method's docstring", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GetterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Getter",
    .tp_basicsize = sizeof(Getter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)getter_init,
    .tp_dealloc = (destructor)getter_dealloc,
    .tp_traverse = (traverseproc)getter_traverse,
    .tp_clear = (inquiry)getter_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = getter_descr_get,
    .tp_members = getter_members,
    .tp_getset = getter_getset,
    .tp_vectorcall_offset = offsetof(Getter, vectorcall),
};

PyObject *mpimesh_getter_new(PyObject *spin, PyObject *fallback, PyObject *finished) {
    return PyObject_CallFunctionObjArgs((PyObject *)&GetterType, spin, fallback, finished, NULL);
}

int mpimesh_getter_add(PyObject *module) {
    if ((s_state = PyUnicode_InternFromString("_state")) == NULL ||
        (s_exception = PyUnicode_InternFromString("_exception")) == NULL ||
        (s_result = PyUnicode_InternFromString("_result")) == NULL)
        return -1;
    return mpimesh_add_type(module, "Getter", &GetterType);
}
