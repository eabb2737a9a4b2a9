/* beat.c - a worker's heartbeat that needs no GIL (issue #14 item 11).
 *
 * A worker whose actor holds the GIL in a long C call cannot answer the
 * controller's PING, nor can any Python thread of it speak: on another host,
 * where the controller cannot read /proc, it was declared dead.  This thread
 * looks at the process's CPU time every `period` seconds and, when the
 * process used at least `share` of a core since its last look, sends a
 * ready-pickled heartbeat frame to the controller.  A process that makes
 * progress (CPU time) is alive; one stopped (SIGSTOP), or hung without using
 * the CPU (a deadlock, a C call that sleeps with the GIL held), sends nothing
 * and is still declared dead after MPIMESH_HEARTBEAT_TIMEOUT.
 *
 *   beat_start(handle, dest, tag, data, period, share)  start the thread (one per process)
 *   beat_stop() -> int   stop it, and return how many heartbeats it sent
 *   beat_sent() -> int   how many it has sent so far
 *
 * It calls MPI from a thread of its own: the library is initialised with
 * MPI_THREAD_MULTIPLE.  Its sends are on the frame tag, which the receiver
 * probes; a frame's raw buffers travel on another tag, so a heartbeat never
 * comes between a frame and its buffers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running, stopping;
static MPI_Comm comm;
static int dest, tag;
static char *data;
static Py_ssize_t len;
static double period, share;
static long sent;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *beat_main(void *arg) {
    MPI_Request req;
    int pending = 0, done = 0, err, i;
    double cpu = cpu_seconds(), now_cpu;
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!mpimesh_nap(&wake, &lock, &stopping, period)) {
        now_cpu = cpu_seconds();
        if (now_cpu - cpu < share * period) {
            cpu = now_cpu;
            continue; /* idle or hung: the controller's PING decides */
        }
        cpu = now_cpu;
        pthread_mutex_unlock(&lock);
        if (pending) {
            err = mpimesh_wire_test(&req, &done);
            pending = err == MPI_SUCCESS && !done;
        }
        if (!pending) {
            err = mpimesh_wire_start(comm, data, len, dest, tag, &req, &done);
            if (err == MPI_SUCCESS) {
                pending = !done;
                __atomic_add_fetch(&sent, 1, __ATOMIC_RELAXED);
            }
            /* an error: the controller has failed; the worker's own watch ends the process */
        }
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    /* A heartbeat is a few bytes (eager): it completes at once, bounded anyway. */
    for (i = 0; pending && i < 10000; i++) {
        if (mpimesh_wire_test(&req, &done) != MPI_SUCCESS || done) break;
        sched_yield();
    }
    return NULL;
}

PyObject *mpimesh_beat_start(PyObject *self, PyObject *args) {
    PyObject *handle;
    Py_buffer buf;
    int d, t, rc;
    double p, s;
    MPI_Comm c;
    (void)self;
    if (!mpimesh_wire_bound()) return NULL;
    if (!PyArg_ParseTuple(args, "Oiiy*dd:beat_start", &handle, &d, &t, &buf, &p, &s)) return NULL;
    if (!mpimesh_wire_handle(handle, &c)) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (!(p > 0.0)) {
        char text[80];
        PyBuffer_Release(&buf);
        snprintf(text, sizeof text, "beat_start: expecting a period > 0, got %g", p); /* PyErr_Format has no %g */
        PyErr_SetString(PyExc_ValueError, text);
        return NULL;
    }
    if (running) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_RuntimeError, "beat_start: the heartbeat runs already; call beat_stop() first");
        return NULL;
    }
    data = malloc((size_t)buf.len);
    if (data == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    memcpy(data, buf.buf, (size_t)buf.len);
    len = buf.len;
    PyBuffer_Release(&buf);
    comm = c;
    dest = d;
    tag = t;
    period = p;
    share = s;
    __atomic_store_n(&sent, 0, __ATOMIC_RELAXED);
    stopping = 0;
    rc = pthread_create(&thread, NULL, beat_main, NULL);
    if (rc != 0) {
        free(data);
        data = NULL;
        return PyErr_Format(PyExc_OSError, "beat_start: pthread_create failed (error %d)", rc);
    }
    running = 1;
    Py_RETURN_NONE;
}

PyObject *mpimesh_beat_stop(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (running) {
        pthread_mutex_lock(&lock);
        stopping = 1;
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&lock);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(thread, NULL);
        Py_END_ALLOW_THREADS
        running = 0;
        free(data);
        data = NULL;
    }
    return PyLong_FromLong(__atomic_load_n(&sent, __ATOMIC_RELAXED));
}

PyObject *mpimesh_beat_sent(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(__atomic_load_n(&sent, __ATOMIC_RELAXED));
}
