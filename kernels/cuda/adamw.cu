/* kernels/cuda/adamw.cu — the optimizer kernels over OptPieces: the
 * gradient sum of squares and AdamW.
 *
 * The host splits the pieces into chunks of at most ADAM_CHUNK elements and
 * copies that chunk table to the device (only when the pieces change); both
 * kernels then run one block per chunk, one launch for all pieces.
 *  - grad_sumsq: each block sums its chunk in double (threads in a fixed
 *    stride, then a fixed tree); a one-block kernel adds the per-chunk sums
 *    in chunk order. Deterministic and independent of the GPU's size.
 *  - AdamW: the gradient read at grad_off, fp32 master/m/v at state_off;
 *    the new param is written at buf_off: exactly the fp32 master, or bf16 with stochastic rounding whose
 *    random bits are a hash of (seed, rng_off + j: the element's index in the
 *    param buffer, or within a tied tensor held on two ranks), so a run is
 *    repeatable and independent of how the buffer is split among ranks. */
#include "common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ADAM_CHUNK 16384
#define ADAM_THREADS 256

struct DevChunk {
    unsigned long long buf_off;
    unsigned long long grad_off;
    unsigned long long rng_off;
    unsigned long long state_off;
    unsigned int len;
    int decay;
};

/* Build (or reuse) the device chunk table for these pieces. */
static DevChunk* chunk_table(Backend* be, const OptPiece* pieces, int npieces) {
    CudaCtx* c = cuda_ctx(be);
    if (c->dev_chunks && npieces == c->host_npieces &&
        (npieces == 0 || memcmp(pieces, c->host_pieces, (size_t)npieces * sizeof(OptPiece)) == 0))
        return (DevChunk*)c->dev_chunks;
    size_t n = 0;
    for (int i = 0; i < npieces; i++) n += (pieces[i].len + ADAM_CHUNK - 1) / ADAM_CHUNK;
    DevChunk* h = (DevChunk*)xcalloc(n ? n : 1, sizeof(DevChunk));
    size_t k = 0;
    for (int i = 0; i < npieces; i++) {
        for (size_t o = 0; o < pieces[i].len; o += ADAM_CHUNK) {
            size_t len = pieces[i].len - o < ADAM_CHUNK ? pieces[i].len - o : ADAM_CHUNK;
            h[k].buf_off = pieces[i].buf_off + o;
            h[k].grad_off = pieces[i].grad_off + o;
            h[k].rng_off = pieces[i].rng_off + o;
            h[k].state_off = pieces[i].state_off + o;
            h[k].len = (unsigned)len;
            h[k].decay = pieces[i].decay;
            k++;
        }
    }
    size_t bytes = (n ? n : 1) * sizeof(DevChunk);
    if (bytes > c->dev_chunks_bytes) {
        if (c->dev_chunks) {
            CUDA_CHECK(cudaStreamSynchronize(c->stream));
            cuda_release_tracked(be, c->dev_chunks, c->dev_chunks_bytes, MEM_OTHER);
        }
        c->dev_chunks = cuda_alloc_tracked(be, bytes, MEM_OTHER);
        c->dev_chunks_bytes = bytes;
    }
    /* synchronous copy: the host table is freed right after */
    CUDA_CHECK(cudaMemcpyAsync(c->dev_chunks, h, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(h);
    free(c->host_pieces);
    c->host_pieces = (OptPiece*)xmalloc((npieces ? npieces : 1) * sizeof(OptPiece));
    if (npieces) memcpy(c->host_pieces, pieces, (size_t)npieces * sizeof(OptPiece));
    c->host_npieces = npieces;
    c->nchunks = (int)n;
    size_t sb = (n + 1) * sizeof(double);
    if (sb > c->dev_sumsq_bytes) {
        if (c->dev_sumsq) cuda_release_tracked(be, c->dev_sumsq, c->dev_sumsq_bytes, MEM_OTHER);
        c->dev_sumsq = (double*)cuda_alloc_tracked(be, sb, MEM_OTHER);
        c->dev_sumsq_bytes = sb;
    }
    return (DevChunk*)c->dev_chunks;
}

void cuda_adamw_destroy(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    if (c->dev_chunks) cuda_release_tracked(be, c->dev_chunks, c->dev_chunks_bytes, MEM_OTHER);
    if (c->dev_sumsq) cuda_release_tracked(be, c->dev_sumsq, c->dev_sumsq_bytes, MEM_OTHER);
    free(c->host_pieces);
    c->dev_chunks = NULL;
    c->dev_sumsq = NULL;
    c->host_pieces = NULL;
}

/* ---- grad sum of squares ---- */
template <typename T>
__global__ void __launch_bounds__(ADAM_THREADS)
    sumsq_chunk_kernel(double* partial, const T* grads, const DevChunk* chunks) {
    __shared__ double red[ADAM_THREADS / 32];
    DevChunk ch = chunks[blockIdx.x];
    const T* g = grads + ch.grad_off;
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < ch.len; i += ADAM_THREADS) {
        double x = (double)to_f<T>(g[i]);
        s += x * x;
    }
    s = warp_sum_d(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < ADAM_THREADS / 32; w++) t += red[w];
        partial[blockIdx.x] = t;
    }
}

__global__ void sumsq_final_kernel(double* out, const double* partial, int n) {
    __shared__ double red[ADAM_THREADS / 32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += ADAM_THREADS) s += partial[i];
    s = warp_sum_d(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < ADAM_THREADS / 32; w++) t += red[w];
        *out = t;
    }
}

double cuda_grad_sumsq(Backend* be, const void* grads, const OptPiece* pieces, int npieces) {
    CudaCtx* c = cuda_ctx(be);
    DevChunk* ch = chunk_table(be, pieces, npieces);
    int n = c->nchunks;
    if (n == 0) return 0.0;
    if (be->dtype == DTYPE_BF16)
        sumsq_chunk_kernel<bf16><<<n, ADAM_THREADS, 0, c->stream>>>(c->dev_sumsq, (const bf16*)grads, ch);
    else sumsq_chunk_kernel<float><<<n, ADAM_THREADS, 0, c->stream>>>(c->dev_sumsq, (const float*)grads, ch);
    LAUNCH_CHECK();
    sumsq_final_kernel<<<1, ADAM_THREADS, 0, c->stream>>>(c->dev_sumsq + n, c->dev_sumsq, n);
    LAUNCH_CHECK();
    double r = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&r, c->dev_sumsq + n, sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return r;
}

/* ---- AdamW ---- */
__device__ __forceinline__ uint32_t sr_hash(uint32_t seed, unsigned long long idx) {
    unsigned long long x = idx * 0x9E3779B97F4A7C15ull ^ ((unsigned long long)seed << 32 | seed);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (uint32_t)x;
}

template <typename T> __device__ __forceinline__ T param_round(float x, uint32_t seed, unsigned long long idx);
template <> __device__ __forceinline__ float param_round<float>(float x, uint32_t, unsigned long long) {
    return x;
}
/* stochastic rounding to bf16: add 16 random bits below the kept ones, truncate */
template <> __device__ __forceinline__ bf16 param_round<bf16>(float x, uint32_t seed, unsigned long long idx) {
    if (!isfinite(x)) return __float2bfloat16_rn(x);
    uint32_t u = __float_as_uint(x);
    uint32_t r = sr_hash(seed, idx) & 0xFFFFu;
    uint32_t t = (u + r) & 0xFFFF0000u;
    if ((t & 0x7F800000u) == 0x7F800000u) t = u & 0xFFFF0000u; /* never round up to inf */
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)(t >> 16);
    return bf16(raw);
}

struct AdamParams {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
    uint32_t seed;
};

/* Each thread takes ADAM_UNROLL elements ADAM_THREADS apart per pass and
 * loads all of them before it computes: four elements' loads in flight per
 * thread instead of one (the stores of one element could otherwise alias the
 * next one's loads for all the compiler knows). */
#define ADAM_UNROLL 4
template <typename T>
__global__ void __launch_bounds__(ADAM_THREADS)
    adamw_kernel(T* __restrict__ params, const T* __restrict__ grads, float* __restrict__ master,
                 float* __restrict__ m, float* __restrict__ v, const DevChunk* __restrict__ chunks,
                 AdamParams a) {
    const DevChunk ch = chunks[blockIdx.x];
    for (unsigned i0 = threadIdx.x; i0 < ch.len; i0 += ADAM_UNROLL * ADAM_THREADS) {
        float g[ADAM_UNROLL], m0[ADAM_UNROLL], v0[ADAM_UNROLL], w0[ADAM_UNROLL];
#pragma unroll
        for (int u = 0; u < ADAM_UNROLL; u++) {
            const unsigned i = i0 + u * ADAM_THREADS;
            if (i < ch.len) {
                const unsigned long long si = ch.state_off + i;
                g[u] = to_f<T>(grads[ch.grad_off + i]);
                m0[u] = m[si];
                v0[u] = v[si];
                w0[u] = master[si];
            }
        }
#pragma unroll
        for (int u = 0; u < ADAM_UNROLL; u++) {
            const unsigned i = i0 + u * ADAM_THREADS;
            if (i < ch.len) {
                const unsigned long long si = ch.state_off + i;
                float gs = g[u] * a.grad_scale;
                float mm = a.beta1 * m0[u] + (1.0f - a.beta1) * gs;
                float vv = a.beta2 * v0[u] + (1.0f - a.beta2) * gs * gs;
                float mhat = mm / a.bc1, vhat = vv / a.bc2;
                float w = w0[u];
                float upd = mhat / (sqrtf(vhat) + a.eps);
                if (ch.decay) upd += a.wd * w;
                w -= a.lr * upd;
                m[si] = mm;
                v[si] = vv;
                master[si] = w;
                params[ch.buf_off + i] = param_round<T>(w, a.seed, ch.rng_off + i);
            }
        }
    }
}

void cuda_adamw(Backend* be, void* params, const void* grads, float* master, float* m, float* v,
                const OptPiece* pieces, int npieces, const AdamWArgs* args) {
    CudaCtx* c = cuda_ctx(be);
    DevChunk* ch = chunk_table(be, pieces, npieces);
    int n = c->nchunks;
    if (n == 0) return;
    AdamParams a;
    a.lr = args->lr;
    a.beta1 = args->beta1;
    a.beta2 = args->beta2;
    a.eps = args->eps;
    a.wd = args->weight_decay;
    a.grad_scale = args->grad_scale;
    a.bc1 = (float)(1.0 - pow((double)args->beta1, (double)args->t));
    a.bc2 = (float)(1.0 - pow((double)args->beta2, (double)args->t));
    a.seed = args->seed;
    if (be->dtype == DTYPE_BF16)
        adamw_kernel<bf16>
            <<<n, ADAM_THREADS, 0, c->stream>>>((bf16*)params, (const bf16*)grads, master, m, v, ch, a);
    else
        adamw_kernel<float>
            <<<n, ADAM_THREADS, 0, c->stream>>>((float*)params, (const float*)grads, master, m, v, ch, a);
    LAUNCH_CHECK();
}
