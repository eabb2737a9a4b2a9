/* callone.c - Endpoint.call_one(*args) of a single-actor mesh, without a Python frame.
 *
 * B1 (issue 30) is one call_one(x).get() of a no-op.  Its call in C
 * (CallSite.call, call.c) cost 6.6 us; the Python frames in front of it
 * (Endpoint.call_one -> _send -> _ready -> MeshRef.cast_one) 4-5 us more.
 * One object per endpoint does what those frames do for the common case:
 *
 *   CallOne(fallback, mesh, fast, method, name, what, arities, atoms)
 *       call_one(*args) -> OneReply
 *           No keywords, at most 32 arguments, each of a type in `atoms`;
 *           the count in `arities` (the signature check passed it before)
 *           unless `arities` is None (no check); the mesh (`mesh._stopped`)
 *           not stopped; a CallSite in `fast` (MeshRef._fast) under
 *           `method`: then fast.call(name, what, args).  Anything else, or
 *           a None from that call, is fallback(*args, **kwargs): the class's
 *           Endpoint.call_one, bound, with every error of today's path.
 *
 * Every condition is checked on every call, so a mesh stopped, an actor
 * dead or a route changed (the CallSite answers None, or MeshRef drops it
 * from `fast`) takes the Python path as before.  The endpoint holds this
 * object and the object holds the endpoint (through `fallback`): the cycle
 * is visible to the GC (tp_traverse).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <structmember.h>

#include "call.h"

static PyObject *s_stopped;

typedef struct {
    PyObject_HEAD
    PyObject *fallback, *mesh, *fast, *method, *name, *what, *arities, *atoms;
    vectorcallfunc vectorcall;
    unsigned long long counts; /* bit n: n arguments found in arities (which only grows), or it is None */
    unsigned char common;      /* which of int, float, str, None, bool (COMMON_TYPES) are in atoms */
} CallOne;

#define COMMON_TYPES 5
static PyTypeObject *const common_types[COMMON_TYPES] = {&PyLong_Type, &PyFloat_Type, &PyUnicode_Type,
                                                         (PyTypeObject *)NULL /* NoneType */, &PyBool_Type};

static int callone_traverse(CallOne *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    Py_VISIT(self->mesh);
    Py_VISIT(self->fast);
    Py_VISIT(self->method);
    Py_VISIT(self->name);
    Py_VISIT(self->what);
    Py_VISIT(self->arities);
    Py_VISIT(self->atoms);
    return 0;
}

static int callone_clear(CallOne *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->mesh);
    Py_CLEAR(self->fast);
    Py_CLEAR(self->method);
    Py_CLEAR(self->name);
    Py_CLEAR(self->what);
    Py_CLEAR(self->arities);
    Py_CLEAR(self->atoms);
    return 0;
}

static void callone_dealloc(CallOne *self) {
    PyObject_GC_UnTrack(self);
    callone_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject *common_type(int i) { return common_types[i] != NULL ? common_types[i] : Py_TYPE(Py_None); }

/* Whether an argument's type is one of `atoms` (serialize.ATOMS): the common ones without a set lookup. */
static int atom(CallOne *self, PyObject *arg) {
    PyTypeObject *type = Py_TYPE(arg);
    for (int i = 0; i < COMMON_TYPES; i++)
        if (type == common_type(i)) return (self->common >> i) & 1;
    return PySet_Contains(self->atoms, (PyObject *)type);
}

/* 1: the fast path may take the call; 0: the Python path must; -1: an error. */
static int plain(CallOne *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *stopped;
    int truth;
    Py_ssize_t i;
    if (nargs > 32) return 0;
    if (!(self->counts >> nargs & 1)) {
        /* an arity not seen yet: the Python path adds it to arities once its signature check passed */
        PyObject *n = PyLong_FromSsize_t(nargs);
        if (n == NULL) return -1;
        truth = PySet_Contains(self->arities, n);
        Py_DECREF(n);
        if (truth <= 0) return truth;
        self->counts |= 1ULL << nargs;
    }
    for (i = 0; i < nargs; i++) {
        truth = atom(self, args[i]);
        if (truth <= 0) return truth;
    }
    stopped = PyObject_GetAttr(self->mesh, s_stopped);
    if (stopped == NULL) return -1;
    truth = PyObject_IsTrue(stopped);
    Py_DECREF(stopped);
    if (truth < 0) return -1;
    return !truth;
}

static PyObject *callone_vectorcall(CallOne *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CallOne: never initialised");
        return NULL;
    }
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        int ok = plain(self, args, nargs);
        if (ok < 0) return NULL;
        if (ok) {
            PyObject *site = PyDict_GetItemWithError(self->fast, self->method); /* borrowed */
            if (site == NULL && PyErr_Occurred()) return NULL;
            if (site != NULL) {
                PyObject *made, *tuple = PyTuple_New(nargs);
                Py_ssize_t i;
                if (tuple == NULL) return NULL;
                for (i = 0; i < nargs; i++) {
                    Py_INCREF(args[i]);
                    PyTuple_SET_ITEM(tuple, i, args[i]);
                }
                Py_INCREF(site);
                made = mpimesh_callsite_call(site, self->name, self->what, tuple);
                Py_DECREF(site);
                Py_DECREF(tuple);
                if (made == NULL || made != Py_None) return made;
                Py_DECREF(made);
            }
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *callone_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static int callone_init(CallOne *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fallback", "mesh", "fast", "method", "name", "what", "arities", "atoms", NULL};
    PyObject *v[8];
    int i;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!UUUOO!:CallOne", names, &v[0], &v[1], &PyDict_Type, &v[2],
                                     &v[3], &v[4], &v[5], &v[6], &PyFrozenSet_Type, &v[7]))
        return -1;
    if (v[6] != Py_None && !PySet_Check(v[6])) {
        PyErr_SetString(PyExc_TypeError, "CallOne: arities must be a set or None");
        return -1;
    }
    self->counts = v[6] == Py_None ? ~0ULL : 0; /* found in arities as calls come */
    {
        unsigned char common = 0;
        for (int k = 0; k < COMMON_TYPES; k++) {
            int in = PySet_Contains(v[7], (PyObject *)common_type(k));
            if (in < 0) return -1;
            if (in) common |= (unsigned char)(1 << k);
        }
        self->common = common;
    }
    for (i = 0; i < 8; i++) Py_INCREF(v[i]);
    callone_clear(self);
    self->fallback = v[0];
    self->mesh = v[1];
    self->fast = v[2];
    self->method = v[3];
    self->name = v[4];
    self->what = v[5];
    self->arities = v[6];
    self->atoms = v[7];
    return 0;
}

static PyObject *callone_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    CallOne *self = (CallOne *)type->tp_alloc(type, 0);
    (void)args;
    (void)kwds;
    if (self != NULL) self->vectorcall = (vectorcallfunc)callone_vectorcall;
    return (PyObject *)self;
}

static PyMemberDef callone_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CallOne, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CallOneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.CallOne",
    .tp_doc = "CallOne(fallback, mesh, fast, method, name, what, arities, atoms)\n\n"
              "An endpoint's call_one(*args) through a registered CallSite, else fallback (native/callone.c).",
    .tp_basicsize = sizeof(CallOne),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = callone_new,
    .tp_init = (initproc)callone_init,
    .tp_dealloc = (destructor)callone_dealloc,
    .tp_traverse = (traverseproc)callone_traverse,
    .tp_clear = (inquiry)callone_clear,
    .tp_call = callone_call,
    .tp_vectorcall_offset = offsetof(CallOne, vectorcall),
    .tp_members = callone_members,
};

int mpimesh_callone_add(PyObject *module) {
    if ((s_stopped = PyUnicode_InternFromString("_stopped")) == NULL) return -1;
    if (PyType_Ready(&CallOneType) < 0) return -1;
    Py_INCREF(&CallOneType);
    if (PyModule_AddObject(module, "CallOne", (PyObject *)&CallOneType) < 0) {
        Py_DECREF(&CallOneType);
        return -1;
    }
    return 0;
}
