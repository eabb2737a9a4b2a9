/* pmix_notify.c - mpimesh._pmix_notify: keeps a Slurm step alive through a dead peer.
 *
 * Open MPI 5 with ULFM (mpi_ft_enable), on finding a dead peer, tells its
 * local PMIx server so (ompi/errhandler/errhandler.c,
 * ompi_errhandler_proc_failed_internal):
 *     PMIx_Notify_event(PMIX_ERR_PROC_TERM_WO_SYNC, &me, PMIX_RANGE_LOCAL, ...)
 * Under `srun --mpi=pmix` that server is slurmstepd, whose PMIx plugin
 * registers a catch-all event handler that SIGKILLs the whole step
 * (src/plugins/mpi/pmix/pmixp_client_v2.c, _errhandler -> slurm_kill_job_step,
 * Slurm 22.05 to master as of 2026): the survivors that ULFM was about to let
 * go on are killed 0.3-0.5 s after the death. The notification tells Slurm
 * nothing it needs (slurmd sees its own tasks end), and ULFM's survivors learn
 * of the failure from MPI itself, not from this event.
 *
 * This library defines PMIx_Notify_event: loaded with RTLD_GLOBAL before
 * libmpi (mpimesh/_transport/mpi.py does so only under Slurm's PMIx direct
 * launch), it comes first in symbol lookup, drops exactly that status and
 * passes every other event to the real PMIx. It does not link libpmix: the
 * real function is found at the first call, in whichever libpmix libmpi
 * loaded. Measured (/work/shared/reference/hostloss/REPORT.md, runs E2, E5,
 * E6, B1): with it the step survives a lost host and the survivors get
 * MPI_ERR_PROC_FAILED within 8-207 ms; without it the step is cancelled.
 *
 * MPIMESH_PMIX_NOTIFY_VERBOSE=1 prints a line on stderr per dropped event.
 * The library is not a Python module; it is built by setup.py as an optional
 * extension only so that the same `pip install` ships it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* pmix_common.h, stable since PMIx 2: status codes and the function's type */
typedef int pmix_status_t;
typedef pmix_status_t (*notify_fn)(pmix_status_t, const void *, int, const void *, size_t, void *, void *);

#define PMIX_ERR_PROC_TERM_WO_SYNC (-200)
#define PMIX_OPERATION_SUCCEEDED (-157)
#define PMIX_ERROR (-1)

/* How many notifications were dropped; mpimesh reads it in tests (ctypes). */
volatile unsigned long mpimesh_pmix_notify_dropped = 0;

pmix_status_t PMIx_Notify_event(pmix_status_t status, const void *source, int range, const void *info,
                                size_t ninfo, void *cbfunc, void *cbdata);

static notify_fn real_notify(void)
{
    static notify_fn real = NULL;
    if (real == NULL) {
        notify_fn next = (notify_fn) dlsym(RTLD_NEXT, "PMIx_Notify_event");
        /* Loaded with dlopen(RTLD_GLOBAL) rather than LD_PRELOAD, libpmix may
         * not be "next" after this library: ask the copy already loaded. */
        if (next == NULL || next == PMIx_Notify_event) {
            void *lib = dlopen("libpmix.so.2", RTLD_LAZY | RTLD_NOLOAD);
            next = lib ? (notify_fn) dlsym(lib, "PMIx_Notify_event") : NULL;
        }
        real = next;
    }
    return real;
}

pmix_status_t PMIx_Notify_event(pmix_status_t status, const void *source, int range, const void *info,
                                size_t ninfo, void *cbfunc, void *cbdata)
{
    if (status == PMIX_ERR_PROC_TERM_WO_SYNC) {
        mpimesh_pmix_notify_dropped++;
        if (getenv("MPIMESH_PMIX_NOTIFY_VERBOSE") != NULL) {
            fprintf(stderr, "mpimesh: dropped PMIx_Notify_event(PMIX_ERR_PROC_TERM_WO_SYNC) to the launcher\n");
        }
        /* "done at once": PMIx then calls no callback, as Open MPI expects */
        return PMIX_OPERATION_SUCCEEDED;
    }
    notify_fn real = real_notify();
    if (real == NULL) {
        return PMIX_ERROR;
    }
    return real(status, source, range, info, ninfo, cbfunc, cbdata);
}
