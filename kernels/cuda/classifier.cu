/* kernels/cuda/classifier.cu — fused softmax + cross-entropy + logits
 * gradient, in place.
 *
 * One block per row (bf16 rows up to 112 KB: read once into shared memory,
 * classifier_smem_kernel; otherwise two passes over memory, below).
 * Pass 1: each thread keeps an online (max, sum of exp)
 * over its columns < V; the threads are combined in a fixed tree (warp
 * butterflies, then warps in order): deterministic. loss = log(sum) + max -
 * logit[target]. Pass 2 (only when dloss != 0): logits[i] = (softmax_i -
 * [i == target]) * dloss for i < V, 0 for the padded columns V..Vp-1. With
 * dloss == 0 the logits are not written at all. */
#include "common.cuh"

#define CLS_THREADS 512

struct MaxSum {
    float m, s;
};
__device__ __forceinline__ MaxSum ms_combine(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

template <typename T, int V>
__global__ void __launch_bounds__(CLS_THREADS)
    classifier_kernel(T* logits, float* losses, const int* targets, float dloss, int Vn, int Vp) {
    __shared__ MaxSum red[CLS_THREADS / 32];
    __shared__ MaxSum tot;
    const int row = blockIdx.x;
    T* x = logits + (size_t)row * Vp;
    MaxSum acc = {-INFINITY, 0.0f};
    /* pass 1 over whole vectors below V, then the tail scalars */
    const int nvfull = Vn / V;
    for (int i = threadIdx.x; i < nvfull; i += blockDim.x) {
        float v[V];
        load_vec<V>(v, x + (size_t)i * V);
        float m = acc.m;
#pragma unroll
        for (int k = 0; k < V; k++) m = fmaxf(m, v[k]);
        float s = acc.s * expf(acc.m - m);
#pragma unroll
        for (int k = 0; k < V; k++) s += expf(v[k] - m);
        acc = {m, s};
    }
    for (int i = nvfull * V + threadIdx.x; i < Vn; i += blockDim.x) {
        float v = to_f<T>(x[i]);
        float m = fmaxf(acc.m, v);
        acc = {m, acc.s * expf(acc.m - m) + expf(v - m)};
    }
    /* combine: warp butterfly, then warps in order */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other = {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
        acc = ms_combine(acc, other);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        MaxSum t = red[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) t = ms_combine(t, red[w]);
        tot = t;
        int tg = targets[row];
        float lt = (tg >= 0 && tg < Vn) ? to_f<T>(x[tg]) : NAN;
        losses[row] = logf(t.s) + t.m - lt;
    }
    __syncthreads();
    if (dloss == 0.0f) return;
    const float mx = tot.m, inv = 1.0f / tot.s;
    const int tg = targets[row];
    const int nvall = Vp / V;
    for (int i = threadIdx.x; i < nvall; i += blockDim.x) {
        float v[V];
        load_vec<V>(v, x + (size_t)i * V);
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = i * V + k;
            v[k] = c < Vn ? (expf(v[k] - mx) * inv - (c == tg ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
        store_vec<V>(x + (size_t)i * V, v);
    }
    for (int c = nvall * V + threadIdx.x; c < Vp; c += blockDim.x) {
        float v = to_f<T>(x[c]);
        x[c] = from_f<T>(c < Vn ? (expf(v - mx) * inv - (c == tg ? 1.0f : 0.0f)) * dloss : 0.0f);
    }
}

/* bf16 rows that fit in shared memory (Vp*2 bytes <= CLS_SM_MAX, two blocks a
 * multiprocessor): the row is read from memory once into shared memory while
 * each thread keeps an online (max, sum of exp) of its columns; after the
 * fixed-order block reduction the gradient is computed from shared memory.
 * One read and one write of the logits instead of two reads and a write. (A
 * version that kept the row in registers, 1024 threads a block, ran one
 * block a multiprocessor with no overlap and was slower: 7.1 ms against 5.2.)
 * Instructions per element are what this kernel spends besides memory:
 * exp(x - m) is one multiply-add and one ex2 (x * log2e - m * log2e), the
 * bounds and target tests are made per 8-column vector, not per column. */
#define CLS_SM_THREADS 512
#define CLS_SM_MAX (112 * 1024)
#define CLS_LOG2E 1.4426950408889634f

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* (max, sum of exp(x - max)) pairs in natural units */
__device__ __forceinline__ MaxSum ms_combine_e(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    return {m, a.s * ex2((a.m - m) * CLS_LOG2E) + b.s * ex2((b.m - m) * CLS_LOG2E)};
}
__device__ __forceinline__ void unpack8(float* v, int4 r) {
    const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 f = __bfloat1622float2(e[j]);
        v[2 * j] = f.x;
        v[2 * j + 1] = f.y;
    }
}

/* batches of 4 vectors a thread that cover CLS_SM_MAX bytes */
#define CLS_SM_BATCHES 4
/* wait until batch b of the CLS_SM_BATCHES committed ones has arrived (the
 * later ones may still be in flight); b is a constant once its loop is unrolled */
__device__ __forceinline__ void cls_wait_batch(int b) {
    static_assert(CLS_SM_BATCHES == 4, "cls_wait_batch is written for 4 batches");
    switch (b) {
    case 0: cp_async_wait<3>(); break;
    case 1: cp_async_wait<2>(); break;
    case 2: cp_async_wait<1>(); break;
    default: cp_async_wait<0>();
    }
}

__global__ void __launch_bounds__(CLS_SM_THREADS)
    classifier_smem_kernel(bf16* logits, float* losses, const int* targets, float dloss, int Vn, int Vp) {
    extern __shared__ int4 rowbuf[]; /* [Vp / 8] */
    __shared__ MaxSum red[CLS_SM_THREADS / 32];
    __shared__ MaxSum tot;
    const int row = blockIdx.x;
    bf16* x = logits + (size_t)row * Vp;
    const int nv = Vp / 8, nfull = Vn / 8; /* vectors; those with every column < Vn */
    const int tg = targets[row];
    const bool tg_ok = tg >= 0 && tg < Vn;
    float lt = 0.0f;
    if (threadIdx.x == 0) lt = tg_ok ? __bfloat162float(x[tg]) : NAN;
    /* the whole row is requested at once, by cp.async straight into shared
     * memory (no registers held), in CLS_SM_BATCHES groups of 4 vectors a
     * thread; each group is summed as soon as it has arrived, while the later
     * ones are still in flight. A thread reads back only the vectors it
     * copied itself, here and in the gradient pass below. */
    static_assert(CLS_SM_MAX / 16 <= CLS_SM_BATCHES * 4 * CLS_SM_THREADS, "a row needs more batches");
#pragma unroll
    for (int b = 0; b < CLS_SM_BATCHES; b++) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = threadIdx.x + (b * 4 + u) * CLS_SM_THREADS;
            if (i < nv) cp_async16(rowbuf + i, reinterpret_cast<const int4*>(x) + i, true);
        }
        cp_async_commit(); /* empty groups past the row's end are fine */
    }
    MaxSum acc = {-INFINITY, 0.0f};
#pragma unroll
    for (int b = 0; b < CLS_SM_BATCHES; b++) {
        cls_wait_batch(b);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = threadIdx.x + (b * 4 + u) * CLS_SM_THREADS;
            if (i < nv) {
                float v[8];
                unpack8(v, rowbuf[i]);
                if (i >= nfull) {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (i * 8 + j >= Vn) v[j] = -INFINITY;
                }
                float vm = v[0];
#pragma unroll
                for (int j = 1; j < 8; j++) vm = fmaxf(vm, v[j]);
                if (vm == -INFINITY) continue; /* padding only */
                if (vm > acc.m) {
                    acc.s *= ex2((acc.m - vm) * CLS_LOG2E);
                    acc.m = vm;
                }
                const float mb = acc.m * CLS_LOG2E;
#pragma unroll
                for (int j = 0; j < 8; j++) acc.s += ex2(fmaf(v[j], CLS_LOG2E, -mb));
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other = {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
        acc = ms_combine_e(acc, other);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        MaxSum t = red[0];
        for (int w = 1; w < CLS_SM_THREADS / 32; w++) t = ms_combine_e(t, red[w]);
        tot = t;
        losses[row] = t.m + logf(t.s) - lt;
    }
    __syncthreads();
    if (dloss == 0.0f) return;
    /* dlogit = softmax * dloss - [column == target] * dloss, 0 past Vn */
    const float mb = tot.m * CLS_LOG2E, sc = dloss / tot.s;
    for (int i = threadIdx.x; i < nv; i += CLS_SM_THREADS) {
        float v[8];
        unpack8(v, rowbuf[i]);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = ex2(fmaf(v[j], CLS_LOG2E, -mb)) * sc;
        if (i >= nfull) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (i * 8 + j >= Vn) v[j] = 0.0f;
        }
        if (tg_ok && i == tg >> 3) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (i * 8 + j == tg) v[j] -= dloss;
        }
        int4 o;
        __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (int j = 0; j < 4; j++) e[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        reinterpret_cast<int4*>(x)[i] = o;
    }
}

template <typename T>
static void classifier_launch(cudaStream_t st, T* logits, float* losses, const int* targets, float dloss, int N,
                              int Vn, int Vp) {
    if (N == 0) return;
    constexpr int VV = Vec16<T>::N;
    if constexpr (sizeof(T) == 2) {
        size_t smem = (size_t)Vp * sizeof(bf16);
        if (Vp % 8 == 0 && aligned16(logits) && smem <= CLS_SM_MAX) {
            CUDA_CHECK(cudaFuncSetAttribute(classifier_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem));
            classifier_smem_kernel<<<N, CLS_SM_THREADS, smem, st>>>(
                (bf16*)logits, losses, targets, dloss, Vn, Vp);
            LAUNCH_CHECK();
            return;
        }
    }
    if (Vp % VV == 0 && aligned16(logits))
        classifier_kernel<T, VV><<<N, CLS_THREADS, 0, st>>>(logits, losses, targets, dloss, Vn, Vp);
    else classifier_kernel<T, 1><<<N, CLS_THREADS, 0, st>>>(logits, losses, targets, dloss, Vn, Vp);
    LAUNCH_CHECK();
}

void cuda_fused_classifier(Backend* be, void* logits, float* losses, const int* targets, float dloss, int N,
                           int V, int Vp) {
    if (V > Vp) fatal("fused_classifier: V=%d is larger than the padded Vp=%d", V, Vp);
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16) classifier_launch<bf16>(st, (bf16*)logits, losses, targets, dloss, N, V, Vp);
    else classifier_launch<float>(st, (float*)logits, losses, targets, dloss, N, V, Vp);
}
