/* test/test_comm.c — tests of the communicator (comm/comm.c) on host buffers:
 * all-reduce (sum, average), reduce-scatter, all-gather in fp32 and bf16
 * against hand-computed values, several handles in flight waited out of
 * order, the scratch pool, the blocking host helpers, and the single backend
 * (average over one rank leaves the bits alone); sub-communicators
 * (comm_split into blocks, strides, reversed keys, the pipeline x
 * data-parallel groups of the trainer, a split of a split), each checked for
 * its members and running every collective above; point-to-point transfers
 * (a ring with many messages in flight in both directions, posted sends
 * first, and a 1F1B pipeline schedule) with exact payloads, on the world and
 * on groups. Run under mpirun by test/test_comm.sh for several world sizes;
 * with --case / --fault it also provides the error and fault scenarios that
 * script checks.
 *
 * It uses a minimal fake Backend of its own, so it depends on nothing but
 * comm/, common/ and kernels/backend.c: "cpu" (malloc with memory tracking)
 * or, in a build with USE_CUDA, "cuda" (cudaMalloc, two non-blocking
 * streams, device local_rank % GPUs). On the device, each test uploads its
 * host data on the compute stream, runs the collective, and downloads the
 * result on the compute stream after comm_wait, so it also checks the stream
 * ordering of the NCCL and staged-MPI paths. With NCCL it also checks that
 * comm_wait does not block the host (the wait is on the device), and
 * --fault device_stall provides the case of the NCCL watchdog: an operation
 * the GPU has reached that never completes, while the host blocks in
 * cudaStreamSynchronize.
 *
 *   test_comm [--device cpu|cuda] [--comm auto|mpi|nccl|...] [--timeout S]
 *             [--case bad_count|p2p_world1|p2p_nosetup|p2p_notneighbour|p2p_order|p2p_count]
 *             [--fault sleep|fatal|kill|nosend|group_sleep|device_stall] [--fault_rank R]
 */
#include "../comm/comm.h"
#include "test.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef USE_CUDA
#include <cuda_runtime.h>
#include <stdint.h>
#include <time.h>

#include "../comm/comm_internal.h" /* comm_test_stall_next */
#endif

/* ------------------------------------------------------------ fake backend */

static void* fake_alloc(Backend* be, size_t bytes, MemCategory cat) {
    void* p = xmalloc(bytes);
    mem_track_alloc(&be->mem, cat, bytes);
    return p;
}

static void fake_release(Backend* be, void* p, size_t bytes, MemCategory cat) {
    free(p);
    mem_track_free(&be->mem, cat, bytes);
}

static void fake_backend_init(Backend* be) {
    memset(be, 0, sizeof *be);
    be->name = "cpu";
    be->dtype = DTYPE_FP32;
    be->alloc = fake_alloc;
    be->release = fake_release;
}

#ifdef USE_CUDA
static void cu_ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fatal("test_comm: %s failed: %s", what, cudaGetErrorString(e));
}

static void* fakecu_alloc(Backend* be, size_t bytes, MemCategory cat) {
    void* p = NULL;
    cu_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    mem_track_alloc(&be->mem, cat, bytes);
    return p;
}

static void fakecu_release(Backend* be, void* p, size_t bytes, MemCategory cat) {
    cu_ok(cudaFree(p), "cudaFree");
    mem_track_free(&be->mem, cat, bytes);
}

static void fake_cuda_init(Backend* be, int local_rank) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) fatal("test_comm --device cuda: no GPU is visible");
    cu_ok(cudaSetDevice(local_rank % n), "cudaSetDevice");
    memset(be, 0, sizeof *be);
    be->name = "cuda";
    be->dtype = DTYPE_BF16;
    be->alloc = fakecu_alloc;
    be->release = fakecu_release;
    cudaStream_t s1, s2;
    cu_ok(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "cudaStreamCreate");
    cu_ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate");
    be->compute_stream = s1;
    be->comm_stream = s2;
}
#endif

/* -------------------------------------------------------------- the tests */

typedef struct {
    Comm* c;
    Backend* be;
    int R, W;
    int dev;           /* buffers live on the GPU */
    const int* vr;     /* the value rank of each rank of c (its global rank), NULL: the rank itself */
    const char* label; /* "world", or which group */
    int quiet;         /* no per-test lines (groups) */
} T;

/* The rank whose values rank r of t's communicator contributes: its global
 * rank, so that a group with the wrong members gives wrong sums. */
static int VR(const T* t, int r) { return t->vr ? t->vr[r] : r; }

/* ------------------------------------------------------------- test values */

/* fp32 input of (value) rank r at index i: multiples of 1/4 below 10 in
 * magnitude, so every sum over up to a few hundred ranks is exact in fp32. */
static float fval(size_t i, int r) {
    return (float)((int)((i * 7 + (size_t)r * 13) % 41) - 20) * 0.25f + (float)r;
}
/* bf16 input: small integers, exact in bf16, and so are their sums (< 256). */
static float gval(size_t i, int r) { return (float)((int)((i * 5 + (size_t)r * 3) % 17) - 8 + r); }

static double fsum(const T* t, size_t i) {
    double s = 0;
    for (int r = 0; r < t->W; r++) s += fval(i, VR(t, r));
    return s;
}

/* bf16 input of value rank r at i; indices 0..3 are 256 on rank 0 and 1
 * elsewhere: reduced in fp32 their sum 256 + W - 1 is exact before the final
 * rounding, while a bf16 accumulation would lose the 1s (256 + 1 rounds to
 * 256). */
static float bval(size_t i, int r) {
    if (i < 4) return r == 0 ? 256.0f : 1.0f;
    return gval(i, r);
}

static double bsum(const T* t, size_t i) {
    double s = 0;
    for (int r = 0; r < t->W; r++) s += bval(i, VR(t, r));
    return s;
}

/* the documented average: the fp32 sum times 1.0f/world, once */
static float avg_of(double sum, int W) { return (float)sum * (1.0f / (float)W); }

typedef struct {
    size_t bad;
    size_t first;
    double maxerr;
} Diff;

static void diff_add(Diff* d, size_t i, double got, double want) {
    double e = fabs(got - want);
    if (got != want || isnan(got)) {
        if (!d->bad) d->first = i;
        d->bad++;
    }
    if (e > d->maxerr || isnan(e)) d->maxerr = e;
}

/* The buffer the collective works on: the host array itself, or (device) a
 * copy uploaded on the compute stream. */
static void* up(T* t, void* host, size_t bytes) {
#ifdef USE_CUDA
    if (t->dev) {
        void* d = t->be->alloc(t->be, bytes, MEM_OTHER);
        cu_ok(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)t->be->compute_stream),
              "upload");
        return d;
    }
#endif
    (void)t;
    (void)bytes;
    return host;
}

/* After comm_wait: bring the result back, on the compute stream. */
static void down(T* t, void* host, void* d, size_t bytes) {
#ifdef USE_CUDA
    if (t->dev) {
        cudaStream_t s = (cudaStream_t)t->be->compute_stream;
        cu_ok(cudaMemcpyAsync(host, d, bytes, cudaMemcpyDeviceToHost, s), "download");
        cu_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        t->be->release(t->be, d, bytes, MEM_OTHER);
    }
#endif
    (void)t;
    (void)host;
    (void)d;
    (void)bytes;
}

static void check_diff(T* t, const char* what, Diff d, size_t n) {
    if (t->R == 0 && !t->quiet)
        printf("  %-34s n=%-7zu mismatches %zu, max |err| %g\n", what, n, d.bad, d.maxerr);
    CHECK(d.bad == 0, "%s rank %d: %s: %zu of %zu wrong (first at %zu), max |err| %g", t->label, t->R, what,
          d.bad, n, d.first, d.maxerr);
}

static void test_allreduce_f32(T* t, int average) {
    size_t n = 10007;
    float* x = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = fval(i, VR(t, t->R));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(float));
    comm_allreduce(t->c, dbuf, n, DTYPE_FP32, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    CHECK(!h.active, "rank %d: handle still active after comm_wait", t->R);
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double s = fsum(t, i);
        diff_add(&d, i, x[i], average ? (double)avg_of(s, t->W) : s);
    }
    check_diff(t, average ? "all-reduce fp32 average" : "all-reduce fp32 sum", d, n);
    free(x);
}

static void test_allreduce_bf16(T* t, int average) {
    size_t n = 4099;
    uint16_t* x = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bval(i, VR(t, t->R)));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(uint16_t));
    comm_allreduce(t->c, dbuf, n, DTYPE_BF16, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(uint16_t));
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double s = bsum(t, i);
        float want = average ? avg_of(s, t->W) : (float)s;
        diff_add(&d, i, bf16_to_f32(x[i]), bf16_to_f32(f32_to_bf16(want)));
    }
    if (t->R == 0 && !t->quiet && !average)
        printf("  bf16 fp32-accumulation probe: 256 + %d x 1 -> %g (bf16 accumulation would give 256)\n",
               t->W - 1, bf16_to_f32(x[0]));
    check_diff(t, average ? "all-reduce bf16 average" : "all-reduce bf16 sum", d, n);
    free(x);
}

static void test_reduce_scatter_f32(T* t, int average) {
    size_t slice = 1237, n = slice * (size_t)t->W;
    float* x = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = fval(i, VR(t, t->R));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(float));
    comm_reduce_scatter(t->c, dbuf, n, DTYPE_FP32, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    Diff d = {0, 0, 0};
    for (size_t i = (size_t)t->R * slice; i < (size_t)(t->R + 1) * slice; i++) {
        double s = fsum(t, i);
        diff_add(&d, i, x[i], average ? (double)avg_of(s, t->W) : s);
    }
    check_diff(t, average ? "reduce-scatter fp32 average" : "reduce-scatter fp32 sum", d, slice);
    free(x);
}

static void test_reduce_scatter_bf16(T* t, int average) {
    size_t slice = 517, n = slice * (size_t)t->W;
    uint16_t* x = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bval(i, VR(t, t->R)));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(uint16_t));
    comm_reduce_scatter(t->c, dbuf, n, DTYPE_BF16, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(uint16_t));
    Diff d = {0, 0, 0};
    for (size_t i = (size_t)t->R * slice; i < (size_t)(t->R + 1) * slice; i++) {
        double s = bsum(t, i);
        float want = average ? avg_of(s, t->W) : (float)s;
        diff_add(&d, i, bf16_to_f32(x[i]), bf16_to_f32(f32_to_bf16(want)));
    }
    check_diff(t, average ? "reduce-scatter bf16 average" : "reduce-scatter bf16 sum", d, slice);
    free(x);
}

/* all-gather value at i, contributed by the owner of i's slice (rank i / slice) */
static float agval(const T* t, size_t i, size_t slice) {
    return (float)i * 0.5f + 1000.0f * (float)VR(t, (int)(i / slice));
}
static float agbval(const T* t, size_t i, size_t slice) {
    return (float)((i % 32) + 32 * (size_t)(VR(t, (int)(i / slice)) % 8));
}

static void fill_allgather_f32(const T* t, float* x, size_t n, size_t slice) {
    for (size_t i = 0; i < n; i++) x[i] = i / slice == (size_t)t->R ? agval(t, i, slice) : NAN;
}
static void fill_allgather_bf16(const T* t, uint16_t* x, size_t n, size_t slice) {
    for (size_t i = 0; i < n; i++) x[i] = i / slice == (size_t)t->R ? f32_to_bf16(agbval(t, i, slice)) : 0x7fc0;
}

static void test_allgather(T* t) {
    size_t slice = 1237, n = slice * (size_t)t->W;
    float* x = (float*)xmalloc(n * sizeof(float));
    fill_allgather_f32(t, x, n, slice);
    CommHandle h = {0, NULL};
    void* dx = up(t, x, n * sizeof(float));
    comm_allgather(t->c, dx, n, DTYPE_FP32, &h);
    comm_wait(t->c, &h);
    down(t, x, dx, n * sizeof(float));
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) diff_add(&d, i, x[i], agval(t, i, slice));
    check_diff(t, "all-gather fp32", d, n);
    free(x);

    size_t bslice = 333, bn = bslice * (size_t)t->W;
    uint16_t* y = (uint16_t*)xmalloc(bn * sizeof(uint16_t));
    fill_allgather_bf16(t, y, bn, bslice);
    void* dy = up(t, y, bn * sizeof(uint16_t));
    comm_allgather(t->c, dy, bn, DTYPE_BF16, &h);
    comm_wait(t->c, &h);
    down(t, y, dy, bn * sizeof(uint16_t));
    Diff e = {0, 0, 0};
    for (size_t i = 0; i < bn; i++) diff_add(&e, i, bf16_to_f32(y[i]), agbval(t, i, bslice));
    check_diff(t, "all-gather bf16", e, bn);
    free(y);
}

/* Four collectives in flight at once, waited in another order than launched. */
static void test_in_flight(T* t, int round, size_t* comm_bytes_in_flight) {
    size_t na = 3001, sb = 257, nb = sb * (size_t)t->W, sc = 129, nc = sc * (size_t)t->W, nd = 2050;
    float* a = (float*)xmalloc(na * sizeof(float));
    float* b = (float*)xmalloc(nb * sizeof(float));
    uint16_t* cc = (uint16_t*)xmalloc(nc * sizeof(uint16_t));
    uint16_t* dd = (uint16_t*)xmalloc(nd * sizeof(uint16_t));
    for (size_t i = 0; i < na; i++) a[i] = fval(i + 11, VR(t, t->R));
    for (size_t i = 0; i < nb; i++) b[i] = fval(i + 5, VR(t, t->R));
    fill_allgather_bf16(t, cc, nc, sc);
    for (size_t i = 0; i < nd; i++) dd[i] = f32_to_bf16(bval(i, VR(t, t->R)));
    CommHandle h[4] = {{0, NULL}, {0, NULL}, {0, NULL}, {0, NULL}};
    void* da = up(t, a, na * sizeof(float));
    void* db = up(t, b, nb * sizeof(float));
    void* dc = up(t, cc, nc * sizeof(uint16_t));
    void* ddd = up(t, dd, nd * sizeof(uint16_t));
    comm_allreduce(t->c, da, na, DTYPE_FP32, 0, &h[0]);
    comm_reduce_scatter(t->c, db, nb, DTYPE_FP32, 1, &h[1]);
    comm_allgather(t->c, dc, nc, DTYPE_BF16, &h[2]);
    comm_allreduce(t->c, ddd, nd, DTYPE_BF16, 1, &h[3]);
    *comm_bytes_in_flight = t->be->mem.current[MEM_COMM];
    CHECK(h[0].active && h[1].active && h[2].active && h[3].active, "rank %d: handles not active after launch",
          t->R);
    comm_wait(t->c, &h[3]);
    comm_wait(t->c, &h[1]);
    comm_wait(t->c, &h[2]);
    comm_wait(t->c, &h[0]);
    comm_wait(t->c, &h[0]); /* waiting twice is a no-op */
    CHECK(!h[0].active && !h[1].active && !h[2].active && !h[3].active,
          "rank %d: handles still active after the waits", t->R);
    down(t, a, da, na * sizeof(float));
    down(t, b, db, nb * sizeof(float));
    down(t, cc, dc, nc * sizeof(uint16_t));
    down(t, dd, ddd, nd * sizeof(uint16_t));

    Diff d = {0, 0, 0};
    for (size_t i = 0; i < na; i++) diff_add(&d, i, a[i], fsum(t, i + 11));
    for (size_t i = (size_t)t->R * sb; i < (size_t)(t->R + 1) * sb; i++)
        diff_add(&d, na + i, b[i], avg_of(fsum(t, i + 5), t->W));
    for (size_t i = 0; i < nc; i++) diff_add(&d, na + nb + i, bf16_to_f32(cc[i]), agbval(t, i, sc));
    for (size_t i = 0; i < nd; i++)
        diff_add(&d, na + nb + nc + i, bf16_to_f32(dd[i]), bf16_to_f32(f32_to_bf16(avg_of(bsum(t, i), t->W))));
    char what[64];
    snprintf(what, sizeof what, "4 in flight, out of order (#%d)", round);
    check_diff(t, what, d, na + sb + nc + nd);
    free(a);
    free(b);
    free(cc);
    free(dd);
}

static void test_count_zero(T* t) {
    float dummy = 42.0f;
    CommHandle h = {0, NULL};
    comm_allreduce(t->c, &dummy, 0, DTYPE_FP32, 1, &h);
    comm_wait(t->c, &h);
    comm_reduce_scatter(t->c, &dummy, 0, DTYPE_BF16, 0, &h);
    comm_wait(t->c, &h);
    CHECK(dummy == 42.0f && !h.active, "rank %d: a 0-element collective touched the buffer", t->R);
}

static void test_host_helpers(T* t) {
    double v[5];
    for (int j = 0; j < 5; j++) v[j] = VR(t, t->R) + 0.5 * j;
    comm_allreduce_host_sum(t->c, v, 5);
    int ok = 1;
    for (int j = 0; j < 5; j++) {
        double want = 0;
        for (int r = 0; r < t->W; r++) want += VR(t, r) + 0.5 * j;
        if (v[j] != want) ok = 0;
    }
    if (t->R == 0 && !t->quiet) printf("  host sum: [%g %g %g %g %g]\n", v[0], v[1], v[2], v[3], v[4]);
    CHECK(ok, "%s rank %d: comm_allreduce_host_sum wrong", t->label, t->R);

    int mine = (VR(t, t->R) * 7 + 3) % 5 - 10, want = -1000;
    for (int r = 0; r < t->W; r++) {
        int x = (VR(t, r) * 7 + 3) % 5 - 10;
        if (x > want) want = x;
    }
    int got = comm_allreduce_host_max_int(t->c, mine);
    CHECK(got == want, "%s rank %d: host max int %d, want %d", t->label, t->R, got, want);

    /* from rank 0 of the communicator: its bytes depend on its value rank */
    size_t nb = 3 * 1024 * 1024 + 7;
    unsigned char* buf = (unsigned char*)xmalloc(nb);
    unsigned root = (unsigned)VR(t, 0);
    for (size_t i = 0; i < nb; i++) buf[i] = t->R == 0 ? (unsigned char)(i * 131 + 7 + root) : 0;
    comm_broadcast_host(t->c, buf, nb);
    size_t bad = 0;
    for (size_t i = 0; i < nb; i++) bad += buf[i] != (unsigned char)(i * 131 + 7 + root);
    CHECK(bad == 0, "%s rank %d: broadcast: %zu of %zu bytes wrong", t->label, t->R, bad, nb);
    free(buf);

    comm_barrier(t->c);
    CHECK(1, "barrier returned");
}

/* One rank: every collective leaves the bits as they are, average included. */
static void test_identity_world1(T* t) {
    size_t n = 1000;
    float* x = (float*)xmalloc(n * sizeof(float));
    float* ref = (float*)xmalloc(n * sizeof(float));
    Rng rng;
    rng_seed(&rng, 1234);
    for (size_t i = 0; i < n; i++) ref[i] = x[i] = rng_normal(&rng) * 3.0f;
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(float));
    comm_allreduce(t->c, dbuf, n, DTYPE_FP32, 1, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    CHECK(memcmp(x, ref, n * sizeof(float)) == 0, "world 1: all-reduce average changed the bits");
    dbuf = up(t, x, n * sizeof(float));
    comm_reduce_scatter(t->c, dbuf, n, DTYPE_FP32, 1, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    CHECK(memcmp(x, ref, n * sizeof(float)) == 0, "world 1: reduce-scatter average changed the bits");
    dbuf = up(t, x, n * sizeof(float));
    comm_allgather(t->c, dbuf, n, DTYPE_FP32, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    CHECK(memcmp(x, ref, n * sizeof(float)) == 0, "world 1: all-gather changed the bits");
    uint16_t* y = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    uint16_t* yref = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) yref[i] = y[i] = f32_to_bf16(ref[i]);
    dbuf = up(t, y, n * sizeof(uint16_t));
    comm_allreduce(t->c, dbuf, n, DTYPE_BF16, 1, &h);
    comm_wait(t->c, &h);
    down(t, y, dbuf, n * sizeof(uint16_t));
    CHECK(memcmp(y, yref, n * sizeof(uint16_t)) == 0, "world 1: bf16 all-reduce average changed the bits");
    if (t->R == 0 && !t->quiet)
        printf("  world 1 (%s): average is the identity, bit for bit\n", comm_kind_name(t->c->kind));
    free(x);
    free(ref);
    free(y);
    free(yref);
}

/* Every collective and host helper on t's communicator. The scratch pool is
 * per communicator, MEM_COMM is the backend's total: the pool checks count
 * from where MEM_COMM stands at the start. */
static void run_collectives(T* t) {
    size_t base = t->be->mem.current[MEM_COMM];
    test_allreduce_f32(t, 0);
    test_allreduce_f32(t, 1);
    test_allreduce_bf16(t, 0);
    test_allreduce_bf16(t, 1);
    test_reduce_scatter_f32(t, 0);
    test_reduce_scatter_f32(t, 1);
    test_reduce_scatter_bf16(t, 0);
    test_reduce_scatter_bf16(t, 1);
    test_allgather(t);
    size_t inflight1 = 0, inflight2 = 0;
    test_in_flight(t, 1, &inflight1);
    size_t pool_after1 = t->be->mem.current[MEM_COMM];
    test_in_flight(t, 2, &inflight2);
    size_t pool_after2 = t->be->mem.current[MEM_COMM];
    if (t->R == 0 && !t->quiet)
        printf("  scratch pool (MEM_COMM): %zu bytes with 4 in flight, %zu after round 1, %zu after round 2\n",
               inflight1 - base, pool_after1 - base, pool_after2 - base);
    if (t->c->kind == COMM_MPI && !t->dev) {
        /* the reduce-scatter's receive buffer and the bf16 fp32 staging */
        size_t need = 257 * sizeof(float) + 2050 * sizeof(float);
        CHECK(inflight1 - base >= need, "%s rank %d: %zu MEM_COMM bytes with 4 in flight, want >= %zu",
              t->label, t->R, inflight1 - base, need);
        CHECK(pool_after2 == pool_after1, "%s rank %d: scratch pool grew from %zu to %zu bytes on reuse",
              t->label, t->R, pool_after1 - base, pool_after2 - base);
    } else {
        /* single and nccl use no scratch; pinned staging is not in be->mem */
        CHECK(inflight1 == base, "%s rank %d: %s backend counted %zu scratch bytes", t->label, t->R,
              comm_kind_name(t->c->kind), inflight1 - base);
    }
    test_count_zero(t);
    test_host_helpers(t);
    if (t->W == 1) test_identity_world1(t);
}

/* ---------------------------------------------------------- point to point */

/* Payloads of the transfers from value rank `from` to value rank `to`, message
 * k, element i: integers, exact in fp32 (below 2^12) and in bf16 (below 2^7). */
static float p2p_f(int from, int to, int k, size_t i) {
    return (float)((int)((i * 7 + (size_t)k * 131 + (size_t)from * 1009 + (size_t)to * 17) % 4093) - 2000);
}
static float p2p_b(int from, int to, int k, size_t i) {
    return (float)((int)((i + (size_t)k * 3 + (size_t)from * 5 + (size_t)to) % 200) - 100);
}

/* Every rank sends RING_M fp32 messages to its right neighbour and RING_M
 * bf16 messages to its left one, all posted before any receive (so every
 * rank's neighbours send to it while it sends to them), then posts the
 * matching receives; everything is in flight at once, waited in the reverse
 * order. Message 2 is empty, message 5 large (MPI's rendezvous path). At
 * world 2 both neighbours are the same rank: its messages then alternate
 * fp32, bf16 on one stream, and the receives are posted in that order. */
#define RING_M 6
static void test_p2p_ring(T* t) {
    int W = t->W, R = t->R, right = (R + 1) % W, left = (R - 1 + W) % W;
    int me = VR(t, R), vright = VR(t, right), vleft = VR(t, left);
    size_t nf[RING_M], nb[RING_M];
    float *sf[RING_M], *rf[RING_M];
    uint16_t *sb[RING_M], *rb[RING_M];
    void *dsf[RING_M], *dsb[RING_M], *drf[RING_M], *drb[RING_M];
    CommHandle h[4 * RING_M];
    memset(h, 0, sizeof h);
    for (int k = 0; k < RING_M; k++) {
        nf[k] = k == 2 ? 0 : k == 5 ? 100003 : 1000 + 37 * (size_t)k;
        nb[k] = k == 2 ? 0 : k == 5 ? 50021 : 300 + 11 * (size_t)k;
        sf[k] = (float*)xmalloc(nf[k] * sizeof(float));
        rf[k] = (float*)xmalloc(nf[k] * sizeof(float));
        sb[k] = (uint16_t*)xmalloc(nb[k] * sizeof(uint16_t));
        rb[k] = (uint16_t*)xmalloc(nb[k] * sizeof(uint16_t));
        for (size_t i = 0; i < nf[k]; i++) {
            sf[k][i] = p2p_f(me, vright, k, i);
            rf[k][i] = NAN;
        }
        for (size_t i = 0; i < nb[k]; i++) {
            sb[k][i] = f32_to_bf16(p2p_b(me, vleft, k, i));
            rb[k][i] = 0x7fc0;
        }
        dsf[k] = up(t, sf[k], nf[k] * sizeof(float));
        dsb[k] = up(t, sb[k], nb[k] * sizeof(uint16_t));
        drf[k] = up(t, rf[k], nf[k] * sizeof(float));
        drb[k] = up(t, rb[k], nb[k] * sizeof(uint16_t));
    }
    for (int k = 0; k < RING_M; k++) {
        comm_send(t->c, dsf[k], nf[k], DTYPE_FP32, right, 2 * k, &h[2 * k]);
        comm_send(t->c, dsb[k], nb[k], DTYPE_BF16, left, 2 * k + 1, &h[2 * k + 1]);
    }
    for (int k = 0; k < RING_M; k++) {
        comm_recv(t->c, drf[k], nf[k], DTYPE_FP32, left, 2 * k, &h[2 * RING_M + 2 * k]);
        comm_recv(t->c, drb[k], nb[k], DTYPE_BF16, right, 2 * k + 1, &h[2 * RING_M + 2 * k + 1]);
    }
    int active = 0;
    for (int j = 0; j < 4 * RING_M; j++) {
        active += h[j].active;
        comm_progress(t->c, &h[j]);
    }
    CHECK(active == 4 * RING_M, "%s rank %d: %d of %d transfer handles active after posting", t->label, R,
          active, 4 * RING_M);
    for (int j = 4 * RING_M - 1; j >= 0; j--) comm_wait(t->c, &h[j]);
    comm_wait(t->c, &h[0]); /* waiting twice is a no-op */
    Diff d = {0, 0, 0};
    size_t n = 0;
    for (int k = 0; k < RING_M; k++) {
        down(t, sf[k], dsf[k], nf[k] * sizeof(float));
        down(t, sb[k], dsb[k], nb[k] * sizeof(uint16_t));
        down(t, rf[k], drf[k], nf[k] * sizeof(float));
        down(t, rb[k], drb[k], nb[k] * sizeof(uint16_t));
        for (size_t i = 0; i < nf[k]; i++) diff_add(&d, n + i, rf[k][i], p2p_f(vleft, me, k, i));
        n += nf[k];
        for (size_t i = 0; i < nb[k]; i++) diff_add(&d, n + i, bf16_to_f32(rb[k][i]), p2p_b(vright, me, k, i));
        n += nb[k];
        /* a send leaves its buffer alone */
        for (size_t i = 0; i < nf[k]; i++) diff_add(&d, n, sf[k][i], p2p_f(me, vright, k, i));
        free(sf[k]);
        free(rf[k]);
        free(sb[k]);
        free(rb[k]);
    }
    char what[80];
    snprintf(what, sizeof what, "p2p ring, %d messages in flight", 4 * RING_M);
    check_diff(t, what, d, n);
}

/* A pipeline of W stages (the ranks of t's communicator) running the 1F1B
 * schedule over M micro-batches, every receive posted up front: stage s
 * receives activation m from s - 1 (fp32), adds 1 and sends it on; the last
 * stage turns it into a gradient 2 x; stage s receives gradient m from s + 1
 * (bf16), adds 1 and sends it back. In the steady state stage s sends
 * activations to s + 1 while s + 1 sends gradients to s. Every stage checks
 * what it receives; stage 0 gets 2 (a + W) + W for input a. */
static void test_p2p_pipeline(T* t, int M) {
    int P = t->W, s = t->R;
    size_t n = 777;
    float** act = (float**)xcalloc((size_t)M, sizeof(float*));
    uint16_t** grad = (uint16_t**)xcalloc((size_t)M, sizeof(uint16_t*));
    void** dact = (void**)xcalloc((size_t)M, sizeof(void*));
    void** dgrad = (void**)xcalloc((size_t)M, sizeof(void*));
    float** sact = (float**)xcalloc((size_t)M, sizeof(float*));
    uint16_t** sgrad = (uint16_t**)xcalloc((size_t)M, sizeof(uint16_t*));
    void** dsact = (void**)xcalloc((size_t)M, sizeof(void*));
    void** dsgrad = (void**)xcalloc((size_t)M, sizeof(void*));
    float** last = (float**)xcalloc((size_t)M, sizeof(float*)); /* the last stage's outputs */
    CommHandle* hact = (CommHandle*)xcalloc((size_t)M, sizeof(CommHandle));
    CommHandle* hgrad = (CommHandle*)xcalloc((size_t)M, sizeof(CommHandle));
    CommHandle* hsact = (CommHandle*)xcalloc((size_t)M, sizeof(CommHandle));
    CommHandle* hsgrad = (CommHandle*)xcalloc((size_t)M, sizeof(CommHandle));
    for (int m = 0; m < M; m++) {
        act[m] = (float*)xmalloc(n * sizeof(float));
        grad[m] = (uint16_t*)xmalloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            act[m][i] = NAN;
            grad[m][i] = 0x7fc0;
        }
        if (s > 0) {
            dact[m] = up(t, act[m], n * sizeof(float));
            comm_recv(t->c, dact[m], n, DTYPE_FP32, s - 1, 2 * m, &hact[m]);
        }
        if (s < P - 1) {
            dgrad[m] = up(t, grad[m], n * sizeof(uint16_t));
            comm_recv(t->c, dgrad[m], n, DTYPE_BF16, s + 1, 2 * m + 1, &hgrad[m]);
        }
    }
    Diff d = {0, 0, 0};
    size_t checked = 0;
    int warm = P - 1 - s < M ? P - 1 - s : M;
    int nf = 0; /* forwards done */
    for (int step = 0; step < warm + 2 * M - warm; step++) {
        /* the schedule: warm forwards, then a forward (while any is left) and a backward, in turn */
        int fwd;
        if (nf < warm) fwd = 1;
        else fwd = (step - warm) % 2 == 0 && nf < M;
        int bwd_m = fwd ? -1 : step - nf;
        if (fwd) {
            int m = nf++;
            float* x = act[m];
            if (s == 0) {
                for (size_t i = 0; i < n; i++) x[i] = (float)((i * 3 + (size_t)m * 7) % 61);
            } else {
                comm_wait(t->c, &hact[m]);
                down(t, x, dact[m], n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    diff_add(&d, checked++, x[i], (float)((i * 3 + (size_t)m * 7) % 61) + (float)s);
            }
            sact[m] = (float*)xmalloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) sact[m][i] = x[i] + 1.0f;
            if (s < P - 1) {
                dsact[m] = up(t, sact[m], n * sizeof(float));
                comm_send(t->c, dsact[m], n, DTYPE_FP32, s + 1, 2 * m, &hsact[m]);
            } else {
                last[m] = sact[m];
            }
        } else {
            int m = bwd_m;
            float* g = (float*)xmalloc(n * sizeof(float));
            if (s == P - 1) {
                for (size_t i = 0; i < n; i++) g[i] = 2.0f * last[m][i];
            } else {
                for (int j = 0; j < M; j++) comm_progress(t->c, &hgrad[j]);
                comm_wait(t->c, &hgrad[m]);
                down(t, grad[m], dgrad[m], n * sizeof(uint16_t));
                for (size_t i = 0; i < n; i++) {
                    g[i] = bf16_to_f32(grad[m][i]);
                    float a = (float)((i * 3 + (size_t)m * 7) % 61);
                    diff_add(&d, checked++, g[i], 2.0f * (a + (float)P) + (float)(P - 1 - s));
                }
            }
            sgrad[m] = (uint16_t*)xmalloc(n * sizeof(uint16_t));
            for (size_t i = 0; i < n; i++) sgrad[m][i] = f32_to_bf16(g[i] + 1.0f);
            if (s > 0) {
                dsgrad[m] = up(t, sgrad[m], n * sizeof(uint16_t));
                comm_send(t->c, dsgrad[m], n, DTYPE_BF16, s - 1, 2 * m + 1, &hsgrad[m]);
            } else {
                for (size_t i = 0; i < n; i++) {
                    float a = (float)((i * 3 + (size_t)m * 7) % 61);
                    diff_add(&d, checked++, bf16_to_f32(sgrad[m][i]), 2.0f * (a + (float)P) + (float)P);
                }
            }
            free(g);
        }
    }
    CHECK(nf == M, "%s rank %d: the schedule ran %d forwards of %d", t->label, s, nf, M);
    for (int m = 0; m < M; m++) {
        comm_wait(t->c, &hsact[m]);
        comm_wait(t->c, &hsgrad[m]);
        if (dsact[m]) down(t, sact[m], dsact[m], n * sizeof(float));
        if (dsgrad[m]) down(t, sgrad[m], dsgrad[m], n * sizeof(uint16_t));
        CHECK(!hact[m].active && !hgrad[m].active && !hsact[m].active && !hsgrad[m].active,
              "%s rank %d: a transfer of micro-batch %d is still active", t->label, s, m);
        free(act[m]);
        free(grad[m]);
        free(sact[m]);
        free(sgrad[m]);
    }
    char what[80];
    snprintf(what, sizeof what, "p2p 1F1B pipeline, %d stages x %d", P, M);
    check_diff(t, what, d, checked);
    free(act);
    free(grad);
    free(dact);
    free(dgrad);
    free(sact);
    free(sgrad);
    free(dsact);
    free(dsgrad);
    free(last);
    free(hact);
    free(hgrad);
    free(hsact);
    free(hsgrad);
}

/* ------------------------------------------------- NCCL: waits on the device */

#ifdef USE_CUDA
/* A host function that holds the stream it is queued on for (uintptr_t)arg
 * milliseconds. */
static void CUDART_CB hold_stream(void* arg) {
    double end = wall_time_s() + 1e-3 * (double)(uintptr_t)arg;
    while (wall_time_s() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* NCCL's comm_wait orders the compute stream after the operation and returns:
 * the host does not wait. The compute stream is held HOLD_MS by a host
 * function; an all-reduce (and, at world >= 2, a receive from the left
 * neighbour and a send to the right one) started and waited for behind it
 * must give the host back at once, the compute stream must still be busy
 * then, and after cudaStreamSynchronize the results must be right. */
#define HOLD_MS 300
static void test_nccl_nonblocking(T* t) {
    cudaStream_t s = (cudaStream_t)t->be->compute_stream;
    size_t n = 4099;
    size_t bytes = n * sizeof(float);
    int p2p = t->W >= 2, right = (t->R + 1) % t->W, left = (t->R - 1 + t->W) % t->W;
    float* x = (float*)xmalloc(bytes);
    float* y = (float*)xmalloc(bytes);
    float* z = (float*)xmalloc(bytes);
    for (size_t i = 0; i < n; i++) {
        x[i] = fval(i, VR(t, t->R));
        y[i] = fval(i + 3, VR(t, t->R));
        z[i] = NAN;
    }
    /* uploads first: a copy from pageable memory may wait for the stream */
    void* dx = up(t, x, bytes);
    void* dy = p2p ? up(t, y, bytes) : NULL;
    void* dz = p2p ? up(t, z, bytes) : NULL;
    cu_ok(cudaLaunchHostFunc(s, hold_stream, (void*)(uintptr_t)HOLD_MS), "cudaLaunchHostFunc");
    CommHandle h = {0, NULL}, hs = {0, NULL}, hr = {0, NULL};
    double t0 = wall_time_s();
    comm_allreduce(t->c, dx, n, DTYPE_FP32, 0, &h);
    if (p2p) {
        comm_recv(t->c, dz, n, DTYPE_FP32, left, 7, &hr);
        comm_send(t->c, dy, n, DTYPE_FP32, right, 7, &hs);
    }
    comm_wait(t->c, &h);
    comm_wait(t->c, &hr);
    comm_wait(t->c, &hs);
    double host_ms = 1000.0 * (wall_time_s() - t0);
    cudaError_t busy = cudaStreamQuery(s);
    cudaGetLastError(); /* (cudaErrorNotReady is the expected answer, not an error) */
    down(t, x, dx, bytes);
    if (p2p) {
        down(t, z, dz, bytes);
        down(t, y, dy, bytes);
    }
    double total_ms = 1000.0 * (wall_time_s() - t0);
    CHECK(busy == cudaErrorNotReady,
          "rank %d: the compute stream was idle right after the waits (%s): the timing says nothing", t->R,
          cudaGetErrorString(busy));
    CHECK(
        host_ms < HOLD_MS / 3.0,
        "rank %d: starting and waiting for %s took %.1f ms on the host while the compute stream was held %d ms: "
        "comm_wait blocked the host",
        t->R, p2p ? "an all-reduce, a send and a receive" : "an all-reduce", host_ms, HOLD_MS);
    CHECK(total_ms >= HOLD_MS * 0.9, "rank %d: the synchronisation took %.1f ms, less than the %d ms hold",
          t->R, total_ms, HOLD_MS);
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) diff_add(&d, i, x[i], fsum(t, i));
    if (p2p)
        for (size_t i = 0; i < n; i++) diff_add(&d, n + i, z[i], fval(i + 3, VR(t, left)));
    if (t->R == 0 && !t->quiet)
        printf("  nccl waits on the device: the host had %s back after %.2f ms, the stream was held %d ms "
               "(synchronised after %.1f ms)\n",
               p2p ? "an all-reduce, a send and a receive" : "an all-reduce", host_ms, HOLD_MS, total_ms);
    check_diff(t, p2p ? "nccl behind a held stream (+p2p)" : "nccl behind a held stream", d, p2p ? 2 * n : n);
    free(x);
    free(y);
    free(z);
}
#endif

/* ------------------------------------------------------- sub-communicators */

/* The color and key of rank r of W under a split rule. The trainer's layout
 * (rules 2-4): DP = 2 data-parallel replicas when W is even, else 1, P = W / DP
 * pipeline stages, rank r = p * DP + d. */
enum { SPLIT_BLOCKS, SPLIT_STRIDE_REVERSED, SPLIT_DP, SPLIT_PIPELINE, SPLIT_EMBEDDING };

static void split_rule(int rule, int k, int r, int W, int* color, int* key) {
    int DP = W % 2 == 0 ? 2 : 1, P = W / DP, p = r / DP, d = r % DP;
    switch (rule) {
    case SPLIT_BLOCKS:
        *color = r / k;
        *key = r;
        break;
    case SPLIT_STRIDE_REVERSED:
        *color = r % k;
        *key = -r;
        break;
    case SPLIT_DP:
        *color = p;
        *key = d;
        break;
    case SPLIT_PIPELINE:
        *color = d;
        *key = p;
        break;
    default:
        *color = p == 0 || p == P - 1 ? d : COMM_COLOR_NONE;
        *key = p;
        break;
    }
}

/* The members (value ranks, in rank order) of the group of rank R of t's
 * communicator, given every rank's color and key: those of R's color in (key,
 * rank) order, or R alone for a negative color. Returns the count; *me is R's
 * rank in the group. */
static int expected_members(const T* t, const int* color, const int* key, int* members, int* me) {
    int n = 0;
    if (color[t->R] < 0) {
        members[n++] = t->R;
    } else {
        for (int j = 0; j < t->W; j++) {
            if (color[j] != color[t->R]) continue;
            int i = n++;
            while (i > 0 && key[members[i - 1]] > key[j]) {
                members[i] = members[i - 1];
                i--;
            }
            members[i] = j;
        }
    }
    for (int i = 0; i < n; i++)
        if (members[i] == t->R) *me = i;
    for (int i = 0; i < n; i++) members[i] = VR(t, members[i]);
    return n;
}

/* Split t's communicator; check the result's rank, size, kind and members
 * (a host sum over the group of one-hot rows: each rank writes its rank + 1
 * at its value rank's column); fill *g to test it. Returns the group size. */
static int split_and_check(T* t, const int* color, const int* key, Comm* sub, T* g, int* members,
                           const char* label) {
    int me = -1;
    int n = expected_members(t, color, key, members, &me);
    int got = comm_split(t->c, color[t->R], key[t->R], sub);
    int nglobal = 0;
    for (int r = 0; r < t->W; r++)
        if (VR(t, r) + 1 > nglobal) nglobal = VR(t, r) + 1;
    CHECK(got == n && sub->world == n && sub->rank == me,
          "%s: rank %d of the parent: comm_split gave rank %d of %d "
          "(returned %d), want rank %d of %d",
          label, t->R, sub->rank, sub->world, got, me, n);
    CommKind want = n == 1 ? COMM_SINGLE : t->c->kind;
    CHECK(sub->kind == want && sub->timeout_s == t->c->timeout_s && sub->local_rank == t->c->local_rank &&
              sub->local_world == t->c->local_world && sub->be == t->c->be,
          "%s: rank %d of the parent: kind %s (want %s), timeout %g, local %d of %d", label, t->R,
          comm_kind_name(sub->kind), comm_kind_name(want), sub->timeout_s, sub->local_rank, sub->local_world);
    if (sub->world != n || sub->rank != me) return 0;
    double* row = (double*)xcalloc((size_t)nglobal, sizeof(double));
    row[VR(t, t->R)] = sub->rank + 1;
    comm_allreduce_host_sum(sub, row, nglobal);
    int bad = 0;
    for (int v = 0; v < nglobal; v++) {
        double want_v = 0;
        for (int i = 0; i < n; i++)
            if (members[i] == v) want_v = i + 1;
        bad += row[v] != want_v;
    }
    CHECK(bad == 0,
          "%s: rank %d of the parent: the group's members or their order differ from the colors and keys",
          label, t->R);
    free(row);
    memset(g, 0, sizeof *g);
    g->c = sub;
    g->be = t->be;
    g->R = sub->rank;
    g->W = sub->world;
    g->dev = t->dev;
    g->vr = members;
    g->label = label;
    g->quiet = 1;
    return n;
}

/* One split rule on t's communicator: the group's members, every collective,
 * for two rules the transfers; a split of the group for one rule; then the
 * group is finalized and must leave no scratch behind. */
static void test_split(T* t, int rule, int k, const char* name) {
    int W = t->W;
    int* color = (int*)xmalloc((size_t)W * sizeof(int));
    int* key = (int*)xmalloc((size_t)W * sizeof(int));
    int* members = (int*)xmalloc((size_t)W * sizeof(int));
    for (int r = 0; r < W; r++) split_rule(rule, k, r, W, &color[r], &key[r]);
    size_t mem0 = t->be->mem.current[MEM_COMM];
    int passed0 = test_passed, failed0 = test_failed;
    Comm sub;
    T g;
    char label[96];
    snprintf(label, sizeof label, "split %s, group of world rank %d", name, t->R);
    int n = split_and_check(t, color, key, &sub, &g, members, label);
    CommKind kind = sub.kind; /* (comm_finalize resets it) */
    if (n > 0) {
        run_collectives(&g);
        /* transfers on the groups of two rules only (with NCCL, every group's
         * channels are communicators of their own, slow to make) */
        if (rule == SPLIT_STRIDE_REVERSED || rule == SPLIT_PIPELINE) {
            comm_p2p_setup(&sub);
            if (g.W > 1) {
                test_p2p_ring(&g);
                test_p2p_pipeline(&g, 5);
            }
        }
        if (rule == SPLIT_STRIDE_REVERSED) {
            /* a split of the split: blocks of 2 in the group's order */
            int* c2 = (int*)xmalloc((size_t)g.W * sizeof(int));
            int* k2 = (int*)xmalloc((size_t)g.W * sizeof(int));
            int* m2 = (int*)xmalloc((size_t)g.W * sizeof(int));
            for (int r = 0; r < g.W; r++) split_rule(SPLIT_BLOCKS, 2, r, g.W, &c2[r], &k2[r]);
            Comm sub2;
            T g2;
            char label2[128];
            snprintf(label2, sizeof label2, "%s, then blocks of 2", label);
            if (split_and_check(&g, c2, k2, &sub2, &g2, m2, label2) > 0) {
                test_allreduce_f32(&g2, 0);
                test_host_helpers(&g2);
                comm_finalize(&sub2);
            }
            free(c2);
            free(k2);
            free(m2);
        }
        comm_finalize(&sub);
    }
    CHECK(t->be->mem.current[MEM_COMM] == mem0, "%s: %zu MEM_COMM bytes after finalizing the group, want %zu",
          label, t->be->mem.current[MEM_COMM], mem0);
    /* one line per rule: rank 0's group, and every rank's failures */
    double tot[2] = {(double)(test_passed - passed0), (double)(test_failed - failed0)};
    comm_allreduce_host_sum(t->c, tot, 2);
    if (t->R == 0) {
        printf("  split %-24s rank 0 in a %d-rank %s group [", name, n, comm_kind_name(kind));
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", members[i]);
        printf("]; all groups: %.0f checks, %.0f failed\n", tot[0], tot[1]);
    }
    free(color);
    free(key);
    free(members);
}

/* ---------------------------------------------------------------- faults */

/* One good collective, then rank fault_rank misbehaves while the others start
 * the next one: every rank must end (the script checks how and how fast).
 *   sleep, fatal, kill: before a world all-reduce.
 *   device_stall (NCCL): fault_rank's next all-reduce has its stream held for
 *     8 x the timeout between its 'started' event and the NCCL call
 *     (comm_test_stall_next): the GPU has reached the operation, which does not
 *     complete, as when a peer stalls, and at world 1 too. Every rank's
 *     comm_wait returns at once; the host then blocks in cudaStreamSynchronize,
 *     and only the watchdog can end the job, well before the hold ends.
 *   nosend: every rank posts a receive from its left neighbour and sends to its
 *     right one, except fault_rank, which stalls instead of sending; the
 *     others, their message received, sleep without calling MPI, so that the
 *     stalled receive's timeout is what must end them all.
 *   group_sleep: groups by rank % 2; fault_rank stalls before a group
 *     all-reduce; the ranks of the other group sleep without calling MPI, so
 *     that only the abort from fault_rank's group can end them. */
static int run_fault(T* t, const char* fault, int fault_rank) {
    float x = 1.0f;
    CommHandle h = {0, NULL};
    void* dbuf = up(t, &x, sizeof x);
    comm_allreduce(t->c, dbuf, 1, DTYPE_FP32, 0, &h);
    comm_wait(t->c, &h);
    down(t, &x, dbuf, sizeof x);
    if (t->R == 0)
        printf("fault %s on rank %d: first collective gave %g (want %d)\n", fault, fault_rank, x, t->W);
    if (strcmp(fault, "nosend") == 0) {
        if (t->W < 2) fatal("--fault nosend needs 2 or more ranks");
        comm_p2p_setup(t->c);
        size_t n = 1000;
        float* y = (float*)xcalloc(n, sizeof(float));
        float* z = (float*)xcalloc(n, sizeof(float));
        void* dy = up(t, y, n * sizeof(float));
        void* dz = up(t, z, n * sizeof(float));
        CommHandle hs = {0, NULL}, hr = {0, NULL};
        comm_recv(t->c, dz, n, DTYPE_FP32, (t->R - 1 + t->W) % t->W, 0, &hr);
        if (t->R == fault_rank) {
            fprintf(stderr, "rank %d: posted its receive, never sends\n", t->R);
            for (;;) sleep(1);
        }
        comm_send(t->c, dy, n, DTYPE_FP32, (t->R + 1) % t->W, 0, &hs);
        comm_wait(t->c, &hr);
        comm_wait(t->c, &hs);
        for (;;) sleep(1);
    }
    if (strcmp(fault, "device_stall") == 0) {
#ifdef USE_CUDA
        if (!t->dev || t->c->kind != COMM_NCCL) fatal("--fault device_stall needs --device cuda --comm nccl");
        size_t n = 1000;
        float* y = (float*)xcalloc(n, sizeof(float));
        void* dy = up(t, y, n * sizeof(float));
        if (t->R == fault_rank) {
            double hold = 8.0 * t->c->timeout_s;
            fprintf(stderr,
                    "rank %d: holding the comm stream %g s between the all-reduce's start and its NCCL call\n",
                    t->R, hold);
            comm_test_stall_next(t->c, hold);
        }
        comm_allreduce(t->c, dy, n, DTYPE_FP32, 0, &h);
        comm_wait(t->c, &h);
        fprintf(stderr, "rank %d: comm_wait returned; blocking in cudaStreamSynchronize\n", t->R);
        down(t, y, dy, n * sizeof(float));
        printf("rank %d: the stalled collective completed (should not happen)\n", t->R);
        free(y);
        return 2;
#else
        fatal("--fault device_stall needs a build with CUDA");
#endif
    }
    if (strcmp(fault, "group_sleep") == 0) {
        Comm sub;
        comm_split(t->c, t->R % 2, t->R, &sub);
        if (sub.world < 2 || t->R % 2 != fault_rank % 2) {
            for (;;) sleep(1);
        }
        T g = *t;
        g.c = &sub;
        g.R = sub.rank;
        g.W = sub.world;
        test_allreduce_f32(&g, 0);
        if (t->R == fault_rank) {
            fprintf(stderr, "rank %d: stalling forever before the group's next collective\n", t->R);
            for (;;) sleep(1);
        }
        size_t n = 1000;
        float* y = (float*)xcalloc(n, sizeof(float));
        void* dy = up(t, y, n * sizeof(float));
        comm_allreduce(&sub, dy, n, DTYPE_FP32, 0, &h);
        comm_wait(&sub, &h);
        printf("rank %d: the group's collective completed despite the fault (should not happen)\n", t->R);
        return 2;
    }
    if (t->R == fault_rank) {
        if (strcmp(fault, "sleep") == 0) {
            fprintf(stderr, "rank %d: stalling forever before the next collective\n", t->R);
            for (;;) sleep(1);
        } else if (strcmp(fault, "fatal") == 0) {
            fatal("test_comm: injected fatal error on rank %d", t->R);
        } else if (strcmp(fault, "kill") == 0) {
            fprintf(stderr, "rank %d: killing itself with SIGKILL\n", t->R);
            raise(SIGKILL);
        } else {
            fatal(
                "--fault: unknown value '%s' (expected sleep, fatal, kill, nosend, group_sleep or device_stall)",
                fault);
        }
    }
    size_t n = 1000;
    float* y = (float*)xcalloc(n, sizeof(float));
    void* dy = up(t, y, n * sizeof(float));
    comm_allreduce(t->c, dy, n, DTYPE_FP32, 0, &h);
    comm_wait(t->c, &h);
    down(t, y, dy, n * sizeof(float));
    printf("rank %d: the collective completed despite the fault (should not happen)\n", t->R);
    free(y);
    return 2;
}

/* ------------------------------------------------------------ error cases */

/* Misuse that must end every rank with a clear message (test_comm.sh checks
 * which). Returns 2 if it was accepted. */
static int run_case(T* t, const char* tcase) {
    Comm* c = t->c;
    CommHandle h = {0, NULL}, h2 = {0, NULL};
    float x[20] = {0};
    void* dx = up(t, x, sizeof x);
    if (strcmp(tcase, "bad_count") == 0) {
        size_t n = 10 * (size_t)t->W + 1;
        float* y = (float*)xcalloc(n, sizeof(float));
        comm_reduce_scatter(c, y, n, DTYPE_FP32, 0, &h);
        comm_wait(c, &h);
        printf("rank %d: reduce-scatter of %zu elements over %d ranks was accepted\n", t->R, n, t->W);
        return 2;
    }
    if (strcmp(tcase, "p2p_world1") == 0) {
        /* one pipeline stage: nothing to send to */
        comm_p2p_setup(c);
        comm_send(c, dx, 20, DTYPE_FP32, 0, 0, &h);
        comm_wait(c, &h);
        printf("rank %d: a send at world %d was accepted\n", t->R, t->W);
        return 2;
    }
    if (strcmp(tcase, "p2p_nosetup") == 0) {
        if (t->R == 0) comm_send(c, dx, 20, DTYPE_FP32, 1, 0, &h);
        if (t->R == 1) comm_recv(c, dx, 20, DTYPE_FP32, 0, 0, &h);
        comm_wait(c, &h);
        comm_barrier(c);
        printf("rank %d: a transfer without comm_p2p_setup was accepted\n", t->R);
        return 2;
    }
    comm_p2p_setup(c);
    if (strcmp(tcase, "p2p_notneighbour") == 0) {
        if (t->R == 0) comm_send(c, dx, 20, DTYPE_FP32, 2, 0, &h);
        if (t->R == 2) comm_recv(c, dx, 20, DTYPE_FP32, 0, 0, &h);
        comm_wait(c, &h);
        comm_barrier(c);
        printf("rank %d: a transfer between non-neighbours was accepted\n", t->R);
        return 2;
    }
    if (strcmp(tcase, "p2p_order") == 0) {
        /* rank 0 sends tags 1, 2; rank 1 receives them as 2, 1 */
        if (t->R == 0) {
            comm_send(c, dx, 10, DTYPE_FP32, 1, 1, &h);
            comm_send(c, (float*)dx + 10, 10, DTYPE_FP32, 1, 2, &h2);
        } else if (t->R == 1) {
            comm_recv(c, dx, 10, DTYPE_FP32, 0, 2, &h);
            comm_recv(c, (float*)dx + 10, 10, DTYPE_FP32, 0, 1, &h2);
        }
        comm_wait(c, &h);
        comm_wait(c, &h2);
        comm_barrier(c);
        printf("rank %d: transfers received out of order were accepted\n", t->R);
        return 2;
    }
    if (strcmp(tcase, "p2p_count") == 0) {
        /* rank 0 sends 20 elements, rank 1 expects 10 */
        if (t->R == 0) comm_send(c, dx, 20, DTYPE_FP32, 1, 0, &h);
        if (t->R == 1) comm_recv(c, dx, 10, DTYPE_FP32, 0, 0, &h);
        comm_wait(c, &h);
        comm_barrier(c);
        printf("rank %d: a transfer of mismatched counts was accepted\n", t->R);
        return 2;
    }
    fatal(
        "--case: unknown value '%s' (expected bad_count, p2p_world1, p2p_nosetup, p2p_notneighbour, p2p_order "
        "or p2p_count)",
        tcase);
}

int main(int argc, char** argv) {
    Comm comm;
    comm_bootstrap(&comm, &argc, &argv);
    const char* want = "auto";
    const char* device = "cpu";
    const char* fault = NULL;
    const char* tcase = NULL;
    double timeout = 30.0;
    int fault_rank = -1;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) fatal("test_comm: flag %s needs a value", argv[i]);
        if (strcmp(argv[i], "--comm") == 0) want = argv[++i];
        else if (strcmp(argv[i], "--device") == 0) device = argv[++i];
        else if (strcmp(argv[i], "--timeout") == 0) timeout = parse_float_flag("--timeout", argv[++i]);
        else if (strcmp(argv[i], "--fault") == 0) fault = argv[++i];
        else if (strcmp(argv[i], "--fault_rank") == 0)
            fault_rank = (int)parse_int_flag("--fault_rank", argv[++i]);
        else if (strcmp(argv[i], "--case") == 0) tcase = argv[++i];
        else fatal("test_comm: unknown flag %s", argv[i]);
    }
    Backend be;
    int dev = 0;
    if (strcmp(device, "cpu") == 0) {
        fake_backend_init(&be);
    } else if (strcmp(device, "cuda") == 0) {
#ifdef USE_CUDA
        fake_cuda_init(&be, comm.local_rank);
        dev = 1;
#else
        fatal("test_comm --device cuda: built without CUDA");
#endif
    } else {
        fatal("--device: unknown value '%s' (expected cpu or cuda)", device);
    }
    comm_setup(&comm, want, &be, timeout);
    T t = {&comm, &be, comm.rank, comm.world, dev, NULL, "world", 0};
    if (fault_rank < 0) fault_rank = t.W - 1;

    if (fault) return run_fault(&t, fault, fault_rank);
    if (tcase) return run_case(&t, tcase);

    if (t.R == 0)
        printf("test_comm: world %d, local world %d, device %s, backend %s, timeout %g s\n", t.W,
               comm.local_world, be.name, comm_kind_name(comm.kind), comm.timeout_s);
    /* the rules of comm_setup, restated */
    CommKind expect = t.W == 1 ? COMM_SINGLE : COMM_MPI;
#ifdef USE_MPI
    if (strcmp(want, "mpi") == 0) expect = COMM_MPI;
#endif
#ifdef USE_CUDA
    int ngpu = 0;
    if (dev) cu_ok(cudaGetDeviceCount(&ngpu), "cudaGetDeviceCount");
    if (strcmp(want, "nccl") == 0) expect = COMM_NCCL;
    if (strcmp(want, "auto") == 0 && dev && t.W > 1 && comm.local_world <= ngpu) expect = COMM_NCCL;
#endif
    CHECK(comm.kind == expect, "rank %d: --comm %s chose %s, want %s", t.R, want, comm_kind_name(comm.kind),
          comm_kind_name(expect));
    CHECK(comm.rank >= 0 && comm.rank < comm.world && comm.local_rank < comm.local_world,
          "rank %d: bad rank numbers (world %d, local %d of %d)", comm.rank, comm.world, comm.local_rank,
          comm.local_world);
    CHECK(comm.timeout_s == timeout, "rank %d: timeout %g, want %g", t.R, comm.timeout_s, timeout);

    run_collectives(&t);
    comm_p2p_setup(&comm); /* at world 1: nothing to connect */
    if (t.W > 1) {
        test_p2p_ring(&t);
        test_p2p_pipeline(&t, 8);
    }
#ifdef USE_CUDA
    if (dev && comm.kind == COMM_NCCL) test_nccl_nonblocking(&t);
#endif
    test_split(&t, SPLIT_BLOCKS, 2, "blocks of 2");
    test_split(&t, SPLIT_STRIDE_REVERSED, 2, "stride 2, keys reversed");
    test_split(&t, SPLIT_BLOCKS, 3, "blocks of 3");
    test_split(&t, SPLIT_STRIDE_REVERSED, 3, "stride 3, keys reversed");
    test_split(&t, SPLIT_DP, 0, "data-parallel groups");
    test_split(&t, SPLIT_PIPELINE, 0, "pipeline groups");
    test_split(&t, SPLIT_EMBEDDING, 0, "embedding groups");
    /* the world still works after its groups are gone */
    test_allreduce_f32(&t, 1);

    double tot[2] = {(double)test_passed, (double)test_failed};
    comm_allreduce_host_sum(&comm, tot, 2);
    int rank = comm.rank;
    char name[64];
    snprintf(name, sizeof name, "test_comm (np=%d, %s, %s)", t.W, be.name, comm_kind_name(comm.kind));
    comm_finalize(&comm);
    int rc = tot[1] > 0 ? 1 : 0;
    if (be.mem.current[MEM_COMM] != 0) {
        printf("FAIL rank %d: %zu MEM_COMM bytes still allocated after comm_finalize\n", rank,
               be.mem.current[MEM_COMM]);
        rc = 1;
    }
    if (rank == 0) {
        test_passed = (int)tot[0];
        test_failed = (int)tot[1];
        test_done(name);
    }
    return rc;
}
