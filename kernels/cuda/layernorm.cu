/* kernels/cuda/layernorm.cu — layernorm forward, the fused residual add +
 * layernorm forward, and layernorm backward.
 *
 * One warp per row; the row stays in registers (dispatch_nch in common.cuh),
 * so each input is read once. Statistics in fp32; eps = 1e-5; rstd =
 * 1/sqrt(var + eps) with the biased variance, as the CPU reference.
 *
 * Backward: dinp += ...; dw, db accumulate deterministically: a fixed grid
 * (occupancy-sized, the same on every run of a device) of blocks, each warp
 * walking rows with a fixed stride and summing its dw/db terms into its own
 * shared-memory slice; the warps of a block are added in warp order into a
 * per-block fp32 partial row; a second kernel sums the partials over blocks
 * in a fixed order and adds the result into dw and db. */
#include "common.cuh"

#define LN_WARPS 8
#define LN_EPS 1e-5f

template <typename T, int V, int NCH, bool RESID>
__global__ void __launch_bounds__(LN_WARPS * 32)
    ln_fwd_kernel(T* out, float* mean, float* rstd, T* resid, const T* in1, const T* in2, const T* w,
                  const T* b, int N, int C) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + warp;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    float x[NCH][V];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
        if (c < C) {
            load_vec_cs<V>(x[j], in1 + off + c);
            if constexpr (RESID) {
                float y[V];
                load_vec_cs<V>(y, in2 + off + c);
#pragma unroll
                for (int k = 0; k < V; k++) x[j][k] = to_f<T>(from_f<T>(x[j][k] + y[k]));
                store_vec<V>(resid + off + c, x[j]);
            }
#pragma unroll
            for (int k = 0; k < V; k++) s += x[j][k];
        } else {
#pragma unroll
            for (int k = 0; k < V; k++) x[j][k] = 0.0f;
        }
    }
    float mu = warp_sum(s) / (float)C;
    float s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
        if (c < C) {
#pragma unroll
            for (int k = 0; k < V; k++) {
                float d = x[j][k] - mu;
                s2 += d * d;
            }
        }
    }
    float var = warp_sum(s2) / (float)C;
    float rs = 1.0f / sqrtf(var + LN_EPS);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
        if (c < C) {
            float wv[V], bv[V], o[V];
            load_vec<V>(wv, w + c);
            load_vec<V>(bv, b + c);
#pragma unroll
            for (int k = 0; k < V; k++) o[k] = (x[j][k] - mu) * rs * wv[k] + bv[k];
            store_vec<V>(out + off + c, o);
        }
    }
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

template <typename T, bool RESID>
static void ln_fwd(cudaStream_t st, T* out, float* mean, float* rstd, T* resid, const T* in1, const T* in2,
                   const T* w, const T* b, int N, int C) {
    if (N == 0) return;
    constexpr int VV = Vec16<T>::N;
    bool vec = C % VV == 0 && aligned16(out) && aligned16(in1) && aligned16(w) && aligned16(b) &&
               (!RESID || (aligned16(in2) && aligned16(resid)));
    unsigned grid = cdiv(N, LN_WARPS);
    bool ok;
    if (vec) {
        ok = dispatch_nch<VV>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            if constexpr (NCH * VV <= 64) {
                ln_fwd_kernel<T, VV, NCH, RESID>
                    <<<grid, LN_WARPS * 32, 0, st>>>(out, mean, rstd, resid, in1, in2, w, b, N, C);
                return true;
            } else {
                return false;
            }
        });
    } else {
        ok = dispatch_nch<1>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            ln_fwd_kernel<T, 1, NCH, RESID>
                <<<grid, LN_WARPS * 32, 0, st>>>(out, mean, rstd, resid, in1, in2, w, b, N, C);
            return true;
        });
    }
    if (!ok) fatal("layernorm: C=%d is larger than the CUDA backend supports (2048)", C);
    LAUNCH_CHECK();
}

void cuda_layernorm_forward(Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w,
                            const void* b, int N, int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        ln_fwd<bf16, false>(st, (bf16*)out, mean, rstd, nullptr, (const bf16*)inp, nullptr, (const bf16*)w,
                            (const bf16*)b, N, C);
    else
        ln_fwd<float, false>(st, (float*)out, mean, rstd, nullptr, (const float*)inp, nullptr, (const float*)w,
                             (const float*)b, N, C);
}

void cuda_residual_layernorm_forward(Backend* be, void* residual, void* out, float* mean, float* rstd,
                                     const void* inp1, const void* inp2, const void* w, const void* b, int N,
                                     int C) {
    cudaStream_t st = cuda_ctx(be)->stream;
    if (be->dtype == DTYPE_BF16)
        ln_fwd<bf16, true>(st, (bf16*)out, mean, rstd, (bf16*)residual, (const bf16*)inp1, (const bf16*)inp2,
                           (const bf16*)w, (const bf16*)b, N, C);
    else
        ln_fwd<float, true>(st, (float*)out, mean, rstd, (float*)residual, (const float*)inp1,
                            (const float*)inp2, (const float*)w, (const float*)b, N, C);
}

/* ---- backward ---- */
/* A block of LN_BWD_WARPS warps; each warp walks rows with a fixed stride.
 * Each warp's dw/db sums live in its own slice of shared memory (not in
 * registers: that kept 150 registers a thread and one block a multiprocessor),
 * lane-major in groups of Q consecutive elements of a lane (Q = 4 where V
 * allows, so each update is one 16-byte access for 4 elements): group e / Q
 * of lane l's element e = j * V + k at [((e / Q) * 32 + l) * Q + e % Q], so
 * that a warp's 32 updates hit every bank once per 128 bytes (column-major,
 * with lanes 32 bytes apart, they hit 4 banks: 8-way conflicts on every
 * update). Rows are double-buffered in registers as loaded (RawVec): the next
 * row's dout, inp and dinp are in flight while the current one is computed.
 * SUM: a third slice sums the dinp values as stored (dsum, a bias gradient).
 * The sums' order is each warp's rows in turn, whatever the buffering. */
#define LN_BWD_WARPS 4

/* floats of one warp's dw (or db) slice */
template <int V, int NCH> __host__ __device__ constexpr int ln_bwd_slice() { return NCH * V * 32; }
/* floats of one shared-memory access of the sums */
template <int V> __host__ __device__ constexpr int ln_bwd_q() { return V % 4 == 0 ? 4 : 1; }

/* one row's inputs as loaded */
template <typename T, int V, int NCH> struct LnBwdRow {
    RawVec<V, T> g[NCH], x[NCH], d[NCH];
    float mu, rs;
    __device__ __forceinline__ void load(const T* dout, const T* inp, const T* dinp, const float* mean,
                                         const float* rstd, int row, int C, int lane) {
        mu = mean[row];
        rs = rstd[row];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) {
                g[j].load_cs(dout + (size_t)row * C + c);
                x[j].load_cs(inp + (size_t)row * C + c);
                d[j].load(dinp + (size_t)row * C + c);
            }
        }
    }
};

template <int Q> __device__ __forceinline__ void lds_q(float* v, const float* p) {
    if constexpr (Q == 4) {
        float4 t = *reinterpret_cast<const float4*>(p);
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
        v[0] = *p;
    }
}
template <int Q> __device__ __forceinline__ void sts_q(float* p, const float* v) {
    if constexpr (Q == 4) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else *p = v[0];
}

template <typename T, int V, int NCH, bool SUM>
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
    ln_bwd_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* w, const float* mean,
                  const float* rstd, int N, int C) {
    constexpr int SL = ln_bwd_slice<V, NCH>();
    constexpr int Q = ln_bwd_q<V>();
    constexpr int NS = SUM ? 3 : 2; /* sums a warp keeps: dw, db (, dsum) */
    extern __shared__ float acc[];  /* [LN_BWD_WARPS][NS][SL] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* group q of this lane's dw sums at myw[q * 32 * Q]; db and dsum likewise */
    float* myw = acc + (size_t)warp * NS * SL + lane * Q;
    float* myb = myw + SL;
    float* mys = myb + SL; /* SUM only */
    RawVec<V, T> wv[NCH];
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = (j * 32 + lane) * V;
        if (c < C) {
            wv[j].load(w + c);
            const float z[Q] = {};
#pragma unroll
            for (int q = 0; q < V / Q; q++) {
                const int o = (j * (V / Q) + q) * 32 * Q;
                sts_q<Q>(myw + o, z);
                sts_q<Q>(myb + o, z);
                if constexpr (SUM) sts_q<Q>(mys + o, z);
            }
        }
    }
    const int stride = gridDim.x * LN_BWD_WARPS;
    int row = blockIdx.x * LN_BWD_WARPS + warp;
    LnBwdRow<T, V, NCH> cur, nxt;
    if (row < N) cur.load(dout, inp, dinp, mean, rstd, row, C, lane);
    for (; row < N; row += stride) {
        const int nx = row + stride;
        if (nx < N) nxt.load(dout, inp, dinp, mean, rstd, nx, C, lane);
        const float mu = cur.mu, rs = cur.rs;
        const size_t off = (size_t)row * C;
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) {
#pragma unroll
                for (int q = 0; q < V / Q; q++) {
                    const int o = (j * (V / Q) + q) * 32 * Q;
                    float aw[Q], ab[Q];
                    lds_q<Q>(aw, myw + o);
                    lds_q<Q>(ab, myb + o);
#pragma unroll
                    for (int kk = 0; kk < Q; kk++) {
                        const int k = q * Q + kk;
                        const float g = cur.g[j][k];
                        const float xn = (cur.x[j][k] - mu) * rs; /* the normalized input */
                        float dn = g * wv[j][k];
                        s1 += dn;
                        s2 += dn * xn;
                        aw[kk] += g * xn;
                        ab[kk] += g;
                    }
                    sts_q<Q>(myw + o, aw);
                    sts_q<Q>(myb + o, ab);
                }
            }
        }
        const float m1 = warp_sum(s1) / (float)C;
        const float m2 = warp_sum(s2) / (float)C;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = (j * 32 + lane) * V;
            if (c < C) {
                float d[V];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float g = cur.g[j][k];
                    const float xn = (cur.x[j][k] - mu) * rs;
                    d[k] = cur.d[j][k];
                    d[k] += (g * wv[j][k] - m1 - xn * m2) * rs;
                }
                store_vec<V>(dinp + off + c, d);
                if constexpr (SUM) {
#pragma unroll
                    for (int q = 0; q < V / Q; q++) {
                        const int o = (j * (V / Q) + q) * 32 * Q;
                        float as[Q];
                        lds_q<Q>(as, mys + o);
#pragma unroll
                        for (int kk = 0; kk < Q; kk++)
                            as[kk] += to_f<T>(from_f<T>(d[q * Q + kk])); /* as stored */
                        sts_q<Q>(mys + o, as);
                    }
                }
            }
        }
        cur = nxt;
    }
    __syncthreads();
    /* this block's partial: the warps' sums added in warp order; column c
     * is element e = j * V + k of lane l where c = (j * 32 + l) * V + k */
    float* dst = partial + (size_t)blockIdx.x * NS * C;
    for (int i = threadIdx.x; i < NS * C; i += blockDim.x) {
        const int part = i / C, c = i - part * C;
        const int v = c / V, k = c % V;
        const int e = (v >> 5) * V + k;
        const int idx = part * SL + ((e / Q) * 32 + (v & 31)) * Q + e % Q;
        float t = 0.0f;
        for (int w2 = 0; w2 < LN_BWD_WARPS; w2++) t += acc[(size_t)w2 * NS * SL + idx];
        dst[i] = t;
    }
}

/* dw[c] += sum_g partial[g][c]; db[c] += sum_g partial[g][C + c]; with NS
 * = 3 also ds[c] += sum_g partial[g][2C + c]; fixed order.
 * Block: 32 columns x 32 row-threads; row-thread ty sums g = ty, ty+32, ...
 * (4 loads in flight), then the 32 are added in order. */
template <typename T>
__global__ void __launch_bounds__(1024)
    ln_bwd_final_kernel(T* dw, T* db, T* ds, const float* partial, int G, int C, int NS) {
    __shared__ float sm[32][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + tx;
    float s = 0.0f;
    if (c < NS * C) {
        const size_t st = (size_t)NS * C;
        int g = ty;
        for (; g + 96 < G; g += 128) {
            float a0 = partial[(size_t)g * st + c], a1 = partial[(size_t)(g + 32) * st + c];
            float a2 = partial[(size_t)(g + 64) * st + c], a3 = partial[(size_t)(g + 96) * st + c];
            s += a0;
            s += a1;
            s += a2;
            s += a3;
        }
        for (; g < G; g += 32) s += partial[(size_t)g * st + c];
    }
    sm[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < NS * C) {
        float tot = 0.0f;
        for (int k = 0; k < 32; k++) tot += sm[k][tx];
        T* p = c < C ? dw + c : c < 2 * C ? db + (c - C) : ds + (c - 2 * C);
        *p = from_f<T>(to_f<T>(*p) + tot);
    }
}

template <typename T>
static void ln_bwd(Backend* be, T* dinp, T* dw, T* db, T* ds, const T* dout, const T* inp, const T* w,
                   const float* mean, const float* rstd, int N, int C) {
    CudaCtx* cx = cuda_ctx(be);
    cudaStream_t st = cx->stream;
    if (N == 0) return;
    constexpr int VV = Vec16<T>::N;
    bool vec = C % VV == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    size_t smem = 0;
    int G = 0;
    float* partial = nullptr;
    const int NS = ds ? 3 : 2;
    auto launch = [&](auto kern_nosum, auto kern_sum, int slice) {
        auto kern = ds ? kern_sum : kern_nosum;
        smem = (size_t)LN_BWD_WARPS * NS * slice * sizeof(float);
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, LN_BWD_WARPS * 32, smem));
        if (per_sm < 1) per_sm = 1;
        G = per_sm * cx->num_sms;
        int need = (int)cdiv(N, LN_BWD_WARPS);
        if (G > need) G = need;
        partial = (float*)cuda_scratch(be, (size_t)G * NS * C * sizeof(float));
        kern<<<G, LN_BWD_WARPS * 32, smem, st>>>(dinp, partial, dout, inp, w, mean, rstd, N, C);
        LAUNCH_CHECK();
    };
    bool ok;
    if (vec) {
        ok = dispatch_nch<VV>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            if constexpr (NCH * VV <= 32) {
                launch(ln_bwd_kernel<T, VV, NCH, false>, ln_bwd_kernel<T, VV, NCH, true>,
                       ln_bwd_slice<VV, NCH>());
                return true;
            } else {
                return false;
            }
        });
    } else {
        ok = dispatch_nch<1>(C, [&](auto nch) {
            constexpr int NCH = decltype(nch)::value;
            if constexpr (NCH <= 32) {
                launch(ln_bwd_kernel<T, 1, NCH, false>, ln_bwd_kernel<T, 1, NCH, true>, ln_bwd_slice<1, NCH>());
                return true;
            } else {
                return false;
            }
        });
    }
    if (!ok) fatal("layernorm_backward: C=%d is larger than the CUDA backend supports (1024)", C);
    ln_bwd_final_kernel<T><<<cdiv((size_t)NS * C, 32), 1024, 0, st>>>(dw, db, ds, partial, G, C, NS);
    LAUNCH_CHECK();
}

void cuda_layernorm_backward(Backend* be, void* dinp, void* dw, void* db, void* dsum, const void* dout,
                             const void* inp, const void* w, const float* mean, const float* rstd, int N,
                             int C) {
    if (be->dtype == DTYPE_BF16)
        ln_bwd<bf16>(be, (bf16*)dinp, (bf16*)dw, (bf16*)db, (bf16*)dsum, (const bf16*)dout, (const bf16*)inp,
                     (const bf16*)w, mean, rstd, N, C);
    else
        ln_bwd<float>(be, (float*)dinp, (float*)dw, (float*)db, (float*)dsum, (const float*)dout,
                      (const float*)inp, (const float*)w, mean, rstd, N, C);
}
