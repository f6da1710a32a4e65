/* comm/comm.c — the communicator's host side: bootstrap (MPI, or rank 0 of 1
 * when built without USE_MPI), the choice of collective backend, the single
 * backend, the MPI backend (host buffers; device buffers staged through
 * pinned host memory), the bounded waits, the blocking host helpers and
 * aborting every rank. The NCCL backend and every CUDA call live in
 * comm/comm_nccl.c.
 *
 * MPI backend semantics (documented here because they fix the rounding):
 *  - Reductions run in fp32. bf16 buffers are widened to an fp32 staging
 *    buffer, reduced, and rounded back to bf16 once (round to nearest even),
 *    so a bf16 all-reduce is as exact as an fp32 one up to that last rounding.
 *  - average = a sum over ranks, then every final value is multiplied once by
 *    1.0f/world in fp32 (v *= 1.0f / world) in comm_wait, before any rounding
 *    to bf16. With world a power of two this equals a division; otherwise it
 *    may differ from v / world by one ulp. At world 1 it is the identity.
 *  - reduce-scatter receives into a separate buffer of count/world elements
 *    from the scratch pool (MPI's in-place variant puts the result at the
 *    start of the buffer, not at the rank's slice) and comm_wait copies it
 *    into the rank's slice.
 *  - Scratch buffers come from a per-communicator pool that only grows (a
 *    buffer is reused once the handle that held it is waited on). On a host
 *    backend they are allocated through be->alloc as MEM_COMM, so they show
 *    in the memory lines; pinned staging of a device backend is host memory,
 *    not device memory, and is not counted in be->mem.
 *  - Device buffers (be->name "cuda") go through pinned host memory: at launch
 *    the comm stream waits on the compute stream, copies the buffer to the
 *    host and the host waits for that copy; the MPI collective then runs on
 *    the host; comm_wait copies the result back on the comm stream and makes
 *    the compute stream wait on it. This path does not overlap the launch's
 *    device-to-host copy with compute: it exists for correctness (several
 *    ranks on one GPU, which NCCL refuses), not for speed.
 *  - Every wait polls (MPI_Test, then a 50 us sleep) until done or
 *    c->timeout_s has passed; a timeout prints which operation stalled and
 *    MPI_Aborts every rank. The blocking host helpers use the same wait.
 *  - MPI counts are int: one collective of more than INT_MAX elements (per
 *    slice for reduce-scatter and all-gather) is refused with a clear error.
 *
 * Sub-communicators (comm_split): the group's ranks are computed from a
 * bounded all-gather of every rank's (color, key) over the parent, so that a
 * dead or stalled rank ends the job there; then MPI_Comm_split makes the
 * group's MPI communicator (none for a group of one rank), and with NCCL the
 * group makes a communicator of its own from a unique id that its rank 0
 * broadcasts over it. A failure on any communicator ends the whole job:
 * comm_abort calls MPI_Abort on MPI_COMM_WORLD whenever the job has more than
 * one rank, whatever the size of the group.
 *
 * Point to point on the MPI backend: a duplicate of the group's MPI
 * communicator (made by comm_p2p_setup) carries only the transfers, so that
 * they never match anything else. Sends carry the caller's tag as the MPI tag;
 * receives take MPI_ANY_TAG from their peer, so that MPI's non-overtaking rule
 * matches them in posting order exactly as NCCL does, and comm_wait checks the
 * tag and the element count the message arrived with. Device buffers: comm_send
 * copies the buffer to pinned memory after the compute stream's work so far
 * (the host waits for it) before MPI_Isend; a receive lands in pinned memory,
 * and comm_wait copies it to the device after the compute stream's work so far
 * (the host waits for that too), then the compute stream waits on the copy.
 */
#include "comm.h"
#include "comm_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_MPI
#include <mpi.h>
#endif

typedef struct {
    void* p;
    size_t bytes;
    int pinned;  /* cudaMallocHost (device-backend staging) */
    int tracked; /* allocated through be->alloc (host backend) */
    int in_use;
} CommScratch;

typedef struct {
#ifdef USE_MPI
    MPI_Comm mpi;     /* collectives and helpers: a duplicate of MPI_COMM_WORLD, or the
                       * group's (MPI_COMM_NULL for a comm_split group of one rank) */
    MPI_Comm p2p_mpi; /* point to point (comm_p2p_setup), else MPI_COMM_NULL */
    int tag_ub;       /* MPI_TAG_UB */
    MPI_Comm local;   /* the job communicator only: the ranks of this host (shared-memory split) */
    int mpi_owned;    /* we called MPI_Init, so we call MPI_Finalize */
#endif
    int root;      /* made by comm_bootstrap (owns the fatal hook), not by comm_split */
    int setup;     /* comm_setup done, or a comm_split result */
    int p2p;       /* comm_p2p_setup done */
    int job_world; /* ranks in the whole job: above 1, an abort ends them with MPI_Abort */
    int* global;   /* global rank of each of the world ranks of this communicator */
    int device;    /* the compute backend is "cuda": buffers are device pointers */
    void* nccl;    /* CommNccl* when kind == COMM_NCCL */
    CommScratch* pool;
    int npool, cap;
} CommImpl;

/* One MPI-backend collective or transfer in flight (CommHandle.impl). */
typedef struct {
    CommOp op;
    int peer, tag;       /* send / receive */
    size_t count, slice; /* slice = count / world */
    DType dt;
    int average;
    void* buf;  /* the caller's buffer (device pointer when staged) */
    void* host; /* host view of the data: buf, or the pinned copy */
    float* f32; /* fp32 staging of a bf16 reduction, else NULL */
    void* recv; /* reduce-scatter result: slice elements of the reduce type */
#ifdef USE_MPI
    MPI_Request req;
    MPI_Status st; /* of the completed request (a receive's tag and count) */
    int done;      /* req completed, st filled (a later MPI_Test would empty st) */
#endif
} CommMpiReq;

static CommImpl* comm_impl(Comm* c) { return (CommImpl*)c->impl; }

const char* comm_kind_name(CommKind k) {
    switch (k) {
    case COMM_SINGLE: return "single";
    case COMM_MPI: return "mpi";
    case COMM_NCCL: return "nccl";
    }
    return "?";
}

const char* comm_op_name(CommOp op) {
    switch (op) {
    case COMM_OP_ALLREDUCE: return "all-reduce";
    case COMM_OP_REDUCE_SCATTER: return "reduce-scatter";
    case COMM_OP_ALLGATHER: return "all-gather";
    case COMM_OP_SEND: return "send";
    case COMM_OP_RECV: return "receive";
    }
    return "?";
}

int comm_global_rank(Comm* c, int r) {
    CommImpl* m = comm_impl(c);
    return m && m->global && r >= 0 && r < c->world ? m->global[r] : r;
}

void comm_p2p_describe(Comm* c, char* out, size_t outsz, CommOp op, size_t count, int peer, int tag) {
    snprintf(out, outsz, "%s of %zu elements %s rank %d of %d (global rank %d), tag %d", comm_op_name(op),
             count, op == COMM_OP_SEND ? "to" : "from", peer, c->world, comm_global_rank(c, peer), tag);
}

void comm_sleep_us(int us) {
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ abort */

/* The process ends once. A failure may be found at the same time by the main
 * thread and by the watchdog threads of the NCCL backend (one per NCCL
 * communicator: the job's and each comm_split group's), each through its own
 * Comm; C leaves calling exit() twice undefined, and two messages would blur
 * which failure came first. So the claim to end the process is process-wide
 * state, the one place here that needs it: the first thread to claim it ends
 * the process; any other thread that fails afterwards parks for good (the
 * first is ending the process under it). */
static pthread_mutex_t comm_end_mu = PTHREAD_MUTEX_INITIALIZER;
static int comm_end_claimed;
static pthread_t comm_end_owner;

/* 1: this thread now owns the end of the process; 0: it already did (an abort
 * nested in an abort). Another thread owns it: never returns. */
static int comm_end_claim(void) {
    pthread_mutex_lock(&comm_end_mu);
    int first = !comm_end_claimed, mine = 1;
    if (first) {
        comm_end_claimed = 1;
        comm_end_owner = pthread_self();
    } else {
        mine = pthread_equal(comm_end_owner, pthread_self());
    }
    pthread_mutex_unlock(&comm_end_mu);
    if (!mine)
        for (;;) pause();
    return first;
}

void comm_end_begin(Comm* c, const char* msg) {
    (void)c;
    if (comm_end_claim()) fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    fflush(stdout);
}

void comm_end_finish(Comm* c, int off_main) {
    CommImpl* m = c ? comm_impl(c) : NULL;
    fflush(stderr);
    fflush(stdout);
#ifdef USE_MPI
    /* a group of one rank still ends the whole job */
    if (c && (m ? m->job_world : c->world) > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#else
    (void)m;
#endif
    if (off_main) _exit(1);
    exit(1);
}

void comm_abort(Comm* c, const char* msg) {
    comm_end_begin(c, msg);
    comm_end_finish(c, 0);
}

void comm_abortf(Comm* c, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    comm_abort(c, msg);
}

/* fatal() prints its line, then calls this: end the other ranks too. With
 * world 1 it returns and fatal() exits 1. Another thread already ending the
 * process: parks (no second exit). */
static void comm_fatal_hook(void* ctx) {
    Comm* c = (Comm*)ctx;
    comm_end_claim();
#ifdef USE_MPI
    if (c->world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#else
    (void)c;
#endif
}

/* -------------------------------------------------------------- bootstrap */

#ifdef USE_MPI
static void comm_mpi_check(Comm* c, int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    comm_abortf(c, "%s failed: %s", what, s);
}

/* The error check of an MPI_Test of what: a truncated receive gets a message
 * of its own. */
static void comm_mpi_test_check(Comm* c, int rc, const char* what) {
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS && MPI_Error_class(rc, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE)
        comm_abortf(c,
                    "%s failed: the peer sent more elements than this receive expects (sends and receives "
                    "between two ranks must be posted in the same order, with the same counts)",
                    what);
    comm_mpi_check(c, rc, what);
}

/* Poll r until it completes or c->timeout_s passes; then end every rank,
 * naming what stalled. st: the completed request's status, or MPI_STATUS_IGNORE. */
static void comm_mpi_wait_req_status(Comm* c, MPI_Request* r, MPI_Status* st, const char* what) {
    double t0 = wall_time_s();
    for (;;) {
        int done = 0;
        comm_mpi_test_check(c, MPI_Test(r, &done, st), what);
        if (done) return;
        if (wall_time_s() - t0 > c->timeout_s)
            comm_abortf(c, "%s did not complete within %g s: a peer rank died or stalled", what, c->timeout_s);
        comm_sleep_us(50);
    }
}

static void comm_mpi_wait_req(Comm* c, MPI_Request* r, const char* what) {
    comm_mpi_wait_req_status(c, r, MPI_STATUS_IGNORE, what);
}
#endif

/* 64-bit FNV-1a of s ("" when NULL, distinct from an empty string). */
static uint64_t comm_hash_str(const char* s) {
    uint64_t h = 1469598103934665603ULL;
    if (!s) return h ^ 1;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Comm.device_index: how many lower local ranks see the same GPUs as this
 * one (the same CUDA_VISIBLE_DEVICES, set or unset). */
static int comm_device_index(Comm* c) {
    uint64_t mine = comm_hash_str(getenv("CUDA_VISIBLE_DEVICES"));
    uint64_t* all = (uint64_t*)xmalloc(sizeof(uint64_t) * (size_t)c->local_world);
    comm_local_allgather_host(c, &mine, sizeof mine, all);
    int idx = 0;
    for (int i = 0; i < c->local_rank; i++) idx += all[i] == mine;
    free(all);
    return idx;
}

/* How many processes the launcher started, as the variable it sets in each
 * process says (Open MPI's mpirun; the PMI of MPICH's and Intel MPI's
 * launchers and of srun --mpi=pmi2; srun --mpi=pmix sets no such count), or
 * 1 where none is set; *name gets the variable's name. */
static int comm_launcher_world(const char** name) {
    static const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char* v = getenv(vars[i]);
        if (v && *v) {
            *name = vars[i];
            const int n = atoi(v);
            return n > 1 ? n : 1;
        }
    }
    *name = "";
    return 1;
}

void comm_bootstrap(Comm* c, int* argc, char*** argv) {
    memset(c, 0, sizeof *c);
    c->rank = 0;
    c->world = 1;
    c->local_rank = 0;
    c->local_world = 1;
    c->kind = COMM_SINGLE;
    c->timeout_s = 300.0;
    c->be = NULL;
    CommImpl* m = (CommImpl*)xcalloc(1, sizeof(CommImpl));
    c->impl = m;
    m->root = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef USE_MPI
    m->mpi = MPI_COMM_NULL;
    m->p2p_mpi = MPI_COMM_NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            fatal("MPI_Init_thread failed: cannot start MPI");
        m->mpi_owned = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    /* from here a fatal() on any rank ends every rank */
    util_set_fatal_hook(comm_fatal_hook, c);
    comm_mpi_check(c, MPI_Comm_dup(MPI_COMM_WORLD, &m->mpi), "MPI_Comm_dup");
    /* errors come back as codes so that they get our message and MPI_Abort */
    comm_mpi_check(c, MPI_Comm_set_errhandler(m->mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    comm_mpi_check(c, MPI_Comm_split_type(m->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &m->local),
                   "MPI_Comm_split_type");
    comm_mpi_check(c, MPI_Comm_set_errhandler(m->local, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(m->local, &c->local_rank);
    MPI_Comm_size(m->local, &c->local_world);
#else
    (void)argc;
    (void)argv;
    util_set_fatal_hook(comm_fatal_hook, c);
#endif
    /* A launcher that started several processes, each of them a job of one
     * here (another MPI's launcher, or a build without MPI): each would train
     * alone on the whole batch and write the same files */
    const char* var;
    const int launched = comm_launcher_world(&var);
    if (c->world == 1 && launched > 1)
#ifdef USE_MPI
        fatal("the launcher started %d processes (%s=%d) but MPI sees 1: it is not the mpirun of the MPI this "
              "binary was built with; launch it with that MPI's mpirun, or rebuild with the launcher's mpicc",
              launched, var, launched);
#else
        fatal("the launcher started %d processes (%s=%d) but this binary was built without MPI: rebuild with "
              "mpicc on the PATH",
              launched, var, launched);
#endif
    m->job_world = c->world;
    m->global = (int*)xmalloc((size_t)c->world * sizeof(int));
    for (int r = 0; r < c->world; r++) m->global[r] = r;
    c->device_index = comm_device_index(c);
}

/* ----------------------------------------------------------- scratch pool */

#ifdef USE_MPI
/* A free pool buffer of at least `bytes` (the smallest that fits), or a new one. */
static void* comm_scratch_get(Comm* c, size_t bytes, int pinned) {
    CommImpl* m = comm_impl(c);
    if (bytes == 0) bytes = 1;
    int best = -1;
    for (int i = 0; i < m->npool; i++) {
        CommScratch* s = &m->pool[i];
        if (s->in_use || s->pinned != pinned || s->bytes < bytes) continue;
        if (best < 0 || s->bytes < m->pool[best].bytes) best = i;
    }
    if (best >= 0) {
        m->pool[best].in_use = 1;
        return m->pool[best].p;
    }
    if (m->npool == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 8;
        CommScratch* np = (CommScratch*)realloc(m->pool, (size_t)m->cap * sizeof(CommScratch));
        if (!np) fatal("out of host memory growing the communicator's scratch pool");
        m->pool = np;
    }
    CommScratch* s = &m->pool[m->npool++];
    memset(s, 0, sizeof *s);
    s->bytes = bytes;
    s->pinned = pinned;
    s->in_use = 1;
    if (pinned) {
#ifdef USE_CUDA
        s->p = comm_cuda_host_alloc(c, bytes);
#else
        fatal("comm: pinned staging requested in a build without CUDA");
#endif
    } else if (!m->device && c->be && c->be->alloc) {
        s->p = c->be->alloc(c->be, bytes, MEM_COMM);
        s->tracked = 1;
    } else {
        s->p = xmalloc(bytes);
    }
    return s->p;
}

static void comm_scratch_put(Comm* c, void* p) {
    if (!p) return;
    CommImpl* m = comm_impl(c);
    for (int i = 0; i < m->npool; i++)
        if (m->pool[i].p == p) {
            m->pool[i].in_use = 0;
            return;
        }
}
#endif

static void comm_scratch_free_all(Comm* c) {
    CommImpl* m = comm_impl(c);
    for (int i = 0; i < m->npool; i++) {
        CommScratch* s = &m->pool[i];
        if (s->pinned) {
#ifdef USE_CUDA
            comm_cuda_host_free(s->p);
#endif
        } else if (s->tracked) {
            c->be->release(c->be, s->p, s->bytes, MEM_COMM);
        } else {
            free(s->p);
        }
    }
    free(m->pool);
    m->pool = NULL;
    m->npool = m->cap = 0;
}

/* ------------------------------------------------------------------ setup */

#ifdef USE_CUDA
/* Collective over every rank: 0 when no two ranks of any host drive the same
 * GPU (compared by PCI bus id, whatever each rank's CUDA_VISIBLE_DEVICES);
 * 1 when two ranks of this host do, 2 when only another host has such. */
static int comm_gpus_shared(Comm* c) {
    enum { ID = 32 };
    char mine[ID];
    comm_cuda_bus_id(c, mine, sizeof mine);
    char* all = (char*)xmalloc((size_t)ID * (size_t)c->local_world);
    comm_local_allgather_host(c, mine, ID, all);
    int here = 0;
    for (int i = 0; i < c->local_world; i++)
        if (i != c->local_rank && strncmp(all + (size_t)i * ID, mine, ID) == 0) here = 1;
    free(all);
    int anywhere = comm_allreduce_host_max_int(c, here);
    return here ? 1 : anywhere ? 2 : 0;
}
#endif

void comm_setup(Comm* c, const char* want, Backend* be, double timeout_s) {
    CommImpl* m = comm_impl(c);
    if (!want) want = "auto";
    int w_auto = strcmp(want, "auto") == 0, w_nccl = strcmp(want, "nccl") == 0,
        w_mpi = strcmp(want, "mpi") == 0;
    if (!w_auto && !w_nccl && !w_mpi) fatal("--comm: unknown value '%s' (expected auto, nccl or mpi)", want);
    if (timeout_s > 0) c->timeout_s = timeout_s;
    c->be = be;
    int is_cuda = be && be->name && strcmp(be->name, "cuda") == 0;
    m->device = is_cuda;
#ifdef USE_CUDA
    int ngpu = is_cuda ? comm_cuda_device_count() : 0;
#endif

    CommKind kind = COMM_SINGLE;
#ifdef USE_CUDA
    /* on any host, local ranks that drive the same GPU (NCCL refuses them) */
    int shared = is_cuda && c->world > 1 ? comm_gpus_shared(c) : 0;
#endif
    if (w_nccl) {
        if (!is_cuda) fatal("--comm nccl needs --device cuda (this run is on the CPU)");
#ifdef USE_CUDA
        if (shared == 1)
            fatal(
                "--comm nccl: %d ranks share %d GPU(s) on this host; NCCL refuses two ranks on one GPU: use --comm mpi",
                c->local_world, ngpu);
        if (shared == 2)
            fatal(
                "--comm nccl: two ranks of another host share a GPU; NCCL refuses two ranks on one GPU: use --comm mpi");
        kind = COMM_NCCL;
#else
        fatal("--comm nccl: this binary was built without CUDA/NCCL; rebuild with nvcc on the PATH");
#endif
    } else if (w_mpi) {
#ifdef USE_MPI
        kind = COMM_MPI;
#else
        if (c->world > 1) fatal("--comm mpi: this binary was built without MPI; rebuild with mpicc");
        kind = COMM_SINGLE; /* one process without MPI: the same thing */
#endif
    } else if (c->world == 1) {
        kind = COMM_SINGLE;
    } else {
        kind = COMM_MPI;
#ifdef USE_CUDA
        if (is_cuda && !shared) kind = COMM_NCCL;
#endif
    }

    /* Every rank must have chosen the same backend (GPU counts can differ
     * between hosts). */
    int hi = comm_allreduce_host_max_int(c, (int)kind);
    int lo = -comm_allreduce_host_max_int(c, -(int)kind);
    if (hi != lo)
        fatal(
            "--comm %s: the ranks chose different collective backends (%s on some, %s on others); pass --comm mpi",
            want, comm_kind_name((CommKind)lo), comm_kind_name((CommKind)hi));

#ifdef USE_CUDA
    if (m->nccl) {
        comm_nccl_destroy(c, (CommNccl*)m->nccl);
        m->nccl = NULL;
    }
#endif
    c->kind = kind;
#ifdef USE_CUDA
    if (kind == COMM_NCCL) m->nccl = comm_nccl_create(c);
#endif
    m->setup = 1;
}

/* ------------------------------------------------------ sub-communicators */

void comm_allgather_host(Comm* c, const void* mine, void* all, size_t bytes) {
    memmove((char*)all + (size_t)c->rank * bytes, mine, bytes);
    if (c->world == 1 || bytes == 0) return;
#ifdef USE_MPI
    if (bytes > (size_t)INT_MAX)
        fatal("comm: host all-gather of %zu bytes per rank exceeds MPI's int count", bytes);
    MPI_Request r;
    char what[96];
    snprintf(what, sizeof what, "host all-gather of %zu bytes per rank", bytes);
    comm_mpi_check(
        c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, (int)bytes, MPI_BYTE, comm_impl(c)->mpi, &r),
        what);
    comm_mpi_wait_req(c, &r, what);
#endif
}

int comm_split(Comm* parent, int color, int key, Comm* out) {
    CommImpl* pm = comm_impl(parent);
    if (!pm || !pm->setup) fatal("comm_split: the parent communicator is not set up (call comm_setup first)");
    if (out == parent) fatal("comm_split: out must not be the parent communicator");
    if (color < 0) color = COMM_COLOR_NONE;
    int W = parent->world;

    /* every rank's (color, key); bounded, so a dead or stalled rank ends the
     * job here rather than in MPI_Comm_split, which cannot time out */
    int mine[2] = {color, key};
    int* all = (int*)xmalloc((size_t)W * sizeof mine);
    comm_allgather_host(parent, mine, all, sizeof mine);
    /* the group: the parent ranks of this color, ordered by (key, parent rank) */
    int* members = (int*)xmalloc((size_t)W * sizeof(int));
    int n = 0;
    if (color < 0) {
        members[n++] = parent->rank;
    } else {
        for (int j = 0; j < W; j++) {
            if (all[2 * j] != color) continue;
            int i = n++;
            while (i > 0 && all[2 * members[i - 1] + 1] > all[2 * j + 1]) {
                members[i] = members[i - 1];
                i--;
            }
            members[i] = j;
        }
    }
    int me = 0;
    while (members[me] != parent->rank) me++;

    memset(out, 0, sizeof *out);
    out->rank = me;
    out->world = n;
    out->local_rank = parent->local_rank;
    out->local_world = parent->local_world;
    out->device_index = parent->device_index;
    out->kind = n == 1 ? COMM_SINGLE : parent->kind;
    out->timeout_s = parent->timeout_s;
    out->be = parent->be;
    CommImpl* m = (CommImpl*)xcalloc(1, sizeof(CommImpl));
    out->impl = m;
    m->setup = 1;
    m->job_world = pm->job_world;
    m->device = pm->device;
    m->global = (int*)xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) m->global[i] = comm_global_rank(parent, members[i]);
#ifdef USE_MPI
    m->mpi = MPI_COMM_NULL;
    m->p2p_mpi = MPI_COMM_NULL;
    if (W > 1) {
        comm_mpi_check(parent, MPI_Comm_split(pm->mpi, n > 1 ? color : MPI_UNDEFINED, key, &m->mpi),
                       "MPI_Comm_split");
        if (n > 1) {
            comm_mpi_check(out, MPI_Comm_set_errhandler(m->mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
            int r = -1, w = -1;
            MPI_Comm_rank(m->mpi, &r);
            MPI_Comm_size(m->mpi, &w);
            if (r != me || w != n)
                comm_abortf(out, "comm_split: MPI_Comm_split made rank %d of %d, expected rank %d of %d", r, w,
                            me, n);
        }
    }
#endif
    free(all);
    free(members);
#ifdef USE_CUDA
    if (out->kind == COMM_NCCL) m->nccl = comm_nccl_create(out);
#endif
    return n;
}

/* ------------------------------------------------------------ collectives */

static void comm_check_args(Comm* c, CommOp op, void* buf, size_t count, CommHandle* h) {
    if (!h) fatal("comm %s: NULL handle", comm_op_name(op));
    if (count > 0 && !buf) fatal("comm %s: NULL buffer of %zu elements", comm_op_name(op), count);
    if (op != COMM_OP_ALLREDUCE && count % (size_t)c->world != 0)
        fatal("comm %s: count %zu does not divide by the world size %d", comm_op_name(op), count, c->world);
}

#ifdef USE_MPI
static void comm_mpi_start(Comm* c, CommOp op, void* buf, size_t count, DType dt, int average, CommHandle* h) {
    CommImpl* m = comm_impl(c);
    size_t slice = count / (size_t)c->world;
    size_t mpicount = op == COMM_OP_ALLREDUCE ? count : slice;
    if (mpicount > (size_t)INT_MAX)
        fatal(
            "comm %s (mpi): %zu elements exceed MPI's int count limit (%d) for one collective; use smaller buckets",
            comm_op_name(op), mpicount, INT_MAX);
    CommMpiReq* r = (CommMpiReq*)xcalloc(1, sizeof *r);
    r->op = op;
    r->count = count;
    r->slice = slice;
    r->dt = dt;
    r->average = average;
    r->buf = buf;

    if (m->device) {
#ifdef USE_CUDA
        size_t es = dtype_size(dt);
        size_t own_off = (size_t)c->rank * slice * es; /* byte offset of this rank's slice */
        r->host = comm_scratch_get(c, count * es, 1);
        if (op == COMM_OP_ALLGATHER) /* only this rank's slice is input */
            comm_cuda_to_host(c, (char*)r->host + own_off, (const char*)buf + own_off, slice * es);
        else comm_cuda_to_host(c, r->host, buf, count * es);
#else
        fatal("comm: a device backend in a build without CUDA");
#endif
    } else {
        r->host = buf;
    }

    char what[128];
    snprintf(what, sizeof what, "MPI %s launch", comm_op_name(op));
    if (op == COMM_OP_ALLGATHER) {
        MPI_Datatype t = dt == DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
        comm_mpi_check(
            c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r->host, (int)slice, t, m->mpi, &r->req),
            what);
    } else {
        /* reductions in fp32: widen bf16 first */
        float* red = (float*)r->host;
        if (dt == DTYPE_BF16) {
            r->f32 = (float*)comm_scratch_get(c, count * sizeof(float), 0);
            const uint16_t* src = (const uint16_t*)r->host;
            for (size_t i = 0; i < count; i++) r->f32[i] = bf16_to_f32(src[i]);
            red = r->f32;
        }
        if (op == COMM_OP_ALLREDUCE) {
            comm_mpi_check(
                c, MPI_Iallreduce(MPI_IN_PLACE, red, (int)count, MPI_FLOAT, MPI_SUM, m->mpi, &r->req), what);
        } else {
            r->recv = comm_scratch_get(c, slice * sizeof(float), 0);
            comm_mpi_check(
                c, MPI_Ireduce_scatter_block(red, r->recv, (int)slice, MPI_FLOAT, MPI_SUM, m->mpi, &r->req),
                what);
        }
    }
    h->impl = r;
}

static void comm_mpi_finish(Comm* c, CommHandle* h) {
    CommImpl* m = comm_impl(c);
    CommMpiReq* r = (CommMpiReq*)h->impl;
    size_t es = dtype_size(r->dt);
    size_t own_off = (size_t)c->rank * r->slice * es;
    char what[128];
    snprintf(what, sizeof what, "%s of %zu elements", comm_op_name(r->op), r->count);
    comm_mpi_wait_req(c, &r->req, what);

    if (r->op != COMM_OP_ALLGATHER) {
        /* the reduced fp32 values, where they are, and where they go */
        float* res;
        size_t n;
        void* dst;
        if (r->op == COMM_OP_ALLREDUCE) {
            res = r->dt == DTYPE_BF16 ? r->f32 : (float*)r->host;
            n = r->count;
            dst = r->host;
        } else {
            res = (float*)r->recv;
            n = r->slice;
            dst = (char*)r->host + own_off;
        }
        if (r->average && c->world > 1) {
            float s = 1.0f / (float)c->world;
            for (size_t i = 0; i < n; i++) res[i] *= s;
        }
        if (r->dt == DTYPE_BF16) {
            uint16_t* d = (uint16_t*)dst;
            for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(res[i]);
        } else if ((void*)res != dst) {
            memcpy(dst, res, n * sizeof(float));
        }
    }

    if (m->device) {
#ifdef USE_CUDA
        if (r->op == COMM_OP_REDUCE_SCATTER)
            comm_cuda_to_device(c, (char*)r->buf + own_off, (const char*)r->host + own_off, r->slice * es, 0);
        else comm_cuda_to_device(c, r->buf, r->host, r->count * es, 0);
        comm_scratch_put(c, r->host);
#endif
    }
    comm_scratch_put(c, r->f32);
    comm_scratch_put(c, r->recv);
    free(r);
    h->impl = NULL;
}
#endif

/* ---------------------------------------------------------- point to point */

#ifdef USE_MPI
/* The MPI tag that carries the caller's tag. */
static int comm_mpi_wire_tag(CommImpl* m, int tag) {
    return m->tag_ub > 0 && m->tag_ub < INT_MAX ? tag % (m->tag_ub + 1) : tag;
}

static void comm_mpi_p2p_start(Comm* c, CommOp op, void* buf, size_t count, DType dt, int peer, int tag,
                               CommHandle* h) {
    CommImpl* m = comm_impl(c);
    char what[192];
    comm_p2p_describe(c, what, sizeof what, op, count, peer, tag);
    if (count > (size_t)INT_MAX)
        fatal("comm %s (mpi): more than MPI's int count limit (%d) for one transfer", what, INT_MAX);
    CommMpiReq* r = (CommMpiReq*)xcalloc(1, sizeof *r);
    r->op = op;
    r->peer = peer;
    r->tag = tag;
    r->count = count;
    r->dt = dt;
    r->buf = buf;
    if (m->device) {
#ifdef USE_CUDA
        const size_t bytes = count * dtype_size(dt);
        r->host = comm_scratch_get(c, bytes, 1);
        if (op == COMM_OP_SEND) comm_cuda_to_host(c, r->host, buf, bytes);
#else
        fatal("comm: a device backend in a build without CUDA");
#endif
    } else {
        r->host = buf;
    }
    MPI_Datatype t = dt == DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    if (op == COMM_OP_SEND)
        comm_mpi_check(
            c, MPI_Isend(r->host, (int)count, t, peer, comm_mpi_wire_tag(m, tag), m->p2p_mpi, &r->req), what);
    else comm_mpi_check(c, MPI_Irecv(r->host, (int)count, t, peer, MPI_ANY_TAG, m->p2p_mpi, &r->req), what);
    h->impl = r;
}

static void comm_mpi_p2p_finish(Comm* c, CommHandle* h) {
    CommImpl* m = comm_impl(c);
    CommMpiReq* r = (CommMpiReq*)h->impl;
    char what[192];
    comm_p2p_describe(c, what, sizeof what, r->op, r->count, r->peer, r->tag);
    if (!r->done) comm_mpi_wait_req_status(c, &r->req, &r->st, what);
    MPI_Status st = r->st;
    if (r->op == COMM_OP_RECV) {
        int got = -1;
        MPI_Get_count(&st, r->dt == DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT, &got);
        if (st.MPI_TAG != comm_mpi_wire_tag(m, r->tag) || got != (int)r->count)
            comm_abortf(
                c,
                "%s: the message that arrived has tag %d and %d elements: sends and receives between two "
                "ranks must be posted in the same order, with the same tags and counts, on both",
                what, st.MPI_TAG, got);
    }
    if (m->device) {
#ifdef USE_CUDA
        /* after what the compute stream has queued, as comm.h promises: the receive
         * writes buf only now, and work queued before comm_recv may still read it */
        if (r->op == COMM_OP_RECV) comm_cuda_to_device(c, r->buf, r->host, r->count * dtype_size(r->dt), 1);
        comm_scratch_put(c, r->host);
#endif
    }
    free(r);
    h->impl = NULL;
}
#endif

void comm_p2p_setup(Comm* c) {
    CommImpl* m = comm_impl(c);
    if (!m || !m->setup)
        fatal("comm_p2p_setup: the communicator is not set up (comm_setup or comm_split first)");
    if (m->p2p) return;
    m->p2p = 1;
    if (c->world == 1) return;
#ifdef USE_MPI
    if (c->kind == COMM_MPI) {
        MPI_Request r;
        comm_mpi_check(c, MPI_Comm_idup(m->mpi, &m->p2p_mpi, &r), "point-to-point setup (MPI_Comm_idup)");
        comm_mpi_wait_req(c, &r, "point-to-point setup (MPI_Comm_idup)");
        comm_mpi_check(c, MPI_Comm_set_errhandler(m->p2p_mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        int* ub = NULL;
        int flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        m->tag_ub = flag && ub ? *ub : 32767;
    }
#endif
#ifdef USE_CUDA
    if (c->kind == COMM_NCCL) comm_nccl_p2p_setup(c, (CommNccl*)m->nccl);
#endif
}

static void comm_p2p_start(Comm* c, CommOp op, void* buf, size_t count, DType dt, int peer, int tag,
                           CommHandle* h) {
    const char* fn = op == COMM_OP_SEND ? "comm_send" : "comm_recv";
    CommImpl* m = comm_impl(c);
    if (!h) fatal("%s: NULL handle", fn);
    if (count > 0 && !buf) fatal("%s: NULL buffer of %zu elements", fn, count);
    if (c->world == 1)
        fatal("%s: this communicator has one rank, so no peer (a pipeline of one stage never sends or "
              "receives)",
              fn);
    if (!m || !m->p2p)
        fatal("%s: call comm_p2p_setup on every rank of the communicator before its first send or receive", fn);
    if (peer < 0 || peer >= c->world || peer == c->rank)
        fatal("%s: peer %d is not another rank of this %d-rank communicator (this is rank %d)", fn, peer,
              c->world, c->rank);
    if (peer != (c->rank + 1) % c->world && peer != (c->rank - 1 + c->world) % c->world)
        fatal(
            "%s: peer %d is not a neighbour of rank %d in a %d-rank communicator (only rank + 1 and rank - 1, "
            "modulo the world, are connected)",
            fn, peer, c->rank, c->world);
    if (tag < 0) fatal("%s: tag %d is negative", fn, tag);
    h->active = 1;
    h->impl = NULL;
    if (count == 0) return; /* done already */
#ifdef USE_CUDA
    if (c->kind == COMM_NCCL) {
        comm_nccl_p2p_start(c, (CommNccl*)m->nccl, op, buf, count, dt, peer, tag, h);
        return;
    }
#endif
#ifdef USE_MPI
    if (c->kind == COMM_MPI) {
        comm_mpi_p2p_start(c, op, buf, count, dt, peer, tag, h);
        return;
    }
#endif
    (void)dt;
    fatal("%s: backend %s is not available in this build", fn, comm_kind_name(c->kind));
}

void comm_send(Comm* c, const void* buf, size_t count, DType dt, int peer, int tag, CommHandle* h) {
    /* the buffer is only read: the cast lets one start function serve both directions */
    comm_p2p_start(c, COMM_OP_SEND, (void*)buf, count, dt, peer, tag, h);
}

void comm_recv(Comm* c, void* buf, size_t count, DType dt, int peer, int tag, CommHandle* h) {
    comm_p2p_start(c, COMM_OP_RECV, buf, count, dt, peer, tag, h);
}

/* ------------------------------------------- collectives: launch and wait */

static void comm_start(Comm* c, CommOp op, void* buf, size_t count, DType dt, int average, CommHandle* h) {
    comm_check_args(c, op, buf, count, h);
    h->active = 1;
    h->impl = NULL;
    if (count == 0 || c->kind == COMM_SINGLE) return; /* done already; average over 1 rank = identity */
#ifdef USE_CUDA
    if (c->kind == COMM_NCCL) {
        comm_nccl_start(c, (CommNccl*)comm_impl(c)->nccl, op, buf, count, dt, average, h);
        return;
    }
#endif
#ifdef USE_MPI
    if (c->kind == COMM_MPI) {
        comm_mpi_start(c, op, buf, count, dt, average, h);
        return;
    }
#endif
    (void)dt;
    (void)average;
    fatal("comm %s: backend %s is not available in this build", comm_op_name(op), comm_kind_name(c->kind));
}

void comm_allreduce(Comm* c, void* buf, size_t count, DType dt, int average, CommHandle* h) {
    comm_start(c, COMM_OP_ALLREDUCE, buf, count, dt, average, h);
}

void comm_reduce_scatter(Comm* c, void* buf, size_t count, DType dt, int average, CommHandle* h) {
    comm_start(c, COMM_OP_REDUCE_SCATTER, buf, count, dt, average, h);
}

void comm_allgather(Comm* c, void* buf, size_t count, DType dt, CommHandle* h) {
    comm_start(c, COMM_OP_ALLGATHER, buf, count, dt, 0, h);
}

void comm_wait(Comm* c, CommHandle* h) {
    (void)c;
    if (!h || !h->active) return;
    if (h->impl) {
#ifdef USE_CUDA
        if (c->kind == COMM_NCCL) comm_nccl_wait(c, (CommNccl*)comm_impl(c)->nccl, h);
#endif
#ifdef USE_MPI
        if (c->kind == COMM_MPI) {
            CommOp op = ((CommMpiReq*)h->impl)->op;
            if (op == COMM_OP_SEND || op == COMM_OP_RECV) comm_mpi_p2p_finish(c, h);
            else comm_mpi_finish(c, h);
        }
#endif
    }
    h->active = 0;
    h->impl = NULL;
}

#ifdef USE_CUDA
void comm_test_stall_next(Comm* c, double seconds) {
    CommImpl* m = comm_impl(c);
    if (c->kind != COMM_NCCL || !m || !m->nccl)
        fatal("comm_test_stall_next: needs the NCCL backend (this communicator's is %s)",
              comm_kind_name(c->kind));
    comm_nccl_test_stall((CommNccl*)m->nccl, seconds);
}
#endif

void comm_progress(Comm* c, CommHandle* h) {
    (void)c;
    if (!h || !h->active || !h->impl) return;
#ifdef USE_MPI
    /* MPI moves a non-blocking collective forward only inside MPI calls: a test
     * now and then during backward lets the reduction overlap the compute. */
    if (c->kind == COMM_MPI) {
        CommMpiReq* r = (CommMpiReq*)h->impl;
        if (!r->done && r->req != MPI_REQUEST_NULL) {
            char what[192] = "MPI_Test";
            if (r->op == COMM_OP_SEND || r->op == COMM_OP_RECV)
                comm_p2p_describe(c, what, sizeof what, r->op, r->count, r->peer, r->tag);
            comm_mpi_test_check(c, MPI_Test(&r->req, &r->done, &r->st), what);
        }
    }
#endif
}

/* ----------------------------------------------------------- host helpers */

void comm_allreduce_host_sum(Comm* c, double* vals, int n) {
    if (c->world == 1 || n <= 0) return;
#ifdef USE_MPI
    MPI_Request r;
    char what[96];
    snprintf(what, sizeof what, "host all-reduce (sum) of %d values", n);
    comm_mpi_check(c, MPI_Iallreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, MPI_SUM, comm_impl(c)->mpi, &r), what);
    comm_mpi_wait_req(c, &r, what);
#else
    (void)vals;
#endif
}

int comm_allreduce_host_max_int(Comm* c, int v) {
    if (c->world == 1) return v;
#ifdef USE_MPI
    MPI_Request r;
    const char* what = "host all-reduce (max) of 1 int";
    comm_mpi_check(c, MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, comm_impl(c)->mpi, &r), what);
    comm_mpi_wait_req(c, &r, what);
#endif
    return v;
}

void comm_barrier(Comm* c) {
    if (c->world == 1) return;
#ifdef USE_MPI
    MPI_Request r;
    comm_mpi_check(c, MPI_Ibarrier(comm_impl(c)->mpi, &r), "barrier");
    comm_mpi_wait_req(c, &r, "barrier");
#endif
}

void comm_broadcast_host(Comm* c, void* buf, size_t bytes) {
    if (c->world == 1 || bytes == 0) return;
#ifdef USE_MPI
    const size_t chunk = (size_t)1 << 30;
    char what[96];
    snprintf(what, sizeof what, "host broadcast of %zu bytes", bytes);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        MPI_Request r;
        comm_mpi_check(c, MPI_Ibcast((char*)buf + off, (int)n, MPI_BYTE, 0, comm_impl(c)->mpi, &r), what);
        comm_mpi_wait_req(c, &r, what);
    }
#else
    (void)buf;
#endif
}

void comm_local_allgather_host(Comm* c, const void* mine, size_t bytes, void* all) {
    if (c->local_world == 1 || bytes == 0) {
        memcpy(all, mine, bytes);
        return;
    }
#ifdef USE_MPI
    if (bytes > INT_MAX)
        comm_abortf(c, "host all-gather of %zu bytes per rank: more than MPI's int count", bytes);
    MPI_Request r;
    const char* what = "host all-gather among the ranks of this host";
    comm_mpi_check(
        c, MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm_impl(c)->local, &r),
        what);
    comm_mpi_wait_req(c, &r, what);
#endif
}

/* --------------------------------------------------------------- finalize */

void comm_finalize(Comm* c) {
    CommImpl* m = comm_impl(c);
    if (!m) return;
#ifdef USE_CUDA
    if (m->nccl) comm_nccl_destroy(c, (CommNccl*)m->nccl);
    m->nccl = NULL;
#endif
    comm_scratch_free_all(c);
    if (m->root) util_set_fatal_hook(NULL, NULL);
#ifdef USE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        if (m->root && m->local != MPI_COMM_NULL) MPI_Comm_free(&m->local);
        if (m->p2p_mpi != MPI_COMM_NULL) MPI_Comm_free(&m->p2p_mpi);
        if (m->mpi != MPI_COMM_NULL) MPI_Comm_free(&m->mpi);
        if (m->mpi_owned) MPI_Finalize();
    }
#endif
    free(m->global);
    free(m);
    c->impl = NULL;
    c->kind = COMM_SINGLE;
}
