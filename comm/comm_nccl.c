/* comm/comm_nccl.c — the CUDA side of the communicator: the NCCL backend
 * (a non-blocking NCCL communicator made from a unique id that rank 0 shares
 * over MPI; in-place collectives on the backend's comm stream, ordered after
 * the compute stream by an event; waits on the device, with a watchdog thread
 * that ends every rank when an operation fails or stalls), its point-to-point
 * channels, and the pinned-memory helpers the MPI backend uses to stage
 * device buffers. Plain C on the CUDA runtime; compiled only when USE_CUDA is
 * defined.
 *
 * Waits and the watchdog. comm_nccl_wait only makes the compute stream wait on
 * the operation's completion event (cudaStreamWaitEvent) and returns: the host
 * keeps queuing kernels ahead of the GPU, and whatever later blocks the host
 * on the GPU (a stream synchronisation, a loss read) blocks on the device's
 * order. A thread per CommNccl, the watchdog, keeps the timeout guarantee:
 * every operation goes on its in-flight list when it is enqueued, with a
 * 'started' event recorded on its stream just before the NCCL call and a
 * 'done' event after it. About every millisecond the watchdog retires what
 * has completed (and been waited for), ends the job on an asynchronous NCCL
 * error, and ends it when an operation has not completed within the timeout
 * of the watchdog first seeing its 'started' event complete. Counting from
 * 'started', not from comm_wait: the host may run far ahead of the GPU, so the
 * time since comm_wait says nothing; once the GPU has reached the operation
 * it only waits for the peers, and that wait is what the timeout bounds. The
 * watchdog watches from the launch, not only from comm_wait, so an operation
 * in flight but not yet waited for is covered too (say while the host blocks
 * in a device-synchronising call). Host waits remain where the host itself
 * needs the result: init and finalize, the point-to-point setup's transfers,
 * comm_nccl_destroy; they poll, bounded by the timeout.
 *
 * One watchdog per CommNccl (the job's communicator and each comm_split
 * group's), not one per process: a CommNccl owns its communicators, events and
 * in-flight list, so a failure aborts exactly its own communicators, as the
 * host waits did, and no registry shared between communicators (process-wide
 * state, or pointers from each group to the job's communicator with lifetimes
 * to manage) is needed. The trainer has at most four (the job's, data-parallel,
 * pipeline, embedding groups); each sleeps between its polls.
 *
 * Ending the job from the watchdog: the message is printed first (one thread
 * only: comm_end_begin's process-wide claim), then ncclCommAbort of n's
 * communicators (NCCL kernels spinning on a dead peer quit), then MPI_Abort and
 * _exit. MPI is initialised MPI_THREAD_FUNNELED, which strictly reserves MPI
 * calls to the main thread; MPI_Abort is made from the watchdog anyway, as
 * torch's NCCL watchdog ends its process from its own thread: it is the one
 * call that never returns, and Open MPI carries it out through its runtime
 * (a message to the local daemon, then _exit), not through the point-to-point
 * progress the main thread may be in. MPI_THREAD_MULTIPLE would make it legal
 * at the price of locks in every MPI call of the MPI backend (and transports
 * that refuse it); plain _exit would leave other ranks to their own timeouts
 * under srun, which does not end a job when one task fails. _exit rather than
 * exit: atexit handlers (the CUDA runtime's teardown) must not run under a
 * main thread blocked in a CUDA call. ncclCommAbort runs on a helper thread and
 * is waited for a bounded time: it synchronises NCCL's internal stream, which
 * follows the operation's stream, so work queued there ahead of the kernel can
 * hold it up; the job ends regardless. The main thread makes its NCCL calls
 * holding n->api, which ncclCommAbort takes first (bounded, in case the main
 * thread is stuck in a kernel launch behind a full queue), so a communicator
 * is not freed under a call in progress; and after an abort the main thread
 * makes no NCCL call on n again (it parks while the watchdog ends the job).
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
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The watchdog's poll interval. */
#define COMM_NCCL_WATCH_US 1000
/* How long ending the job waits for ncclCommAbort, and how long that waits
 * for the main thread to leave an NCCL call (seconds; see the top of the file). */
#define COMM_NCCL_ABORT_WAIT_S 2.0
#define COMM_NCCL_API_WAIT_S 0.5

/* One direction of the link with a ring neighbour (see the top of the file). */
typedef struct {
    ncclComm_t comm;     /* 2 ranks: the sender is rank 0, the receiver rank 1 */
    cudaStream_t stream; /* this channel's transfers, in posting order */
    int peer;            /* the neighbour, a rank of the Comm */
    int send;            /* 1: this rank sends on it; 0: it receives */
} CommNcclChannel;

/* One NCCL collective or transfer in flight (CommHandle.impl), and the
 * watchdog's record of it. */
typedef struct CommNcclReq {
    struct CommNcclReq* next; /* the in-flight list, under CommNccl.mu */
    char what[192];           /* "all-reduce of N elements", or comm_p2p_describe's text */
    ncclComm_t comm;          /* the NCCL communicator it runs on (whose errors are polled) */
    cudaEvent_t started;      /* recorded on its stream just before the NCCL call */
    cudaEvent_t done;         /* recorded on its stream after the operation */
    double started_at;        /* when the watchdog first saw 'started' complete; < 0: not yet */
    int complete;             /* the watchdog saw 'done' complete */
    int waited;               /* comm_nccl_wait ordered the compute stream after 'done' */
} CommNcclReq;

struct CommNccl {
    Comm c;     /* a copy of the communicator: the watchdog's timeout, and what it ends the job with */
    int device; /* the GPU (the watchdog and the abort helper select it) */
    ncclComm_t comm;
    CommNcclChannel ch[4]; /* comm_nccl_p2p_setup: up to 2 neighbours x 2 directions */
    int nch;
    void* p2p_scratch;   /* device memory of the setup's 1-element transfers */
    double test_stall_s; /* comm_nccl_test_stall: armed for the next operation */
    /* Held by the main thread across each of its NCCL calls on these
     * communicators, and by comm_nccl_abort (bounded). */
    pthread_mutex_t api;
    atomic_int aborted;    /* comm_nccl_abort has run: the communicators are gone */
    atomic_int abort_done; /* comm_nccl_abort_bounded's helper has finished */
    /* The watchdog and what it shares with the main thread, under mu. */
    pthread_mutex_t mu;
    pthread_t thread;
    int watching; /* the thread runs (joined by comm_nccl_destroy) */
    int stop;     /* asks it to return */
    CommNcclReq* head;
    CommNcclReq** tail;  /* &head, or &last->next */
    cudaEvent_t* events; /* free list of timing-disabled events */
    int nevents, cap;
};

#define COMM_CUDA_CHECK(c, call) comm_cuda_check((c), (call), #call, __FILE__, __LINE__)

static void comm_cuda_check(Comm* c, cudaError_t e, const char* what, const char* file, int line) {
    if (e == cudaSuccess) return;
    comm_abortf(c, "%s:%d: %s failed: %s", file, line, what, cudaGetErrorString(e));
}

static cudaStream_t comm_stream_of(Comm* c) { return (cudaStream_t)c->be->comm_stream; }
static cudaStream_t compute_stream_of(Comm* c) { return (cudaStream_t)c->be->compute_stream; }

/* ---------------------------------------------------------------- errors */

static void* comm_nccl_abort_main(void* arg) {
    CommNccl* n = (CommNccl*)arg;
    cudaSetDevice(n->device); /* (a runtime call here must not make a context on GPU 0) */
    comm_nccl_abort(n);
    atomic_store(&n->abort_done, 1);
    return NULL;
}

/* comm_nccl_abort on a helper thread, waited for at most
 * COMM_NCCL_ABORT_WAIT_S. Returns 1 when it finished. */
static int comm_nccl_abort_bounded(CommNccl* n) {
    if (!n) return 1;
    pthread_t th;
    if (pthread_create(&th, NULL, comm_nccl_abort_main, n) != 0) {
        comm_nccl_abort(n);
        return 1;
    }
    pthread_detach(th);
    double t0 = wall_time_s();
    while (!atomic_load(&n->abort_done)) {
        if (wall_time_s() - t0 > COMM_NCCL_ABORT_WAIT_S) return 0;
        comm_sleep_us(1000);
    }
    return 1;
}

/* End every rank after a failure of n: print msg (unless another thread is
 * already ending the process: then park), abort n's NCCL communicators
 * (bounded), end the job. off_main: called from the watchdog. */
static NORETURN void comm_nccl_end(Comm* c, CommNccl* n, const char* msg, int off_main) {
    comm_end_begin(c, msg);
    int aborted = comm_nccl_abort_bounded(n);
    /* an abort still running is a thread inside NCCL and CUDA: no atexit teardown under it */
    comm_end_finish(c, off_main || !aborted);
}

/* The message of a failed NCCL call or operation; comm: the communicator
 * that failed (NULL: none yet). */
static void comm_nccl_fail_text(char* out, size_t cap, ncclComm_t comm, const char* what, ncclResult_t r) {
    const char* last = comm ? ncclGetLastError(comm) : NULL;
    snprintf(out, cap, "nccl %s failed: %s%s%s%s", what, ncclGetErrorString(r), last && *last ? " (" : "",
             last && *last ? last : "", last && *last ? ")" : "");
}

static void comm_nccl_timeout_text(char* out, size_t cap, const char* what, double timeout_s) {
    snprintf(out, cap, "nccl %s did not complete within %g s: a peer rank died or stalled", what, timeout_s);
}

static NORETURN void comm_nccl_fail(Comm* c, CommNccl* n, ncclComm_t comm, const char* what, ncclResult_t r) {
    char msg[1024];
    comm_nccl_fail_text(msg, sizeof msg, comm, what, r);
    comm_nccl_end(c, n, msg, 0);
}

static NORETURN void comm_nccl_timeout(Comm* c, CommNccl* n, const char* what) {
    char msg[512];
    comm_nccl_timeout_text(msg, sizeof msg, what, c->timeout_s);
    comm_nccl_end(c, n, msg, 0);
}

/* The main thread around each of its NCCL calls on n's communicators (never
 * held across a wait, nor while ending the job). After an abort the
 * communicators are gone: the thread that aborted them is ending the job, so
 * comm_abort parks this one. */
static void comm_nccl_enter(Comm* c, CommNccl* n) {
    pthread_mutex_lock(&n->api);
    if (atomic_load(&n->aborted)) {
        pthread_mutex_unlock(&n->api);
        comm_abort(c, "nccl: the communicator was aborted after a failure");
    }
}

static void comm_nccl_leave(CommNccl* n) { pthread_mutex_unlock(&n->api); }

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
        comm_nccl_enter(c, n);
        ncclResult_t q = ncclCommGetAsyncError(comm, &st);
        comm_nccl_leave(n);
        if (q != ncclSuccess) comm_nccl_fail(c, n, comm, what, q);
        if (st == ncclSuccess) return;
        if (st != ncclInProgress) comm_nccl_fail(c, n, comm, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
}

/* pthread_mutex_lock, giving up after s seconds; 1: locked. */
static int comm_nccl_lock_bounded(pthread_mutex_t* m, double s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((s - (double)(long)s) * 1e9);
    ts.tv_sec += (time_t)s + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    return pthread_mutex_timedlock(m, &ts) == 0;
}

void comm_nccl_abort(CommNccl* n) {
    if (!n) return;
    /* api: not under an NCCL call of the main thread, unless that call is stuck
     * (a kernel launch behind a full queue) */
    int api = comm_nccl_lock_bounded(&n->api, COMM_NCCL_API_WAIT_S);
    /* mu: not under the watchdog's poll of ncclCommGetAsyncError */
    pthread_mutex_lock(&n->mu);
    if (!atomic_load(&n->aborted)) {
        atomic_store(&n->aborted, 1);
        if (n->comm) ncclCommAbort(n->comm);
        n->comm = NULL;
        for (int i = 0; i < n->nch; i++) {
            if (n->ch[i].comm) ncclCommAbort(n->ch[i].comm);
            n->ch[i].comm = NULL;
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (api) pthread_mutex_unlock(&n->api);
}

/* --------------------------------------------------------------- events */

static cudaEvent_t comm_nccl_event_get(Comm* c, CommNccl* n) {
    pthread_mutex_lock(&n->mu);
    int have = n->nevents > 0;
    cudaEvent_t e = have ? n->events[--n->nevents] : NULL;
    pthread_mutex_unlock(&n->mu);
    if (!have) COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

/* With n->mu held. */
static void comm_nccl_event_put_locked(CommNccl* n, cudaEvent_t e) {
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

static void comm_nccl_event_put(CommNccl* n, cudaEvent_t e) {
    pthread_mutex_lock(&n->mu);
    comm_nccl_event_put_locked(n, e);
    pthread_mutex_unlock(&n->mu);
}

/* With n->mu held: q's events back to the free list, q freed. */
static void comm_nccl_req_free_locked(CommNccl* n, CommNcclReq* q) {
    comm_nccl_event_put_locked(n, q->started);
    comm_nccl_event_put_locked(n, q->done);
    free(q);
}

/* ------------------------------------------------------------- watchdog */

/* One pass over the in-flight list (n->mu held): retire what completed and
 * was waited for; on a failure or a timeout, write the message to msg.
 * Returns -1, and the watchdog stops without a word, when the CUDA runtime
 * is unloading (the process is exiting without comm_finalize) or the CUDA
 * context has failed: an error such as a kernel's illegal address is
 * reported by every later CUDA call, so the main thread's next call reports
 * it with the call that found it, instead of the watchdog blaming the NCCL
 * operation it happened to be polling; else 0. */
static int comm_nccl_watch_once(CommNccl* n, char* msg, size_t cap) {
    double now = wall_time_s();
    CommNcclReq** pp = &n->head;
    while (*pp) {
        CommNcclReq* q = *pp;
        if (!q->complete) {
            cudaError_t e = cudaEventQuery(q->done);
            if (e == cudaSuccess) {
                q->complete = 1;
            } else if (e != cudaErrorNotReady) {
                return -1;
            } else {
                ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(q->comm, &st);
                if (r != ncclSuccess) st = r;
                if (st != ncclSuccess && st != ncclInProgress) {
                    comm_nccl_fail_text(msg, cap, q->comm, q->what, st);
                    return 0;
                }
                if (q->started_at < 0) {
                    if (cudaEventQuery(q->started) == cudaSuccess) q->started_at = now;
                } else if (now - q->started_at > n->c.timeout_s) {
                    comm_nccl_timeout_text(msg, cap, q->what, n->c.timeout_s);
                    return 0;
                }
            }
        }
        if (q->complete && q->waited) {
            *pp = q->next;
            if (n->tail == &q->next) n->tail = pp;
            comm_nccl_req_free_locked(n, q);
            continue;
        }
        pp = &q->next;
    }
    return 0;
}

static void* comm_nccl_watchdog(void* arg) {
    CommNccl* n = (CommNccl*)arg;
    char msg[1024] = "";
    /* on the communicator's GPU: a runtime call on another would make a context there */
    cudaError_t e = cudaSetDevice(n->device);
    if (e != cudaSuccess)
        snprintf(msg, sizeof msg, "nccl: the watchdog thread cannot select GPU %d: %s", n->device,
                 cudaGetErrorString(e));
    pthread_mutex_lock(&n->mu);
    while (!msg[0] && !n->stop) {
        /* after an abort the communicators are gone; the aborting thread ends the job */
        if (!atomic_load(&n->aborted) && comm_nccl_watch_once(n, msg, sizeof msg) < 0) break;
        if (msg[0]) break;
        pthread_mutex_unlock(&n->mu);
        comm_sleep_us(COMM_NCCL_WATCH_US);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    if (msg[0]) comm_nccl_end(&n->c, n, msg, 1);
    return NULL;
}

/* Poll ev (recorded after an operation on comm) and comm's async error from
 * the host until ev completes or c->timeout_s passes (the waits that are not
 * the watchdog's: setup and teardown). */
static void comm_nccl_wait_event(Comm* c, CommNccl* n, ncclComm_t comm, cudaEvent_t ev, const char* what) {
    double t0 = wall_time_s();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) {
            char msg[512];
            snprintf(msg, sizeof msg, "nccl %s: CUDA error while waiting: %s", what, cudaGetErrorString(e));
            comm_nccl_end(c, n, msg, 0);
        }
        ncclResult_t st = ncclSuccess;
        comm_nccl_enter(c, n);
        ncclResult_t qr = ncclCommGetAsyncError(comm, &st);
        comm_nccl_leave(n);
        if (qr != ncclSuccess) comm_nccl_fail(c, n, comm, what, qr);
        if (st != ncclSuccess && st != ncclInProgress) comm_nccl_fail(c, n, comm, what, st);
        if (wall_time_s() - t0 > c->timeout_s) comm_nccl_timeout(c, n, what);
        comm_sleep_us(100);
    }
}

/* ------------------------------------------------------------- lifecycle */

CommNccl* comm_nccl_create(Comm* c) {
    CommNccl* n = (CommNccl*)xcalloc(1, sizeof *n);
    n->c = *c;
    n->tail = &n->head;
    pthread_mutex_init(&n->api, NULL);
    pthread_mutex_init(&n->mu, NULL);
    atomic_init(&n->aborted, 0);
    atomic_init(&n->abort_done, 0);
    COMM_CUDA_CHECK(c, cudaGetDevice(&n->device));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) comm_nccl_fail(c, n, NULL, "ncclGetUniqueId", r);
    }
    comm_broadcast_host(c, &id, sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* non-blocking: errors and hangs can be polled and aborted */
    comm_nccl_enter(c, n);
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->world, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) n->comm = NULL; /* it may not exist: nothing to abort */
    comm_nccl_leave(n);
    if (r != ncclSuccess && r != ncclInProgress) {
        char msg[512];
        snprintf(msg, sizeof msg, "nccl init (rank %d of %d) failed: %s", c->rank, c->world,
                 ncclGetErrorString(r));
        comm_abort(c, msg);
    }
    comm_nccl_settle(c, n, n->comm, r, "init (ncclCommInitRankConfig)");
    int e = pthread_create(&n->thread, NULL, comm_nccl_watchdog, n);
    if (e != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "nccl: cannot start the watchdog thread: %s", strerror(e));
        comm_nccl_end(c, n, msg, 0);
    }
    n->watching = 1;
    return n;
}

void comm_nccl_destroy(Comm* c, CommNccl* n) {
    if (!n) return;
    if (n->watching) {
        pthread_mutex_lock(&n->mu);
        n->stop = 1;
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->thread, NULL);
        n->watching = 0;
    }
    /* what the watchdog had not retired: wait for it here, bounded (a handle
     * never waited for included; the events must not be destroyed under it) */
    while (n->head) {
        CommNcclReq* q = n->head;
        if (!q->complete) comm_nccl_wait_event(c, n, q->comm, q->done, q->what);
        n->head = q->next;
        comm_nccl_req_free_locked(n, q); /* (no other thread left) */
    }
    n->tail = &n->head;
    /* the channels: start every finalize, then wait for them all (non-blocking,
     * so the order in which the neighbours finalize theirs does not matter) */
    const char* fin = "finalize of a point-to-point channel (ncclCommFinalize)";
    for (int i = 0; i < n->nch; i++) {
        comm_nccl_enter(c, n);
        ncclResult_t r = n->ch[i].comm ? ncclCommFinalize(n->ch[i].comm) : ncclSuccess;
        comm_nccl_leave(n);
        if (r != ncclSuccess && r != ncclInProgress) comm_nccl_fail(c, n, n->ch[i].comm, fin, r);
    }
    for (int i = 0; i < n->nch; i++) {
        CommNcclChannel* ch = &n->ch[i];
        if (ch->comm) {
            comm_nccl_settle(c, n, ch->comm, ncclInProgress, fin);
            comm_nccl_enter(c, n);
            ncclCommDestroy(ch->comm);
            ch->comm = NULL;
            comm_nccl_leave(n);
        }
        if (ch->stream) cudaStreamDestroy(ch->stream);
        ch->stream = NULL;
    }
    n->nch = 0;
    if (n->p2p_scratch) cudaFree(n->p2p_scratch);
    n->p2p_scratch = NULL;
    if (n->comm) {
        comm_nccl_enter(c, n);
        ncclResult_t r = ncclCommFinalize(n->comm);
        comm_nccl_leave(n);
        comm_nccl_settle(c, n, n->comm, r, "finalize (ncclCommFinalize)");
        comm_nccl_enter(c, n);
        ncclCommDestroy(n->comm);
        n->comm = NULL;
        comm_nccl_leave(n);
    }
    for (int i = 0; i < n->nevents; i++) cudaEventDestroy(n->events[i]);
    free(n->events);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->api);
    free(n);
}

/* ---------------------------------------------------------------- launch */

/* The host function of comm_nccl_test_stall: sleeps (uintptr_t)arg
 * microseconds on the stream it was queued on. */
static void CUDART_CB comm_nccl_stall_fn(void* arg) {
    double end = wall_time_s() + 1e-6 * (double)(uintptr_t)arg;
    while (wall_time_s() < end) comm_sleep_us(10000);
}

void comm_nccl_test_stall(CommNccl* n, double seconds) { n->test_stall_s = seconds; }

/* Before an operation's NCCL call on stream s: s runs after what the compute
 * stream has queued so far; a new request on comm named what, its 'started'
 * event recorded on s (then the test stall, when armed). */
static CommNcclReq* comm_nccl_req_begin(Comm* c, CommNccl* n, cudaStream_t s, ncclComm_t comm,
                                        const char* what) {
    cudaEvent_t ready = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(ready, compute_stream_of(c)));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(s, ready, 0));
    comm_nccl_event_put(n, ready); /* the wait above has captured it */
    CommNcclReq* q = (CommNcclReq*)xcalloc(1, sizeof *q);
    snprintf(q->what, sizeof q->what, "%s", what);
    q->comm = comm;
    q->started_at = -1.0;
    q->started = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(q->started, s));
    if (n->test_stall_s > 0) {
        uintptr_t us = (uintptr_t)(n->test_stall_s * 1e6);
        n->test_stall_s = 0;
        COMM_CUDA_CHECK(c, cudaLaunchHostFunc(s, comm_nccl_stall_fn, (void*)us));
    }
    return q;
}

/* After the NCCL call: 'done' recorded on s, the request on the watchdog's
 * list (in launch order: the oldest is checked first) and in h. */
static void comm_nccl_req_end(Comm* c, CommNccl* n, cudaStream_t s, CommNcclReq* q, CommHandle* h) {
    q->done = comm_nccl_event_get(c, n);
    COMM_CUDA_CHECK(c, cudaEventRecord(q->done, s));
    pthread_mutex_lock(&n->mu);
    *n->tail = q;
    n->tail = &q->next;
    pthread_mutex_unlock(&n->mu);
    h->impl = q;
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

    CommNcclReq* q = comm_nccl_req_begin(c, n, cs, n->comm, what);
    ncclResult_t r;
    comm_nccl_enter(c, n);
    switch (op) {
    case COMM_OP_ALLREDUCE: r = ncclAllReduce(buf, buf, count, t, rop, n->comm, cs); break;
    case COMM_OP_REDUCE_SCATTER: r = ncclReduceScatter(buf, own, slice, t, rop, n->comm, cs); break;
    default: r = ncclAllGather(own, buf, slice, t, n->comm, cs); break;
    }
    comm_nccl_leave(n);
    comm_nccl_settle(c, n, q->comm, r, what);
    comm_nccl_req_end(c, n, cs, q, h);
}

void comm_nccl_wait(Comm* c, CommNccl* n, CommHandle* h) {
    CommNcclReq* q = (CommNcclReq*)h->impl;
    /* later compute-stream work is ordered after the operation; the wait
     * captures 'done' now, so the watchdog may recycle it from here on */
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(compute_stream_of(c), q->done, 0));
    pthread_mutex_lock(&n->mu);
    q->waited = 1; /* the watchdog retires it once complete */
    pthread_mutex_unlock(&n->mu);
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
    comm_nccl_enter(c, n); /* (n->ch and n->nch are comm_nccl_abort's too) */
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
    comm_nccl_leave(n);
    free(all);

    /* non-blocking inits run in the background: start all, then wait for all,
     * so that the order in which the neighbours start theirs does not matter */
    ncclResult_t e = ncclSuccess;
    cudaError_t ce = cudaSuccess;
    comm_nccl_enter(c, n); /* (also keeps comm_nccl_abort off the channels being made) */
    for (int i = 0; i < n->nch && e == ncclSuccess && ce == cudaSuccess; i++) {
        CommNcclChannel* ch = &n->ch[i];
        ce = cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) break;
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        e = ncclCommInitRankConfig(&ch->comm, 2, ids[i], ch->send ? 0 : 1, &cfg);
        if (e == ncclInProgress) e = ncclSuccess;
        if (e != ncclSuccess) ch->comm = NULL;
    }
    comm_nccl_leave(n);
    COMM_CUDA_CHECK(c, ce);
    if (e != ncclSuccess)
        comm_nccl_fail(c, n, NULL, "init of a point-to-point channel (ncclCommInitRankConfig)", e);
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
    ncclComm_t failed = NULL;
    comm_nccl_enter(c, n);
    e = ncclGroupStart();
    for (int i = 0; i < n->nch && e == ncclSuccess; i++) {
        CommNcclChannel* ch = &n->ch[i];
        float* x = (float*)n->p2p_scratch + i;
        e = ch->send ? ncclSend(x, 1, ncclFloat, 1, ch->comm, ch->stream)
                     : ncclRecv(x, 1, ncclFloat, 0, ch->comm, ch->stream);
        if (e == ncclInProgress) e = ncclSuccess;
        if (e != ncclSuccess) failed = ch->comm;
    }
    if (e == ncclSuccess) e = ncclGroupEnd();
    comm_nccl_leave(n);
    if (e != ncclSuccess && e != ncclInProgress) comm_nccl_fail(c, n, failed, connect, e);
    for (int i = 0; i < n->nch; i++) comm_nccl_settle(c, n, n->ch[i].comm, ncclInProgress, connect);
    /* the host waits here (bounded): afterwards no transfer waits for a peer at posting */
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

    CommNcclReq* q = comm_nccl_req_begin(c, n, ch->stream, ch->comm, what);
    ncclDataType_t t = dt == DTYPE_BF16 ? ncclBfloat16 : ncclFloat;
    comm_nccl_enter(c, n);
    ncclResult_t r = send ? ncclSend(buf, count, t, 1, ch->comm, ch->stream)
                          : ncclRecv(buf, count, t, 0, ch->comm, ch->stream);
    comm_nccl_leave(n);
    comm_nccl_settle(c, n, q->comm, r, what);
    comm_nccl_req_end(c, n, ch->stream, q, h);
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
