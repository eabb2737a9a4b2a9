/* post.c - the router's send path in C, for a frame that leaves at once.
 *
 * NativeWire.send (mpimesh/_transport/wire_native.py) hands a frame here.
 * One call does what Mpi4pyWire.send and Outbox.post (mpimesh/_transport/outbox.py)
 * do in Python for such a frame: pickle it, then, under the send lock, count
 * it, look at its destination's coalescing state, start the send and test it,
 * ring a doorbell after a pause and reap the sends still in flight, with no
 * Python step in between (docs/design/transport.md, "Two I/O paths, one choice"):
 *
 *   Out(link, rank)  one destination's coalescing state (the router keeps
 *       one per process it sends to): `frames` held back for a batch, when
 *       it was `last` sent to, and the router's poll count (`polls`) then;
 *       Python's batching code (Outbox._hold, _release, flush) reads and
 *       writes the same members;
 *   Sender(lock, tag, batching, burst, ring_after, failed_classes)
 *       sender.post(out, frame, polls) -> None | bytes
 *           pickles the frame and, under `lock`, sends it unless it must
 *           wait: frames are held for `out` already, or it follows the last
 *           send to `out` within `burst` seconds with no poll in between
 *           (`polls` unchanged) and `batching` is on.  Then it returns the
 *           pickle, for Outbox.post to hold.  After a pause of `ring_after`
 *           seconds, calls `sender.ring(out)` (under the lock).  Sends that
 *           do not complete at once are kept, with their bytes, until
 *           `reap()` (called by every post) finds them complete.
 *       sender.reap() -> int   the sends still in flight.
 *
 * An MPI error raises mpi4py's MPI.Exception; a send that completes with an
 * error of one of `failed_classes` (a peer died, ULFM) is dropped, as
 * Outbox._reap does.
 */
#include "wire.h"

#include <stddef.h>
#include <structmember.h>
#include <time.h>

#include "clock.h"
#include "fastpickle.h"
#include "lock.h"

static PyObject *str_post; /* "post", for a sender that is not a Sender */

/* --- Out ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *link;   /* the router's Link */
    PyObject *frames; /* list of pickled frames held back */
    MPI_Comm comm;
    int rank;
    double last;
    long long polls;
} Out;

static int out_traverse(Out *self, visitproc visit, void *arg) {
    Py_VISIT(self->link);
    Py_VISIT(self->frames);
    return 0;
}

static int out_clear(Out *self) {
    Py_CLEAR(self->link);
    Py_CLEAR(self->frames);
    return 0;
}

static void out_dealloc(Out *self) {
    PyObject_GC_UnTrack(self);
    out_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int out_init(Out *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"link", "rank", NULL};
    PyObject *link, *handle, *frames;
    int rank, ok;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi:Out", names, &link, &rank)) return -1;
    handle = PyObject_GetAttrString(link, "handle");
    if (handle == NULL) return -1;
    ok = mpimesh_wire_handle(handle, &self->comm);
    Py_DECREF(handle);
    if (!ok) return -1;
    frames = PyList_New(0);
    if (frames == NULL) return -1;
    Py_INCREF(link);
    Py_XSETREF(self->link, link);
    Py_XSETREF(self->frames, frames);
    self->rank = rank;
    self->last = 0.0;
    self->polls = -1;
    return 0;
}

static PyObject *out_get_frames(Out *self, void *closure) {
    (void)closure;
    if (self->frames == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the Out was never initialised");
        return NULL;
    }
    Py_INCREF(self->frames);
    return self->frames;
}

static int out_set_frames(Out *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL || !PyList_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Out.frames must be a list");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->frames, value);
    return 0;
}

static PyGetSetDef out_getset[] = {
    {"frames", (getter)out_get_frames, (setter)out_set_frames, "pickled frames held back for a batch", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef out_members[] = {
    {"link", T_OBJECT, offsetof(Out, link), READONLY, "the link the destination is reached through"},
    {"rank", T_INT, offsetof(Out, rank), READONLY, "the destination's rank on the link"},
    {"last", T_DOUBLE, offsetof(Out, last), 0, "when a frame last left for it (time.monotonic)"},
    {"polls", T_LONGLONG, offsetof(Out, polls), 0, "the router's poll count then"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject OutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Out",
    .tp_basicsize = sizeof(Out),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Out(link, rank): frames waiting to leave for one process, and when it was last sent to.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)out_init,
    .tp_dealloc = (destructor)out_dealloc,
    .tp_traverse = (traverseproc)out_traverse,
    .tp_clear = (inquiry)out_clear,
    .tp_members = out_members,
    .tp_getset = out_getset,
};

/* --- Sender --------------------------------------------------------------- */

typedef struct {
    MPI_Request req;
    PyObject *data; /* kept alive until the send completes */
} Flight;

typedef struct {
    PyObject_HEAD
    PyObject *lock, *acquire, *release; /* the send lock, and its bound methods */
    PyObject *dumps, *protocol;  /* pickle.dumps, 5 */
    PyObject *ring;              /* ring(out), or None */
    int *failed;                 /* MPI error classes of a failed peer */
    int nfailed;
    int tag, batching;
    double burst, ring_after;
    long long frames_out;
    double sent_at;
    Flight *flights; /* sends in flight, oldest first: [head, count) */
    Py_ssize_t head, count, cap;
} Sender;

static int sender_traverse(Sender *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->dumps);
    Py_VISIT(self->protocol);
    Py_VISIT(self->ring);
    for (Py_ssize_t i = self->head; i < self->count; i++) Py_VISIT(self->flights[i].data);
    return 0;
}

static int sender_clear(Sender *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->dumps);
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->ring);
    return 0;
}

static void sender_dealloc(Sender *self) {
    PyObject_GC_UnTrack(self);
    sender_clear(self);
    /* Sends still in flight keep their requests: the process is ending. */
    for (Py_ssize_t i = self->head; i < self->count; i++) Py_XDECREF(self->flights[i].data);
    PyMem_Free(self->flights);
    PyMem_Free(self->failed);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int sender_init(Sender *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"lock", "tag", "batching", "burst", "ring_after", "failed_classes", NULL};
    PyObject *lock, *failed, *pickle;
    Py_ssize_t i, n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OipddO!:Sender", names, &lock, &self->tag, &self->batching,
                                     &self->burst, &self->ring_after, &PyTuple_Type, &failed))
        return -1;
    if (!mpimesh_wire_bound()) return -1;
    sender_clear(self);
    n = PyTuple_GET_SIZE(failed);
    PyMem_Free(self->failed);
    self->failed = PyMem_Calloc((size_t)n + 1, sizeof(int));
    if (self->failed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        self->failed[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(failed, i));
        if (self->failed[i] == -1 && PyErr_Occurred()) return -1;
    }
    self->nfailed = (int)n;
    Py_INCREF(lock);
    self->lock = lock;
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = PyObject_GetAttrString(lock, "release");
    if (self->acquire == NULL || self->release == NULL) return -1;
    pickle = PyImport_ImportModule("pickle");
    if (pickle == NULL) return -1;
    self->dumps = PyObject_GetAttrString(pickle, "dumps");
    Py_DECREF(pickle);
    self->protocol = PyLong_FromLong(5);
    if (self->dumps == NULL || self->protocol == NULL) return -1;
    Py_INCREF(Py_None);
    self->ring = Py_None;
    return 0;
}

static int is_failed_class(Sender *self, int code) {
    int klass = mpimesh_wire_error_class(code);
    for (int i = 0; i < self->nfailed; i++)
        if (self->failed[i] == klass) return 1;
    return 0;
}

/* Drop the completed sends at the front (lock held); -1 with MPI.Exception set on an error. */
static int reap(Sender *self) {
    while (self->head < self->count) {
        Flight *f = &self->flights[self->head];
        int done = 0, err = mpimesh_wire_test(&f->req, &done);
        if (err != MPI_SUCCESS) {
            if (!is_failed_class(self, err)) {
                mpimesh_wire_error(err);
                return -1;
            }
            done = 1; /* a dead peer: liveness reports it */
        }
        if (!done) break;
        Py_CLEAR(f->data);
        self->head++;
    }
    if (self->head == self->count) self->head = self->count = 0;
    return 0;
}

static int keep(Sender *self, MPI_Request req, PyObject *data) {
    if (self->count == self->cap) {
        if (self->head > 0) {
            memmove(self->flights, self->flights + self->head, sizeof(Flight) * (size_t)(self->count - self->head));
            self->count -= self->head;
            self->head = 0;
        }
        if (self->count == self->cap) {
            Py_ssize_t cap = self->cap ? self->cap * 2 : 16;
            Flight *grown = PyMem_Realloc(self->flights, sizeof(Flight) * (size_t)cap);
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            self->flights = grown;
            self->cap = cap;
        }
    }
    Py_INCREF(data);
    self->flights[self->count].req = req;
    self->flights[self->count].data = data;
    self->count++;
    return 0;
}

/* post(out, frame, polls) -> None (sent) | bytes (the pickle: hold it back) */
static PyObject *sender_post(Sender *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *argv[2], *data, *result = NULL;
    Out *out;
    long long polls;
    double now;
    int paused, done = 0, err;
    MPI_Request req;
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &OutType)) {
        PyErr_SetString(PyExc_TypeError, "Sender.post(out, frame, polls): out must be an Out");
        return NULL;
    }
    out = (Out *)args[0];
    if (self->acquire == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Sender.post: the Sender was never initialised");
        return NULL;
    }
    if (out->frames == NULL) {
        PyErr_SetString(PyExc_TypeError, "Sender.post: the Out was never initialised");
        return NULL;
    }
    polls = PyLong_AsLongLong(args[2]);
    if (polls == -1 && PyErr_Occurred()) return NULL;
    data = mpimesh_fast_dumps(args[1]);
    if (data == NULL) {
        if (PyErr_Occurred()) return NULL;
        argv[0] = args[1];
        argv[1] = self->protocol;
        data = PyObject_Vectorcall(self->dumps, argv, 2, NULL);
        if (data == NULL) return NULL;
    }
    now = mpimesh_monotonic();
    if (mpimesh_lock_take(self->lock, self->acquire) < 0) {
        Py_DECREF(data);
        return NULL;
    }
    if (PyList_GET_SIZE(out->frames) > 0 ||
        (self->batching && out->polls == polls && now - out->last < self->burst)) {
        result = data; /* Router._post holds it back */
        data = NULL;
        goto unlock;
    }
    paused = now - out->last > self->ring_after;
    out->last = now;
    out->polls = polls;
    err = mpimesh_wire_start(out->comm, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), out->rank, self->tag, &req,
                             &done);
    if (err != MPI_SUCCESS) {
        mpimesh_wire_error(err);
        goto unlock;
    }
    self->frames_out++;
    self->sent_at = now;
    if (!done && keep(self, req, data) < 0) goto unlock;
    if (paused && self->ring != Py_None) {
        PyObject *rc = PyObject_CallOneArg(self->ring, (PyObject *)out);
        if (rc == NULL) goto unlock;
        Py_DECREF(rc);
    }
    if (reap(self) < 0) goto unlock;
    Py_INCREF(Py_None);
    result = Py_None;
unlock:
    Py_XDECREF(data);
    if (result == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (mpimesh_lock_give(self->lock, self->release) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (mpimesh_lock_give(self->lock, self->release) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyTypeObject SenderType;

PyObject *mpimesh_sender_post(PyObject *sender, PyObject *out, PyObject *frame, PyObject *polls) {
    if (!Py_IS_TYPE(sender, &SenderType)) {
        PyObject *argv[4] = {sender, out, frame, polls};
        return PyObject_VectorcallMethod(str_post, argv, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    {
        PyObject *args[3] = {out, frame, polls};
        return sender_post((Sender *)sender, args, 3);
    }
}

/* reap() -> int: the sends still in flight (call it holding the lock). */
static PyObject *sender_reap(Sender *self, PyObject *unused) {
    (void)unused;
    if (reap(self) < 0) return NULL;
    return PyLong_FromSsize_t(self->count - self->head);
}

static PyObject *sender_get_pending(Sender *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->count - self->head);
}

static PyObject *sender_get_ring(Sender *self, void *closure) {
    (void)closure;
    Py_INCREF(self->ring);
    return self->ring;
}

static int sender_set_ring(Sender *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL || (value != Py_None && !PyCallable_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "Sender.ring must be a callable or None");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->ring, value);
    return 0;
}

static PyMethodDef sender_methods[] = {
    {"post", (PyCFunction)(void (*)(void))sender_post, METH_FASTCALL,
     "post(out, frame, polls) -> None | bytes\n\nSend a frame now, or return its pickle to hold back; see native/post.c."},
    {"reap", (PyCFunction)sender_reap, METH_NOARGS,
     "reap() -> int\n\nDrop the completed sends; returns those still in flight (call it holding the lock)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sender_getset[] = {
    {"pending", (getter)sender_get_pending, NULL, "sends in flight", NULL},
    {"ring", (getter)sender_get_ring, (setter)sender_set_ring, "ring(out) after a pause, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef sender_members[] = {
    {"frames_out", T_LONGLONG, offsetof(Sender, frames_out), READONLY, "frames sent"},
    {"sent_at", T_DOUBLE, offsetof(Sender, sent_at), READONLY, "when a frame last left (time.monotonic)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Sender",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The router's send path for frames that leave at once (see native/post.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_traverse = (traverseproc)sender_traverse,
    .tp_clear = (inquiry)sender_clear,
    .tp_methods = sender_methods,
    .tp_members = sender_members,
    .tp_getset = sender_getset,
};

int mpimesh_post_add(PyObject *module) {
    if (str_post == NULL && (str_post = PyUnicode_InternFromString("post")) == NULL) return -1;
    if (PyType_Ready(&OutType) < 0 || PyType_Ready(&SenderType) < 0) return -1;
    Py_INCREF(&OutType);
    if (PyModule_AddObject(module, "Out", (PyObject *)&OutType) < 0) {
        Py_DECREF(&OutType);
        return -1;
    }
    Py_INCREF(&SenderType);
    if (PyModule_AddObject(module, "Sender", (PyObject *)&SenderType) < 0) {
        Py_DECREF(&SenderType);
        return -1;
    }
    return 0;
}
