/* comm/comm_internal.h — private to comm/: what comm.c (host side: bootstrap,
 * single and MPI backends) and comm_nccl.c (CUDA side: the NCCL backend and
 * the pinned-memory staging helpers of the MPI backend) share. Outside comm/
 * only test/test_comm.c includes it, for comm_test_stall_next. */
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
/* comm_abort in two halves, so that the NCCL backend can abort its
 * communicators after the message is out and before the ranks end:
 * comm_end_begin claims the end of the process and prints msg. The claim is
 * process-wide, over every communicator and thread: the first claim prints; a
 * nested one (the same thread) prints nothing; a claim from any other thread
 * never returns (parks: the first thread is ending the process).
 * comm_end_finish: MPI_Abort of the job when it has more than one rank, then
 * exit(1), or _exit(1) when off_main (a watchdog thread: exit() would run the
 * atexit handlers, the CUDA runtime's teardown among them, under a main
 * thread that may be inside a CUDA call). */
void comm_end_begin(Comm* c, const char* msg);
NORETURN void comm_end_finish(Comm* c, int off_main);
/* Sleep for about us microseconds (the poll interval of every bounded wait). */
void comm_sleep_us(int us);

#ifdef USE_CUDA
/* ---- NCCL backend (comm_nccl.c) ---- */
typedef struct CommNccl CommNccl;
/* Rank 0 makes the unique id, comm_broadcast_host shares it, every rank joins
 * a non-blocking NCCL communicator on the current device (the CUDA backend
 * has already selected it). Bounded by c->timeout_s. Starts n's watchdog
 * thread, which ends the job (message, ncclCommAbort, MPI_Abort) when an
 * operation of n fails, or has not completed within c->timeout_s of the GPU
 * reaching it. c is copied: c->timeout_s and c->impl must not change while n
 * lives. */
CommNccl* comm_nccl_create(Comm* c);
/* Enqueue op on be->comm_stream, after the work already on be->compute_stream,
 * and hand it to the watchdog. */
void comm_nccl_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int average,
                     CommHandle* h);
/* The compute stream waits on the collective (or transfer) on the device;
 * returns at once, the host never waits here. Failures and timeouts are the
 * watchdog's. */
void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h);
/* ncclCommAbort of every NCCL communicator of n (used before ending the
 * ranks after a failure); once (later calls do nothing). */
void comm_nccl_abort(CommNccl* n);
/* Stops and joins the watchdog, waits on the host (bounded by c->timeout_s)
 * for every operation still in flight, then ncclCommFinalize +
 * ncclCommDestroy of every NCCL communicator of n, its streams and events;
 * frees n. Handles not waited for are void afterwards. */
void comm_nccl_destroy(Comm* c, CommNccl* n);
/* Testing (comm_test_stall_next): see there. */
void comm_nccl_test_stall(CommNccl* n, double seconds);
/* Collective over c (world >= 2): the point-to-point channels of n, one per
 * direction and ring neighbour, each a 2-rank NCCL communicator (sender rank
 * 0, receiver rank 1) with a stream of its own. */
void comm_nccl_p2p_setup(Comm* c, CommNccl* n);
/* ncclSend (op COMM_OP_SEND) or ncclRecv on the channel to / from peer, on the
 * channel's stream after the compute stream's work so far, handed to the
 * watchdog; comm_nccl_wait orders the compute stream after it. count > 0; peer
 * is a neighbour (checked by the caller). */
void comm_nccl_p2p_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int peer, int tag,
                         CommHandle* h);

/* Testing only (test/test_comm.c, the watchdog's test): the next operation
 * started on c, which must use the NCCL backend, gets a host function that
 * sleeps `seconds` queued on its stream between its 'started' event and the
 * NCCL call. The GPU then has reached the operation, which does not complete,
 * as when a peer stalls, however many ranks there are. */
void comm_test_stall_next(Comm* c, double seconds);

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
