/* kernels/cuda/classifier.cu — fused softmax + cross-entropy + logits
 * gradient, in place.
 *
 * One block per row. Pass 1: each thread keeps an online (max, sum of exp)
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

/* bf16, Vp <= CLS_REG_THREADS * 8 * CLS_REG_NPT: the whole row is read once
 * into registers (NPT 16-byte vectors a thread), so the logits cross memory
 * once each way instead of reading them twice. Max, then sum of exp, each
 * reduced in a fixed tree. */
#define CLS_REG_THREADS 1024
#define CLS_REG_NPT 8

__device__ __forceinline__ float block_reduce_fixed(float v, bool is_max, float* sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  /* sm may still be read from a previous reduction */
    if (lane == 0) sm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x >> 5) ? sm[lane] : (is_max ? -INFINITY : 0.0f);
        t = is_max ? warp_max(t) : warp_sum(t);
        if (lane == 0) sm[32] = t;
    }
    __syncthreads();
    return sm[32];
}

__global__ void __launch_bounds__(CLS_REG_THREADS)
    classifier_reg_kernel(bf16* logits, float* losses, const int* targets, float dloss, int Vn, int Vp) {
    __shared__ float sm[33];
    const int row = blockIdx.x;
    bf16* x = logits + (size_t)row * Vp;
    const int nv = Vp / 8;
    const int tg = targets[row];
    /* the target logit, read before any thread of the block writes the row */
    float lt = 0.0f;
    if (threadIdx.x == 0) lt = (tg >= 0 && tg < Vn) ? __bfloat162float(x[tg]) : NAN;
    int4 raw[CLS_REG_NPT];
#pragma unroll
    for (int k = 0; k < CLS_REG_NPT; k++) {
        int i = threadIdx.x + k * CLS_REG_THREADS;
        if (i < nv) raw[k] = __ldcs(reinterpret_cast<const int4*>(x) + i);
    }
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < CLS_REG_NPT; k++) {
        int i = threadIdx.x + k * CLS_REG_THREADS;
        if (i < nv) {
            const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (i * 8 + j < Vn) mx = fmaxf(mx, __bfloat162float(e[j]));
        }
    }
    mx = block_reduce_fixed(mx, true, sm);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CLS_REG_NPT; k++) {
        int i = threadIdx.x + k * CLS_REG_THREADS;
        if (i < nv) {
            const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (i * 8 + j < Vn) s += expf(__bfloat162float(e[j]) - mx);
        }
    }
    s = block_reduce_fixed(s, false, sm);
    if (threadIdx.x == 0) losses[row] = logf(s) + mx - lt;
    if (dloss == 0.0f) return;
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < CLS_REG_NPT; k++) {
        int i = threadIdx.x + k * CLS_REG_THREADS;
        if (i < nv) {
            const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int c = i * 8 + j;
                v[j] = c < Vn ? (expf(__bfloat162float(e[j]) - mx) * inv - (c == tg ? 1.0f : 0.0f)) * dloss : 0.0f;
            }
            store_vec<8>(x + (size_t)i * 8, v);
        }
    }
}

template <typename T>
static void classifier_launch(cudaStream_t st, T* logits, float* losses, const int* targets,
                              float dloss, int N, int Vn, int Vp) {
    if (N == 0) return;
    constexpr int VV = Vec16<T>::N;
    if constexpr (sizeof(T) == 2) {
        if (Vp % 8 == 0 && aligned16(logits) && Vp <= CLS_REG_THREADS * 8 * CLS_REG_NPT) {
            classifier_reg_kernel<<<N, CLS_REG_THREADS, 0, st>>>((bf16*)logits, losses, targets, dloss, Vn, Vp);
            LAUNCH_CHECK();
            return;
        }
    }
    if (Vp % VV == 0 && aligned16(logits))
        classifier_kernel<T, VV><<<N, CLS_THREADS, 0, st>>>(logits, losses, targets, dloss, Vn, Vp);
    else
        classifier_kernel<T, 1><<<N, CLS_THREADS, 0, st>>>(logits, losses, targets, dloss, Vn, Vp);
    LAUNCH_CHECK();
}

void cuda_fused_classifier(Backend* be, void* logits, float* losses, const int* targets,
                           float dloss, int N, int V, int Vp) {
    if (V > Vp) fatal("fused_classifier: V=%d is larger than the padded Vp=%d", V, Vp);
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        classifier_launch<bf16>(st, (bf16*)logits, losses, targets, dloss, N, V, Vp);
    else
        classifier_launch<float>(st, (float*)logits, losses, targets, dloss, N, V, Vp);
}
