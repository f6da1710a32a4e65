/* comm/comm_internal.h — private to comm/: what comm.c (host side: bootstrap,
 * single and MPI backends) and comm_nccl.c (CUDA side: the NCCL backend and
 * the pinned-memory staging helpers of the MPI backend) share. Nothing
 * outside comm/ includes it. */
#ifndef COMM_COMM_INTERNAL_H
#define COMM_COMM_INTERNAL_H

#include "comm.h"

typedef enum {
    COMM_OP_ALLREDUCE = 0,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_ALLGATHER,
    COMM_OP_SEND,
    COMM_OP_RECV
} CommOp;

/* "all-reduce", "reduce-scatter", "all-gather", "send", "receive" */
const char* comm_op_name(CommOp op);
/* The global rank (in the job) of rank r of c. */
int comm_global_rank(Comm* c, int r);
/* Describes a transfer for messages: "send of N elements to rank P (global
 * rank G), tag T" or "receive of ... from ...". */
void comm_p2p_describe(Comm* c, char* out, size_t outsz, CommOp op, size_t count, int peer, int tag);
/* Blocking, bounded all-gather of host bytes: every rank's `bytes` bytes at
 * mine land at all + rank * bytes on every rank of c. Collective over c. */
void comm_allgather_host(Comm* c, const void* mine, void* all, size_t bytes);
/* Like comm_abort, with a printf-style message. */
NORETURN void comm_abortf(Comm* c, const char* fmt, ...) PRINTF_LIKE(2, 3);
/* Sleep for about us microseconds (the poll interval of every bounded wait). */
void comm_sleep_us(int us);

#ifdef USE_CUDA
/* ---- NCCL backend (comm_nccl.c) ---- */
typedef struct CommNccl CommNccl;
/* Rank 0 makes the unique id, comm_broadcast_host shares it, every rank joins
 * a non-blocking NCCL communicator on the current device (the CUDA backend
 * has already selected it). Bounded by c->timeout_s. */
CommNccl* comm_nccl_create(Comm* c);
/* Enqueue op on be->comm_stream, after the work already on be->compute_stream. */
void comm_nccl_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int average,
                     CommHandle* h);
/* Poll the handle's completion event and NCCL's async error until done or
 * c->timeout_s; then the compute stream waits on the collective (or transfer). */
void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h);
/* ncclCommAbort of every NCCL communicator of n (used before ending the
 * ranks after a failure). */
void comm_nccl_abort(CommNccl* n);
/* ncclCommFinalize + ncclCommDestroy of every NCCL communicator of n, and its
 * streams; frees n. */
void comm_nccl_destroy(Comm* c, CommNccl* n);
/* Collective over c (world >= 2): the point-to-point channels of n, one per
 * direction and ring neighbour, each a 2-rank NCCL communicator (sender rank
 * 0, receiver rank 1) with a stream of its own. */
void comm_nccl_p2p_setup(Comm* c, CommNccl* n);
/* ncclSend (op COMM_OP_SEND) or ncclRecv on the channel to / from peer, on the
 * channel's stream after the compute stream's work so far; comm_nccl_wait
 * completes h. count > 0; peer is a neighbour (checked by the caller). */
void comm_nccl_p2p_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int peer, int tag,
                         CommHandle* h);

/* ---- CUDA helpers of the MPI backend's staging path (comm_nccl.c) ---- */
int comm_cuda_device_count(void); /* 0 when none or on error */
/* The PCI bus id of the current device ("0000:19:00.0"), NUL-terminated in
 * out[0, n), the rest of out zeroed; aborts on failure. */
void comm_cuda_bus_id(Comm* c, char* out, int n);
void* comm_cuda_host_alloc(Comm* c, size_t bytes); /* pinned; aborts on failure */
void comm_cuda_host_free(void* p);
/* dev -> host on the comm stream, after the compute stream's work so far;
 * returns when the copy is done. */
void comm_cuda_to_host(Comm* c, void* host, const void* dev, size_t bytes);
/* host -> dev on the comm stream; the compute stream waits on the copy; returns
 * when the copy is done (so the host buffer may be reused). after_compute: the
 * copy also waits for the work the compute stream has queued so far (a
 * received transfer, whose buffer that work may still read). */
void comm_cuda_to_device(Comm* c, void* dev, const void* host, size_t bytes, int after_compute);
#endif

#endif
