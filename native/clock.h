/* clock.h - time.monotonic()'s clock for the native part's spins and "heard" stamps. */
#ifndef MPIMESH_CLOCK_H
#define MPIMESH_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC, the clock of Python's time.monotonic(), so C and Python stamps compare. */
static inline double mpimesh_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* MPIMESH_CLOCK_H */
