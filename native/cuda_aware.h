/* cuda_aware.h - compile-time and run-time CUDA-aware MPI query. */
#ifndef MPIMESH_CUDA_AWARE_H
#define MPIMESH_CUDA_AWARE_H

/* 1 yes, 0 no, -1 unknown: what the MPI headers said at build time. */
int mpimesh_cuda_compile_time(void);

/* The vendor and version of the headers the extension was built with. */
const char *mpimesh_built_with(void);

/* Ask the libmpi loaded in this process (the file at `libpath`, already
 * loaded by mpi4py; it is not loaded again).  Returns 1 yes, 0 no, -1 the
 * library has no query function, -2 the library is not loaded.  `how`
 * receives the name of the function used (or ""). */
int mpimesh_cuda_run_time(const char *libpath, const char **how);

#endif /* MPIMESH_CUDA_AWARE_H */
