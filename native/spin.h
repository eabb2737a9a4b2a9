/* spin.h - whether a spinning waiter gives its CPU up now and then (wire.c's probe, call.c's Spin). */
#ifndef MPIMESH_SPIN_H
#define MPIMESH_SPIN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 1: a spin calls sched_yield() every so many empty probes, for the job's
 * other processes on a crowded node; 0: it keeps its CPU, as MPI's own
 * blocking calls do where each process has a core (mpimesh._core.crowding
 * decides, MPIMESH_SPIN_YIELD).  Read without a lock: a stale value costs a
 * few yields more or less. */
extern int mpimesh_spin_yields;

/* spin_yield(flag) -> bool: set it; returns the value before. */
PyObject *mpimesh_spin_yield(PyObject *self, PyObject *flag);

#endif /* MPIMESH_SPIN_H */
