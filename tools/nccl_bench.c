/* tools/nccl_bench.c — bus bandwidth of NCCL's all-reduce, reduce-scatter and
 * all-gather (bf16 and fp32) on the GPUs of this job, one MPI rank per GPU (the
 * local rank picks the GPU), for the figures of tools/bench_multigpu.sh.
 *
 *   mpirun -np N build/nccl_bench [--sizes LIST] [--ops LIST] [--dtypes LIST]
 *                                 [--warmup K] [--iters K] [--check 0|1]
 *
 * A size is the element count of the FULL buffer: the all-reduce's buffer, the
 * reduce-scatter's input, the all-gather's output (rounded up to a multiple of
 * N so that every rank's part is equal). Suffixes: K M G = 1e3 1e6 1e9 (as the
 * trainer's --bucket_size), Ki Mi Gi = 2^10 2^20 2^30. Each (op, dtype, size)
 * runs K warm-up calls, then the timed calls back to back on one stream between
 * two CUDA events; time = the slowest rank's elapsed / iterations, then
 *   algbw = bytes / time,   busbw = algbw * 2(N-1)/N (all-reduce),
 *                           busbw = algbw * (N-1)/N  (reduce-scatter, all-gather),
 * bytes being the full buffer's, as NCCL's own tests define them. Out of place.
 * With --check 1 (default) each (op, dtype) is first run once on integer data
 * whose result is exact in bf16 and compared with the expected values.
 * NCCL_NVLS_ENABLE is set to 0 before the communicator is created when the
 * environment does not set it (NVLink multicast stays off on the lent machines).
 * Errors (bad flag, fewer GPUs than ranks on a host, a CUDA or NCCL failure, a
 * wrong result) print one line "error: nccl_bench: ..." and end every rank. */
#if !defined(USE_CUDA) || !defined(USE_MPI)
#error "tools/nccl_bench.c needs CUDA and MPI: it is built only where nvcc and mpicc are found"
#endif

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "../common/util.h"

#define NB_MAX_SIZES 64
#define NB_MAX_CHECK (4ull << 20) /* elements checked at most (the first size, capped) */

typedef enum { OP_ALLREDUCE = 0, OP_REDUCESCATTER, OP_ALLGATHER, OP_COUNT } BenchOp;
static const char* const op_names[OP_COUNT] = {"allreduce", "reducescatter", "allgather"};

typedef struct {
    size_t sizes[NB_MAX_SIZES];
    int nsizes;
    int ops[OP_COUNT]; /* 1 = run */
    int dtypes[2];     /* [0] bf16, [1] fp32 */
    int warmup, iters, check;
} BenchArgs;

typedef struct {
    int rank, world, local_rank, local_size;
    ncclComm_t nccl;
    cudaStream_t stream;
    void *send, *recv; /* device, max_bytes each */
    size_t max_bytes;
} Bench;

/* fatal()'s hook: end every rank */
static void bench_abort(void* ctx) {
    (void)ctx;
    MPI_Abort(MPI_COMM_WORLD, 1);
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fatal("nccl_bench: %s failed on rank %d: %s", #call, b->rank, cudaGetErrorString(e_)); \
    } while (0)
#define NCCL_OK(call)                                                                                 \
    do {                                                                                              \
        ncclResult_t r_ = (call);                                                                     \
        if (r_ != ncclSuccess)                                                                        \
            fatal("nccl_bench: %s failed on rank %d: %s%s%s", #call, b->rank, ncclGetErrorString(r_), \
                  b->nccl ? " | " : "", b->nccl ? ncclGetLastError(b->nccl) : "");                    \
    } while (0)

/* Every rank knows whether it is fine; the lowest failing rank prints its
 * message through fatal() (which aborts the job); the others wait for that. */
static void bench_agree(const Bench* b, int bad, const char* msg) {
    int mine = bad ? b->rank : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == INT_MAX) return;
    if (first == b->rank) fatal("%s", msg);
    MPI_Barrier(MPI_COMM_WORLD); /* never completes: the failing rank aborts the job */
    exit(1);
}

/* ------------------------------------------------------------ flags */

static int bench_parse_size(const char* s, size_t* out) {
    char* end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return 0;
    double mul = 1;
    if (strcmp(end, "") == 0) mul = 1;
    else if (strcmp(end, "K") == 0) mul = 1e3;
    else if (strcmp(end, "M") == 0) mul = 1e6;
    else if (strcmp(end, "G") == 0) mul = 1e9;
    else if (strcmp(end, "Ki") == 0) mul = 1024.0;
    else if (strcmp(end, "Mi") == 0) mul = 1048576.0;
    else if (strcmp(end, "Gi") == 0) mul = 1073741824.0;
    else return 0;
    double n = v * mul;
    if (n < 1 || n > 4e9 || n != (double)(size_t)n) return 0;
    *out = (size_t)n;
    return 1;
}

/* Comma- or space-separated list; returns NULL or a message naming the problem. */
static const char* bench_parse_list(const char* flag, const char* val, BenchArgs* a, char* msg, size_t msglen) {
    char buf[2048];
    if (strlen(val) >= sizeof buf) {
        snprintf(msg, msglen, "nccl_bench: %s: list too long", flag);
        return msg;
    }
    strcpy(buf, val);
    int n = 0;
    if (strcmp(flag, "--ops") == 0) memset(a->ops, 0, sizeof a->ops);
    if (strcmp(flag, "--dtypes") == 0) memset(a->dtypes, 0, sizeof a->dtypes);
    if (strcmp(flag, "--sizes") == 0) a->nsizes = 0;
    for (char* tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", "), n++) {
        if (strcmp(flag, "--sizes") == 0) {
            size_t v;
            if (!bench_parse_size(tok, &v)) {
                snprintf(msg, msglen,
                         "nccl_bench: --sizes: '%s' is not a positive element count "
                         "(integer, optional suffix K M G Ki Mi Gi, at most 4e9)",
                         tok);
                return msg;
            }
            if (a->nsizes == NB_MAX_SIZES) {
                snprintf(msg, msglen, "nccl_bench: --sizes: more than %d sizes", NB_MAX_SIZES);
                return msg;
            }
            a->sizes[a->nsizes++] = v;
        } else if (strcmp(flag, "--ops") == 0) {
            int k = -1;
            for (int o = 0; o < OP_COUNT; o++)
                if (strcmp(tok, op_names[o]) == 0) k = o;
            if (k < 0) {
                snprintf(msg, msglen,
                         "nccl_bench: --ops: unknown op '%s' (allreduce, reducescatter, allgather)", tok);
                return msg;
            }
            a->ops[k] = 1;
        } else {
            if (strcmp(tok, "bf16") == 0) a->dtypes[0] = 1;
            else if (strcmp(tok, "fp32") == 0) a->dtypes[1] = 1;
            else {
                snprintf(msg, msglen, "nccl_bench: --dtypes: unknown dtype '%s' (bf16, fp32)", tok);
                return msg;
            }
        }
    }
    if (n == 0) {
        snprintf(msg, msglen, "nccl_bench: %s is empty", flag);
        return msg;
    }
    return NULL;
}

static const char* bench_parse_int(const char* flag, const char* val, int lo, int hi, int* out, char* msg,
                                   size_t msglen) {
    char* end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        snprintf(msg, msglen, "nccl_bench: %s: '%s' is not an integer in [%d, %d]", flag, val, lo, hi);
        return msg;
    }
    *out = (int)v;
    return NULL;
}

static void bench_usage(void) {
    printf(
        "usage: mpirun -np N build/nccl_bench [--sizes LIST] [--ops LIST] [--dtypes LIST]\n"
        "                                     [--warmup K] [--iters K] [--check 0|1]\n"
        "  --sizes   elements of the full buffer, comma-separated; K M G = 1e3 1e6 1e9, Ki Mi Gi = 2^10..2^30\n"
        "            (default: GPT-2 124M's bucket sizes 4720896, 39423744, the whole model 124475904,\n"
        "            and 1Mi 2Mi 4Mi ... 256Mi)\n"
        "  --ops     allreduce,reducescatter,allgather (default: all three)\n"
        "  --dtypes  bf16,fp32 (default: both)\n"
        "  --warmup  untimed calls per size [5];  --iters  timed calls per size [20]\n"
        "  --check   1 = check each op's result once on exact integer data first [1]\n");
}

/* Returns NULL, or a message; sets *help for --help. */
static const char* bench_parse_args(int argc, char** argv, BenchArgs* a, int* help, char* msg, size_t msglen) {
    static const size_t dflt[] = {1u << 20,  2u << 20, 4u << 20,  4720896,   8u << 20,   16u << 20,
                                  32u << 20, 39423744, 64u << 20, 124475904, 128u << 20, 256u << 20};
    memset(a, 0, sizeof *a);
    a->nsizes = (int)(sizeof dflt / sizeof dflt[0]);
    memcpy(a->sizes, dflt, sizeof dflt);
    for (int o = 0; o < OP_COUNT; o++) a->ops[o] = 1;
    a->dtypes[0] = a->dtypes[1] = 1;
    a->warmup = 5;
    a->iters = 20;
    a->check = 1;
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            *help = 1;
            return NULL;
        }
        const char* eq = strchr(f, '=');
        char name[64];
        const char* val;
        if (strncmp(f, "--", 2) == 0 && eq) {
            size_t k = (size_t)(eq - f);
            if (k >= sizeof name) k = sizeof name - 1;
            memcpy(name, f, k);
            name[k] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", f);
            val = i + 1 < argc ? argv[i + 1] : NULL;
            i++;
        }
        int known = strcmp(name, "--sizes") == 0 || strcmp(name, "--ops") == 0 ||
                    strcmp(name, "--dtypes") == 0 || strcmp(name, "--warmup") == 0 ||
                    strcmp(name, "--iters") == 0 || strcmp(name, "--check") == 0;
        if (!known) {
            snprintf(msg, msglen, "nccl_bench: unknown argument '%s' (see --help)", f);
            return msg;
        }
        if (!val) {
            snprintf(msg, msglen, "nccl_bench: %s needs a value", name);
            return msg;
        }
        const char* err = NULL;
        if (strcmp(name, "--warmup") == 0) err = bench_parse_int(name, val, 0, 1000, &a->warmup, msg, msglen);
        else if (strcmp(name, "--iters") == 0)
            err = bench_parse_int(name, val, 1, 100000, &a->iters, msg, msglen);
        else if (strcmp(name, "--check") == 0) err = bench_parse_int(name, val, 0, 1, &a->check, msg, msglen);
        else err = bench_parse_list(name, val, a, msg, msglen);
        if (err) return err;
    }
    return NULL;
}

/* ------------------------------------------------------------ the collectives */

static size_t bench_esize(int fp32) { return fp32 ? 4 : 2; }

/* full element count rounded up to a multiple of world */
static size_t bench_full(const Bench* b, size_t n) {
    return (n + (size_t)b->world - 1) / (size_t)b->world * (size_t)b->world;
}

static void bench_launch(Bench* b, BenchOp op, int fp32, size_t full) {
    ncclDataType_t dt = fp32 ? ncclFloat32 : ncclBfloat16;
    size_t part = full / (size_t)b->world;
    switch (op) {
    case OP_ALLREDUCE: NCCL_OK(ncclAllReduce(b->send, b->recv, full, dt, ncclSum, b->nccl, b->stream)); break;
    case OP_REDUCESCATTER:
        NCCL_OK(ncclReduceScatter(b->send, b->recv, part, dt, ncclSum, b->nccl, b->stream));
        break;
    case OP_ALLGATHER: NCCL_OK(ncclAllGather(b->send, b->recv, part, dt, b->nccl, b->stream)); break;
    default: fatal("internal: nccl_bench op %d", (int)op);
    }
}

/* waits for the stream and surfaces an asynchronous NCCL error */
static void bench_sync(Bench* b) {
    CUDA_OK(cudaStreamSynchronize(b->stream));
    ncclResult_t async = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(b->nccl, &async));
    if (async != ncclSuccess)
        fatal("nccl_bench: asynchronous NCCL error on rank %d: %s", b->rank, ncclGetErrorString(async));
}

/* integer test value of element i of rank r's input: 1..4, so any sum over
 * at most 64 ranks is an integer <= 256, exact in bf16 */
static float bench_value(int r, size_t i) { return (float)(((size_t)r + i) % 4 + 1); }

static void bench_put(void* host, size_t i, int fp32, float v) {
    if (fp32) ((float*)host)[i] = v;
    else ((uint16_t*)host)[i] = f32_to_bf16(v);
}
static float bench_get(const void* host, size_t i, int fp32) {
    return fp32 ? ((const float*)host)[i] : bf16_to_f32(((const uint16_t*)host)[i]);
}

/* One call on integer data; every element compared with the expected value. */
static void bench_check(Bench* b, BenchOp op, int fp32, size_t n) {
    size_t full = bench_full(b, n), part = full / (size_t)b->world, es = bench_esize(fp32);
    size_t in_n = op == OP_ALLGATHER ? part : full;
    size_t out_n = op == OP_REDUCESCATTER ? part : full;
    void* h = xmalloc((in_n > out_n ? in_n : out_n) * es);
    /* the input: element i of the input stands for element (offset + i) of the full buffer */
    size_t in_off = op == OP_ALLGATHER ? (size_t)b->rank * part : 0;
    for (size_t i = 0; i < in_n; i++) bench_put(h, i, fp32, bench_value(b->rank, in_off + i));
    CUDA_OK(cudaMemcpy(b->send, h, in_n * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(b->recv, 0xff, out_n * es)); /* NaN-ish garbage: a missing write shows */
    bench_launch(b, op, fp32, full);
    bench_sync(b);
    CUDA_OK(cudaMemcpy(h, b->recv, out_n * es, cudaMemcpyDeviceToHost));
    size_t out_off = op == OP_REDUCESCATTER ? (size_t)b->rank * part : 0;
    long long bad = 0;
    size_t first_bad = 0;
    float got_bad = 0, want_bad = 0;
    for (size_t i = 0; i < out_n; i++) {
        size_t g = out_off + i; /* index in the full buffer */
        float want = 0;
        if (op == OP_ALLGATHER) want = bench_value((int)(g / part), g);
        else
            for (int r = 0; r < b->world; r++) want += bench_value(r, g);
        float got = bench_get(h, i, fp32);
        if (got != want) {
            if (!bad) {
                first_bad = g;
                got_bad = got;
                want_bad = want;
            }
            bad++;
        }
    }
    free(h);
    char msg[256];
    snprintf(msg, sizeof msg,
             "nccl_bench: %s %s of %zu elements gave a wrong result on rank %d: %lld wrong "
             "elements, first at %zu: %g instead of %g",
             op_names[op], fp32 ? "fp32" : "bf16", full, b->rank, bad, first_bad, (double)got_bad,
             (double)want_bad);
    bench_agree(b, bad != 0, msg);
}

/* seconds per call, the slowest rank's */
static double bench_time(Bench* b, BenchOp op, int fp32, size_t full, int warmup, int iters) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int k = 0; k < warmup; k++) bench_launch(b, op, fp32, full);
    bench_sync(b);
    MPI_Barrier(MPI_COMM_WORLD);
    CUDA_OK(cudaEventRecord(e0, b->stream));
    for (int k = 0; k < iters; k++) bench_launch(b, op, fp32, full);
    CUDA_OK(cudaEventRecord(e1, b->stream));
    bench_sync(b);
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    double mine = (double)ms / 1000.0 / iters, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    Bench bench;
    Bench* b = &bench;
    memset(b, 0, sizeof *b);
    MPI_Comm_rank(MPI_COMM_WORLD, &b->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b->world);
    util_set_fatal_hook(bench_abort, NULL);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &b->local_rank);
    MPI_Comm_size(local, &b->local_size);
    MPI_Comm_free(&local);

    /* ---- flags (the same on every rank: rank 0 speaks) ---- */
    BenchArgs a;
    int help = 0;
    char msg[512];
    const char* err = bench_parse_args(argc, argv, &a, &help, msg, sizeof msg);
    if (err && b->rank == 0) fatal("%s", err);
    if (err) {
        MPI_Barrier(MPI_COMM_WORLD);
        exit(1);
    }
    if (help) {
        if (b->rank == 0) bench_usage();
        MPI_Finalize();
        return 0;
    }

    /* ---- one GPU per local rank ---- */
    int ngpu = 0;
    cudaError_t ce = cudaGetDeviceCount(&ngpu);
    if (ce != cudaSuccess) {
        snprintf(msg, sizeof msg, "nccl_bench: no CUDA GPU is visible on rank %d (%s)", b->rank,
                 cudaGetErrorString(ce));
        ngpu = 0;
    } else {
        snprintf(msg, sizeof msg,
                 "nccl_bench: %d ranks on one host but %d GPU(s) visible there: run one rank "
                 "per GPU (mpirun -np N with N <= GPUs per host)",
                 b->local_size, ngpu);
    }
    bench_agree(b, ngpu < 1 || b->local_rank >= ngpu, msg);
    CUDA_OK(cudaSetDevice(b->local_rank));
    CUDA_OK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));

    /* ---- buffers: the largest full buffer, in and out ---- */
    size_t maxn = 0;
    for (int i = 0; i < a.nsizes; i++)
        if (bench_full(b, a.sizes[i]) > maxn) maxn = bench_full(b, a.sizes[i]);
    b->max_bytes = maxn * (a.dtypes[1] ? 4 : 2);
    size_t free_b = 0, total_b = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    snprintf(msg, sizeof msg,
             "nccl_bench: --sizes: two buffers of %zu bytes do not fit in the %zu bytes free on "
             "GPU %d of rank %d",
             b->max_bytes, free_b, b->local_rank, b->rank);
    bench_agree(b, 2 * b->max_bytes + (256u << 20) > free_b, msg);
    CUDA_OK(cudaMalloc(&b->send, b->max_bytes));
    CUDA_OK(cudaMalloc(&b->recv, b->max_bytes));
    CUDA_OK(cudaMemset(b->send, 0, b->max_bytes));
    CUDA_OK(cudaMemset(b->recv, 0, b->max_bytes));

    /* ---- NCCL: multicast off unless the environment says otherwise ---- */
    if (!getenv("NCCL_NVLS_ENABLE")) setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId id;
    if (b->rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    NCCL_OK(ncclCommInitRank(&b->nccl, b->world, id, b->rank));
    int ver = 0;
    NCCL_OK(ncclGetVersion(&ver));

    if (b->rank == 0) {
        struct cudaDeviceProp prop;
        CUDA_OK(cudaGetDeviceProperties(&prop, b->local_rank));
        printf("# nccl_bench: %d ranks, %d per host, GPU %s, NCCL %d.%d.%d, NCCL_NVLS_ENABLE=%s, "
               "%d warm-up + %d timed calls per size, out of place, result check %s\n",
               b->world, b->local_size, prop.name, ver / 10000, (ver / 100) % 100, ver % 100,
               getenv("NCCL_NVLS_ENABLE"), a.warmup, a.iters, a.check ? "on" : "off");
        printf("# busbw = algbw * 2(n-1)/n (allreduce), algbw * (n-1)/n (reducescatter, allgather); "
               "size = the full buffer\n");
        fflush(stdout);
    }

    for (int op = 0; op < OP_COUNT; op++) {
        if (!a.ops[op]) continue;
        if (a.check)
            for (int d = 0; d < 2; d++) {
                if (!a.dtypes[d]) continue;
                size_t n = a.sizes[0] < NB_MAX_CHECK ? a.sizes[0] : NB_MAX_CHECK;
                bench_check(b, (BenchOp)op, d, n);
            }
        if (b->rank == 0) {
            printf("#\n# op %s%s\n", op_names[op], a.check ? " (result checked)" : "");
            printf("# %12s %14s %6s %11s %11s %11s\n", "elements", "bytes", "dtype", "time(us)", "algbw(GB/s)",
                   "busbw(GB/s)");
        }
        double factor =
            op == OP_ALLREDUCE ? 2.0 * (b->world - 1) / b->world : (double)(b->world - 1) / b->world;
        for (int i = 0; i < a.nsizes; i++)
            for (int d = 0; d < 2; d++) {
                if (!a.dtypes[d]) continue;
                size_t full = bench_full(b, a.sizes[i]);
                double t = bench_time(b, (BenchOp)op, d, full, a.warmup, a.iters);
                double bytes = (double)full * (double)bench_esize(d);
                double algbw = bytes / t / 1e9;
                if (b->rank == 0) {
                    printf("  %12zu %14.0f %6s %11.1f %11.2f %11.2f\n", full, bytes, d ? "fp32" : "bf16",
                           t * 1e6, algbw, algbw * factor);
                    fflush(stdout);
                }
            }
    }

    NCCL_OK(ncclCommDestroy(b->nccl));
    CUDA_OK(cudaFree(b->send));
    CUDA_OK(cudaFree(b->recv));
    CUDA_OK(cudaStreamDestroy(b->stream));
    MPI_Finalize();
    return 0;
}
