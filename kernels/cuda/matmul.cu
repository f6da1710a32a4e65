/* kernels/cuda/matmul.cu — matmul forward and backward through cuBLASLt, and
 * the deterministic bias-gradient column sum.
 *
 * Row-major X[rows][cols] is column-major X^T, so (all in column-major terms):
 *   forward   out^T[OC,N]  = W^T-stored[C,OC]^T * inp^T[C,N]   (m=OC, n=N, k=C)
 *             epilogue BIAS, GELU_AUX(_BIAS) (aux = pre_gelu), or DEFAULT
 *   dinp      dinp^T[C,N]  = W[C,OC] * dout^T[OC,N]            (m=C, n=N, k=OC)
 *             epilogue DGELU (aux = pre_gelu) when pre_gelu is given
 *   dW        dW^T[C,OC]  += inp^T[C,N] * dout[N,OC]           (m=C, n=OC, k=N, beta=1)
 *             (matmul_backward_weight: the same with ldb = ld_dout, a column
 *             slice of a wider dout: the lm head's dW per vocabulary chunk)
 *   dbias     column sums of dout (own kernel: it must accumulate, and be
 *             deterministic), fp32 per-chunk partials + fixed-order final sum.
 * bf16: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F). fp32: exact
 * fp32 (CUBLAS_COMPUTE_32F) unless allow_tf32 (..._FAST_TF32).
 * Each distinct configuration (shape, transposes, epilogue, beta, pointer
 * alignments) gets its descriptors and ONE algorithm the first time it is
 * seen; later calls reuse them, so results are repeatable.
 *
 * Which algorithm. The heuristic's first candidate defines the bits of the
 * result; it is often not the fastest of the candidates the heuristic offers
 * (on the H200: the lm head's forward 7.16 ms against 6.41 for another tile
 * shape). A candidate may replace it only if it does the same arithmetic:
 * each output's k-sum in the same order, differing in tile shape or
 * schedule. Two tests, both required: its configuration has the first
 * candidate's algorithm id (kernel family), split-k count and reduction
 * scheme (the structure of the k-sum), and on the configuration's first call
 * its output (and written aux matrix) has exactly the first candidate's bits
 * on the call's own operands (a bf16 output can hide a different fp32 order
 * in a small matrix, so the bits alone do not decide). Of those, the fastest
 * (least of three timed runs) is kept. Timing noise may change which
 * algorithm runs, never the results: reruns and ranks stay bit-identical to
 * the heuristic's first choice. GPT2_CUDA_GEMM_TUNE=0 keeps the first
 * candidate without trying the others; =2 also prints each choice and
 * every candidate's structure and time (those of another k-sum structure
 * are then timed too, for the print only: never chosen).
 * Where cuBLASLt offers no algorithm for a fused epilogue (e.g. aux ld not a
 * multiple of 8) the unfused path is taken: plain matmul + our GELU kernels. */
#include "common.cuh"

#include <stdlib.h>
#include <string.h>

#define LT_WORKSPACE_BYTES (32u << 20)
#define LT_CANDIDATES 8 /* heuristic candidates tried on a configuration's first call */

struct LtKey {
    int transa, transb;
    int m, n, k, lda, ldb, ldd;
    int epilogue;
    int beta_one;
    int alignA, alignB, alignD, alignBias, alignAux;
    int ldaux;
};

struct LtPlan {
    LtKey key;
    int ok; /* 0: no algorithm for this configuration */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo; /* the one that runs */
    /* the heuristic's candidates, until the first call has chosen among them */
    cublasLtMatmulAlgo_t cand[LT_CANDIDATES];
    int ncand; /* 0 once chosen */
    LtPlan* next;
};

static int ptr_align(const void* p) {
    uintptr_t v = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (v % (uintptr_t)a) != 0) a >>= 1;
    return a;
}

void cuda_matmul_init(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    const char* env = getenv("GPT2_CUDA_GEMM_TUNE");
    c->gemm_tune = 1;
    if (env && *env) {
        if (strcmp(env, "0") && strcmp(env, "1") && strcmp(env, "2"))
            fatal("GPT2_CUDA_GEMM_TUNE='%s': expected 0 (the heuristic's first algorithm), 1 (the fastest with "
                  "its bits, the default) or 2 (1, printing each choice and every candidate)",
                  env);
        c->gemm_tune = env[0] - '0';
    }
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    c->lt_workspace_bytes = LT_WORKSPACE_BYTES;
    c->lt_workspace = cuda_alloc_tracked(be, c->lt_workspace_bytes, MEM_OTHER);
    c->plans = NULL;
}

void cuda_matmul_destroy(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    LtPlan* p = c->plans;
    while (p) {
        LtPlan* nx = p->next;
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->d) cublasLtMatrixLayoutDestroy(p->d);
        free(p);
        p = nx;
    }
    c->plans = NULL;
    if (c->lt_workspace) cuda_release_tracked(be, c->lt_workspace, c->lt_workspace_bytes, MEM_OTHER);
    c->lt_workspace = NULL;
    if (c->lt) CUBLAS_CHECK(cublasLtDestroy(c->lt));
    c->lt = NULL;
}

/* ---- choosing among the candidates (see the top of the file) ---- */

/* Two order-free 64-bit sums of a hash of each 16-bit unit and its index:
 * equal outputs give equal sums; different ones collide with probability
 * about 2^-128. Integer additions, so the atomics' order does not matter. */
__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
__global__ void hash_units_kernel(unsigned long long* out, const uint16_t* u, size_t n) {
    unsigned long long h1 = 0, h2 = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long x = ((unsigned long long)u[i] << 48) ^ i;
        h1 += mix64(x);
        h2 += mix64(x ^ 0x9e3779b97f4a7c15ull);
    }
    for (int o = 16; o > 0; o >>= 1) {
        h1 += __shfl_xor_sync(0xffffffffu, h1, o);
        h2 += __shfl_xor_sync(0xffffffffu, h2, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&out[0], h1);
        atomicAdd(&out[1], h2);
    }
}

/* one call's operands, as lt_choose needs them */
struct LtCall {
    void* D;
    const void *A, *B;
    float beta;
    size_t d_bytes; /* D's extent: ((n - 1) * ldd + m) elements */
    void* aux;      /* the epilogue's aux matrix (NULL: none) */
    size_t aux_bytes;
    bool aux_out; /* written by the epilogue (GELU_AUX), not read (DGELU) */
};

static bool lt_overlap(const void* p, size_t pb, const void* q, size_t qb) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return q && a < b + qb && b < a + pb;
}

/* The configuration attributes that fix the order of each output's k-sum:
 * the algorithm id (kernel family), the split-k count, the reduction scheme. */
static void lt_sum_structure(const cublasLtMatmulAlgo_t* a, int out[3]) {
    int32_t id = 0;
    uint32_t splitk = 0, red = 0;
    size_t w = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w));
    CUBLAS_CHECK(
        cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w));
    CUBLAS_CHECK(
        cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w));
    out[0] = (int)id;
    out[1] = (int)splitk;
    out[2] = (int)red;
}

static cublasStatus_t lt_run(Backend* be, LtPlan* p, const cublasLtMatmulAlgo_t* algo, void* D, const void* A,
                             const void* Bm, float beta) {
    CudaCtx* c = cuda_ctx(be);
    float alpha = 1.0f;
    return cublasLtMatmul(c->lt, p->desc, &alpha, A, p->a, Bm, p->b, &beta, D, p->d, D, p->d, algo,
                          c->lt_workspace, c->lt_workspace_bytes, c->stream);
}

/* Runs every candidate of p on the call's operands and keeps in p->algo the
 * fastest whose output (and aux output) has candidate 0's bits. With beta != 0
 * each run starts from a copy of D (stream-ordered memory, freed at the end),
 * so D itself is not touched; with beta == 0 the runs overwrite D (and aux),
 * which the caller's call then overwrites again. */
static void lt_choose(Backend* be, LtPlan* p, const LtCall* k) {
    CudaCtx* c = cuda_ctx(be);
    cudaStream_t st = c->stream;
    const int nc = p->ncand;
    p->algo = p->cand[0];
    p->ncand = 0;
    if (nc < 2 || c->gemm_tune == 0) return;
    /* an output that overlaps an input would change the inputs between runs */
    const size_t es = dtype_size(be->dtype);
    const size_t a_bytes = (size_t)(p->key.transa ? p->key.m : p->key.k) * p->key.lda * es;
    const size_t b_bytes = (size_t)(p->key.transb ? p->key.k : p->key.n) * p->key.ldb * es;
    if (lt_overlap(k->D, k->d_bytes, k->A, a_bytes) || lt_overlap(k->D, k->d_bytes, k->B, b_bytes) ||
        lt_overlap(k->D, k->d_bytes, k->aux, k->aux_bytes) ||
        (k->aux_out &&
         (lt_overlap(k->aux, k->aux_bytes, k->A, a_bytes) || lt_overlap(k->aux, k->aux_bytes, k->B, b_bytes))))
        return;

    /* only candidates with the first one's k-sum structure are tried */
    int sums[LT_CANDIDATES][3], same_structure[LT_CANDIDATES];
    int ntry = 0;
    for (int i = 0; i < nc; i++) {
        lt_sum_structure(&p->cand[i], sums[i]);
        same_structure[i] = memcmp(sums[i], sums[0], sizeof sums[0]) == 0;
        ntry += same_structure[i];
    }
    if (ntry < 2 && c->gemm_tune < 2) return;

    /* the tuning's memory is stream-ordered and short-lived; where there is
     * none to spare, the first candidate stays */
    const bool copy = k->beta != 0.0f;
    unsigned long long* hash = NULL;
    void* Dt = NULL;
    if (cudaMallocAsync((void**)&hash, (size_t)nc * 4 * sizeof(unsigned long long), st) != cudaSuccess ||
        (copy && cudaMallocAsync(&Dt, k->d_bytes + 256, st) != cudaSuccess)) {
        cudaGetLastError(); /* the failed allocation's error, not sticky */
        if (hash) CUDA_CHECK(cudaFreeAsync(hash, st));
        return;
    }
    CUDA_CHECK(cudaMemsetAsync(hash, 0, (size_t)nc * 4 * sizeof(unsigned long long), st));
    /* the copy keeps D's alignment within 256 bytes (the plan's key holds
     * alignments up to 256; cudaMallocAsync's are at least that) */
    void* Drun = copy ? (void*)((char*)Dt + ((uintptr_t)k->D & 255)) : k->D;
    if (ptr_align(Drun) < p->key.alignD) fatal("internal: lt_choose's copy of D is less aligned than D");
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    float best_ms[LT_CANDIDATES];
    int ran[LT_CANDIDATES];
    for (int i = 0; i < nc; i++) {
        best_ms[i] = 1e30f;
        ran[i] = 0;
        if (!same_structure[i] && c->gemm_tune < 2) continue; /* =2 times the others too, to print */
        /* one run for the bits, then three timed */
        for (int r = 0; r < 4; r++) {
            if (copy) CUDA_CHECK(cudaMemcpyAsync(Drun, k->D, k->d_bytes, cudaMemcpyDeviceToDevice, st));
            CUDA_CHECK(cudaEventRecord(t0, st));
            if (lt_run(be, p, &p->cand[i], Drun, k->A, k->B, k->beta) != CUBLAS_STATUS_SUCCESS) break;
            CUDA_CHECK(cudaEventRecord(t1, st));
            if (r == 0) {
                hash_units_kernel<<<256, 256, 0, st>>>(hash + 4 * i, (const uint16_t*)Drun, k->d_bytes / 2);
                LAUNCH_CHECK();
                if (k->aux_out) {
                    hash_units_kernel<<<256, 256, 0, st>>>(
                        hash + 4 * i + 2, (const uint16_t*)k->aux, k->aux_bytes / 2);
                    LAUNCH_CHECK();
                }
                ran[i] = 1;
                continue;
            }
            float ms = 0.0f;
            CUDA_CHECK(cudaEventSynchronize(t1));
            CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (ms < best_ms[i]) best_ms[i] = ms;
        }
    }
    unsigned long long h[LT_CANDIDATES * 4];
    CUDA_CHECK(
        cudaMemcpyAsync(h, hash, (size_t)nc * 4 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (Dt) CUDA_CHECK(cudaFreeAsync(Dt, st));
    CUDA_CHECK(cudaFreeAsync(hash, st));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));

    /* a candidate may replace the first only with the first's k-sum
     * structure and bits (the others ran only to be printed) */
    int same_bits[LT_CANDIDATES];
    int pick = 0, same = 1;
    for (int i = 0; i < nc; i++) {
        same_bits[i] = ran[i] && memcmp(&h[4 * i], &h[0], 4 * sizeof h[0]) == 0;
        if (i == 0 || !same_structure[i] || !same_bits[i]) continue;
        same++;
        if (best_ms[i] < best_ms[pick]) pick = i;
    }
    p->algo = p->cand[pick];
    if (c->gemm_tune == 2) {
        fprintf(stderr,
                "gemm m=%d n=%d k=%d trans=%d%d epilogue=%d beta=%g: candidate %d of %d (%d with the first's "
                "k-sum structure, %d of those with its bits): %.4f ms, the first %.4f ms\n",
                p->key.m, p->key.n, p->key.k, p->key.transa, p->key.transb, p->key.epilogue, (double)k->beta,
                pick, nc, ntry, same, (double)best_ms[pick], (double)best_ms[0]);
        for (int i = 0; i < nc; i++) {
            int tile = 0, stages = 0;
            size_t w = 0;
            cublasLtMatmulAlgoConfigGetAttribute(
                &p->cand[i], CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
            cublasLtMatmulAlgoConfigGetAttribute(
                &p->cand[i], CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
            fprintf(stderr, "  cand %d: id %d splitk %d red %d tile %d stages %d: %.4f ms%s%s\n", i, sums[i][0],
                    sums[i][1], sums[i][2], tile, stages, (double)best_ms[i],
                    same_structure[i] ? "" : " (other k-sum)", same_bits[i] ? " same bits" : "");
        }
    }
}

/* D[m,n] (col-major, ld ldd) = op(A) op(B) (+ beta D), with an epilogue.
 * Returns 0 (doing nothing) when cuBLASLt has no algorithm for it. */
static int lt_matmul(Backend* be, void* D, const void* A, const void* Bm, int m, int n, int k, int transa,
                     int transb, int lda, int ldb, int ldd, float beta, cublasLtEpilogue_t epi,
                     const void* bias, const void* aux, int ldaux) {
    CudaCtx* c = cuda_ctx(be);
    LtKey key;
    memset(&key, 0, sizeof key);
    key.transa = transa;
    key.transb = transb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldd = ldd;
    key.epilogue = (int)epi;
    key.beta_one = beta != 0.0f;
    key.alignA = ptr_align(A);
    key.alignB = ptr_align(Bm);
    key.alignD = ptr_align(D);
    key.alignBias = bias ? ptr_align(bias) : 0;
    key.alignAux = aux ? ptr_align(aux) : 0;
    key.ldaux = aux ? ldaux : 0;

    LtPlan* p = c->plans;
    while (p && memcmp(&p->key, &key, sizeof key) != 0) p = p->next;
    if (!p) {
        p = (LtPlan*)xcalloc(1, sizeof(LtPlan));
        p->key = key;
        bool bf = be->dtype == DTYPE_BF16;
        cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
        cublasComputeType_t ct = (!bf && c->allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F));
        cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (bias)
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (aux) {
            int64_t ld64 = ldaux;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld64, sizeof ld64));
        }
        /* stored shapes: op(A) is m x k, op(B) is k x n */
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, dt, transa ? k : m, transa ? m : k, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, dt, transb ? n : k, transb ? k : n, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, m, n, ldd));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = c->lt_workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        uint32_t al[3] = {(uint32_t)key.alignA, (uint32_t)key.alignB, (uint32_t)key.alignD};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]));
        cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
        int count = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
            c->lt, p->desc, p->a, p->b, p->d, p->d, pref, LT_CANDIDATES, res, &count);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        /* any refusal (not supported, invalid for these sizes) -> fallback path */
        if (s == CUBLAS_STATUS_SUCCESS && count > 0) {
            for (int i = 0; i < count; i++) p->cand[i] = res[i].algo;
            p->ncand = count;
            p->algo = res[0].algo;
            p->ok = 1;
        }
        p->next = c->plans;
        c->plans = p;
    }
    if (!p->ok) return 0;
    if (bias)
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    if (p->ncand > 0) {
        const size_t es = dtype_size(be->dtype);
        LtCall k;
        k.D = D;
        k.A = A;
        k.B = Bm;
        k.beta = beta;
        k.d_bytes = ((size_t)(n - 1) * ldd + m) * es;
        k.aux = (void*)aux;
        k.aux_bytes = aux ? ((size_t)(n - 1) * ldaux + m) * es : 0;
        k.aux_out = epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        lt_choose(be, p, &k);
    }
    CUBLAS_CHECK(lt_run(be, p, &p->algo, D, A, Bm, beta));
    return 1;
}

/* Fallback for shapes cuBLASLt refuses (e.g. odd leading dimensions in
 * bf16): one thread per output element, fp32 sum over k in order. Slow, but
 * only odd test-sized problems take it. */
template <typename T>
__global__ void naive_gemm_kernel(T* D, const T* A, const T* Bm, int m, int n, int k, int transa, int transb,
                                  int lda, int ldb, int ldd, float beta, const T* bias) {
    int i = blockIdx.y * blockDim.x + threadIdx.x; /* row of D */
    int j = blockIdx.x;                            /* column of D */
    if (i >= m) return;
    float s = 0.0f;
    for (int p = 0; p < k; p++) {
        float a = to_f<T>(transa ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i]);
        float b = to_f<T>(transb ? Bm[(size_t)p * ldb + j] : Bm[(size_t)j * ldb + p]);
        s += a * b;
    }
    if (bias) s += to_f<T>(bias[i]);
    T* d = D + (size_t)j * ldd + i;
    if (beta != 0.0f) s += beta * to_f<T>(*d);
    *d = from_f<T>(s);
}

static void lt_matmul_required(Backend* be, void* D, const void* A, const void* Bm, int m, int n, int k,
                               int transa, int transb, int lda, int ldb, int ldd, float beta,
                               cublasLtEpilogue_t epi, const void* bias) {
    if (lt_matmul(be, D, A, Bm, m, n, k, transa, transb, lda, ldb, ldd, beta, epi, bias, NULL, 0)) return;
    cudaStream_t st = cuda_ctx(be)->stream;
    dim3 grid(n, cdiv(m, 128));
    if (be->dtype == DTYPE_BF16)
        naive_gemm_kernel<bf16><<<grid, 128, 0, st>>>((bf16*)D, (const bf16*)A, (const bf16*)Bm, m, n, k,
                                                      transa, transb, lda, ldb, ldd, beta, (const bf16*)bias);
    else
        naive_gemm_kernel<float><<<grid, 128, 0, st>>>((float*)D, (const float*)A, (const float*)Bm, m, n, k,
                                                       transa, transb, lda, ldb, ldd, beta, (const float*)bias);
    LAUNCH_CHECK();
}

void cuda_matmul_forward(Backend* be, void* out, void* pre_gelu, const void* inp, const void* w,
                         const void* bias, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    if (pre_gelu) {
        cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (OC % 8 == 0 && lt_matmul(be, out, w, inp, OC, N, C, 1, 0, C, C, OC, 0.0f, epi, bias, pre_gelu, OC))
            return;
        /* unfused: pre_gelu = inp @ w^T + b, then out = gelu(pre_gelu) */
        lt_matmul_required(be, pre_gelu, w, inp, OC, N, C, 1, 0, C, C, OC, 0.0f,
                           bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias);
        cuda_gelu_forward(be, out, pre_gelu, (size_t)N * OC);
        return;
    }
    lt_matmul_required(be, out, w, inp, OC, N, C, 1, 0, C, C, OC, 0.0f,
                       bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias);
}

/* ---- dbias[OC] += column sums of dout[N, OC] ---- */
#define DB_ROWT 32   /* row-threads per block */
#define DB_COLS 8    /* column-threads per block, each with V columns */
#define DB_CHUNKS 64 /* row chunks (grid.y) */

template <typename T, int V>
__global__ void dbias_partial_kernel(float* partial, const T* dout, int N, int OC, int rows_per) {
    __shared__ float sm[DB_ROWT][DB_COLS * V + 1];
    int tx = threadIdx.x % DB_COLS, ty = threadIdx.x / DB_COLS;
    int c0 = (blockIdx.x * DB_COLS + tx) * V;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] = 0.0f;
    if (c0 < OC) {
        for (int r = r0 + ty; r < r1; r += DB_ROWT) {
            float x[V];
            load_vec<V>(x, dout + (size_t)r * OC + c0);
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] += x[k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) sm[ty][tx * V + k] = acc[k];
    __syncthreads();
    if (ty == 0 && c0 < OC) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            float s = 0.0f;
            for (int r = 0; r < DB_ROWT; r++) s += sm[r][tx * V + k];
            partial[(size_t)blockIdx.y * OC + c0 + k] = s;
        }
    }
}

template <typename T> __global__ void dbias_final_kernel(T* dbias, const float* partial, int chunks, int OC) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float s = 0.0f;
    for (int g = 0; g < chunks; g++) s += partial[(size_t)g * OC + c];
    dbias[c] = from_f<T>(to_f<T>(dbias[c]) + s);
}

template <typename T> static void dbias_launch(Backend* be, T* dbias, const T* dout, int N, int OC) {
    cudaStream_t st = cuda_ctx(be)->stream;
    constexpr int VV = Vec16<T>::N;
    int chunks = N < DB_CHUNKS ? N : DB_CHUNKS;
    int rows_per = (N + chunks - 1) / chunks;
    chunks = (N + rows_per - 1) / rows_per;
    float* partial = (float*)cuda_scratch(be, (size_t)chunks * OC * sizeof(float));
    if (OC % VV == 0 && aligned16(dout)) {
        dim3 grid(cdiv(OC, DB_COLS * VV), chunks);
        dbias_partial_kernel<T, VV><<<grid, DB_ROWT * DB_COLS, 0, st>>>(partial, dout, N, OC, rows_per);
    } else {
        dim3 grid(cdiv(OC, DB_COLS), chunks);
        dbias_partial_kernel<T, 1><<<grid, DB_ROWT * DB_COLS, 0, st>>>(partial, dout, N, OC, rows_per);
    }
    LAUNCH_CHECK();
    dbias_final_kernel<T><<<cdiv(OC, 128), 128, 0, st>>>(dbias, partial, chunks, OC);
    LAUNCH_CHECK();
}

void cuda_bias_colsum_add(Backend* be, void* dbias, const void* dout, int N, int OC) {
    if (N == 0 || OC == 0) return;
    if (be->dtype == DTYPE_BF16) dbias_launch<bf16>(be, (bf16*)dbias, (const bf16*)dout, N, OC);
    else dbias_launch<float>(be, (float*)dbias, (const float*)dout, N, OC);
}

void cuda_bias_partials_add(Backend* be, void* dbias, const float* partial, int chunks, int OC) {
    if (OC == 0) return;
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        dbias_final_kernel<bf16><<<cdiv(OC, 128), 128, 0, st>>>((bf16*)dbias, partial, chunks, OC);
    else dbias_final_kernel<float><<<cdiv(OC, 128), 128, 0, st>>>((float*)dbias, partial, chunks, OC);
    LAUNCH_CHECK();
}

/* dw[OC,C] += dout[:, 0:OC]^T inp, dout's rows ld_dout apart:
 * dW^T[C,OC] = inp^T[C,N] * (the OC x N column-major view of dout, ld
 * ld_dout)^T. One plan per (shape, ld, alignments), like every GEMM here:
 * the same call gives the same bits. */
void cuda_matmul_backward_weight(Backend* be, void* dw, const void* dout, int ld_dout, const void* inp, int N,
                                 int C, int OC) {
    if (N == 0 || C == 0 || OC == 0) return;
    if (ld_dout < OC) fatal("matmul_backward_weight: ld_dout %d is smaller than OC %d", ld_dout, OC);
    lt_matmul_required(be, dw, inp, dout, C, OC, N, 0, 1, C, ld_dout, C, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, NULL);
}

void cuda_matmul_backward(Backend* be, void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                          const void* w, const void* pre_gelu, int N, int C, int OC) {
    if (N == 0 || C == 0 || OC == 0) return;
    /* dw += dout^T inp (skipped when dw is NULL), first: dinp may be inp */
    if (dw) cuda_matmul_backward_weight(be, dw, dout, OC, inp, N, C, OC);
    /* dinp = dout @ w (overwrite), with the GELU backward fused when asked;
     * skipped when dinp is NULL */
    if (dinp) {
        int done = 0;
        if (pre_gelu && C % 8 == 0)
            done = lt_matmul(be, dinp, w, dout, C, N, OC, 0, 0, C, OC, C, 0.0f, CUBLASLT_EPILOGUE_DGELU, NULL,
                             pre_gelu, C);
        if (!done) {
            lt_matmul_required(be, dinp, w, dout, C, N, OC, 0, 0, C, OC, C, 0.0f, CUBLASLT_EPILOGUE_DEFAULT,
                               NULL);
            if (pre_gelu) cuda_gelu_backward(be, dinp, pre_gelu, dinp, (size_t)N * C);
        }
    }
    /* dbias by our column-sum kernel: cuBLASLt's BGRADB epilogue made the
     * dW GEMM slower than GEMM + column sum, and it overwrites; DGELU_BGRAD
     * (the layer below's bias gradient inside the DGELU GEMM above) ran
     * about 3x slower than DGELU alone on the H200 (docs/CUDA.md, run 9). */
    if (dbias) cuda_bias_colsum_add(be, dbias, dout, N, OC);
}
