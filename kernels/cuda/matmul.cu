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
 * alignments) gets its descriptors and ONE algorithm from the heuristic, the
 * first time it is seen; later calls reuse them, so results are repeatable.
 * Where cuBLASLt offers no algorithm for a fused epilogue (e.g. aux ld not a
 * multiple of 8) the unfused path is taken: plain matmul + our GELU kernels. */
#include "common.cuh"

#include <stdlib.h>
#include <string.h>

#define LT_WORKSPACE_BYTES (32u << 20)

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
    cublasLtMatmulAlgo_t algo;
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
        cublasLtMatmulHeuristicResult_t res;
        int count = 0;
        cublasStatus_t s =
            cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &count);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        /* any refusal (not supported, invalid for these sizes) -> fallback path */
        if (s == CUBLAS_STATUS_SUCCESS && count > 0) {
            p->algo = res.algo;
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
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(c->lt, p->desc, &alpha, A, p->a, Bm, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                c->lt_workspace, c->lt_workspace_bytes, c->stream));
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
    /* dw += dout^T inp (skipped when dw is NULL). dbias by our column-sum
     * kernel: cuBLASLt's BGRADB epilogue (tried 2026-12-02) made the dW GEMM
     * slower than GEMM + column sum, and it overwrites. */
    if (dw) cuda_matmul_backward_weight(be, dw, dout, OC, inp, N, C, OC);
    if (dbias) {
        if (be->dtype == DTYPE_BF16) dbias_launch<bf16>(be, (bf16*)dbias, (const bf16*)dout, N, OC);
        else dbias_launch<float>(be, (float*)dbias, (const float*)dout, N, OC);
    }
}
