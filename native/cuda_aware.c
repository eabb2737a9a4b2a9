/* cuda_aware.c - is the MPI library CUDA-aware?
 *
 * Compile time: Open MPI's MPIX_CUDA_AWARE_SUPPORT (compat.h).
 * Run time: MPIX_Query_cuda_support() (Open MPI, MVAPICH) or
 * MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag) (MPICH >= 4), looked up
 * with dlsym in the libmpi that mpi4py has already loaded.
 *
 * The extension deliberately does not link libmpi (setup.py links with
 * -Wl,--as-needed and no MPI symbol is referenced directly): one source tree
 * may serve several virtual environments, each with its own MPI (the Open MPI
 * and MPICH test venvs share this checkout), and an extension linked against
 * one libmpi would load that library into a process running the other.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>

#include "compat.h"
#include "cuda_aware.h"

int mpimesh_cuda_compile_time(void) { return MPIMESH_CUDA_COMPILE_TIME; }

const char *mpimesh_built_with(void) { return MPIMESH_VENDOR " " MPIMESH_VENDOR_VERSION; }

typedef int (*query_cuda_fn)(void);
typedef int (*query_gpu_fn)(int, int *);

int mpimesh_cuda_run_time(const char *libpath, const char **how) {
    void *lib;
    void *sym;
    int result = -1;
    *how = "";
#ifdef RTLD_NOLOAD
    lib = dlopen(libpath, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
#else
    lib = NULL;
#endif
    if (lib == NULL) return -2;
    sym = dlsym(lib, "MPIX_Query_cuda_support");
    if (sym != NULL) {
        *how = "MPIX_Query_cuda_support";
        result = ((query_cuda_fn)sym)() ? 1 : 0;
    } else {
        sym = dlsym(lib, "MPIX_GPU_query_support");
        if (sym != NULL) {
            int flag = 0;
            *how = "MPIX_GPU_query_support";
            result = (((query_gpu_fn)sym)(MPIMESH_GPU_SUPPORT_CUDA, &flag) == 0 && flag) ? 1 : 0;
        }
    }
    dlclose(lib); /* drops only the reference taken above */
    return result;
}
