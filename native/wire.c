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

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

/* --- Sharing a core with the peer ------------------------------------------
 *
 * Two processes that spin waiting for each other on one vCPU (--bind-to none
 * on a busy node) take turns only when a spinner yields: each leg of a round
 * trip then waits out part of the other's spin, ~115 us in all where 28 us is
 * the norm (docs/design/data.md, "B1 against a raw round trip").  So each
 * process on a host with doorbells publishes, in a shared word (a file beside
 * its bell, mapped by wire_share), the CPU its polling thread runs on:
 *   0          not known (not polling, or went back to Python without a frame);
 *   cpu + 1    polling, or handling what its poll received, on cpu;
 *   -(cpu + 1) asleep on the word (a futex), waiting for a frame.
 * A spinner that finds the process it last sent to (Out.share maps that one's
 * word) busy on its own CPU stops spinning: it sleeps on its own word, and the
 * peer's next send to it (Sender.post) wakes it.  Each sleep is bounded by
 * the spin and by SLEEP_MAX_NS. */

static volatile int *word_mine; /* this process's word, or NULL */
static volatile int *word_peer; /* the word of the process last sent to, or NULL */

static int futex(volatile int *addr, int op, int val, const struct timespec *timeout) {
    /* Not FUTEX_PRIVATE_FLAG: the word is shared between processes. */
    return (int)syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

/* Mapped words by path, never unmapped: a spinner may read the word of the
 * process last sent to (word_peer) at any time, without the GIL, so a word
 * outlives the Out that mapped it.  One mapping per process ever sent to. */
typedef struct Mapped {
    struct Mapped *next;
    volatile int *word;
    char path[];
} Mapped;
static Mapped *mapped;

volatile int *mpimesh_wire_map_word(const char *path, int create) {
    Mapped *m;
    void *mem;
    int fd;
    size_t len = strlen(path) + 1;
    for (m = mapped; m != NULL; m = m->next)
        if (strcmp(m->path, path) == 0) return m->word;
    m = malloc(sizeof(Mapped) + len);
    if (m == NULL) return NULL;
    fd = open(path, O_RDWR | (create ? O_CREAT : 0) | O_CLOEXEC, 0600);
    if (fd < 0 || (create && ftruncate(fd, (off_t)sizeof(int)) < 0)) {
        if (fd >= 0) close(fd);
        free(m);
        return NULL;
    }
    mem = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) {
        free(m);
        return NULL;
    }
    memcpy(m->path, path, len);
    m->word = (volatile int *)mem;
    m->next = mapped;
    mapped = m;
    return m->word;
}

void mpimesh_wire_sent_to(volatile int *peer) {
    int now;
    word_peer = peer;
    if (peer == NULL) return;
    now = *peer;
    /* Woken, it is busy on its CPU again (maybe this one: then this spinner sleeps for it). */
    if (now < 0 && __sync_bool_compare_and_swap(peer, now, -now)) futex(peer, FUTEX_WAKE, 1, NULL);
}

/* wire_share(path) -> None: map this process's word (the file is made if need be). */
PyObject *mpimesh_wire_share(PyObject *self, PyObject *args) {
    const char *path;
    volatile int *word;
    (void)self;
    if (!PyArg_ParseTuple(args, "s:wire_share", &path)) return NULL;
    word = mpimesh_wire_map_word(path, 1);
    if (word == NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    *word = 0;
    word_mine = word;
    Py_RETURN_NONE;
}

/* While spinning (GIL released): publish this thread's CPU.  If the peer is
 * busy on it, the word says asleep and this returns the CPU + 1: the caller
 * probes once more (a frame sent before the store did not wake this) and
 * then calls sleep_on_word.  Else 0. */
static int core_shared(void) {
    volatile int *mine = word_mine, *peer = word_peer;
    int cpu, here;
    if (mine == NULL) return 0;
    cpu = sched_getcpu();
    here = cpu < 0 ? 0 : cpu + 1;
    if (peer == NULL || here == 0 || *peer != here) {
        if (*mine != here) *mine = here; /* the peer reads this line: write it only when it changes */
        return 0;
    }
    *mine = -here;
    return here;
}

/* Sleep on this process's word (asleep on CPU here - 1) until a peer's send
 * wakes it, until `end` or for SLEEP_MAX_NS; then busy on that CPU again.
 * Senders without this word (another host, a batch or raw buffers from the
 * outbox) wake nobody: the bound is how late their frames are seen. */
#define SLEEP_MAX_NS 50000LL
static void sleep_on_word(int here, long long end) {
    struct timespec ts;
    long long left = end - now_ns();
    if (left > SLEEP_MAX_NS) left = SLEEP_MAX_NS;
    if (left > 0) {
        ts.tv_sec = (time_t)(left / 1000000000LL);
        ts.tv_nsec = (long)(left % 1000000000LL);
        futex(word_mine, FUTEX_WAIT, -here, &ts); /* at once if woken meanwhile */
    }
    *word_mine = here;
}

/* Leaving a spin: a frame came (busy on this CPU, as published) or none did
 * (back to Python, which may nap: not known). */
static void spin_ended(int hit) {
    volatile int *mine = word_mine;
    if (mine != NULL && !hit) *mine = 0;
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
        int shared = 0;
        for (unsigned polls = 1; hit < 0; polls++) {
            for (i = 0; i < n; i++) {
                e = p_improbe(MPI_ANY_SOURCE, tag, comms[i], &flag, &msg, &status);
                if (e != MPI_SUCCESS || flag) { hit = i; break; }
            }
            if (shared) {
                /* that was the look after saying asleep: nothing, so sleep */
                if (hit < 0) sleep_on_word(shared, end);
                else *word_mine = shared;
                shared = 0;
                continue;
            }
            if (hit >= 0 || (polls & 7) != 0) continue;
            if (now_ns() >= end) break;
            /* the peer is busy on this CPU: spinning would only delay it */
            if ((shared = core_shared()) != 0) continue;
            /* let the other processes of an oversubscribed node run */
            if ((polls & 31) == 0) sched_yield();
        }
        spin_ended(hit >= 0);
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
