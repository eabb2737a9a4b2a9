/* pump.c - the router's receive path in C: receive, unpickle, dispatch.
 *
 * NativeWire.poll (mpimesh/_transport/wire_native.py) calls this for what
 * Mpi4pyWire._poll (mpimesh/_transport/wire_mpi4py.py) does in Python: probe, receive,
 * unpickle, expand BATCH frames, take the raw buffers that follow a frame,
 * note who was heard from, then call each frame's handler.  A Pump does it
 * in one call, with no Python step per frame but the handler's
 * (docs/design/transport.md, "Two I/O paths, one choice"):
 *
 *   Pump(lock, handlers, take_buffers, on_error, no_buffers, tag, batch_kind,
 *        ping_kind, max_frames)
 *   pump.set_links(handles, sources)   the communicators to poll, and per
 *       link the address of its sources: an (island, rank) tuple when the
 *       link has one peer (a spawned worker's parent), else the island;
 *   pump.poll(spin) -> int | (int, [(link index, MPI error code), ...])
 *       under `lock`, receive up to max_frames frames (after the first when
 *       spin > 0: a waiting thread returns with its reply), probing up to
 *       spin seconds with the GIL released; then, without the lock, note the
 *       time each source was heard from (`heard`, a dict of the sources to
 *       track, or `heard_controller` when it is None) and call
 *       handlers[kind](source, frame, buffers) in arrival order.  Returns
 *       the frames handled, heartbeats (ping_kind) not counted.  A link
 *       whose probe fails is left out for the rest of the call and reported
 *       with its error code, for the router to acknowledge (ULFM).
 *
 * A SITE_CALL frame (kind site_kind) whose call site is in `sites` (a dict
 * of site numbers to _native.Site, or None: set by NativeWire._serve_sites)
 * is first offered to its Site, which takes it for the actor's own thread
 * to run in C when that thread is the one polling, idle (native/site.c); if
 * it declines, the handler gets it as any frame.
 *
 * A handler that raises an Exception is reported as on_error(kind, source,
 * exception) and the next frame goes on; with on_error None it propagates.
 * Frames with raw buffers get them from take_buffers(link index, source,
 * sizes), called under the lock right after the frame, as the buffers are
 * the next messages from that source.
 */
#include "wire.h"

#include <stddef.h>
#include "site.h"
#include <structmember.h>
#include <time.h>

#include "clock.h"
#include "fastpickle.h"
#include "lock.h"

typedef struct {
    PyObject_HEAD
    PyObject *lock, *acquire, *release; /* the router lock, and its bound methods */
    PyObject *handlers;          /* dict: kind -> handler(source, frame, buffers) */
    PyObject *take_buffers;      /* take_buffers(link index, source rank, sizes) -> list */
    PyObject *on_error;          /* on_error(kind, source, exception), or None */
    PyObject *no_buffers;        /* the list passed for frames without raw buffers */
    PyObject *loads;             /* pickle.loads */
    PyObject *sources;           /* tuple: per link, an address tuple or an island int */
    PyObject *heard;             /* dict of tracked sources -> last heard (monotonic s), or None */
    PyObject *sites;             /* dict: call site number -> _native.Site, or None */
    MPI_Comm comms[MPIMESH_MAX_LINKS];
    int n;
    int tag, batch_kind, ping_kind, site_kind;
    Py_ssize_t max_frames;
    double heard_controller;
    PyObject *heard_last; /* the source last written to `heard`, at heard_at */
    double heard_at;
    long long frames_in;
} Pump;

/* A source's frames within this many seconds of its last write to `heard` are not written again (the
 * frames of a busy exchange: B1's round trip would pay a dict update per reply); a heartbeat always is,
 * as the liveness watch compares its echo's time with the PING's.  Liveness works in milliseconds. */
#define HEARD_GRAIN 1e-4

static int pump_traverse(Pump *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->handlers);
    Py_VISIT(self->take_buffers);
    Py_VISIT(self->on_error);
    Py_VISIT(self->no_buffers);
    Py_VISIT(self->loads);
    Py_VISIT(self->sources);
    Py_VISIT(self->heard);
    Py_VISIT(self->sites);
    Py_VISIT(self->heard_last);
    return 0;
}

static int pump_clear(Pump *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->handlers);
    Py_CLEAR(self->take_buffers);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->no_buffers);
    Py_CLEAR(self->loads);
    Py_CLEAR(self->sources);
    Py_CLEAR(self->heard);
    Py_CLEAR(self->sites);
    Py_CLEAR(self->heard_last);
    return 0;
}

static void pump_dealloc(Pump *self) {
    PyObject_GC_UnTrack(self);
    pump_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pump_init(Pump *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"lock", "handlers", "take_buffers", "on_error", "no_buffers", "tag",
                            "batch_kind", "ping_kind", "max_frames", NULL};
    PyObject *lock, *handlers, *take_buffers, *on_error, *no_buffers, *pickle;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOO!iiin:Pump", names, &lock, &PyDict_Type, &handlers,
                                     &take_buffers, &on_error, &PyList_Type, &no_buffers, &self->tag,
                                     &self->batch_kind, &self->ping_kind, &self->max_frames))
        return -1;
    if (self->max_frames < 1) {
        PyErr_Format(PyExc_ValueError, "Pump: max_frames must be at least 1, got %zd", self->max_frames);
        return -1;
    }
    pump_clear(self);
    Py_INCREF(lock);
    Py_XSETREF(self->lock, lock);
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = PyObject_GetAttrString(lock, "release");
    if (self->acquire == NULL || self->release == NULL) return -1;
    pickle = PyImport_ImportModule("pickle");
    if (pickle == NULL) return -1;
    self->loads = PyObject_GetAttrString(pickle, "loads");
    Py_DECREF(pickle);
    if (self->loads == NULL) return -1;
    Py_INCREF(handlers);
    self->handlers = handlers;
    Py_INCREF(take_buffers);
    self->take_buffers = take_buffers;
    Py_INCREF(on_error);
    self->on_error = on_error;
    Py_INCREF(no_buffers);
    self->no_buffers = no_buffers;
    self->sources = PyTuple_New(0);
    Py_INCREF(Py_None);
    self->heard = Py_None;
    Py_INCREF(Py_None);
    self->sites = Py_None;
    self->site_kind = -1;
    self->n = 0;
    self->heard_controller = mpimesh_monotonic();
    return self->sources == NULL ? -1 : 0;
}

/* set_links(handles, sources): call it holding the lock. */
static PyObject *pump_set_links(Pump *self, PyObject *args) {
    PyObject *handles, *sources;
    MPI_Comm comms[MPIMESH_MAX_LINKS];
    int n;
    if (!PyArg_ParseTuple(args, "O!O!:set_links", &PyTuple_Type, &handles, &PyTuple_Type, &sources)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sources); i++) {
        PyObject *entry = PyTuple_GET_ITEM(sources, i);
        if (!(PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2) && !PyLong_Check(entry)) {
            PyErr_SetString(PyExc_TypeError, "Pump.set_links: a source must be an (island, rank) tuple or an island");
            return NULL;
        }
    }
    n = mpimesh_wire_comms("Pump.set_links", handles, comms);
    if (n < 0) return NULL;
    if (PyTuple_GET_SIZE(sources) != n) {
        PyErr_Format(PyExc_ValueError, "Pump.set_links: %d handles but %zd sources", n, PyTuple_GET_SIZE(sources));
        return NULL;
    }
    memcpy(self->comms, comms, sizeof(MPI_Comm) * (size_t)n);
    self->n = n;
    Py_INCREF(sources);
    Py_SETREF(self->sources, sources);
    Py_RETURN_NONE;
}

/* The address a frame from rank `src` of link `index` came from (new reference). */
static PyObject *source_of(Pump *self, int index, int src) {
    PyObject *entry = PyTuple_GET_ITEM(self->sources, index);
    PyObject *rank, *addr;
    if (PyTuple_Check(entry)) {
        Py_INCREF(entry);
        return entry;
    }
    rank = PyLong_FromLong(src);
    if (rank == NULL) return NULL;
    addr = PyTuple_Pack(2, entry, rank);
    Py_DECREF(rank);
    return addr;
}

/* The frame pickled in data (bytes): read in C when it holds only scalars (fastpickle.c), else pickle.loads. */
static PyObject *loads(Pump *self, PyObject *data) {
    PyObject *frame = NULL;
    if (PyBytes_Check(data)) {
        frame = mpimesh_fast_loads(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
        if (frame != NULL || PyErr_Occurred()) return frame;
    }
    return PyObject_CallOneArg(self->loads, data);
}

static int frame_kind(PyObject *frame, long *kind) {
    if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) < 2) {
        PyErr_SetString(PyExc_TypeError, "Pump: a frame must be a (kind, sizes, ...) tuple");
        return -1;
    }
    *kind = PyLong_AsLong(PyTuple_GET_ITEM(frame, 0));
    return (*kind == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int append3(PyObject *got, PyObject *a, PyObject *b, PyObject *c) {
    PyObject *item = PyTuple_Pack(3, a, b, c);
    int rc;
    if (item == NULL) return -1;
    rc = PyList_Append(got, item);
    Py_DECREF(item);
    return rc;
}

/* Whether a frame goes to its handler as it is: no raw buffers follow it, and not a BATCH; -1 with an
 * exception set if it is no frame. */
static int is_plain(Pump *self, PyObject *frame) {
    long kind;
    int sized;
    if (frame_kind(frame, &kind) < 0) return -1;
    sized = PyObject_IsTrue(PyTuple_GET_ITEM(frame, 1));
    if (sized < 0) return -1;
    return !sized && kind != self->batch_kind;
}

/* One received frame (a new reference, consumed) into got, as Mpi4pyWire._take does. */
static int take(Pump *self, PyObject *got, int index, int src, PyObject *frame) {
    PyObject *source = source_of(self, index, src), *buffers;
    long kind;
    int rc = -1, sized;
    if (source == NULL || frame_kind(frame, &kind) < 0) goto done;
    sized = PyObject_IsTrue(PyTuple_GET_ITEM(frame, 1));
    if (sized < 0) goto done;
    if (sized) {
        /* its raw buffers are the next messages from src */
        buffers = PyObject_CallFunction(self->take_buffers, "iiO", index, src, PyTuple_GET_ITEM(frame, 1));
        if (buffers == NULL) goto done;
        rc = append3(got, source, frame, buffers);
        Py_DECREF(buffers);
    } else if (kind == self->batch_kind) {
        PyObject *inner = PyTuple_GET_SIZE(frame) > 2 ? PyTuple_GET_ITEM(frame, 2) : NULL;
        Py_ssize_t i;
        if (inner == NULL || !PyList_Check(inner)) {
            PyErr_SetString(PyExc_TypeError, "Pump: a BATCH frame must carry a list of frames");
            goto done;
        }
        for (i = 0; i < PyList_GET_SIZE(inner); i++) {
            PyObject *one = loads(self, PyList_GET_ITEM(inner, i));
            long inner_kind;
            if (one == NULL) goto done;
            rc = frame_kind(one, &inner_kind);
            if (rc == 0) rc = append3(got, source, one, self->no_buffers);
            Py_DECREF(one);
            if (rc < 0) goto done;
        }
        rc = 0;
    } else {
        rc = append3(got, source, frame, self->no_buffers);
    }
done:
    Py_XDECREF(source);
    Py_DECREF(frame);
    return rc;
}

static int is_controller(PyObject *source) {
    return PyTuple_GET_SIZE(source) == 2 && PyLong_AsLong(PyTuple_GET_ITEM(source, 0)) == 0 &&
           PyLong_AsLong(PyTuple_GET_ITEM(source, 1)) == 0;
}

/* A handler raised (the exception is set): report it through on_error, or let it propagate. */
static int handler_failed(Pump *self, PyObject *kind, PyObject *source) {
    PyObject *type, *value, *tb, *rc;
    if (self->on_error == Py_None || !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    rc = PyObject_CallFunctionObjArgs(self->on_error, kind, source, value, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (rc == NULL) return -1;
    Py_DECREF(rc);
    return 0;
}

/* Whether two sources are the same address: (island, rank) tuples of equal ints (the pump makes a new
 * tuple per frame from a link with many peers). */
static int same_source(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (b == NULL || !PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || PyTuple_GET_SIZE(a) != 2 ||
        PyTuple_GET_SIZE(b) != 2)
        return 0;
    for (int i = 0; i < 2; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        long u, v;
        if (x == y) continue;
        if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y)) return 0;
        u = PyLong_AsLong(x);
        v = PyLong_AsLong(y);
        if (u != v || (u == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Hand one frame to its handler, noting its source as heard (at `now`, in *now_obj, made once per
 * poll); 1 a frame that counts, 0 a heartbeat, -1 an error. */
static int dispatch_one(Pump *self, PyObject *source, PyObject *frame, PyObject *buffers, double now,
                        PyObject **now_obj) {
    PyObject *kind = PyTuple_GET_ITEM(frame, 0), *handler, *rc = NULL;
    long kind_long = PyLong_AsLong(kind);
    int counts;
    if (kind_long == -1 && PyErr_Occurred()) return -1;
    counts = kind_long != self->ping_kind;
    if (PyDict_Check(self->heard)) {
        int again = counts && now - self->heard_at < HEARD_GRAIN && same_source(source, self->heard_last);
        if (!again) {
            int known = PyDict_Contains(self->heard, source);
            if (known < 0) return -1;
            if (known) {
                if (*now_obj == NULL && (*now_obj = PyFloat_FromDouble(now)) == NULL) return -1;
                if (PyDict_SetItem(self->heard, source, *now_obj) < 0) return -1;
            }
            Py_INCREF(source);
            Py_XSETREF(self->heard_last, source);
            self->heard_at = now;
        }
    } else if (is_controller(source)) {
        self->heard_controller = now;
    }
    if (kind_long == self->site_kind && self->sites != NULL && PyDict_Check(self->sites) &&
        PyTuple_GET_SIZE(frame) > 2) {
        PyObject *site = PyDict_GetItemWithError(self->sites, PyTuple_GET_ITEM(frame, 2));
        int took = 0;
        if (site != NULL) {
            Py_INCREF(site); /* the table may change meanwhile */
            took = mpimesh_site_take(site, frame);
            Py_DECREF(site);
        } else if (PyErr_Occurred()) {
            took = -1;
        }
        if (took > 0) return counts;
        if (took < 0) return handler_failed(self, kind, source) < 0 ? -1 : counts;
    }
    handler = PyDict_GetItemWithError(self->handlers, kind);
    if (handler != NULL) {
        PyObject *argv[3] = {source, frame, buffers};
        Py_INCREF(handler); /* a handler may change the table */
        rc = PyObject_Vectorcall(handler, argv, 3, NULL);
        Py_DECREF(handler);
    } else if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_KeyError, "no handler for frame kind %R", kind);
    }
    if (rc != NULL) {
        Py_DECREF(rc);
    } else if (handler_failed(self, kind, source) < 0) {
        return -1;
    }
    return counts;
}

/* Hand the frames of got to their handlers; returns the number not heartbeats, or -1. */
static Py_ssize_t dispatch(Pump *self, PyObject *got) {
    Py_ssize_t i, count = PyList_GET_SIZE(got), counted = 0;
    double now = mpimesh_monotonic();
    PyObject *now_obj = NULL;
    for (i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(got, i);
        int rc = dispatch_one(self, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), PyTuple_GET_ITEM(item, 2),
                              now, &now_obj);
        if (rc < 0) {
            Py_XDECREF(now_obj);
            self->frames_in += i;
            return -1;
        }
        counted += rc;
    }
    Py_XDECREF(now_obj);
    self->frames_in += count;
    return counted;
}

/* poll(spin) -> int | (int, [(link index, MPI error code), ...]) */
static PyObject *pump_poll(Pump *self, PyObject *arg) {
    double spin = PyFloat_AsDouble(arg);
    long long spin_ns;
    MPI_Comm comms[MPIMESH_MAX_LINKS];
    int index_of[MPIMESH_MAX_LINKS];
    int n, i, locked = 0;
    /* the frames received, made at the second one: a spinning poll (a wait for one reply) most often gets
     * one frame, handled from `one` with no list and no tuple per frame */
    PyObject *got = NULL, *errors = NULL, *one_source = NULL, *one_frame = NULL;
    Py_ssize_t handled;
    if (spin == -1.0 && PyErr_Occurred()) return NULL;
    if (self->acquire == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Pump.poll: the Pump was never initialised");
        return NULL;
    }
    spin_ns = spin > 0 ? (long long)(spin * 1e9) : 0;
    if (mpimesh_lock_take(self->lock, self->acquire) < 0) goto fail;
    locked = 1;
    n = self->n; /* read under the lock: set_links is called holding it */
    memcpy(comms, self->comms, sizeof(MPI_Comm) * (size_t)n);
    for (i = 0; i < n; i++) index_of[i] = i;
    for (long long probe = spin_ns;;) {
        int index = -1, src = -1, err = 0, got_one;
        PyObject *data = NULL, *frame;
        got_one = mpimesh_wire_receive(comms, n, self->tag, probe, &index, &src, &err, &data);
        if (got_one == 0) break;
        if (got_one < 0) goto fail;
        if (got_one == 2) {
            /* Reported after the frames; the other links go on being read,
             * so that one failed link cannot keep the rest unread. */
            PyObject *pair = Py_BuildValue("(ii)", index_of[index], err);
            if (pair == NULL) goto fail;
            if (errors == NULL && (errors = PyList_New(0)) == NULL) {
                Py_DECREF(pair);
                goto fail;
            }
            if (PyList_Append(errors, pair) < 0) {
                Py_DECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
            n--;
            memmove(comms + index, comms + index + 1, sizeof(MPI_Comm) * (size_t)(n - index));
            memmove(index_of + index, index_of + index + 1, sizeof(int) * (size_t)(n - index));
            probe = 0;
            continue;
        }
        frame = loads(self, data);
        Py_DECREF(data);
        if (frame == NULL) goto fail;
        if (spin_ns > 0 && got == NULL) {
            int plain = is_plain(self, frame);
            if (plain < 0) {
                Py_DECREF(frame);
                goto fail;
            }
            if (plain) {
                if ((one_source = source_of(self, index_of[index], src)) == NULL) {
                    Py_DECREF(frame);
                    goto fail;
                }
                one_frame = frame;
                break;
            }
        }
        if (got == NULL && (got = PyList_New(0)) == NULL) {
            Py_DECREF(frame);
            goto fail;
        }
        if (take(self, got, index_of[index], src, frame) < 0) goto fail;
        if (spin_ns > 0 || PyList_GET_SIZE(got) >= self->max_frames) break;
        probe = -1; /* one more look on each link */
    }
    locked = 0;
    if (mpimesh_lock_give(self->lock, self->release) < 0) goto fail;
    if (one_frame != NULL) {
        PyObject *now_obj = NULL;
        int counted = dispatch_one(self, one_source, one_frame, self->no_buffers, mpimesh_monotonic(), &now_obj);
        Py_XDECREF(now_obj);
        Py_CLEAR(one_source);
        Py_CLEAR(one_frame);
        if (counted < 0) goto fail;
        self->frames_in++;
        handled = counted;
    } else if (got != NULL) {
        handled = dispatch(self, got);
        Py_CLEAR(got);
        if (handled < 0) goto fail;
    } else {
        handled = 0;
    }
    if (errors == NULL) return PyLong_FromSsize_t(handled);
    return Py_BuildValue("(nN)", handled, errors);
fail:
    if (locked) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (mpimesh_lock_give(self->lock, self->release) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(got);
    Py_XDECREF(one_source);
    Py_XDECREF(one_frame);
    Py_XDECREF(errors);
    return NULL;
}

static PyMethodDef pump_methods[] = {
    {"set_links", (PyCFunction)pump_set_links, METH_VARARGS,
     "set_links(handles, sources) -> None\n\nThe communicators to poll and, per link, an address tuple or an island."},
    {"poll", (PyCFunction)pump_poll, METH_O,
     "poll(spin) -> int | (int, [(index, error code), ...])\n\nReceive and dispatch; see native/pump.c."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pump_members[] = {
    {"heard", T_OBJECT, offsetof(Pump, heard), 0, "dict of tracked sources -> when last heard from, or None"},
    {"heard_controller", T_DOUBLE, offsetof(Pump, heard_controller), 0,
     "when a frame from (0, 0) last arrived (time.monotonic), if heard is None"},
    {"sites", T_OBJECT, offsetof(Pump, sites), 0,
     "dict of call site numbers -> _native.Site whose SITE_CALLs it offers to them first, or None"},
    {"site_kind", T_INT, offsetof(Pump, site_kind), 0, "the SITE_CALL frame kind (-1: none)"},
    {"frames_in", T_LONGLONG, offsetof(Pump, frames_in), READONLY, "frames dispatched"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpimesh._native.Pump",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The router's receive path: receive, unpickle and dispatch frames (see native/pump.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pump_init,
    .tp_dealloc = (destructor)pump_dealloc,
    .tp_traverse = (traverseproc)pump_traverse,
    .tp_clear = (inquiry)pump_clear,
    .tp_methods = pump_methods,
    .tp_members = pump_members,
};

int mpimesh_pump_add(PyObject *module) {
    if (PyType_Ready(&PumpType) < 0) return -1;
    Py_INCREF(&PumpType);
    if (PyModule_AddObject(module, "Pump", (PyObject *)&PumpType) < 0) {
        Py_DECREF(&PumpType);
        return -1;
    }
    return 0;
}
