/* site.c - a worker's calls through a known call site, taken by the pump (issue 30, B1).
 *
 * A SITE_CALL names a call site that an earlier CALL registered (actor,
 * method, caller, message point).  In Python it goes Pump.poll ->
 * ActorHost.on_site_call -> SiteCall -> SyncRunner.put, then
 * SyncRunner._main -> Invoker.call_site -> _invoke -> the endpoint ->
 * Runtime.reply_value -> protocol.reply -> Router.send -> NativeWire.send ->
 * Sender.post: a dozen Python frames per call on the worker.  When the
 * actor's own thread is the one polling, idle with an empty mailbox, the
 * pump hands the frame to the site's Site here instead, which takes it
 * (mpimesh_site_take); the thread's idle wait then returns (its done() is
 * Lane.ready) and SyncRunner._main calls Lane.run, which does what those
 * frames do with no Python frame but the endpoint's
 * (docs/design/data.md, "B1 against a raw round trip").  The endpoint runs
 * where the Python path runs it, outside the poll: without the progress
 * token, free to wait for calls of its own.
 *
 *   Lane(mailbox, lifecycle, running, tid)   one sync actor: its mailbox (a
 *       deque), its Lifecycle and the phase it must be in (Phase.RUNNING),
 *       its thread's id, and the one call taken; `armed` is set by that
 *       thread (SyncRunner._main) only while it waits, idle, for mail.  It
 *       counts the calls run here (`calls`) and says which one runs since
 *       when (`busy`), in C fields: the actor's cell adds them to its own
 *       (ActorCell.calls and busy, which the dashboard reads);
 *   Site(lane, fn, var, ctx, method, index, dest, island, rank,
 *        routes, routed, peers, outs, sender, outbox, dead, reply_kind,
 *        value_status, finish, hold, send_failed, slow)
 *       one call site: the bound endpoint, the context variable and the
 *       site's Context, the method's name and the message's index, and
 *       the reply's way (Router.direct_route): the caller's address, its
 *       island and its rank on the link the reply leaves on, the router's
 *       routes table and what it must map the island to (that link, or None
 *       for the parent link), the router's peers (none to the caller), the
 *       link's Out table, the Sender, the Outbox (its `polls`) and the
 *       runtime's dead processes.
 *
 * The pump's offer is declined (0: the ordinary handler takes the frame)
 * unless the lane is armed, holds no call yet, this thread is the actor's
 * and its mailbox is empty: then the call taken is the actor's next item, in
 * order.  Lane.run gives it back to the Python path, slow(pid, args), unless
 * the actor still runs and the caller's way is still the one made for the
 * site.  Once it calls the endpoint, it answers: a result of a plain scalar
 * type (serialize.ATOMS) as a VALUE reply through Sender.post, anything else
 * (an exception, another result) through finish(pid, result, exc), the
 * Python path's own ending (Invoker.site_done).  A reply the sender holds
 * for a batch goes to hold(data); a send that raises, to send_failed(exc).
 */
#include "site.h"

#include <stddef.h>
#include <structmember.h>
#include <time.h>

#include "clock.h"
#include "wire.h"

#include "pythread.h"

/* --- Lane ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *mailbox, *lifecycle, *running;
    PyObject *site, *pid, *args; /* the call taken, not yet run (site NULL: none) */
    /* the dashboard's: calls run here, and the method running (NULL: none) since when */
    long long calls;
    PyObject *busy;
    double since;
    unsigned long tid;
    char armed;
} Lane;

static int lane_traverse(Lane *self, visitproc visit, void *arg) {
    Py_VISIT(self->mailbox);
    Py_VISIT(self->lifecycle);
    Py_VISIT(self->running);
    Py_VISIT(self->site);
    Py_VISIT(self->pid);
    Py_VISIT(self->args);
    Py_VISIT(self->busy);
    return 0;
}

static int lane_clear(Lane *self) {
    Py_CLEAR(self->mailbox);
    Py_CLEAR(self->lifecycle);
    Py_CLEAR(self->running);
    Py_CLEAR(self->site);
    Py_CLEAR(self->pid);
    Py_CLEAR(self->args);
    Py_CLEAR(self->busy);
    return 0;
}

static void lane_dealloc(Lane *self) {
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lane_init(Lane *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"mailbox", "lifecycle", "running", "tid", NULL};
    PyObject *mailbox, *lifecycle, *running;
    unsigned long tid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOk:Lane", names, &mailbox, &lifecycle, &running, &tid))
        return -1;
    lane_clear(self);
    Py_INCREF(mailbox);
    self->mailbox = mailbox;
    Py_INCREF(lifecycle);
    self->lifecycle = lifecycle;
    Py_INCREF(running);
    self->running = running;
    self->tid = tid;
    self->armed = 0;
    return 0;
}

/* ready() -> bool: mail, or a call taken (the actor's idle wait's done()) */
static PyObject *lane_ready(Lane *self, PyObject *unused) {
    Py_ssize_t mail;
    (void)unused;
    if (self->site != NULL) Py_RETURN_TRUE;
    if (self->mailbox == NULL) Py_RETURN_FALSE;
    mail = PyObject_Size(self->mailbox);
    if (mail < 0) return NULL;
    return PyBool_FromLong(mail > 0);
}

static PyObject *lane_run(Lane *self, PyObject *unused);

static PyMethodDef lane_methods[] = {
    {"ready", (PyCFunction)lane_ready, METH_NOARGS,
     "ready() -> bool\n\nWhether the mailbox has mail or a call was taken: the idle wait's done()."},
    {"run", (PyCFunction)lane_run, METH_NOARGS,
     "run() -> bool\n\nRun the call taken, if any (see native/site.c); whether there was one."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef lane_members[] = {
    {"armed", T_BOOL, offsetof(Lane, armed), 0, "set by the actor's thread while it waits, idle, for mail"},
    {"tid", T_ULONG, offsetof(Lane, tid), READONLY, "the actor's thread (threading.get_ident())"},
    {"calls", T_LONGLONG, offsetof(Lane, calls), READONLY, "calls its sites ran in C (the dashboard's count)"},
    {NULL, 0, 0, 0, NULL},
};

/* busy: (method, time.monotonic() at its start) while a call runs here, else None */
static PyObject *lane_get_busy(Lane *self, void *closure) {
    PyObject *since, *busy;
    (void)closure;
    if (self->busy == NULL) Py_RETURN_NONE;
    since = PyFloat_FromDouble(self->since);
    if (since == NULL) return NULL;
    busy = PyTuple_Pack(2, self->busy, since);
    Py_DECREF(since);
    return busy;
}

static PyGetSetDef lane_getset[] = {
    {"busy", (getter)lane_get_busy, NULL, "(method, time.monotonic() at its start) while a call runs here, else None",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One sync actor, as the native call sites see it (see native/site.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lane_init,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_methods = lane_methods,
    .tp_members = lane_members,
    .tp_getset = lane_getset,
};

/* --- Site ----------------------------------------------------------------- */

#define SITE_FIELDS 22

typedef struct {
    PyObject_HEAD
    /* in the constructor's order; `lane` is a Lane */
    PyObject *lane, *fn, *var, *ctx, *method, *index, *dest, *island, *rank, *routes, *routed, *peers, *outs,
        *sender, *outbox, *dead, *reply_kind, *value_status, *finish, *hold, *send_failed, *slow;
    long long runs;
} Site;

static PyObject **site_fields(Site *self) { return &self->lane; }

static int site_traverse(Site *self, visitproc visit, void *arg) {
    PyObject **field = site_fields(self);
    for (int i = 0; i < SITE_FIELDS; i++) Py_VISIT(field[i]);
    return 0;
}

static int site_clear(Site *self) {
    PyObject **field = site_fields(self);
    for (int i = 0; i < SITE_FIELDS; i++) Py_CLEAR(field[i]);
    return 0;
}

static void site_dealloc(Site *self) {
    PyObject_GC_UnTrack(self);
    site_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int site_init(Site *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"lane", "fn", "var", "ctx", "method", "index", "dest", "island", "rank",
                            "routes", "routed", "peers", "outs", "sender", "outbox", "dead", "reply_kind",
                            "value_status",
                            "finish", "hold", "send_failed", "slow", NULL};
    PyObject *got[SITE_FIELDS];
    PyObject **field = site_fields(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOOOOOOO!OO!O!OOO!OOOOOO:Site", names, &LaneType, &got[0],
                                     &got[1], &got[2], &got[3], &got[4], &got[5], &got[6], &got[7], &got[8],
                                     &PyDict_Type, &got[9], &got[10], &PyDict_Type, &got[11], &PyDict_Type,
                                     &got[12], &got[13], &got[14], &PyDict_Type, &got[15], &got[16], &got[17],
                                     &got[18], &got[19], &got[20], &got[21]))
        return -1;
    if (!PyContextVar_CheckExact(got[2])) {
        PyErr_SetString(PyExc_TypeError, "Site: var must be a contextvars.ContextVar");
        return -1;
    }
    for (int i = 0; i < SITE_FIELDS; i++) {
        Py_INCREF(got[i]);
        Py_XSETREF(field[i], got[i]);
    }
    return 0;
}

static PyMemberDef site_members[] = {
    {"runs", T_LONGLONG, offsetof(Site, runs), READONLY, "calls run in C (the others took the Python path)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SiteType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Site",
    .tp_basicsize = sizeof(Site),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A call site whose SITE_CALLs the pump runs itself (see native/site.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)site_init,
    .tp_dealloc = (destructor)site_dealloc,
    .tp_traverse = (traverseproc)site_traverse,
    .tp_clear = (inquiry)site_clear,
    .tp_members = site_members,
};

/* --- running a call --------------------------------------------------------- */

static PyObject *str_phase, *str_polls;

/* serialize.ATOMS: answered in the frame itself */
static int is_atom(PyObject *value) {
    return value == Py_None || PyLong_CheckExact(value) || PyBool_Check(value) || PyFloat_CheckExact(value) ||
           PyUnicode_CheckExact(value) || PyComplex_CheckExact(value);
}

/* Call fn(arg...) and drop its result; 0 or -1. */
static int call_drop(PyObject *fn, PyObject *const *argv, size_t argc) {
    PyObject *rc = PyObject_Vectorcall(fn, argv, argc, NULL);
    if (rc == NULL) return -1;
    Py_DECREF(rc);
    return 0;
}

/* Runtime.reply_value, past its checks: (REPLY, None, pid, index, VALUE, value) to the caller. */
static int reply_value(Site *self, PyObject *out, PyObject *pid, PyObject *value) {
    PyObject *frame = PyTuple_Pack(6, self->reply_kind, Py_None, pid, self->index, self->value_status, value);
    PyObject *polls, *data;
    int rc = 0;
    if (frame == NULL) return -1;
    polls = PyObject_GetAttr(self->outbox, str_polls);
    if (polls == NULL) {
        Py_DECREF(frame);
        return -1;
    }
    data = mpimesh_sender_post(self->sender, out, frame, polls);
    Py_DECREF(polls);
    Py_DECREF(frame);
    if (data == NULL) {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL) PyException_SetTraceback(exc, tb);
        rc = call_drop(self->send_failed, &exc, 1);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    } else {
        if (data != Py_None) rc = call_drop(self->hold, &data, 1); /* held for a batch */
        Py_DECREF(data);
    }
    return rc;
}

/* The call itself, in the site's context, with the actor's bookkeeping (Invoker._invoke's, in the lane). */
static int run(Site *self, PyObject *out, PyObject *pid, PyObject *args) {
    Lane *lane = (Lane *)self->lane;
    PyObject *token, *result;
    int rc;
    lane->calls++;
    Py_INCREF(self->method);
    Py_XSETREF(lane->busy, self->method);
    lane->since = mpimesh_monotonic();
    token = PyContextVar_Set(self->var, self->ctx);
    if (token == NULL) return -1;
    result = PyObject_Call(self->fn, args, NULL);
    if (result == NULL) {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL) PyException_SetTraceback(exc, tb);
        Py_CLEAR(lane->busy);
        {
            PyObject *argv[3] = {pid, Py_None, exc};
            rc = call_drop(self->finish, argv, 3);
        }
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    } else {
        Py_CLEAR(lane->busy);
        if (is_atom(result)) {
            rc = reply_value(self, out, pid, result);
        } else {
            PyObject *argv[3] = {pid, result, Py_None};
            rc = call_drop(self->finish, argv, 3);
        }
        Py_DECREF(result);
    }
    {
        /* reset even on error, keeping the error */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyContextVar_Reset(self->var, token) < 0 && type == NULL) {
            rc = -1;
        } else {
            PyErr_Restore(type, value, tb);
        }
        Py_DECREF(token);
    }
    return rc;
}

int mpimesh_site_take(PyObject *obj, PyObject *frame) {
    Site *self = (Site *)obj;
    Lane *lane;
    PyObject *args;
    Py_ssize_t mail;
    if (!Py_IS_TYPE(obj, &SiteType) || self->lane == NULL) return 0;
    lane = (Lane *)self->lane;
    if (!lane->armed || lane->site != NULL || lane->tid != PyThread_get_thread_ident()) return 0;
    /* (SITE_CALL, None, site, pid, args) */
    if (PyTuple_GET_SIZE(frame) != 5 || PyTuple_GET_ITEM(frame, 1) != Py_None) return 0;
    args = PyTuple_GET_ITEM(frame, 4);
    if (!PyTuple_CheckExact(args)) return 0;
    mail = PyObject_Size(lane->mailbox);
    if (mail != 0) return mail < 0 ? -1 : 0; /* after what is queued, in order */
    Py_INCREF(obj);
    lane->site = obj;
    Py_INCREF(PyTuple_GET_ITEM(frame, 3));
    lane->pid = PyTuple_GET_ITEM(frame, 3);
    Py_INCREF(args);
    lane->args = args;
    return 1;
}

/* Whether the reply's way is still the one made for the site; then *out is
 * its Out (borrowed).  0 no, 1 yes, -1 error. */
static int way_holds(Site *self, PyObject **out) {
    PyObject *routed;
    int dead, peer;
    /* the dead and the peers are most often none: no hash of dest then */
    dead = PyDict_GET_SIZE(self->dead) > 0 ? PyDict_Contains(self->dead, self->dest) : 0;
    if (dead != 0) return dead < 0 ? -1 : 0;
    routed = PyDict_GetItemWithError(self->routes, self->island);
    if (routed == NULL && PyErr_Occurred()) return -1;
    if ((routed == NULL ? Py_None : routed) != self->routed) return 0; /* the router would go another way */
    peer = PyDict_GET_SIZE(self->peers) > 0 ? PyDict_Contains(self->peers, self->dest) : 0;
    if (peer != 0) return peer < 0 ? -1 : 0;
    *out = PyDict_GetItemWithError(self->outs, self->rank);
    if (*out == NULL) return PyErr_Occurred() ? -1 : 0;
    return 1;
}

static PyObject *lane_run(Lane *lane, PyObject *unused) {
    Site *self = (Site *)lane->site;
    PyObject *pid = lane->pid, *args = lane->args, *phase, *out = NULL;
    int rc, holds;
    (void)unused;
    if (self == NULL) Py_RETURN_FALSE;
    lane->site = lane->pid = lane->args = NULL; /* taken: the references are ours */
    phase = PyObject_GetAttr(lane->lifecycle, str_phase);
    if (phase == NULL) {
        rc = -1;
        goto done;
    }
    Py_DECREF(phase); /* compared by identity only */
    holds = phase == lane->running ? way_holds(self, &out) : 0;
    if (holds < 0) {
        rc = -1;
    } else if (holds == 0) {
        /* stopped, failed, or the caller's way changed: the Python path says or does what is right */
        PyObject *argv[2] = {pid, args};
        rc = call_drop(self->slow, argv, 2);
    } else {
        Py_INCREF(out);
        self->runs++;
        rc = run(self, out, pid, args);
        Py_DECREF(out);
    }
done:
    Py_DECREF(self);
    Py_DECREF(pid);
    Py_DECREF(args);
    if (rc < 0) return NULL;
    Py_RETURN_TRUE;
}

int mpimesh_lane_check(PyObject *obj) { return Py_IS_TYPE(obj, &LaneType); }

void mpimesh_lane_arm(PyObject *lane, int armed) { ((Lane *)lane)->armed = (char)(armed != 0); }

int mpimesh_lane_taken(PyObject *lane) { return ((Lane *)lane)->site != NULL; }

Py_ssize_t mpimesh_lane_mail(PyObject *lane) {
    PyObject *mailbox = ((Lane *)lane)->mailbox;
    return mailbox == NULL ? 0 : PyObject_Size(mailbox);
}

PyObject *mpimesh_lane_run(PyObject *lane) { return lane_run((Lane *)lane, NULL); }

int mpimesh_site_add(PyObject *module) {
    if (str_phase == NULL) {
        str_phase = PyUnicode_InternFromString("phase");
        str_polls = PyUnicode_InternFromString("polls");
        if (str_phase == NULL || str_polls == NULL) return -1;
    }
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&SiteType) < 0) return -1;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    Py_INCREF(&SiteType);
    if (PyModule_AddObject(module, "Site", (PyObject *)&SiteType) < 0) {
        Py_DECREF(&SiteType);
        return -1;
    }
    return 0;
}
