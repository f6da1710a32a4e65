/* comm/comm_nccl.c — the CUDA side of the communicator: the NCCL backend
 * (a non-blocking NCCL communicator made from a unique id that rank 0 shares
 * over MPI; in-place collectives on the backend's comm stream, ordered after
 * the compute stream by an event; waits bounded by the communicator's timeout
 * that poll the completion event and ncclCommGetAsyncError, and on failure
 * print which operation failed, ncclCommAbort and end every rank), and the
 * pinned-memory helpers the MPI backend uses to stage device buffers.
 * Plain C on the CUDA runtime; compiled only when USE_CUDA is defined. */
#ifdef USE_CUDA

#include "comm_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

struct CommNccl {
    ncclComm_t comm;
    cudaEvent_t* events; /* free list of timing-disabled events */
    int nevents, cap;
};

/* One NCCL collective in flight (CommHandle.impl). */
typedef struct {
    CommOp op;
    size_t count;
    cudaEvent_t done;    /* recorded on the comm stream after the collective */
} CommNcclReq;

#define COMM_CUDA_CHECK(c, call) comm_cuda_check((c), (call), #call, __FILE__, __LINE__)

static void comm_cuda_check(Comm* c, cudaError_t e, const char* what, const char* file, int line) {
    if (e == cudaSuccess) return;
    comm_abortf(c, "%s:%d: %s failed: %s", file, line, what, cudaGetErrorString(e));
}

static cudaStream_t comm_stream_of(Comm* c) { return (cudaStream_t)c->be->comm_stream; }
static cudaStream_t compute_stream_of(Comm* c) { return (cudaStream_t)c->be->compute_stream; }

/* ---------------------------------------------------------------- errors */

/* Abort the NCCL communicator and end every rank with a message that names
 * the operation. */
static NORETURN void comm_nccl_fail(Comm* c, CommNccl* n, const char* what, ncclResult_t r) {
    const char* last = n && n->comm ? ncclGetLastError(n->comm) : NULL;
    char msg[1024];
    snprintf(msg, sizeof msg, "nccl %s failed: %s%s%s%s", what, ncclGetErrorString(r),
             last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
    comm_nccl_abort(n);
    comm_abort(c, msg);
}

static NORETURN void comm_nccl_timeout(Comm* c, CommNccl* n, const char* what) {
    char msg[512];
    snprintf(msg, sizeof msg, "nccl %s did not complete within %g s: a peer rank died or stalled", what,
             c->timeout_s);
    comm_nccl_abort(n);
    comm_abort(c, msg);
}

/* A call on a non-blocking communicator may return ncclInProgress: then no
 * other NCCL call may be made until the communicator's state leaves
 * ncclInProgress. Wait for that (bounded), and fail on any error. */
static void comm_nccl_settle(Comm* c, CommNccl* n, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) comm_nccl_fail(c, n, what, r);
    double t0 = wall_time_s();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &st);
        if (q != ncclSuccess) comm_nccl_fail(c, n, what, q);
        if (st == ncclSuccess) return;
        if (st != ncclInProgress) comm_nccl_fail(c, n, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
}

void comm_nccl_abort(CommNccl* n) {
    if (n && n->comm) {
        ncclCommAbort(n->comm);
        n->comm = NULL;
    }
}

/* --------------------------------------------------------------- events */

static cudaEvent_t comm_nccl_event_get(Comm* c, CommNccl* n) {
    if (n->nevents > 0) return n->events[--n->nevents];
    cudaEvent_t e;
    COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

static void comm_nccl_event_put(CommNccl* n, cudaEvent_t e) {
    if (n->nevents == n->cap) {
        int cap = n->cap ? 2 * n->cap : 8;
        cudaEvent_t* ne = (cudaEvent_t*)realloc(n->events, (size_t)cap * sizeof(cudaEvent_t));
        if (!ne) {
            cudaEventDestroy(e);
            return;
        }
        n->events = ne;
        n->cap = cap;
    }
    n->events[n->nevents++] = e;
}

/* ------------------------------------------------------------- lifecycle */

CommNccl* comm_nccl_create(Comm* c) {
    CommNccl* n = (CommNccl*)xcalloc(1, sizeof *n);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) comm_nccl_fail(c, n, "ncclGetUniqueId", r);
    }
    comm_broadcast_host(c, &id, sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* non-blocking: errors and hangs can be polled and aborted */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->world, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        /* the communicator may not exist: nothing to abort */
        char msg[512];
        snprintf(msg, sizeof msg, "nccl init (rank %d of %d) failed: %s", c->rank, c->world,
                 ncclGetErrorString(r));
        n->comm = NULL;
        comm_abort(c, msg);
    }
    comm_nccl_settle(c, n, r, "init (ncclCommInitRankConfig)");
    return n;
}

void comm_nccl_destroy(Comm* c, CommNccl* n) {
    if (!n) return;
    if (n->comm) {
        comm_nccl_settle(c, n, ncclCommFinalize(n->comm), "finalize (ncclCommFinalize)");
        ncclCommDestroy(n->comm);
        n->comm = NULL;
    }
    for (int i = 0; i < n->nevents; i++) cudaEventDestroy(n->events[i]);
    free(n->events);
    free(n);
}

/* ----------------------------------------------------------- collectives */

void comm_nccl_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt,
                     int average, CommHandle* h) {
    ncclDataType_t t = dt == DTYPE_BF16 ? ncclBfloat16 : ncclFloat;
    ncclRedOp_t rop = average ? ncclAvg : ncclSum;
    size_t es = dtype_size(dt);
    size_t slice = count / (size_t)c->world;
    char* own = (char*)buf + (size_t)c->rank * slice * es;
    cudaStream_t cs = comm_stream_of(c);
    char what[128];
    snprintf(what, sizeof what, "%s of %zu elements", comm_op_name(op), count);

    /* the comm stream runs after what the compute stream has queued so far */
    cudaEvent_t ready = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(ready, compute_stream_of(c)));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(cs, ready, 0));
    comm_nccl_event_put(n, ready); /* the wait above has captured it */

    ncclResult_t r;
    switch (op) {
    case COMM_OP_ALLREDUCE:
        r = ncclAllReduce(buf, buf, count, t, rop, n->comm, cs);
        break;
    case COMM_OP_REDUCE_SCATTER:
        r = ncclReduceScatter(buf, own, slice, t, rop, n->comm, cs);
        break;
    default:
        r = ncclAllGather(own, buf, slice, t, n->comm, cs);
        break;
    }
    comm_nccl_settle(c, n, r, what);

    CommNcclReq* q = (CommNcclReq*)xcalloc(1, sizeof *q);
    q->op = op;
    q->count = count;
    q->done = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(q->done, cs));
    h->impl = q;
}

void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h) {
    CommNcclReq* q = (CommNcclReq*)h->impl;
    char what[128];
    snprintf(what, sizeof what, "%s of %zu elements", comm_op_name(q->op), q->count);
    double t0 = wall_time_s();
    for (;;) {
        cudaError_t e = cudaEventQuery(q->done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            char msg[512];
            snprintf(msg, sizeof msg, "nccl %s: CUDA error while waiting: %s", what, cudaGetErrorString(e));
            comm_nccl_abort(n);
            comm_abort(c, msg);
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t qr = ncclCommGetAsyncError(n->comm, &st);
        if (qr != ncclSuccess) comm_nccl_fail(c, n, what, qr);
        if (st != ncclSuccess && st != ncclInProgress) comm_nccl_fail(c, n, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
    /* later compute-stream work is ordered after the collective */
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(compute_stream_of(c), q->done, 0));
    comm_nccl_event_put(n, q->done);
    free(q);
    h->impl = NULL;
}

/* ------------------------------------------------ MPI backend's staging */

int comm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the error state so that later calls are unaffected */
        return 0;
    }
    return n;
}

void comm_cuda_bus_id(Comm* c, char* out, int n) {
    int dev = 0;
    memset(out, 0, (size_t)n);
    COMM_CUDA_CHECK(c, cudaGetDevice(&dev));
    COMM_CUDA_CHECK(c, cudaDeviceGetPCIBusId(out, n - 1, dev));
}

void* comm_cuda_host_alloc(Comm* c, size_t bytes) {
    void* p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess)
        comm_abortf(c, "comm: cannot allocate %zu bytes of pinned host memory for MPI staging: %s", bytes,
                    cudaGetErrorString(e));
    return p;
}

void comm_cuda_host_free(void* p) {
    if (p) cudaFreeHost(p);
}

void comm_cuda_to_host(Comm* c, void* host, const void* dev, size_t bytes) {
    cudaStream_t cs = comm_stream_of(c);
    cudaEvent_t e;
    COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    COMM_CUDA_CHECK(c, cudaEventRecord(e, compute_stream_of(c)));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(cs, e, 0));
    COMM_CUDA_CHECK(c, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cs));
    COMM_CUDA_CHECK(c, cudaStreamSynchronize(cs));
    cudaEventDestroy(e);
}

void comm_cuda_to_device(Comm* c, void* dev, const void* host, size_t bytes) {
    cudaStream_t cs = comm_stream_of(c);
    cudaEvent_t e;
    COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    COMM_CUDA_CHECK(c, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cs));
    COMM_CUDA_CHECK(c, cudaEventRecord(e, cs));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(compute_stream_of(c), e, 0));
    COMM_CUDA_CHECK(c, cudaStreamSynchronize(cs));
    cudaEventDestroy(e);
}

#else
/* built without CUDA: nothing here (ISO C wants a non-empty file) */
typedef int comm_nccl_unused;
#endif /* USE_CUDA */
