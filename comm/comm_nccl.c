/* comm/comm_nccl.c — the CUDA side of the communicator: the NCCL backend
 * (a non-blocking NCCL communicator made from a unique id that rank 0 shares
 * over MPI; in-place collectives on the backend's comm stream, ordered after
 * the compute stream by an event; waits bounded by the communicator's timeout
 * that poll the completion event and ncclCommGetAsyncError, and on failure
 * print which operation failed, ncclCommAbort and end every rank), its
 * point-to-point channels, and the pinned-memory helpers the MPI backend uses
 * to stage device buffers. Plain C on the CUDA runtime; compiled only when
 * USE_CUDA is defined.
 *
 * Point-to-point channels. NCCL matches the sends and receives between two
 * ranks of one communicator in issue order, and a send or receive blocks the
 * GPU until its peer's matching operation runs; operations of one
 * communicator that are not in one ncclGroupStart/End group are not promised
 * to progress concurrently. So a rank sending to its neighbour while that
 * neighbour sends to it would deadlock on one communicator. Each direction to
 * each ring neighbour therefore gets a channel of its own: a 2-rank NCCL
 * communicator (the sender is its rank 0, the receiver its rank 1) and a CUDA
 * stream. A channel carries exactly one first-in first-out message stream, so
 * NCCL's issue-order matching is exactly the ordering contract of comm.h, and
 * a blocked transfer only holds back later transfers of the same stream.
 * NCCL connects point-to-point peers lazily, at the first transfer, with a
 * handshake that blocks the host until the peer's first transfer on that
 * communicator; comm_nccl_p2p_setup therefore makes one 1-element transfer on
 * every channel in a single group, so that posting a transfer later never
 * waits for a peer. */
#ifdef USE_CUDA

#include "comm_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

/* One direction of the link with a ring neighbour (see the top of the file). */
typedef struct {
    ncclComm_t comm;     /* 2 ranks: the sender is rank 0, the receiver rank 1 */
    cudaStream_t stream; /* this channel's transfers, in posting order */
    int peer;            /* the neighbour, a rank of the Comm */
    int send;            /* 1: this rank sends on it; 0: it receives */
} CommNcclChannel;

struct CommNccl {
    ncclComm_t comm;
    CommNcclChannel ch[4]; /* comm_nccl_p2p_setup: up to 2 neighbours x 2 directions */
    int nch;
    void* p2p_scratch;   /* device memory of the setup's 1-element transfers */
    cudaEvent_t* events; /* free list of timing-disabled events */
    int nevents, cap;
};

/* One NCCL collective or transfer in flight (CommHandle.impl). */
typedef struct {
    CommOp op;
    size_t count;
    int peer, tag;    /* transfers */
    ncclComm_t comm;  /* the NCCL communicator it runs on (whose errors are polled) */
    cudaEvent_t done; /* recorded on its stream after the operation */
} CommNcclReq;

#define COMM_CUDA_CHECK(c, call) comm_cuda_check((c), (call), #call, __FILE__, __LINE__)

static void comm_cuda_check(Comm* c, cudaError_t e, const char* what, const char* file, int line) {
    if (e == cudaSuccess) return;
    comm_abortf(c, "%s:%d: %s failed: %s", file, line, what, cudaGetErrorString(e));
}

static cudaStream_t comm_stream_of(Comm* c) { return (cudaStream_t)c->be->comm_stream; }
static cudaStream_t compute_stream_of(Comm* c) { return (cudaStream_t)c->be->compute_stream; }

/* ---------------------------------------------------------------- errors */

/* Abort the NCCL communicators and end every rank with a message that names
 * the operation; comm is the communicator that failed (NULL: none yet). */
static NORETURN void comm_nccl_fail(Comm* c, CommNccl* n, ncclComm_t comm, const char* what, ncclResult_t r) {
    const char* last = comm ? ncclGetLastError(comm) : NULL;
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
 * other NCCL call may be made on it until its state leaves ncclInProgress.
 * Wait for that (bounded), and fail on any error. comm: the communicator the
 * call was made on. */
static void comm_nccl_settle(Comm* c, CommNccl* n, ncclComm_t comm, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) comm_nccl_fail(c, n, comm, what, r);
    double t0 = wall_time_s();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &st);
        if (q != ncclSuccess) comm_nccl_fail(c, n, comm, what, q);
        if (st == ncclSuccess) return;
        if (st != ncclInProgress) comm_nccl_fail(c, n, comm, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
}

void comm_nccl_abort(CommNccl* n) {
    if (!n) return;
    if (n->comm) {
        ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    for (int i = 0; i < n->nch; i++)
        if (n->ch[i].comm) {
            ncclCommAbort(n->ch[i].comm);
            n->ch[i].comm = NULL;
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
        if (r != ncclSuccess) comm_nccl_fail(c, n, NULL, "ncclGetUniqueId", r);
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
    comm_nccl_settle(c, n, n->comm, r, "init (ncclCommInitRankConfig)");
    return n;
}

void comm_nccl_destroy(Comm* c, CommNccl* n) {
    if (!n) return;
    /* the channels: start every finalize, then wait for them all (non-blocking,
     * so the order in which the neighbours finalize theirs does not matter) */
    const char* fin = "finalize of a point-to-point channel (ncclCommFinalize)";
    for (int i = 0; i < n->nch; i++) {
        ncclResult_t r = n->ch[i].comm ? ncclCommFinalize(n->ch[i].comm) : ncclSuccess;
        if (r != ncclSuccess && r != ncclInProgress) comm_nccl_fail(c, n, n->ch[i].comm, fin, r);
    }
    for (int i = 0; i < n->nch; i++) {
        CommNcclChannel* ch = &n->ch[i];
        if (ch->comm) {
            comm_nccl_settle(c, n, ch->comm, ncclInProgress, fin);
            ncclCommDestroy(ch->comm);
            ch->comm = NULL;
        }
        if (ch->stream) cudaStreamDestroy(ch->stream);
        ch->stream = NULL;
    }
    n->nch = 0;
    if (n->p2p_scratch) cudaFree(n->p2p_scratch);
    n->p2p_scratch = NULL;
    if (n->comm) {
        comm_nccl_settle(c, n, n->comm, ncclCommFinalize(n->comm), "finalize (ncclCommFinalize)");
        ncclCommDestroy(n->comm);
        n->comm = NULL;
    }
    for (int i = 0; i < n->nevents; i++) cudaEventDestroy(n->events[i]);
    free(n->events);
    free(n);
}

/* ----------------------------------------------------------- collectives */

void comm_nccl_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int average,
                     CommHandle* h) {
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
    case COMM_OP_ALLREDUCE: r = ncclAllReduce(buf, buf, count, t, rop, n->comm, cs); break;
    case COMM_OP_REDUCE_SCATTER: r = ncclReduceScatter(buf, own, slice, t, rop, n->comm, cs); break;
    default: r = ncclAllGather(own, buf, slice, t, n->comm, cs); break;
    }
    comm_nccl_settle(c, n, n->comm, r, what);

    CommNcclReq* q = (CommNcclReq*)xcalloc(1, sizeof *q);
    q->op = op;
    q->count = count;
    q->comm = n->comm;
    q->done = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(q->done, cs));
    h->impl = q;
}

/* Poll ev (recorded after an operation on comm) and comm's async error until
 * ev completes or c->timeout_s passes. */
static void comm_nccl_wait_event(Comm* c, CommNccl* n, ncclComm_t comm, cudaEvent_t ev, const char* what) {
    double t0 = wall_time_s();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) {
            char msg[512];
            snprintf(msg, sizeof msg, "nccl %s: CUDA error while waiting: %s", what, cudaGetErrorString(e));
            comm_nccl_abort(n);
            comm_abort(c, msg);
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t qr = ncclCommGetAsyncError(comm, &st);
        if (qr != ncclSuccess) comm_nccl_fail(c, n, comm, what, qr);
        if (st != ncclSuccess && st != ncclInProgress) comm_nccl_fail(c, n, comm, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
}

void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h) {
    CommNcclReq* q = (CommNcclReq*)h->impl;
    char what[192];
    if (q->op == COMM_OP_SEND || q->op == COMM_OP_RECV)
        comm_p2p_describe(c, what, sizeof what, q->op, q->count, q->peer, q->tag);
    else snprintf(what, sizeof what, "%s of %zu elements", comm_op_name(q->op), q->count);
    comm_nccl_wait_event(c, n, q->comm, q->done, what);
    /* later compute-stream work is ordered after the operation */
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(compute_stream_of(c), q->done, 0));
    comm_nccl_event_put(n, q->done);
    free(q);
    h->impl = NULL;
}

/* -------------------------------------------------------- point to point */

static void comm_nccl_channel_add(CommNccl* n, int peer, int send) {
    CommNcclChannel* ch = &n->ch[n->nch++];
    memset(ch, 0, sizeof *ch);
    ch->peer = peer;
    ch->send = send;
}

void comm_nccl_p2p_setup(Comm* c, CommNccl* n) {
    int W = c->world, r = c->rank;
    int right = (r + 1) % W, left = (r - 1 + W) % W;
    int two = W > 2; /* two distinct neighbours; at W = 2 both are the same rank */
    /* the ids of the channels this rank sends on: [0] to the right, [1] to the left */
    ncclUniqueId mine[2];
    memset(mine, 0, sizeof mine);
    for (int i = 0; i < 1 + two; i++) {
        ncclResult_t e = ncclGetUniqueId(&mine[i]);
        if (e != ncclSuccess) comm_nccl_fail(c, n, NULL, "ncclGetUniqueId (point-to-point setup)", e);
    }
    ncclUniqueId* all = (ncclUniqueId*)xmalloc((size_t)W * sizeof mine);
    comm_allgather_host(c, mine, all, sizeof mine);
    ncclUniqueId ids[4];
    n->nch = 0;
    ids[n->nch] = mine[0];
    comm_nccl_channel_add(n, right, 1);
    ids[n->nch] = all[2 * left + 0]; /* the left neighbour's channel to its right */
    comm_nccl_channel_add(n, left, 0);
    if (two) {
        ids[n->nch] = mine[1];
        comm_nccl_channel_add(n, left, 1);
        ids[n->nch] = all[2 * right + 1]; /* the right neighbour's channel to its left */
        comm_nccl_channel_add(n, right, 0);
    }
    free(all);

    /* non-blocking inits run in the background: start all, then wait for all,
     * so that the order in which the neighbours start theirs does not matter */
    for (int i = 0; i < n->nch; i++) {
        CommNcclChannel* ch = &n->ch[i];
        COMM_CUDA_CHECK(c, cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t e = ncclCommInitRankConfig(&ch->comm, 2, ids[i], ch->send ? 0 : 1, &cfg);
        if (e != ncclSuccess && e != ncclInProgress) {
            ch->comm = NULL;
            comm_nccl_fail(c, n, NULL, "init of a point-to-point channel (ncclCommInitRankConfig)", e);
        }
    }
    char what[128];
    for (int i = 0; i < n->nch; i++) {
        snprintf(what, sizeof what, "init of the point-to-point channel %s rank %d",
                 n->ch[i].send ? "to" : "from", n->ch[i].peer);
        comm_nccl_settle(c, n, n->ch[i].comm, ncclInProgress, what);
    }

    /* connect every channel now, in one group (see the top of the file) */
    /* (what the 1-element transfers carry does not matter) */
    COMM_CUDA_CHECK(c, cudaMalloc(&n->p2p_scratch, 4 * sizeof(float)));
    const char* connect = "point-to-point setup (connecting the channels)";
    ncclResult_t e = ncclGroupStart();
    if (e != ncclSuccess) comm_nccl_fail(c, n, NULL, connect, e);
    for (int i = 0; i < n->nch; i++) {
        CommNcclChannel* ch = &n->ch[i];
        float* x = (float*)n->p2p_scratch + i;
        e = ch->send ? ncclSend(x, 1, ncclFloat, 1, ch->comm, ch->stream)
                     : ncclRecv(x, 1, ncclFloat, 0, ch->comm, ch->stream);
        if (e != ncclSuccess && e != ncclInProgress) comm_nccl_fail(c, n, ch->comm, connect, e);
    }
    e = ncclGroupEnd();
    if (e != ncclSuccess && e != ncclInProgress) comm_nccl_fail(c, n, NULL, connect, e);
    for (int i = 0; i < n->nch; i++) comm_nccl_settle(c, n, n->ch[i].comm, ncclInProgress, connect);
    for (int i = 0; i < n->nch; i++) {
        cudaEvent_t ev = comm_nccl_event_get(c, n);
        COMM_CUDA_CHECK(c, cudaEventRecord(ev, n->ch[i].stream));
        comm_nccl_wait_event(c, n, n->ch[i].comm, ev, connect);
        comm_nccl_event_put(n, ev);
    }
}

void comm_nccl_p2p_start(Comm* c, CommNccl* n, CommOp op, void* buf, size_t count, DType dt, int peer, int tag,
                         CommHandle* h) {
    int send = op == COMM_OP_SEND;
    char what[192];
    comm_p2p_describe(c, what, sizeof what, op, count, peer, tag);
    CommNcclChannel* ch = NULL;
    for (int i = 0; i < n->nch; i++)
        if (n->ch[i].peer == peer && n->ch[i].send == send) ch = &n->ch[i];
    if (!ch) comm_abortf(c, "nccl %s: no channel to that peer (comm_p2p_setup not called?)", what);

    /* the channel's stream runs after what the compute stream has queued so far */
    cudaEvent_t ready = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(ready, compute_stream_of(c)));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(ch->stream, ready, 0));
    comm_nccl_event_put(n, ready); /* the wait above has captured it */

    ncclDataType_t t = dt == DTYPE_BF16 ? ncclBfloat16 : ncclFloat;
    ncclResult_t r = send ? ncclSend(buf, count, t, 1, ch->comm, ch->stream)
                          : ncclRecv(buf, count, t, 0, ch->comm, ch->stream);
    comm_nccl_settle(c, n, ch->comm, r, what);

    CommNcclReq* q = (CommNcclReq*)xcalloc(1, sizeof *q);
    q->op = op;
    q->count = count;
    q->peer = peer;
    q->tag = tag;
    q->comm = ch->comm;
    q->done = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(q->done, ch->stream));
    h->impl = q;
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

void comm_cuda_to_device(Comm* c, void* dev, const void* host, size_t bytes, int after_compute) {
    cudaStream_t cs = comm_stream_of(c);
    cudaEvent_t e;
    COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (after_compute) {
        COMM_CUDA_CHECK(c, cudaEventRecord(e, compute_stream_of(c)));
        COMM_CUDA_CHECK(c, cudaStreamWaitEvent(cs, e, 0));
    }
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
