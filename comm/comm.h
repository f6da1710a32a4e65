/* comm/comm.h — the communicator: bootstrap, collectives, aborting.
 *
 * MPI only bootstraps (ranks, local rank, NCCL's unique id, abort); the
 * collectives run on one of three backends:
 *   single : world size 1, no MPI needed; every collective is a no-op
 *            (average over one rank is the identity).
 *   mpi    : host buffers, MPI non-blocking collectives. With a device
 *            backend the buffers are staged through pinned host memory; this
 *            also lets several ranks share one GPU, which NCCL refuses.
 *   nccl   : device buffers, NCCL on the backend's communication stream,
 *            ordered after the compute stream by an event.
 *
 * All collectives are in place on a buffer of `count` elements of dtype dt,
 * and asynchronous: they return a handle; comm_wait() completes it. A failed
 * collective, or one that does not complete within the timeout (a dead or
 * stalled peer), prints a clear message and ends every rank (ncclCommAbort,
 * MPI_Abort) instead of hanging.
 */
#ifndef COMM_COMM_H
#define COMM_COMM_H

#include <stddef.h>
#include "../kernels/kernels.h"

typedef enum { COMM_SINGLE = 0, COMM_MPI = 1, COMM_NCCL = 2 } CommKind;

typedef struct {
    int active;
    void* impl;          /* backend-specific request state */
} CommHandle;

typedef struct Comm {
    int rank, world;             /* global */
    int local_rank, local_world; /* within this host (shared-memory split) */
    int device_index;            /* this rank's position among the local ranks that see the same
                                  * GPUs (equal CUDA_VISIBLE_DEVICES): the GPU it uses, counted
                                  * among those it sees (the CUDA backend wraps it round their
                                  * number). = local_rank where every rank sees every GPU (mpirun,
                                  * srun --gpus-per-node); 0 where each sees its own (srun
                                  * --gpus-per-task=1) */
    CommKind kind;
    double timeout_s;            /* bound on any wait; default 300 */
    Backend* be;                 /* the compute backend (for streams/staging) */
    void* impl;                  /* private */
} Comm;

/* Step 1, first thing in main: MPI_Init when built with MPI and launched by
 * mpirun or srun (or as a singleton); fills rank/world/local_rank/
 * device_index. Without MPI: rank 0 of 1. Installs the fatal() hook that
 * aborts every rank. */
void comm_bootstrap(Comm* c, int* argc, char*** argv);

/* Step 2, once the backend exists: choose the collective backend.
 * want: "auto" | "nccl" | "mpi". auto = nccl for a CUDA backend where no two
 * ranks of a host drive the same GPU (compared by PCI bus id, so it holds
 * whether each rank sees every GPU or only its own), mpi otherwise (single
 * when world == 1). Errors (fatal on every rank): nccl without a CUDA
 * backend, nccl when built without NCCL, several ranks on one GPU with nccl,
 * mpi when built without MPI and world > 1. */
void comm_setup(Comm* c, const char* want, Backend* be, double timeout_s);

const char* comm_kind_name(CommKind k);

/* In-place all-reduce of buf[0..count). average: divide by world once. */
void comm_allreduce(Comm* c, void* buf, size_t count, DType dt, int average, CommHandle* h);
/* In-place reduce-scatter: on completion rank r's slice
 * buf[r*count/world, (r+1)*count/world) holds the reduced (summed, or averaged
 * if average) values of that slice; the rest of buf is unspecified.
 * count must divide by world. */
void comm_reduce_scatter(Comm* c, void* buf, size_t count, DType dt, int average, CommHandle* h);
/* In-place all-gather: rank r contributes buf[r*count/world, ...); on
 * completion every rank holds every slice. count must divide by world. */
void comm_allgather(Comm* c, void* buf, size_t count, DType dt, CommHandle* h);
/* Blocks until h completes (fatal with a clear message after timeout_s). On
 * a device backend, after the wait the compute stream is ordered after the
 * collective. */
void comm_wait(Comm* c, CommHandle* h);

/* Lets an in-flight collective make progress without waiting for it (MPI
 * progresses non-blocking collectives only inside MPI calls; NCCL and the
 * single backend need nothing). Cheap; call it often during compute. */
void comm_progress(Comm* c, CommHandle* h);

/* Blocking all-reduce of host doubles (sum), for losses and grad norms. */
void comm_allreduce_host_sum(Comm* c, double* vals, int n);
/* Blocking max over ranks of host ints (agreeing on errors, flags). */
int comm_allreduce_host_max_int(Comm* c, int v);
void comm_barrier(Comm* c);
/* Broadcast host bytes from rank 0. */
void comm_broadcast_host(Comm* c, void* buf, size_t bytes);
/* Blocking all-gather among the ranks of this host (collective over every
 * rank): all[i * bytes, (i + 1) * bytes) receives local rank i's `mine`;
 * all holds local_world * bytes. */
void comm_local_allgather_host(Comm* c, const void* mine, size_t bytes, void* all);

/* Print msg, then end every rank with a non-zero exit. */
NORETURN void comm_abort(Comm* c, const char* msg);
void comm_finalize(Comm* c);

#endif
