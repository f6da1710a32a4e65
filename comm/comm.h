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
 * and asynchronous: they return a handle; comm_wait() completes it (on NCCL,
 * on the device: see comm_wait). A failed collective, or one that does not
 * complete within the timeout (a dead or stalled peer), prints a clear
 * message and ends every rank (ncclCommAbort, MPI_Abort) instead of hanging.
 */
#ifndef COMM_COMM_H
#define COMM_COMM_H

#include <stddef.h>
#include "../kernels/kernels.h"

typedef enum { COMM_SINGLE = 0, COMM_MPI = 1, COMM_NCCL = 2 } CommKind;

typedef struct {
    int active;
    void* impl; /* backend-specific request state */
} CommHandle;

typedef struct Comm {
    int rank, world;             /* global; within the group for a comm_split result */
    int local_rank, local_world; /* within this host (shared-memory split) */
    int device_index;            /* this rank's position among the local ranks that see the same
                                  * GPUs (equal CUDA_VISIBLE_DEVICES): the GPU it uses, counted
                                  * among those it sees (the CUDA backend wraps it round their
                                  * number). = local_rank where every rank sees every GPU (mpirun,
                                  * srun --gpus-per-node); 0 where each sees its own (srun
                                  * --gpus-per-task=1) */
    CommKind kind;
    double timeout_s; /* bound on any wait; default 300 */
    Backend* be;      /* the compute backend (for streams/staging) */
    void* impl;       /* private */
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
/* Completes h (a collective, or a transfer: comm_send/comm_recv); h is
 * inactive afterwards, and waiting on an inactive handle does nothing.
 *  - single, mpi: blocks the host until the operation is done (fatal with a
 *    clear message after timeout_s). On a device backend (mpi staging) the
 *    compute stream is then also ordered after it.
 *  - nccl: does not block the host. The compute stream waits for the
 *    operation on the device and comm_wait returns at once: work queued on the
 *    compute stream afterwards runs after the operation, so the buffer's
 *    result is the compute stream's to read, and the host's once it has
 *    synchronised with the compute stream (a cudaStreamSynchronize of it, a
 *    be->to_host, be->synchronize). Nothing else is ordered: another stream, the
 *    legacy default stream, or a host read without that synchronisation may
 *    still see the buffer before the operation. Failures and timeouts are still
 *    detected, by a watchdog thread, wherever the host is meanwhile (even
 *    blocked in a CUDA call), and end every rank with the same messages: "nccl
 *    <operation> failed: ..." or "nccl <operation> did not complete within N s:
 *    a peer rank died or stalled". The timeout counts from the moment the GPU
 *    reaches the operation (it then only waits for its peers), not from
 *    comm_wait, since the host may run far ahead of the GPU. */
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

/* ---------------------------------------------------- sub-communicators */

/* The color of a rank that joins no group in comm_split: it gets a
 * communicator of its own (world 1). Any negative color means the same. */
#define COMM_COLOR_NONE (-1)

/* Collective over parent (every rank of parent calls it, in the same order
 * relative to parent's other collectives and host helpers): the ranks that
 * pass the same color >= 0 form one new communicator, written to *out and
 * ranked by key (ties by their rank in parent); a rank passing a negative
 * color gets a communicator of its own. In *out: rank and world are within
 * the group; local_rank, local_world, timeout_s and be are parent's; kind is
 * parent's, or single when the group has one rank (every collective is then
 * the identity, as at world 1). Every collective, host helper, comm_progress,
 * comm_p2p_setup and comm_send/comm_recv work on *out, with parent's
 * guarantees: an operation on *out that fails or does not complete within
 * timeout_s prints a message and ends every rank of the whole job, not only
 * the group's. parent must be set up (comm_setup, or itself a comm_split
 * result). NCCL: the group gets a communicator of its own (a unique id shared
 * over the group's MPI communicator), so collectives of different groups may
 * be in flight at once. Returns out->world. comm_finalize(out) frees only
 * *out; finalize every split result before parent. */
int comm_split(Comm* parent, int color, int key, Comm* out);

/* --------------------------------------------------------- point to point */

/* Point-to-point transfers between ring neighbours (pipeline stages):
 *
 *   comm_p2p_setup(c)      collective over c (every rank, in the same order
 *                          relative to c's other collectives), once, before
 *                          the first comm_send or comm_recv on c (they end
 *                          the job with a message otherwise; a second call
 *                          does nothing). Connects every rank to its neighbours
 *                          (rank + 1) % world and (rank - 1 + world) % world,
 *                          the only peers that comm_send/comm_recv accept.
 *                          At world 1 it does nothing (there is no peer).
 *   comm_send(c, buf, ...)  start sending count elements of dt from buf to peer.
 *   comm_recv(c, buf, ...)  start receiving count elements of dt into buf from
 *                          peer.
 *
 * peer is a rank within c; tag (>= 0) is the caller's label of the message
 * (say chunk, micro-batch and direction; the MPI backend compares it modulo
 * MPI_TAG_UB + 1, at least 32768). Both return at once with h active;
 * comm_wait(c, h) completes the transfer (on NCCL on the device, as for
 * collectives), comm_progress(c, h) moves it on; one that does not complete
 * within timeout_s ends every rank with a message naming the operation and the
 * peer.
 * Any number of sends and receives may be in flight on c at once, to and from
 * both neighbours, waited in any order.
 *
 * Ordering contract (the caller's part):
 *  - The messages from rank a to rank b of c form one first-in first-out
 *    stream: the k-th comm_send of a with peer b is received by the k-th
 *    comm_recv of b with peer a. The two must agree on count, dt and tag. The
 *    MPI backend checks tag and count at the receive and ends the job on a
 *    mismatch; NCCL checks nothing (a mismatch corrupts data or hangs until the
 *    timeout), so a schedule is first tried on the MPI backend.
 *  - Streams of different pairs, and the two directions of one pair, are
 *    independent: a may send to b while b sends to a, both posted in any
 *    order, without deadlock.
 *  - A send may complete only once the peer has posted the matching receive
 *    (no buffering is promised). So do not comm_wait on a transfer whose
 *    matching operation the peer posts only after something this rank does
 *    after that wait. Posting itself never waits for a peer (the MPI
 *    backend's device staging of a send waits for the local compute stream).
 *  - buf is the transfer's until comm_wait(h) returns: not written (send) or
 *    not read or written (receive) before then. On a device backend buf is a
 *    device pointer: the send reads it after the work the compute stream had
 *    queued when comm_send was called; the receive writes it after the work
 *    the compute stream had queued when comm_recv was called; after comm_wait
 *    the compute stream is ordered after the transfer (so work queued on it
 *    then may read the received data or overwrite the sent buffer); on NCCL
 *    only the compute stream is (see comm_wait), so the buffer is the
 *    transfer's, for any other stream or the host, until they synchronise with
 *    the compute stream.
 *  - count 0 completes at once (both sides must still post it).
 *  - World 1 (one pipeline stage): comm_send/comm_recv end the job with a
 *    message: a rank has no peer but itself, and a pipeline of one stage never
 *    sends.
 *
 * Backends: mpi: MPI_Isend/MPI_Irecv on a duplicate of c's MPI communicator,
 * the tag travelling as the MPI tag (modulo MPI_TAG_UB + 1), received with
 * MPI_ANY_TAG so that the order, not the tag, matches messages, as on NCCL;
 * device buffers are staged through pinned host memory (the send copies to
 * the host before MPI_Isend, the receive copies to the device in comm_wait).
 * nccl: one 2-rank NCCL communicator and one CUDA stream per direction and
 * neighbour (so that the directions never queue behind each other), ncclSend
 * and ncclRecv ordered after the compute stream by an event; the tag and the
 * count are not checked. NCCL kernels wait on the GPU for their peer: a
 * device-synchronising CUDA call (cudaMalloc, cudaFree, cudaDeviceSynchronize),
 * or a synchronisation with the compute stream after a comm_wait (which
 * leaves the wait to the GPU), while a transfer is in flight can wait for a
 * peer that waits for this rank; allocate before the transfers start. Collectives of other communicators
 * (the data-parallel group's) may be in flight at the same time, on the comm
 * stream: this relies on the GPU running the kernels of different NCCL
 * communicators side by side (each takes a few multiprocessors). */
void comm_p2p_setup(Comm* c);
void comm_send(Comm* c, const void* buf, size_t count, DType dt, int peer, int tag, CommHandle* h);
void comm_recv(Comm* c, void* buf, size_t count, DType dt, int peer, int tag, CommHandle* h);

/* Print msg, then end every rank with a non-zero exit. */
NORETURN void comm_abort(Comm* c, const char* msg);
/* Frees c's resources. The communicator of comm_bootstrap also ends MPI (when
 * it started it); a comm_split result frees only itself. */
void comm_finalize(Comm* c);

#endif
