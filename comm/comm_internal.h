/* comm/comm_internal.h — private to comm/: what comm.c (host side: bootstrap,
 * single and MPI backends) and comm_nccl.c (CUDA side: the NCCL backend and
 * the pinned-memory staging helpers of the MPI backend) share. Nothing
 * outside comm/ includes it. */
#ifndef COMM_COMM_INTERNAL_H
#define COMM_COMM_INTERNAL_H

#include "comm.h"

typedef enum { COMM_OP_ALLREDUCE = 0, COMM_OP_REDUCE_SCATTER, COMM_OP_ALLGATHER } CommOp;

/* "all-reduce", "reduce-scatter", "all-gather" */
const char* comm_op_name(CommOp op);
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
void comm_nccl_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt,
                     int average, CommHandle* h);
/* Poll the handle's completion event and NCCL's async error until done or
 * c->timeout_s; then the compute stream waits on the collective. */
void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h);
/* ncclCommAbort (used before ending the ranks after a failure). */
void comm_nccl_abort(CommNccl* n);
/* ncclCommFinalize + ncclCommDestroy; frees n. */
void comm_nccl_destroy(Comm* c, CommNccl* n);

/* ---- CUDA helpers of the MPI backend's staging path (comm_nccl.c) ---- */
int comm_cuda_device_count(void);               /* 0 when none or on error */
/* The PCI bus id of the current device ("0000:19:00.0"), NUL-terminated in
 * out[0, n), the rest of out zeroed; aborts on failure. */
void comm_cuda_bus_id(Comm* c, char* out, int n);
void* comm_cuda_host_alloc(Comm* c, size_t bytes); /* pinned; aborts on failure */
void comm_cuda_host_free(void* p);
/* dev -> host on the comm stream, after the compute stream's work so far;
 * returns when the copy is done. */
void comm_cuda_to_host(Comm* c, void* host, const void* dev, size_t bytes);
/* host -> dev on the comm stream; the compute stream waits on the copy; returns
 * when the copy is done (so the host buffer may be reused). */
void comm_cuda_to_device(Comm* c, void* dev, const void* host, size_t bytes);
#endif

#endif
