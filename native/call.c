/* call.c - the controller's half of call_one().get() through a registered call site, in C.
 *
 * B1 (issue 30) is one call_one(...).get() of a no-op; its MPI calls were
 * already in C (pump.c, post.c), its cost was the Python frames around them
 * (docs/design/data.md, "B1 against a raw round trip").  Three objects take
 * those frames out of the common case and leave everything else to the
 * Python path, which they call or hand back to:
 *
 *   CallSite(sender, out, outbox, hold, failed, routes, open, ids, dead,
 *        multicast, one_type, kind, number, addr, shape, rank, actor)
 *       site.call(name, what, args) -> OneReply | None
 *           MeshRef.cast_one's call through the registered site `number`
 *           of the actor at `addr`: make the OneReply (without running
 *           Python's __init__), open its port in the PortTable (`ports`, the
 *           open dict, and `ids`, its itertools.count), build the SITE_CALL
 *           frame and Sender.post it on `out` with the outbox's poll count;
 *           a frame the sender holds back for a batch goes to hold(data),
 *           and a send that raises to failed(fut, port id, exception), which
 *           does what NativeWire.send and calls._post do then.  None, before anything is
 *           opened or sent, when the Python path must do it: `addr` is known
 *           dead, a cast down a tree is under way (`multicast.enrolled`:
 *           frames to actors then travel numbered), or the router's route
 *           to its island (`routes`) is no longer out's link.
 *   Replies(open, fallback, lazy_lock, one_type, value_status, finished)
 *       replies(src, frame, buffers): the REPLY handler.  A plain value for
 *       a OneReply nobody sleeps on (Future._made false) settles it here
 *       (under future._lazy_lock, as Future._settle_unwatched does) and
 *       closes its port; anything else is fallback(src, frame, buffers),
 *       PortTable's Python handler.
 *   Spin(progress, token, leaders, spin, chunk, yield_every, main_ident)
 *       spin.wait(fut) -> bool: Progress.wait's spinning phase for a leader:
 *       take the progress token, poll (progress._poll: NativeWire.poll, or
 *       what a benchmark's probe put in its place), give it back,
 *       until `fut` is settled (True).  False, at once, for everything that
 *       phase does not cover: the token is busy (a follower), the main
 *       thread may not poll, or `spin` seconds passed without traffic (the
 *       naps, the step back to the background waiter and the timeout are
 *       Progress.wait's).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sched.h>
#include <structmember.h>
#include <time.h>

#include "addtype.h"
#include "call.h"
#include "clock.h"
#include "site.h"
#include "spin.h"
#include "wire.h"

/* Interned attribute names, made once by mpimesh_call_add. */
static PyObject *s_info, *s_made, *s_state, *s_result, *s_enrolled,
    *s_polls, *s_acquire, *s_release, *s_polled_at, *s_main_thread_polls, *s_link, *s_poll, *s_call;

/* Whether a future's _state is settled (FINISHED or CANCELLED*); -1 with an exception set. */
static int settled(PyObject *fut) {
    PyObject *state = PyObject_GetAttr(fut, s_state);
    int rc;
    if (state == NULL) return -1;
    rc = PyUnicode_Check(state) && PyUnicode_CompareWithASCIIString(state, "PENDING") != 0 &&
         PyUnicode_CompareWithASCIIString(state, "RUNNING") != 0;
    Py_DECREF(state);
    return rc;
}

/* fn(), its result dropped: 0, or -1 with an exception set */
static int call0(PyObject *fn) {
    PyObject *rc = PyObject_CallNoArgs(fn);
    if (rc == NULL) return -1;
    Py_DECREF(rc);
    return 0;
}

/* --- Site ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *sender, *out, *outbox, *hold, *failed, *routes, *open, *ids, *dead, *multicast, *one_type;
    PyObject *kind, *number, *addr, *pending, *shape, *rank, *actor;
    /* the last call's future attributes, (name, what, pending, shape, rank, actor): OneReply._info */
    PyObject *info;
} Site;

#define SITE_FIELDS(X) \
    X(sender) X(out) X(outbox) X(hold) X(failed) X(routes) X(open) X(ids) X(dead) X(multicast) X(one_type) X(kind) X(number) X(addr) X(pending) \
    X(shape) X(rank) X(actor) X(info)

static int site_traverse(Site *self, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(self->f);
    SITE_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int site_clear(Site *self) {
#define CLEAR(f) Py_CLEAR(self->f);
    SITE_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void site_dealloc(Site *self) {
    PyObject_GC_UnTrack(self);
    site_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int site_init(Site *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"sender", "out", "outbox", "hold", "failed", "routes", "open", "ids", "dead",
                            "multicast", "one_type", "kind", "number", "addr", "shape", "rank", "actor", NULL};
    PyObject *v[17];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO!O!OO!OO!OOO!OOO:CallSite", names, &v[0], &v[1], &v[2], &v[3],
                                     &v[4], &PyDict_Type, &v[5], &PyDict_Type, &v[6], &v[7], &PyDict_Type, &v[8],
                                     &v[9], &PyType_Type, &v[10], &v[11], &v[12], &PyTuple_Type, &v[13], &v[14],
                                     &v[15], &v[16]))
        return -1;
    if (PyTuple_GET_SIZE(v[13]) != 2) {
        PyErr_SetString(PyExc_ValueError, "CallSite: addr must be an (island, rank) tuple");
        return -1;
    }
    site_clear(self);
    self->pending = PyTuple_Pack(1, v[13]);
    if (self->pending == NULL) return -1;
#define TAKE(f, i) \
    Py_INCREF(v[i]); \
    self->f = v[i];
    TAKE(sender, 0) TAKE(out, 1) TAKE(outbox, 2) TAKE(hold, 3) TAKE(failed, 4) TAKE(routes, 5) TAKE(open, 6)
    TAKE(ids, 7) TAKE(dead, 8) TAKE(multicast, 9) TAKE(one_type, 10) TAKE(kind, 11) TAKE(number, 12)
    TAKE(addr, 13) TAKE(shape, 14) TAKE(rank, 15) TAKE(actor, 16)
#undef TAKE
    return 0;
}

/* Whether the Python path must take this call (1), or not (0); -1 with an exception set. */
static int site_unusual(Site *self) {
    PyObject *enrolled, *link, *route;
    int rc;
    route = PyDict_GetItemWithError(self->routes, PyTuple_GET_ITEM(self->addr, 0));
    if (route == NULL) return PyErr_Occurred() ? -1 : 1;
    link = PyObject_GetAttr(self->out, s_link);
    if (link == NULL) return -1;
    Py_DECREF(link);
    if (link != route) return 1;
    if (PyDict_GET_SIZE(self->dead) > 0) {
        rc = PyDict_Contains(self->dead, self->addr);
        if (rc != 0) return rc;
    }
    enrolled = PyObject_GetAttr(self->multicast, s_enrolled);
    if (enrolled == NULL) return -1;
    rc = PyObject_IsTrue(enrolled);
    Py_DECREF(enrolled);
    return rc;
}

/* A OneReply for this call (new reference): its attributes in one tuple, OneReply._info, which the
 * next call of the same endpoint object (the same name and what) shares; OneReply.__init__ would set
 * six attributes, which cost more than the rest of the future. */
static PyObject *site_future(Site *self, PyObject *name, PyObject *what) {
    PyTypeObject *type = (PyTypeObject *)self->one_type;
    PyObject *empty, *fut;
    if (self->info == NULL || PyTuple_GET_ITEM(self->info, 0) != name || PyTuple_GET_ITEM(self->info, 1) != what) {
        PyObject *info = PyTuple_Pack(6, name, what, self->pending, self->shape, self->rank, self->actor);
        if (info == NULL) return NULL;
        Py_XSETREF(self->info, info);
    }
    empty = PyTuple_New(0);
    if (empty == NULL) return NULL;
    fut = type->tp_new(type, empty, NULL);
    Py_DECREF(empty);
    if (fut == NULL) return NULL;
    if (PyObject_SetAttr(fut, s_info, self->info) < 0) {
        Py_DECREF(fut);
        return NULL;
    }
    return fut;
}

/* Send frame on out as NativeWire.send does, for fut on port pid: 0 done, -1 error. */
static int site_send(Site *self, PyObject *frame, PyObject *fut, PyObject *pid) {
    PyObject *polls, *data;
    polls = PyObject_GetAttr(self->outbox, s_polls);
    if (polls == NULL) return -1;
    data = mpimesh_sender_post(self->sender, self->out, frame, polls);
    Py_DECREF(polls);
    if (data == NULL) {
        /* an MPI error (a peer's failure among them): failed() does what the Python path does */
        PyObject *type, *value, *tb, *rc;
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) PyException_SetTraceback(value, tb);
        rc = PyObject_CallFunctionObjArgs(self->failed, fut, pid, value, NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (rc == NULL) return -1;
        Py_DECREF(rc);
        return 0;
    }
    if (data != Py_None) {
        /* to be held back for a batch (Outbox.post) */
        PyObject *rc = PyObject_CallOneArg(self->hold, data);
        Py_DECREF(data);
        if (rc == NULL) return -1;
        Py_DECREF(rc);
        return 0;
    }
    Py_DECREF(data);
    return 0;
}

/* call(name, what, args) -> OneReply | None */
static PyObject *site_call(Site *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *fut, *pid, *frame;
    int rc;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "CallSite.call(name, what, args) takes 3 arguments");
        return NULL;
    }
    if (self->sender == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CallSite.call: the Site was never initialised");
        return NULL;
    }
    rc = site_unusual(self);
    if (rc < 0) return NULL;
    if (rc) Py_RETURN_NONE;
    fut = site_future(self, args[0], args[1]);
    if (fut == NULL) return NULL;
    pid = PyIter_Next(self->ids);
    if (pid == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "CallSite.call: the port ids ran out");
        Py_DECREF(fut);
        return NULL;
    }
    if (PyDict_SetItem(self->open, pid, fut) < 0) goto fail;
    frame = PyTuple_Pack(5, self->kind, Py_None, self->number, pid, args[2]);
    if (frame == NULL) goto close;
    rc = site_send(self, frame, fut, pid);
    Py_DECREF(frame);
    if (rc < 0) goto close;
    Py_DECREF(pid);
    return fut;
close: {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyDict_DelItem(self->open, pid) < 0) PyErr_Clear();
    PyErr_Restore(type, value, tb);
}
fail:
    Py_DECREF(pid);
    Py_DECREF(fut);
    return NULL;
}

static PyTypeObject SiteType;

PyObject *mpimesh_callsite_call(PyObject *site, PyObject *name, PyObject *what, PyObject *args) {
    if (!Py_IS_TYPE(site, &SiteType)) {
        PyObject *argv[4] = {site, name, what, args};
        return PyObject_VectorcallMethod(s_call, argv, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    {
        PyObject *argv[3] = {name, what, args};
        return site_call((Site *)site, argv, 3);
    }
}

static PyMethodDef site_methods[] = {
    {"call", (PyCFunction)(void (*)(void))site_call, METH_FASTCALL,
     "call(name, what, args) -> OneReply | None\n\nCall through the site; None: take the Python path (native/call.c)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef site_members[] = {
    {"number", T_OBJECT, offsetof(Site, number), READONLY, "the call site's number"},
    {"addr", T_OBJECT, offsetof(Site, addr), READONLY, "the actor's address"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SiteType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.CallSite",
    .tp_basicsize = sizeof(Site),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A registered call site's call_one in one C call (see native/call.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)site_init,
    .tp_dealloc = (destructor)site_dealloc,
    .tp_traverse = (traverseproc)site_traverse,
    .tp_clear = (inquiry)site_clear,
    .tp_methods = site_methods,
    .tp_members = site_members,
};

/* --- Replies -------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *open, *fallback, *lock, *one_type, *finished;
    PyObject *acquire, *release, *locked; /* the lock's, bound once */
    long value;
} Replies;

static int replies_traverse(Replies *self, visitproc visit, void *arg) {
    Py_VISIT(self->open);
    Py_VISIT(self->fallback);
    Py_VISIT(self->lock);
    Py_VISIT(self->one_type);
    Py_VISIT(self->finished);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->locked);
    return 0;
}

static int replies_clear(Replies *self) {
    Py_CLEAR(self->open);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->one_type);
    Py_CLEAR(self->finished);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->locked);
    return 0;
}

static void replies_dealloc(Replies *self) {
    PyObject_GC_UnTrack(self);
    replies_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The settle itself, with the lazy lock held or its equivalent (below): 1 done, 0 not, -1 error. */
static int settle_held(Replies *self, PyObject *fut, PyObject *value) {
    PyObject *made = PyObject_GetAttr(fut, s_made);
    int rc, busy;
    if (made == NULL) return -1;
    busy = PyObject_IsTrue(made);
    Py_DECREF(made);
    if (busy != 0) return busy < 0 ? -1 : 0; /* somebody may sleep on its condition: the Python path */
    rc = settled(fut);
    if (rc != 0) return rc < 0 ? -1 : 0;     /* settled already: deliver says what happens */
    return (PyObject_SetAttr(fut, s_result, value) < 0 || PyObject_SetAttr(fut, s_state, self->finished) < 0) ? -1 : 1;
}

/* Settle fut with value as Future._settle_unwatched does: 1 done, 0 not (the Python path must), -1 error.
 *
 * Under future._lazy_lock, as there: a thread making the condition (_Lazy) or settling in Python then
 * sees the state settled.  Taking the lock (its acquire parses its arguments) cost half of a reply's
 * handling, so when nobody holds it the settle runs without it, with the cyclic GC off: its reads and
 * writes of plain instance attributes then run no Python code and never let the GIL go (a collection,
 * which an allocation can start, could run finalizers that do), so no other thread runs, and none can
 * take the lock, until it is over: as if it held it.  This rests on the GIL: a free-threaded CPython
 * (3.13t) would need the lock taken always. */
static int settle_unwatched(Replies *self, PyObject *fut, PyObject *value) {
    PyObject *held = PyObject_CallNoArgs(self->locked);
    int rc, taken;
    if (held == NULL) return -1;
    taken = PyObject_IsTrue(held);
    Py_DECREF(held);
    if (taken < 0) return -1;
    if (!taken) {
        int gc = PyGC_Disable();
        rc = settle_held(self, fut, value);
        if (gc) PyGC_Enable();
        return rc;
    }
    if (call0(self->acquire) < 0) return -1;
    rc = settle_held(self, fut, value);
    if (rc < 0) {
        PyObject *type, *value_, *tb;
        PyErr_Fetch(&type, &value_, &tb);
        if (call0(self->release) < 0) PyErr_Clear();
        PyErr_Restore(type, value_, tb);
        return -1;
    }
    if (call0(self->release) < 0) return -1;
    return rc;
}

static PyObject *replies_vectorcall(Replies *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *frame, *pid, *recv;
    if (nargs != 3 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "Replies(src, frame, buffers) takes 3 positional arguments");
        return NULL;
    }
    frame = args[1];
    if (self->open != NULL && PyTuple_Check(frame) && PyTuple_GET_SIZE(frame) == 6) {
        long status = PyLong_AsLong(PyTuple_GET_ITEM(frame, 4));
        if (status == -1 && PyErr_Occurred()) PyErr_Clear(); /* not an int: the Python path's to judge */
        else if (status == self->value) {
            pid = PyTuple_GET_ITEM(frame, 2);
            recv = PyDict_GetItemWithError(self->open, pid);
            if (recv == NULL && PyErr_Occurred()) return NULL;
            if (recv != NULL && (PyObject *)Py_TYPE(recv) == self->one_type) {
                int rc;
                Py_INCREF(recv);
                rc = settle_unwatched(self, recv, PyTuple_GET_ITEM(frame, 5));
                Py_DECREF(recv);
                if (rc < 0) return NULL;
                if (rc > 0) {
                    /* the one reply came: the port closes (pop: a failure may have closed it meanwhile) */
                    if (PyDict_DelItem(self->open, pid) < 0) {
                        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return NULL;
                        PyErr_Clear();
                    }
                    Py_RETURN_NONE;
                }
            }
        }
    }
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Replies: never initialised");
        return NULL;
    }
    return PyObject_Vectorcall(self->fallback, args, nargs, NULL);
}

static int replies_init(Replies *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"open", "fallback", "lazy_lock", "one_type", "value_status", "finished", NULL};
    PyObject *open, *fallback, *lock, *one_type, *finished;
    long value;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!lO:Replies", names, &PyDict_Type, &open, &fallback, &lock,
                                     &PyType_Type, &one_type, &value, &finished))
        return -1;
    replies_clear(self);
    if ((self->acquire = PyObject_GetAttr(lock, s_acquire)) == NULL ||
        (self->release = PyObject_GetAttr(lock, s_release)) == NULL ||
        (self->locked = PyObject_GetAttrString(lock, "locked")) == NULL)
        return -1;
    Py_INCREF(open);
    self->open = open;
    Py_INCREF(fallback);
    self->fallback = fallback;
    Py_INCREF(lock);
    self->lock = lock;
    Py_INCREF(one_type);
    self->one_type = one_type;
    Py_INCREF(finished);
    self->finished = finished;
    self->value = value;
    self->vectorcall = (vectorcallfunc)replies_vectorcall;
    return 0;
}

/* __func__: the fallback's function, so that the dispatch table names the Python handler this one fronts. */
static PyObject *replies_get_func(Replies *self, void *closure) {
    (void)closure;
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_AttributeError, "__func__");
        return NULL;
    }
    if (PyMethod_Check(self->fallback)) return Py_NewRef(PyMethod_GET_FUNCTION(self->fallback));
    return Py_NewRef(self->fallback);
}

static PyGetSetDef replies_getset[] = {
    {"__func__", (getter)replies_get_func, NULL, "the Python handler's function (fallback), for introspection", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RepliesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Replies",
    .tp_basicsize = sizeof(Replies),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The REPLY handler: a plain value for a OneReply settles in C (see native/call.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)replies_init,
    .tp_dealloc = (destructor)replies_dealloc,
    .tp_traverse = (traverseproc)replies_traverse,
    .tp_clear = (inquiry)replies_clear,
    .tp_call = PyVectorcall_Call,
    .tp_getset = replies_getset,
    .tp_vectorcall_offset = offsetof(Replies, vectorcall),
};

/* --- Spin ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *progress, *token, *leaders;
    PyObject *acquire, *release; /* the token's, bound once */
    double spin, chunk;
    int yield_every;
    unsigned long main_ident;
    double polled_written; /* when poll_once last wrote progress._polled_at */
    long long served; /* statistics: calls run by serve() */
} Spin;

static int spin_traverse(Spin *self, visitproc visit, void *arg) {
    Py_VISIT(self->progress);
    Py_VISIT(self->token);
    Py_VISIT(self->leaders);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    return 0;
}

static int spin_clear(Spin *self) {
    Py_CLEAR(self->progress);
    Py_CLEAR(self->token);
    Py_CLEAR(self->leaders);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    return 0;
}

static void spin_dealloc(Spin *self) {
    PyObject_GC_UnTrack(self);
    spin_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int spin_init(Spin *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"progress", "token", "leaders", "spin", "chunk", "yield_every", "main_ident", NULL};
    PyObject *progress, *token, *leaders;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!ddik:Spin", names, &progress, &token, &PyList_Type, &leaders,
                                     &self->spin, &self->chunk, &self->yield_every, &self->main_ident))
        return -1;
    if (self->yield_every < 1) {
        PyErr_SetString(PyExc_ValueError, "Spin: yield_every must be at least 1");
        return -1;
    }
    spin_clear(self);
    if ((self->acquire = PyObject_GetAttr(token, s_acquire)) == NULL ||
        (self->release = PyObject_GetAttr(token, s_release)) == NULL)
        return -1;
    Py_INCREF(progress);
    self->progress = progress;
    Py_INCREF(token);
    self->token = token;
    Py_INCREF(leaders);
    self->leaders = leaders;
    return 0;
}

/* token.acquire(False): 1 taken, 0 busy, -1 error. */
static int try_token(Spin *self) {
    PyObject *rc = PyObject_CallOneArg(self->acquire, Py_False);
    int taken;
    if (rc == NULL) return -1;
    taken = PyObject_IsTrue(rc);
    Py_DECREF(rc);
    return taken;
}

/* Remove the first `mine` from the leaders (Progress.wait's entry of this wait). */
static void leave(Spin *self, PyObject *mine) {
    PyObject *type, *value, *tb;
    Py_ssize_t i;
    PyErr_Fetch(&type, &value, &tb);
    for (i = 0; i < PyList_GET_SIZE(self->leaders); i++) {
        if (PyList_GET_ITEM(self->leaders, i) == mine) {
            if (PyList_SetSlice(self->leaders, i, i + 1, NULL) < 0) PyErr_Clear();
            break;
        }
    }
    PyErr_Restore(type, value, tb);
}

#define POLLED_AT_GRAIN 1e-4

/* One poll as the token holder, then progress._polled_at = now: frames handled, 0 with the token busy
 * (*busy set), -1 with an exception set. */
static long poll_once(Spin *self, PyObject *poll, double chunk, double now, int *busy) {
    PyObject *got, *when;
    long handled;
    int taken = try_token(self);
    *busy = 0;
    if (taken <= 0) {
        *busy = taken == 0;
        return taken;
    }
    when = PyFloat_FromDouble(chunk);
    got = when == NULL ? NULL : PyObject_CallOneArg(poll, when);
    Py_XDECREF(when);
    if (call0(self->release) < 0) {
        Py_XDECREF(got);
        return -1;
    }
    if (got == NULL) return -1;
    handled = PyLong_AsLong(got);
    Py_DECREF(got);
    if (handled == -1 && PyErr_Occurred()) return -1;
    /* Progress reads it against a window of milliseconds: written at most every POLLED_AT_GRAIN seconds */
    if (now - self->polled_written >= POLLED_AT_GRAIN) {
        when = PyFloat_FromDouble(now);
        if (when == NULL || PyObject_SetAttr(self->progress, s_polled_at, when) < 0) {
            Py_XDECREF(when);
            return -1;
        }
        Py_DECREF(when);
        self->polled_written = now;
    }
    return handled;
}

/* spin(fut) -> bool */
static PyObject *spin_call(Spin *self, PyObject *fut) {
    PyObject *mine, *poll, *result = NULL;
    double now, last_traffic, chunk;
    long spins = 0;
    int done;
    if (self->progress == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Spin: never initialised");
        return NULL;
    }
    done = settled(fut);
    if (done != 0) return done < 0 ? NULL : Py_NewRef(Py_True);
    if (PyThread_get_thread_ident() == self->main_ident) {
        PyObject *polls = PyObject_GetAttr(self->progress, s_main_thread_polls);
        int may;
        if (polls == NULL) return NULL;
        may = PyObject_IsTrue(polls);
        Py_DECREF(polls);
        if (may <= 0) return may < 0 ? NULL : Py_NewRef(Py_False);
    }
    poll = PyObject_GetAttr(self->progress, s_poll);
    if (poll == NULL) return NULL;
    mine = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type); /* this wait's entry in the leaders */
    if (mine == NULL || PyList_Append(self->leaders, mine) < 0) {
        Py_XDECREF(mine);
        Py_DECREF(poll);
        return NULL;
    }
    now = last_traffic = mpimesh_monotonic();
    chunk = self->chunk;
    for (;;) {
        int busy;
        long handled = poll_once(self, poll, chunk, now, &busy);
        if (handled < 0) goto out;
        if (busy) {
            result = Py_NewRef(Py_False); /* another thread polls: Progress.wait follows */
            goto out;
        }
        done = settled(fut);
        if (done != 0) {
            if (done > 0) result = Py_NewRef(Py_True);
            goto out;
        }
        now = mpimesh_monotonic();
        if (handled) {
            last_traffic = now;
            continue;
        }
        if (now - last_traffic >= self->spin) {
            result = Py_NewRef(Py_False); /* no traffic for the spin's length: Progress.wait naps */
            goto out;
        }
        chunk = self->spin - (now - last_traffic);
        if (chunk > self->chunk) chunk = self->chunk;
        if (mpimesh_spin_yields && ++spins % self->yield_every == 0) {
            /* let the other processes of an oversubscribed node (and our other threads) run */
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
            done = settled(fut);
            if (done != 0) {
                if (done > 0) result = Py_NewRef(Py_True);
                goto out;
            }
        }
    }
out:
    leave(self, mine);
    Py_DECREF(mine);
    Py_DECREF(poll);
    return result;
}

/* serve(lane) -> bool: a sync actor's idle wait (SyncRunner._main), as the leader, running each call the
 * pump takes for the lane's sites (Lane.run) as it comes, without going back to Python in between.  True:
 * the mailbox has mail; False: what this loop does not cover (another thread polls, or `spin` seconds
 * passed without traffic), Progress.wait goes on.  No call taken is left unrun. */
static PyObject *spin_serve(Spin *self, PyObject *lane) {
    PyObject *mine, *poll, *result = NULL;
    double now, last_traffic, chunk;
    long spins = 0;
    if (self->progress == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Spin: never initialised");
        return NULL;
    }
    if (!mpimesh_lane_check(lane)) {
        PyErr_SetString(PyExc_TypeError, "Spin.serve(lane): lane must be a _native.Lane");
        return NULL;
    }
    poll = PyObject_GetAttr(self->progress, s_poll);
    if (poll == NULL) return NULL;
    mine = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type); /* this wait's entry in the leaders */
    if (mine == NULL || PyList_Append(self->leaders, mine) < 0) {
        Py_XDECREF(mine);
        Py_DECREF(poll);
        return NULL;
    }
    mpimesh_lane_arm(lane, 1);
    now = last_traffic = mpimesh_monotonic();
    chunk = self->chunk;
    for (;;) {
        Py_ssize_t mail;
        int busy;
        long handled = poll_once(self, poll, chunk, now, &busy);
        if (handled < 0) goto out;
        if (busy) {
            result = Py_NewRef(Py_False); /* another thread polls: Progress.wait follows */
            goto out;
        }
        if (mpimesh_lane_taken(lane)) {
            /* the call came first: run it as SyncRunner._main would, disarmed and not leading */
            PyObject *ran;
            mpimesh_lane_arm(lane, 0);
            leave(self, mine);
            ran = mpimesh_lane_run(lane);
            if (ran == NULL) goto out_left;
            Py_DECREF(ran);
            self->served++;
            if (PyList_Append(self->leaders, mine) < 0) goto out_left;
            mpimesh_lane_arm(lane, 1);
            handled = 1;
        }
        mail = mpimesh_lane_mail(lane);
        if (mail != 0) {
            if (mail > 0) result = Py_NewRef(Py_True);
            goto out;
        }
        now = mpimesh_monotonic();
        if (handled) {
            last_traffic = now;
            chunk = self->chunk;
            continue;
        }
        if (now - last_traffic >= self->spin) {
            result = Py_NewRef(Py_False); /* no traffic for the spin's length: Progress.wait naps */
            goto out;
        }
        chunk = self->spin - (now - last_traffic);
        if (chunk > self->chunk) chunk = self->chunk;
        if (mpimesh_spin_yields && ++spins % self->yield_every == 0) {
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
        }
    }
out:
    leave(self, mine);
out_left:
    mpimesh_lane_arm(lane, 0);
    Py_DECREF(mine);
    Py_DECREF(poll);
    return result;
}

static PyTypeObject SpinType;

PyObject *mpimesh_spin_wait(PyObject *spin, PyObject *fut) {
    if (!Py_IS_TYPE(spin, &SpinType)) return PyObject_CallOneArg(spin, fut);
    return spin_call((Spin *)spin, fut);
}

/* getter(fallback, finished) -> Getter */
static PyObject *spin_getter(Spin *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Spin.getter(fallback, finished) takes 2 arguments");
        return NULL;
    }
    return mpimesh_getter_new((PyObject *)self, args[0], args[1]);
}

static PyMethodDef spin_methods[] = {
    {"wait", (PyCFunction)spin_call, METH_O,
     "wait(fut) -> bool\n\nProgress.wait's spin for a leader, until fut is settled; False: not covered here."},
    {"getter", (PyCFunction)(void (*)(void))spin_getter, METH_FASTCALL,
     "getter(fallback, finished) -> Getter\n\nFuture.get in C over this spin; fallback (Future.get) for the rest."},
    {"serve", (PyCFunction)spin_serve, METH_O,
     "serve(lane) -> bool\n\nA sync actor's idle wait as the leader, running the calls its sites take; True: mail."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef spin_members[] = {
    {"served", T_LONGLONG, offsetof(Spin, served), READONLY, "statistics: calls run by serve(), in C"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SpinType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Spin",
    .tp_basicsize = sizeof(Spin),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Progress.wait's spinning phase in C (see native/call.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)spin_init,
    .tp_dealloc = (destructor)spin_dealloc,
    .tp_traverse = (traverseproc)spin_traverse,
    .tp_clear = (inquiry)spin_clear,
    .tp_methods = spin_methods,
    .tp_members = spin_members,
};

int mpimesh_call_add(PyObject *module) {
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(s_info, "_info") INTERN(s_made, "_made") INTERN(s_state, "_state") INTERN(s_result, "_result")
    INTERN(s_enrolled, "enrolled") INTERN(s_polls, "polls")
    INTERN(s_acquire, "acquire") INTERN(s_release, "release") INTERN(s_polled_at, "_polled_at")
    INTERN(s_main_thread_polls, "main_thread_polls")
    INTERN(s_link, "link") INTERN(s_call, "call") INTERN(s_poll, "_poll")
#undef INTERN
    if (mpimesh_add_type(module, "CallSite", &SiteType) < 0 || mpimesh_add_type(module, "Replies", &RepliesType) < 0)
        return -1;
    return mpimesh_add_type(module, "Spin", &SpinType);
}
