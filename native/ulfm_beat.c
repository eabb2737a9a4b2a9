/* ulfm_beat.c - MPI progress for ULFM's heartbeats that needs no GIL.
 *
 * With its heartbeat detector on (mpimesh turns it on under srun --mpi=pmix),
 * Open MPI's ULFM sends a process's heartbeats from its progress engine only,
 * that is from inside an MPI call.  The controller's MPI calls come from
 * Python threads; a user script that holds the GIL for longer than the
 * detector's timeout (a C call through ctypes.PyDLL, a sort of millions of
 * ints) stops them all, and the other ranks declare the controller dead.
 * This thread makes `calls` MPI_Iprobe on MPI_COMM_SELF every `period`
 * seconds without the GIL (Open MPI runs its timers, the detector's among
 * them, once in 8 calls of opal_progress), as mpimesh/_launch/boot_beat.py
 * does through the boot.
 *
 *   ulfm_beat_start(libpath, self_handle, period, calls[, exit_bound])  start the thread (one per process)
 *   ulfm_beat_hold(bound) / ulfm_beat_release()  no MPI call from it in between (nestable);
 *       hold() raises TimeoutError, not held, when the thread's polls do not end within bound seconds
 *   ulfm_beat_stop([bound]) -> int  stop it (the interpreter's exit does too); the wakes on which it polled;
 *       raises TimeoutError, the thread still running, when its polls do not end within bound seconds
 *
 * Open MPI waits for ever in a communicator's activation when another thread
 * polls meanwhile: mpimesh/_transport/mpi.alone() holds the thread as it
 * holds the runtime's pollers.  The thread polls under `lock`, so hold()
 * returns once its polls are done; it waits with the GIL released, and at most
 * `bound` seconds (an MPI_Iprobe that never returns must not hang its caller).
 *
 * It ends right before mpi4py's MPI_Finalize: a cleanup function of
 * Py_AtExit, registered after mpi4py's, runs before it (last in, first out).
 * A stop at Python's atexit came too early: the interpreter's teardown runs
 * between the two, seconds without an MPI call where it frees much.  An
 * MPI_COMM_SELF attribute's delete callback came too late: Open MPI marks
 * Finalize as started before it deletes them, and aborts on an MPI_Iprobe
 * in between.  That stop is bounded too (exit_bound, 30 s from Python): an
 * MPI_Iprobe that never returns would otherwise hang the exit, and an
 * MPI_Finalize beside a thread still in MPI is undefined, so the process
 * then leaves at once with status 1 and a line on stderr, without Finalize
 * (as mpimesh leaves after a death).  A stop waits for the polls under way
 * as hold() does, on `lock`: once it holds it, the thread naps and ends at
 * once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

typedef int (*iprobe_fn)(int, int, MPI_Comm, int *, MPI_Status *);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t life = PTHREAD_MUTEX_INITIALIZER; /* start and stop: a Python caller, or Py_AtExit */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running, stopping, held, calls;
static double period;
static iprobe_fn p_iprobe;
static MPI_Comm self_comm;
static long wakes;
static int at_exit_set;
static double exit_bound = 30.0; /* seconds the stop at the interpreter's exit waits */

static void *ulfm_beat_main(void *arg) {
    int i, flag;
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!mpimesh_nap(&wake, &lock, &stopping, period)) {
        if (held) continue; /* a communicator is being made: its maker's own calls drive progress */
        for (i = 0; i < calls; i++) {
            /* an error: MPI is failing, and the runtime's own calls say how; keep polling (progress) */
            p_iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self_comm, &flag, MPI_STATUS_IGNORE);
        }
        wakes++;
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* End the thread if it runs, waiting at most `bound` seconds for its polls under way (no GIL needed).
 * Returns 0, or ETIMEDOUT (the thread still runs, in an MPI_Iprobe) or another error of the wait. */
static int halt(double bound) {
    struct timespec until;
    int rc = 0;
    pthread_mutex_lock(&life);
    if (running) {
        mpimesh_deadline(&until, bound);
        rc = pthread_mutex_timedlock(&lock, &until);
        if (rc == 0) {
            stopping = 1;
            pthread_cond_signal(&wake);
            pthread_mutex_unlock(&lock);
            pthread_join(thread, NULL); /* it naps: it sees stopping and returns */
            running = 0;
        }
    }
    pthread_mutex_unlock(&life);
    return rc;
}

/* Py_AtExit, right before mpi4py's MPI_Finalize: a thread stuck in MPI must not run beside it. */
static void halt_at_exit(void) {
    if (halt(exit_bound) != 0) {
        fprintf(stderr, "mpimesh: the ULFM beat thread's MPI_Iprobe has not returned within %g s at exit "
                "(MPI's progress is stuck); exiting with status 1 without MPI_Finalize\n", exit_bound);
        fflush(stderr);
        _exit(1);
    }
}

PyObject *mpimesh_ulfm_beat_start(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *handle;
    size_t h;
    double p, bound = 30.0;
    int c, rc;
    void *lib;
    (void)self;
    if (!PyArg_ParseTuple(args, "sOdi|d:ulfm_beat_start", &path, &handle, &p, &c, &bound)) return NULL;
    h = PyLong_AsSize_t(handle);
    if (h == (size_t)-1 && PyErr_Occurred()) return NULL;
    if (!(p > 0.0) || c < 1) {
        char text[96];
        snprintf(text, sizeof text, "ulfm_beat_start: expecting a period > 0 and calls >= 1, got %g and %d", p, c);
        PyErr_SetString(PyExc_ValueError, text);
        return NULL;
    }
    if (running) {
        PyErr_SetString(PyExc_RuntimeError, "ulfm_beat_start: the thread runs already; call ulfm_beat_stop() first");
        return NULL;
    }
#ifdef RTLD_NOLOAD
    lib = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
#else
    lib = NULL;
#endif
    if (lib == NULL) return PyErr_Format(PyExc_OSError, "ulfm_beat_start: %s is not loaded in this process", path);
    p_iprobe = (iprobe_fn)dlsym(lib, "MPI_Iprobe");
    dlclose(lib); /* mpi4py keeps it loaded */
    if (p_iprobe == NULL) return PyErr_Format(PyExc_OSError, "ulfm_beat_start: %s lacks MPI_Iprobe", path);
    self_comm = (MPI_Comm)(intptr_t)h;
    if (!at_exit_set) {
        if (Py_AtExit(halt_at_exit) < 0) {
            PyErr_SetString(PyExc_RuntimeError, "ulfm_beat_start: no room left in Py_AtExit");
            return NULL;
        }
        at_exit_set = 1;
    }
    period = p;
    calls = c;
    exit_bound = bound;
    pthread_mutex_lock(&life);
    wakes = 0;
    stopping = 0;
    rc = pthread_create(&thread, NULL, ulfm_beat_main, NULL);
    running = rc == 0;
    if (running) pthread_setname_np(thread, "mpimesh-ulfm"); /* as tests and ps see it */
    pthread_mutex_unlock(&life);
    if (rc != 0) return PyErr_Format(PyExc_OSError, "ulfm_beat_start: pthread_create failed (error %d)", rc);
    Py_RETURN_NONE;
}

/* The TimeoutError of a stop or hold whose wait for the thread's MPI_Iprobe passed `bound` seconds; NULL. */
static PyObject *stuck(const char *what, double bound, const char *outcome) {
    char text[192];
    snprintf(text, sizeof text, "%s: the thread's MPI_Iprobe has not returned within %g s (MPI's progress is stuck); %s",
             what, bound, outcome); /* PyErr_Format has no %g */
    PyErr_SetString(PyExc_TimeoutError, text);
    return NULL;
}

PyObject *mpimesh_ulfm_beat_stop(PyObject *self, PyObject *args) {
    double bound = 30.0;
    long n;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "|d:ulfm_beat_stop", &bound)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = halt(bound);
    Py_END_ALLOW_THREADS
    if (rc == ETIMEDOUT) /* the caller must not finalize MPI now: the thread may still be in MPI */
        return stuck("ulfm_beat_stop", bound, "the thread still runs");
    if (rc != 0) return PyErr_Format(PyExc_OSError, "ulfm_beat_stop: pthread_mutex_timedlock failed (error %d)", rc);
    pthread_mutex_lock(&lock);
    n = wakes;
    pthread_mutex_unlock(&lock);
    return PyLong_FromLong(n);
}

PyObject *mpimesh_ulfm_beat_hold(PyObject *self, PyObject *args) {
    double bound;
    struct timespec until;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "d:ulfm_beat_hold", &bound)) return NULL;
    Py_BEGIN_ALLOW_THREADS /* the thread may be in its polls: wait for them without the GIL */
    mpimesh_deadline(&until, bound);
    rc = pthread_mutex_timedlock(&lock, &until);
    if (rc == 0) {
        held++;
        pthread_mutex_unlock(&lock);
    }
    Py_END_ALLOW_THREADS
    if (rc == ETIMEDOUT) /* MPI's progress is stuck, and a communicator made now would be too */
        return stuck("ulfm_beat_hold", bound, "not held");
    if (rc != 0) return PyErr_Format(PyExc_OSError, "ulfm_beat_hold: pthread_mutex_timedlock failed (error %d)", rc);
    Py_RETURN_NONE;
}

PyObject *mpimesh_ulfm_beat_release(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&lock);
    if (held > 0) held--;
    pthread_mutex_unlock(&lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
