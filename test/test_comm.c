/* test/test_comm.c — tests of the communicator (comm/comm.c) on host buffers:
 * all-reduce (sum, average), reduce-scatter, all-gather in fp32 and bf16
 * against hand-computed values, several handles in flight waited out of
 * order, the scratch pool, the blocking host helpers, and the single backend
 * (average over one rank leaves the bits alone). Run under mpirun by
 * test/test_comm.sh for several world sizes; with --case / --fault it also
 * provides the error and fault scenarios that script checks.
 *
 * It uses a minimal fake Backend of its own, so it depends on nothing but
 * comm/, common/ and kernels/backend.c: "cpu" (malloc with memory tracking)
 * or, in a build with USE_CUDA, "cuda" (cudaMalloc, two non-blocking
 * streams, device local_rank % GPUs). On the device, each test uploads its
 * host data on the compute stream, runs the collective, and downloads the
 * result on the compute stream after comm_wait, so it also checks the stream
 * ordering of the NCCL and staged-MPI paths.
 *
 *   test_comm [--device cpu|cuda] [--comm auto|mpi|nccl|...] [--timeout S]
 *             [--case bad_count] [--fault sleep|fatal|kill] [--fault_rank R]
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

/* ------------------------------------------------------------- test values */

/* fp32 input of rank r at index i: multiples of 1/4 below 10 in magnitude,
 * so every sum over up to a few hundred ranks is exact in fp32. */
static float fval(size_t i, int r) {
    return (float)((int)((i * 7 + (size_t)r * 13) % 41) - 20) * 0.25f + (float)r;
}
/* bf16 input: small integers, exact in bf16, and so are their sums (< 256). */
static float gval(size_t i, int r) { return (float)((int)((i * 5 + (size_t)r * 3) % 17) - 8 + r); }

static double fsum(size_t i, int W) {
    double s = 0;
    for (int r = 0; r < W; r++) s += fval(i, r);
    return s;
}

/* bf16 input of rank r at i; indices 0..3 are 256 on rank 0 and 1 elsewhere:
 * reduced in fp32 their sum 256 + W - 1 is exact before the final rounding,
 * while a bf16 accumulation would lose the 1s (256 + 1 rounds to 256). */
static float bval(size_t i, int r) {
    if (i < 4) return r == 0 ? 256.0f : 1.0f;
    return gval(i, r);
}

static double bsum(size_t i, int W) {
    double s = 0;
    for (int r = 0; r < W; r++) s += bval(i, r);
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

/* -------------------------------------------------------------- the tests */

typedef struct {
    Comm* c;
    Backend* be;
    int R, W;
    int dev;   /* buffers live on the GPU */
} T;

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
    if (t->R == 0) printf("  %-34s n=%-7zu mismatches %zu, max |err| %g\n", what, n, d.bad, d.maxerr);
    CHECK(d.bad == 0, "rank %d: %s: %zu of %zu wrong (first at %zu), max |err| %g", t->R, what, d.bad, n,
          d.first, d.maxerr);
}

static void test_allreduce_f32(T* t, int average) {
    size_t n = 10007;
    float* x = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = fval(i, t->R);
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(float));
    comm_allreduce(t->c, dbuf, n, DTYPE_FP32, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    CHECK(!h.active, "rank %d: handle still active after comm_wait", t->R);
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double s = fsum(i, t->W);
        diff_add(&d, i, x[i], average ? (double)avg_of(s, t->W) : s);
    }
    check_diff(t, average ? "all-reduce fp32 average" : "all-reduce fp32 sum", d, n);
    free(x);
}

static void test_allreduce_bf16(T* t, int average) {
    size_t n = 4099;
    uint16_t* x = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bval(i, t->R));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(uint16_t));
    comm_allreduce(t->c, dbuf, n, DTYPE_BF16, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(uint16_t));
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double s = bsum(i, t->W);
        float want = average ? avg_of(s, t->W) : (float)s;
        diff_add(&d, i, bf16_to_f32(x[i]), bf16_to_f32(f32_to_bf16(want)));
    }
    if (t->R == 0 && !average)
        printf("  bf16 fp32-accumulation probe: 256 + %d x 1 -> %g (bf16 accumulation would give 256)\n",
               t->W - 1, bf16_to_f32(x[0]));
    check_diff(t, average ? "all-reduce bf16 average" : "all-reduce bf16 sum", d, n);
    free(x);
}

static void test_reduce_scatter_f32(T* t, int average) {
    size_t slice = 1237, n = slice * (size_t)t->W;
    float* x = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = fval(i, t->R);
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(float));
    comm_reduce_scatter(t->c, dbuf, n, DTYPE_FP32, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(float));
    Diff d = {0, 0, 0};
    for (size_t i = (size_t)t->R * slice; i < (size_t)(t->R + 1) * slice; i++) {
        double s = fsum(i, t->W);
        diff_add(&d, i, x[i], average ? (double)avg_of(s, t->W) : s);
    }
    check_diff(t, average ? "reduce-scatter fp32 average" : "reduce-scatter fp32 sum", d, slice);
    free(x);
}

static void test_reduce_scatter_bf16(T* t, int average) {
    size_t slice = 517, n = slice * (size_t)t->W;
    uint16_t* x = (uint16_t*)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bval(i, t->R));
    CommHandle h = {0, NULL};
    void* dbuf = up(t, x, n * sizeof(uint16_t));
    comm_reduce_scatter(t->c, dbuf, n, DTYPE_BF16, average, &h);
    comm_wait(t->c, &h);
    down(t, x, dbuf, n * sizeof(uint16_t));
    Diff d = {0, 0, 0};
    for (size_t i = (size_t)t->R * slice; i < (size_t)(t->R + 1) * slice; i++) {
        double s = bsum(i, t->W);
        float want = average ? avg_of(s, t->W) : (float)s;
        diff_add(&d, i, bf16_to_f32(x[i]), bf16_to_f32(f32_to_bf16(want)));
    }
    check_diff(t, average ? "reduce-scatter bf16 average" : "reduce-scatter bf16 sum", d, slice);
    free(x);
}

/* all-gather value at i, contributed by the owner of i's slice */
static float agval(size_t i, size_t slice) { return (float)i * 0.5f + 1000.0f * (float)(i / slice); }
static float agbval(size_t i, size_t slice) { return (float)((i % 32) + 32 * ((i / slice) % 8)); }

static void fill_allgather_f32(float* x, size_t n, size_t slice, int R) {
    for (size_t i = 0; i < n; i++) x[i] = i / slice == (size_t)R ? agval(i, slice) : NAN;
}
static void fill_allgather_bf16(uint16_t* x, size_t n, size_t slice, int R) {
    for (size_t i = 0; i < n; i++) x[i] = i / slice == (size_t)R ? f32_to_bf16(agbval(i, slice)) : 0x7fc0;
}

static void test_allgather(T* t) {
    size_t slice = 1237, n = slice * (size_t)t->W;
    float* x = (float*)xmalloc(n * sizeof(float));
    fill_allgather_f32(x, n, slice, t->R);
    CommHandle h = {0, NULL};
    void* dx = up(t, x, n * sizeof(float));
    comm_allgather(t->c, dx, n, DTYPE_FP32, &h);
    comm_wait(t->c, &h);
    down(t, x, dx, n * sizeof(float));
    Diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) diff_add(&d, i, x[i], agval(i, slice));
    check_diff(t, "all-gather fp32", d, n);
    free(x);

    size_t bslice = 333, bn = bslice * (size_t)t->W;
    uint16_t* y = (uint16_t*)xmalloc(bn * sizeof(uint16_t));
    fill_allgather_bf16(y, bn, bslice, t->R);
    void* dy = up(t, y, bn * sizeof(uint16_t));
    comm_allgather(t->c, dy, bn, DTYPE_BF16, &h);
    comm_wait(t->c, &h);
    down(t, y, dy, bn * sizeof(uint16_t));
    Diff e = {0, 0, 0};
    for (size_t i = 0; i < bn; i++) diff_add(&e, i, bf16_to_f32(y[i]), agbval(i, bslice));
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
    for (size_t i = 0; i < na; i++) a[i] = fval(i + 11, t->R);
    for (size_t i = 0; i < nb; i++) b[i] = fval(i + 5, t->R);
    fill_allgather_bf16(cc, nc, sc, t->R);
    for (size_t i = 0; i < nd; i++) dd[i] = f32_to_bf16(bval(i, t->R));
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
    for (size_t i = 0; i < na; i++) diff_add(&d, i, a[i], fsum(i + 11, t->W));
    for (size_t i = (size_t)t->R * sb; i < (size_t)(t->R + 1) * sb; i++)
        diff_add(&d, na + i, b[i], avg_of(fsum(i + 5, t->W), t->W));
    for (size_t i = 0; i < nc; i++) diff_add(&d, na + nb + i, bf16_to_f32(cc[i]), agbval(i, sc));
    for (size_t i = 0; i < nd; i++)
        diff_add(&d, na + nb + nc + i, bf16_to_f32(dd[i]),
                 bf16_to_f32(f32_to_bf16(avg_of(bsum(i, t->W), t->W))));
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
    for (int j = 0; j < 5; j++) v[j] = t->R + 0.5 * j;
    comm_allreduce_host_sum(t->c, v, 5);
    int ok = 1;
    for (int j = 0; j < 5; j++) {
        double want = 0;
        for (int r = 0; r < t->W; r++) want += r + 0.5 * j;
        if (v[j] != want) ok = 0;
    }
    if (t->R == 0) printf("  host sum: [%g %g %g %g %g]\n", v[0], v[1], v[2], v[3], v[4]);
    CHECK(ok, "rank %d: comm_allreduce_host_sum wrong", t->R);

    int mine = (t->R * 7 + 3) % 5 - 10, want = -1000;
    for (int r = 0; r < t->W; r++) {
        int x = (r * 7 + 3) % 5 - 10;
        if (x > want) want = x;
    }
    int got = comm_allreduce_host_max_int(t->c, mine);
    CHECK(got == want, "rank %d: host max int %d, want %d", t->R, got, want);

    size_t nb = 3 * 1024 * 1024 + 7;
    unsigned char* buf = (unsigned char*)xmalloc(nb);
    for (size_t i = 0; i < nb; i++) buf[i] = t->R == 0 ? (unsigned char)(i * 131 + 7) : 0;
    comm_broadcast_host(t->c, buf, nb);
    size_t bad = 0;
    for (size_t i = 0; i < nb; i++) bad += buf[i] != (unsigned char)(i * 131 + 7);
    CHECK(bad == 0, "rank %d: broadcast: %zu of %zu bytes wrong", t->R, bad, nb);
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
    if (t->R == 0) printf("  world 1 (%s): average is the identity, bit for bit\n", comm_kind_name(t->c->kind));
    free(x);
    free(ref);
    free(y);
    free(yref);
}

/* ---------------------------------------------------------------- faults */

/* One good collective, then rank fault_rank misbehaves while the others start
 * the next one: every rank must end (the script checks how and how fast). */
static int run_fault(T* t, const char* fault, int fault_rank) {
    float x = 1.0f;
    CommHandle h = {0, NULL};
    void* dbuf = up(t, &x, sizeof x);
    comm_allreduce(t->c, dbuf, 1, DTYPE_FP32, 0, &h);
    comm_wait(t->c, &h);
    down(t, &x, dbuf, sizeof x);
    if (t->R == 0) printf("fault %s on rank %d: first collective gave %g (want %d)\n", fault, fault_rank, x, t->W);
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
            fatal("--fault: unknown value '%s' (expected sleep, fatal or kill)", fault);
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
        else if (strcmp(argv[i], "--fault_rank") == 0) fault_rank = (int)parse_int_flag("--fault_rank", argv[++i]);
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
    T t = {&comm, &be, comm.rank, comm.world, dev};
    if (fault_rank < 0) fault_rank = t.W - 1;

    if (fault) return run_fault(&t, fault, fault_rank);
    if (tcase) {
        if (strcmp(tcase, "bad_count") == 0) {
            size_t n = 10 * (size_t)t.W + 1;
            float* x = (float*)xcalloc(n, sizeof(float));
            CommHandle h = {0, NULL};
            comm_reduce_scatter(&comm, x, n, DTYPE_FP32, 0, &h);
            comm_wait(&comm, &h);
            printf("rank %d: reduce-scatter of %zu elements over %d ranks was accepted\n", t.R, n, t.W);
            return 2;
        }
        fatal("--case: unknown value '%s' (expected bad_count)", tcase);
    }

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

    test_allreduce_f32(&t, 0);
    test_allreduce_f32(&t, 1);
    test_allreduce_bf16(&t, 0);
    test_allreduce_bf16(&t, 1);
    test_reduce_scatter_f32(&t, 0);
    test_reduce_scatter_f32(&t, 1);
    test_reduce_scatter_bf16(&t, 0);
    test_reduce_scatter_bf16(&t, 1);
    test_allgather(&t);
    size_t inflight1 = 0, inflight2 = 0;
    test_in_flight(&t, 1, &inflight1);
    size_t pool_after1 = be.mem.current[MEM_COMM];
    test_in_flight(&t, 2, &inflight2);
    size_t pool_after2 = be.mem.current[MEM_COMM];
    if (t.R == 0)
        printf("  scratch pool (MEM_COMM): %zu bytes with 4 in flight, %zu after round 1, %zu after round 2\n",
               inflight1, pool_after1, pool_after2);
    if (comm.kind == COMM_MPI && !dev) {
        /* the reduce-scatter's receive buffer and the bf16 fp32 staging */
        size_t need = 257 * sizeof(float) + 2050 * sizeof(float);
        CHECK(inflight1 >= need, "rank %d: %zu MEM_COMM bytes with 4 in flight, want >= %zu", t.R, inflight1, need);
        CHECK(pool_after2 == pool_after1, "rank %d: scratch pool grew from %zu to %zu bytes on reuse", t.R,
              pool_after1, pool_after2);
    } else {
        /* single and nccl use no scratch; pinned staging is not in be->mem */
        CHECK(inflight1 == 0, "rank %d: %s backend counted %zu scratch bytes", t.R, comm_kind_name(comm.kind),
              inflight1);
    }
    test_count_zero(&t);
    test_host_helpers(&t);
    if (t.W == 1) test_identity_world1(&t);

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
