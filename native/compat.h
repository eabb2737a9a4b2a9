/* compat.h - MPI vendor and version guards for mpimesh's native part.
 *
 * Every vendor difference the C code needs is decided here, once, in the
 * manner of mpi4py's src/lib-mpi/compat/ headers.  Only headers are used: the
 * extension does not link libmpi (see cuda_aware.c for why).
 */
#ifndef MPIMESH_COMPAT_H
#define MPIMESH_COMPAT_H

#include <mpi.h>
#include <pthread.h>
#include <time.h>

#define MPIMESH_STR_(x) #x
#define MPIMESH_STR(x) MPIMESH_STR_(x)

#if defined(OPEN_MPI) && OPEN_MPI
#  if defined(__has_include)
#    if __has_include(<mpi-ext.h>)
#      include <mpi-ext.h>
#    endif
#  else
#    include <mpi-ext.h>
#  endif
#  define MPIMESH_VENDOR "Open MPI"
#  define MPIMESH_VENDOR_VERSION MPIMESH_STR(OMPI_MAJOR_VERSION) "." MPIMESH_STR(OMPI_MINOR_VERSION) \
                                 "." MPIMESH_STR(OMPI_RELEASE_VERSION)
#elif defined(MPICH_VERSION)
#  define MPIMESH_VENDOR "MPICH"
#  define MPIMESH_VENDOR_VERSION MPICH_VERSION
#elif defined(I_MPI_VERSION)
#  define MPIMESH_VENDOR "Intel MPI"
#  define MPIMESH_VENDOR_VERSION I_MPI_VERSION
#else
#  define MPIMESH_VENDOR "unknown MPI"
#  define MPIMESH_VENDOR_VERSION "?"
#endif

/* Compile-time CUDA awareness: 1 yes, 0 no, -1 the headers do not say.
 * Open MPI's mpi-ext.h defines MPIX_CUDA_AWARE_SUPPORT (0 or 1) when the
 * cuda extension was built; MPICH has no compile-time flag. */
#if defined(MPIX_CUDA_AWARE_SUPPORT)
#  if MPIX_CUDA_AWARE_SUPPORT
#    define MPIMESH_CUDA_COMPILE_TIME 1
#  else
#    define MPIMESH_CUDA_COMPILE_TIME 0
#  endif
#else
#  define MPIMESH_CUDA_COMPILE_TIME (-1)
#endif

/* MPICH >= 4: MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag). */
#ifndef MPIX_GPU_SUPPORT_CUDA
#  define MPIMESH_GPU_SUPPORT_CUDA 0
#else
#  define MPIMESH_GPU_SUPPORT_CUDA MPIX_GPU_SUPPORT_CUDA
#endif

/* The CLOCK_REALTIME instant `seconds` from now, as pthread_cond_timedwait and
 * pthread_mutex_timedlock take it: the one deadline computation of the C threads. */
static inline void mpimesh_deadline(struct timespec *until, double seconds) {
    clock_gettime(CLOCK_REALTIME, until);
    until->tv_sec += (time_t)seconds;
    until->tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (until->tv_nsec >= 1000000000L) {
        until->tv_sec += 1;
        until->tv_nsec -= 1000000000L;
    }
}

/* A C thread's wait between two rounds: `seconds`, or until *stopping is set and `wake` signalled (both
 * under `lock`, which the caller holds).  Returns *stopping. */
static inline int mpimesh_nap(pthread_cond_t *wake, pthread_mutex_t *lock, const int *stopping, double seconds) {
    struct timespec until;
    mpimesh_deadline(&until, seconds);
    while (!*stopping && pthread_cond_timedwait(wake, lock, &until) == 0) {
    }
    return *stopping;
}

#endif /* MPIMESH_COMPAT_H */
