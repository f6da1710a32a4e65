/* kernels/cuda/attention.cu — causal self-attention, forward and backward,
 * flash style: the T x T score matrix is never stored.
 *
 * Layout: qkv[B,T,3C] (q | k | v; head h at columns h*HS of each third),
 * out[B,T,C], lse[B,NH,T] = logsumexp of the scaled scores (natural log).
 *
 * bf16 with HS 64 or 128: tensor-core kernels (mma.sync m16n8k16, bf16 in,
 * fp32 accumulate; tiles moved to shared memory with cp.async, fragments with
 * ldmatrix). 4 warps a block, 64 queries or keys a block, 16 rows a warp.
 *  - forward: one block per (64-query block, b, h), online softmax over the
 *    key blocks 0..qb (K/V double-buffered), P rounded to bf16 for P.V.
 *  - backward, no atomics: D = rowsum(dO * O) first; then one kernel per key
 *    block computes dK and dV walking the query blocks qb >= kb, and one per
 *    query block computes dQ walking the key blocks kb <= qb. Each output
 *    element is written once by one thread: deterministic.
 * Everything else (fp32 mode, other head sizes up to 128, misaligned
 * pointers): straightforward fp32-arithmetic kernels, a warp per row, same
 * algorithm; used as the exact path in fp32 mode. */
#include "common.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ------------------------------------------------------------------------ */
/* PTX helpers                                                              */
/* ------------------------------------------------------------------------ */
/* cp_async16 / cp_async_commit / cp_async_wait: common.cuh */
__device__ __forceinline__ void ldsm4(uint32_t* r, const bf16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t* r, const bf16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* c[4] += a[4] (16x16 bf16, row) * (b0, b1) (16x8 bf16, col) */
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

/* Fragment addressing for a warp (lane = 0..31), smem row-major with row
 * length LD elements:
 *  A 16x16 at (r0, c0):                      frag_a
 *  B for n-tiles n0, n0+8, k-chunk c0, where smem rows are n and columns k
 *  (e.g. K[key][d] for S = Q K^T):           frag_b_nmajor -> {b0,b1}(n0), {b0,b1}(n0+8)
 *  B for k-chunk k0, n-tiles n0, n0+8, where smem rows are k and columns n
 *  (e.g. V[key][d] for O = P V):             frag_b_kmajor (ldmatrix.trans) */
template <int LD> __device__ __forceinline__ void frag_a(uint32_t* a, const bf16* s, int r0, int c0, int lane) {
    ldsm4(a, s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + c0 + (lane >> 4) * 8);
}
template <int LD>
__device__ __forceinline__ void frag_b_nmajor(uint32_t* b, const bf16* s, int n0, int c0, int lane) {
    ldsm4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + c0 + ((lane >> 3) & 1) * 8);
}
template <int LD>
__device__ __forceinline__ void frag_b_kmajor(uint32_t* b, const bf16* s, int k0, int n0, int lane) {
    ldsm4t(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

/* rows [t0, t0+ROWS) of a head's HS columns into smem [ROWS][HS+8]; rows >= T
 * are zero-filled. base points at row 0 of the head; stride in elements.
 * NT threads share the copy. */
template <int HS, int ROWS, int NT>
__device__ __forceinline__ void load_tile(bf16* sm, const bf16* base, int t0, int T, int stride) {
    constexpr int CPR = HS / 8;
    constexpr int LD = HS + 8;
    for (int i = threadIdx.x; i < ROWS * CPR; i += NT) {
        int r = i / CPR, cc = i % CPR;
        int t = t0 + r;
        bool ok = t < T;
        const bf16* src = base + (size_t)(ok ? t : 0) * stride + cc * 8;
        cp_async16(sm + r * LD + cc * 8, src, ok);
    }
}

/* Tiles: the block's own rows (queries in forward and dQ, keys in dK/dV) are
 * 16*NW, a warp each 16; the rows it walks over come in tiles of 64. */
template <int HS, int NW> static constexpr size_t fwd_smem() {
    return (size_t)(16 * NW + 4 * 64) * (HS + 8) * sizeof(bf16);
}
template <int HS, int NW> static constexpr size_t dkdv_smem() {
    return (size_t)(2 * 16 * NW + 4 * 64) * (HS + 8) * sizeof(bf16) + 4 * 64 * sizeof(float);
}
template <int HS, int NW> static constexpr size_t dq_smem() {
    return (size_t)(2 * 16 * NW + 4 * 64) * (HS + 8) * sizeof(bf16);
}

/* ------------------------------------------------------------------------ */
/* forward (tensor cores)                                                   */
/* ------------------------------------------------------------------------ */
template <int HS, int NW>
__global__ void __launch_bounds__(NW * 32)
    attn_fwd_mma(bf16* out, float* lse, const bf16* qkv, int T, int NH, float sl2) {
    constexpr int LD = HS + 8;
    constexpr int BR = 16 * NW;
    constexpr int NT = NW * 32;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* Qs = (bf16*)smraw;
    bf16* Ks = Qs + BR * LD;
    bf16* Vs = Ks + 2 * 64 * LD;
    const int qb = gridDim.x - 1 - blockIdx.x; /* heavy blocks first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qb * BR;
    const int qw0 = q0 + warp * 16; /* this warp's first query */

    load_tile<HS, BR, NT>(Qs, base, q0, T, C3);
    cp_async_commit();
    load_tile<HS, 64, NT>(Ks, base + C, 0, T, C3);
    load_tile<HS, 64, NT>(Vs, base + 2 * C, 0, T, C3);
    cp_async_commit();

    uint32_t qf[HS / 16][4];
    float o[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int nkb = (min(q0 + BR, T) - 1) / 64 + 1;
    const int qrow0 = qw0 + g;

    for (int kb = 0; kb < nkb; kb++) {
        const int cur = kb & 1;
        if (kb + 1 < nkb) {
            load_tile<HS, 64, NT>(Ks + (cur ^ 1) * 64 * LD, base + C, (kb + 1) * 64, T, C3);
            load_tile<HS, 64, NT>(Vs + (cur ^ 1) * 64 * LD, base + 2 * C, (kb + 1) * 64, T, C3);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kb == 0) {
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) frag_a<LD>(qf[kc], Qs, warp * 16, kc * 16, lane);
        }
        if (kb * 64 <= qw0 + 15) { /* else every key of this tile is in this warp's future */
            const bf16* Kc = Ks + cur * 64 * LD;
            const bf16* Vc = Vs + cur * 64 * LD;
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int np = 0; np < 4; np++) {
#pragma unroll
                for (int kc = 0; kc < HS / 16; kc++) {
                    uint32_t bb[4];
                    frag_b_nmajor<LD>(bb, Kc, np * 16, kc * 16, lane);
                    mma16816(s[2 * np], qf[kc], bb[0], bb[1]);
                    mma16816(s[2 * np + 1], qf[kc], bb[2], bb[3]);
                }
            }
            const bool diag = kb * 64 + 63 > qw0;
            float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[j][e] * sl2;
                    if (diag) {
                        int key = kb * 64 + j * 8 + 2 * t4 + (e & 1);
                        int q = qrow0 + (e >> 1) * 8;
                        if (key > q) v = -INFINITY;
                    }
                    s[j][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                alpha[r] = exp2f(mrow[r] - mx[r]);
                mrow[r] = mx[r];
                lrow[r] *= alpha[r];
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[j][e] - mrow[e >> 1]);
                    s[j][e] = p;
                    lrow[e >> 1] += p;
                }
            }
#pragma unroll
            for (int i = 0; i < HS / 8; i++) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                  pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                  pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
                for (int dp = 0; dp < HS / 16; dp++) {
                    uint32_t bb[4];
                    frag_b_kmajor<LD>(bb, Vc, kc * 16, dp * 16, lane);
                    mma16816(o[2 * dp], pa, bb[0], bb[1]);
                    mma16816(o[2 * dp + 1], pa, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = 1.0f / l;
        int q = qrow0 + r * 8;
        if (q < T) {
            bf16* dst = out + ((size_t)b * T + q) * C + h * HS + 2 * t4;
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *reinterpret_cast<uint32_t*>(dst + i * 8) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
            if (t4 == 0) lse[(size_t)bh * T + q] = (mrow[r] + log2f(l)) * LN2;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* backward (tensor cores)                                                  */
/* ------------------------------------------------------------------------ */
/* dK, dV for one block of 16*NW keys; warp w owns keys k0 + 16w .. +15. */
template <int HS, int NW>
__global__ void __launch_bounds__(NW * 32)
    attn_bwd_dkdv_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* Dbuf, int T,
                      int NH, float sl2, float scale) {
    constexpr int LD = HS + 8;
    constexpr int BK = 16 * NW;
    constexpr int NT = NW * 32;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* Ks = (bf16*)smraw;
    bf16* Vs = Ks + BK * LD;
    bf16* Qs = Vs + BK * LD;                    /* [2][64][LD] */
    bf16* dOs = Qs + 2 * 64 * LD;               /* [2][64][LD] */
    float* lse_s = (float*)(dOs + 2 * 64 * LD); /* [2][64], log2 units */
    float* D_s = lse_s + 2 * 64;                /* [2][64] */
    const int kb = blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const bf16* obase = dout + (size_t)b * T * C + h * HS;
    const float* lse_bh = lse + (size_t)bh * T;
    const float* D_bh = Dbuf + (size_t)bh * T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int k0 = kb * BK;
    const int kw0 = k0 + warp * 16; /* this warp's first key */
    const int nqb = (T + 63) / 64;
    const int qb0 = k0 / 64;

    load_tile<HS, BK, NT>(Ks, base + C, k0, T, C3);
    load_tile<HS, BK, NT>(Vs, base + 2 * C, k0, T, C3);
    load_tile<HS, 64, NT>(Qs, base, qb0 * 64, T, C3);
    load_tile<HS, 64, NT>(dOs, obase, qb0 * 64, T, C);
    cp_async_commit();
    if (threadIdx.x < 64) {
        int q = qb0 * 64 + threadIdx.x;
        lse_s[threadIdx.x] = q < T ? lse_bh[q] * LOG2E : INFINITY;
        D_s[threadIdx.x] = q < T ? D_bh[q] : 0.0f;
    }

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.0f;
    const int keyrow0 = kw0 + g;

    for (int qb = qb0; qb < nqb; qb++) {
        const int cur = (qb - qb0) & 1;
        if (qb + 1 < nqb) {
            load_tile<HS, 64, NT>(Qs + (cur ^ 1) * 64 * LD, base, (qb + 1) * 64, T, C3);
            load_tile<HS, 64, NT>(dOs + (cur ^ 1) * 64 * LD, obase, (qb + 1) * 64, T, C);
            cp_async_commit();
            if (threadIdx.x < 64) {
                int q = (qb + 1) * 64 + threadIdx.x;
                lse_s[(cur ^ 1) * 64 + threadIdx.x] = q < T ? lse_bh[q] * LOG2E : INFINITY;
                D_s[(cur ^ 1) * 64 + threadIdx.x] = q < T ? D_bh[q] : 0.0f;
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (qb * 64 + 63 >= kw0) { /* else every query of this tile precedes this warp's keys */
            const bf16* Qc = Qs + cur * 64 * LD;
            const bf16* dOc = dOs + cur * 64 * LD;
            const float* lsec = lse_s + cur * 64;
            const float* Dc = D_s + cur * 64;

            /* S^T = K_w Q^T (16 keys x 64 queries) and dP^T = V_w dO^T */
            float s[8][4], dp[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) {
                uint32_t ka[4], va[4];
                frag_a<LD>(ka, Ks, warp * 16, kc * 16, lane);
                frag_a<LD>(va, Vs, warp * 16, kc * 16, lane);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bq[4], bo[4];
                    frag_b_nmajor<LD>(bq, Qc, np * 16, kc * 16, lane);
                    frag_b_nmajor<LD>(bo, dOc, np * 16, kc * 16, lane);
                    mma16816(s[2 * np], ka, bq[0], bq[1]);
                    mma16816(s[2 * np + 1], ka, bq[2], bq[3]);
                    mma16816(dp[2 * np], va, bo[0], bo[1]);
                    mma16816(dp[2 * np + 1], va, bo[2], bo[3]);
                }
            }
            const bool diag = qb * 64 < kw0 + 15;
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qi = j * 8 + 2 * t4 + (e & 1);
                    float p = exp2f(s[j][e] * sl2 - lsec[qi]);
                    if (diag) {
                        int key = keyrow0 + (e >> 1) * 8;
                        if (qb * 64 + qi < key) p = 0.0f;
                    }
                    s[j][e] = p;
                    dp[j][e] = p * (dp[j][e] - Dc[qi]); /* dS^T */
                }
            }
            /* dV += P^T dO ; dK += dS^T Q (k-dim = queries) */
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                  pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                  pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
                uint32_t da[4] = {pack_bf16(dp[2 * kc][0], dp[2 * kc][1]),
                                  pack_bf16(dp[2 * kc][2], dp[2 * kc][3]),
                                  pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                  pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
#pragma unroll
                for (int dd = 0; dd < HS / 16; dd++) {
                    uint32_t bo[4], bq[4];
                    frag_b_kmajor<LD>(bo, dOc, kc * 16, dd * 16, lane);
                    frag_b_kmajor<LD>(bq, Qc, kc * 16, dd * 16, lane);
                    mma16816(dv[2 * dd], pa, bo[0], bo[1]);
                    mma16816(dv[2 * dd + 1], pa, bo[2], bo[3]);
                    mma16816(dk[2 * dd], da, bq[0], bq[1]);
                    mma16816(dk[2 * dd + 1], da, bq[2], bq[3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = keyrow0 + r * 8;
        if (key < T) {
            bf16* dst = dqkv + ((size_t)b * T + key) * C3 + h * HS + 2 * t4;
#pragma unroll
            for (int i = 0; i < HS / 8; i++) {
                *reinterpret_cast<uint32_t*>(dst + C + i * 8) =
                    pack_bf16(dk[i][2 * r] * scale, dk[i][2 * r + 1] * scale);
                *reinterpret_cast<uint32_t*>(dst + 2 * C + i * 8) = pack_bf16(dv[i][2 * r], dv[i][2 * r + 1]);
            }
        }
    }
}

/* dQ for one block of 16*NW queries; warp w owns queries q0 + 16w .. +15. */
template <int HS, int NW>
__global__ void __launch_bounds__(NW * 32)
    attn_bwd_dq_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* Dbuf, int T,
                    int NH, float sl2, float scale) {
    constexpr int LD = HS + 8;
    constexpr int BR = 16 * NW;
    constexpr int NT = NW * 32;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* Qs = (bf16*)smraw;
    bf16* dOs = Qs + BR * LD;
    bf16* Ks = dOs + BR * LD; /* [2][64][LD] */
    bf16* Vs = Ks + 2 * 64 * LD;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const bf16* obase = dout + (size_t)b * T * C + h * HS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qb * BR;
    const int qw0 = q0 + warp * 16;
    const int qrow0 = qw0 + g;

    load_tile<HS, BR, NT>(Qs, base, q0, T, C3);
    load_tile<HS, BR, NT>(dOs, obase, q0, T, C);
    cp_async_commit();
    load_tile<HS, 64, NT>(Ks, base + C, 0, T, C3);
    load_tile<HS, 64, NT>(Vs, base + 2 * C, 0, T, C3);
    cp_async_commit();

    float lse2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int q = qrow0 + r * 8;
        lse2[r] = q < T ? lse[(size_t)bh * T + q] * LOG2E : INFINITY;
        Dr[r] = q < T ? Dbuf[(size_t)bh * T + q] : 0.0f;
    }
    uint32_t qf[HS / 16][4], of[HS / 16][4];
    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    const int nkb = (min(q0 + BR, T) - 1) / 64 + 1;

    for (int kb = 0; kb < nkb; kb++) {
        const int cur = kb & 1;
        if (kb + 1 < nkb) {
            load_tile<HS, 64, NT>(Ks + (cur ^ 1) * 64 * LD, base + C, (kb + 1) * 64, T, C3);
            load_tile<HS, 64, NT>(Vs + (cur ^ 1) * 64 * LD, base + 2 * C, (kb + 1) * 64, T, C3);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kb == 0) {
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) {
                frag_a<LD>(qf[kc], Qs, warp * 16, kc * 16, lane);
                frag_a<LD>(of[kc], dOs, warp * 16, kc * 16, lane);
            }
        }
        if (kb * 64 <= qw0 + 15) {
            const bf16* Kc = Ks + cur * 64 * LD;
            const bf16* Vc = Vs + cur * 64 * LD;
            float s[8][4], dp[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
            for (int np = 0; np < 4; np++) {
#pragma unroll
                for (int kc = 0; kc < HS / 16; kc++) {
                    uint32_t bk[4], bv[4];
                    frag_b_nmajor<LD>(bk, Kc, np * 16, kc * 16, lane);
                    frag_b_nmajor<LD>(bv, Vc, np * 16, kc * 16, lane);
                    mma16816(s[2 * np], qf[kc], bk[0], bk[1]);
                    mma16816(s[2 * np + 1], qf[kc], bk[2], bk[3]);
                    mma16816(dp[2 * np], of[kc], bv[0], bv[1]);
                    mma16816(dp[2 * np + 1], of[kc], bv[2], bv[3]);
                }
            }
            const bool diag = kb * 64 + 63 > qw0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[j][e] * sl2 - lse2[e >> 1]);
                    if (diag) {
                        int key = kb * 64 + j * 8 + 2 * t4 + (e & 1);
                        if (key > qrow0 + (e >> 1) * 8) p = 0.0f;
                    }
                    dp[j][e] = p * (dp[j][e] - Dr[e >> 1]); /* dS */
                }
            }
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                uint32_t da[4] = {pack_bf16(dp[2 * kc][0], dp[2 * kc][1]),
                                  pack_bf16(dp[2 * kc][2], dp[2 * kc][3]),
                                  pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                  pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
#pragma unroll
                for (int dd = 0; dd < HS / 16; dd++) {
                    uint32_t bk[4];
                    frag_b_kmajor<LD>(bk, Kc, kc * 16, dd * 16, lane);
                    mma16816(dq[2 * dd], da, bk[0], bk[1]);
                    mma16816(dq[2 * dd + 1], da, bk[2], bk[3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int q = qrow0 + r * 8;
        if (q < T) {
            bf16* dst = dqkv + ((size_t)b * T + q) * C3 + h * HS + 2 * t4;
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *reinterpret_cast<uint32_t*>(dst + i * 8) =
                    pack_bf16(dq[i][2 * r] * scale, dq[i][2 * r + 1] * scale);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* generic kernels: any type, HS <= 128, a warp per row                     */
/* ------------------------------------------------------------------------ */
#define GW 4 /* warps per block */

template <typename T>
__global__ void attn_fwd_generic(T* out, float* lse, const T* qkv, int B, int T_, int NH, int HS, float scale) {
    __shared__ float qs[GW][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)blockIdx.x * GW + warp;
    if (row >= (long)B * NH * T_) return;
    const int t = (int)(row % T_);
    const int bh = (int)(row / T_), b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const T* bq = qkv + (size_t)b * T_ * C3 + h * HS;
    for (int d = lane; d < HS; d += 32) qs[warp][d] = to_f<T>(bq[(size_t)t * C3 + d]);
    __syncwarp();
    float m = -INFINITY, l = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = 0; j0 <= t; j0 += 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        if (j <= t) {
            const T* kp = bq + (size_t)j * C3 + C;
            float acc = 0.0f;
            for (int d = 0; d < HS; d++) acc += qs[warp][d] * to_f<T>(kp[d]);
            s = acc * scale;
        }
        float mn = fmaxf(m, warp_max(s));
        float corr = expf(m - mn);
        float p = j <= t ? expf(s - mn) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] *= corr;
        int cnt = min(32, t - j0 + 1);
        for (int jj = 0; jj < cnt; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const T* vp = bq + (size_t)(j0 + jj) * C3 + 2 * C;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int d = lane + 32 * i;
                if (d < HS) o[i] += pj * to_f<T>(vp[d]);
            }
        }
        m = mn;
    }
    T* op = out + ((size_t)b * T_ + t) * C + h * HS;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int d = lane + 32 * i;
        if (d < HS) op[d] = from_f<T>(o[i] / l);
    }
    if (lane == 0) lse[(size_t)bh * T_ + t] = m + logf(l);
}

/* D[bh, t] = sum_d dout * out (fp32) */
template <typename T>
__global__ void attn_bwd_pre(float* Dbuf, const T* dout, const T* out, int B, int T_, int NH, int HS) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)blockIdx.x * 8 + warp;
    if (row >= (long)B * NH * T_) return;
    const int t = (int)(row % T_);
    const int bh = (int)(row / T_), b = bh / NH, h = bh % NH;
    const int C = NH * HS;
    const T* a = dout + ((size_t)b * T_ + t) * C + h * HS;
    const T* o = out + ((size_t)b * T_ + t) * C + h * HS;
    float s = 0.0f;
    for (int d = lane; d < HS; d += 32) s += to_f<T>(a[d]) * to_f<T>(o[d]);
    s = warp_sum(s);
    if (lane == 0) Dbuf[row] = s;
}
/* the same for bf16 rows of HS = 8 L elements, 16-byte aligned: L lanes a
 * row, each with one 16-byte vector of dO and of O, summed across the L lanes */
template <int L>
__global__ void attn_bwd_pre_vec(float* Dbuf, const bf16* dout, const bf16* out, long rows, int T_, int NH) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long row = i / L;
    const int c = (int)(i % L);
    const int t = (int)(row % T_), bh = (int)(row / T_);
    const float s = attn_row_dot<L>(dout, out, bh / NH, t, bh % NH, T_, NH, c, row < rows);
    if (row < rows && c == 0) Dbuf[row] = s;
}

template <typename T>
__global__ void attn_bwd_dq_generic(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dbuf,
                                    int B, int T_, int NH, int HS, float scale) {
    __shared__ float qs[GW][128], dos[GW][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)blockIdx.x * GW + warp;
    if (row >= (long)B * NH * T_) return;
    const int t = (int)(row % T_);
    const int bh = (int)(row / T_), b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const T* bq = qkv + (size_t)b * T_ * C3 + h * HS;
    const T* bo = dout + ((size_t)b * T_ + t) * C + h * HS;
    for (int d = lane; d < HS; d += 32) {
        qs[warp][d] = to_f<T>(bq[(size_t)t * C3 + d]);
        dos[warp][d] = to_f<T>(bo[d]);
    }
    __syncwarp();
    const float L = lse[row], Dt = Dbuf[row];
    float dq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = 0; j0 <= t; j0 += 32) {
        int j = j0 + lane;
        float ds = 0.0f;
        if (j <= t) {
            const T* kp = bq + (size_t)j * C3 + C;
            const T* vp = bq + (size_t)j * C3 + 2 * C;
            float sd = 0.0f, dp = 0.0f;
            for (int d = 0; d < HS; d++) {
                sd += qs[warp][d] * to_f<T>(kp[d]);
                dp += dos[warp][d] * to_f<T>(vp[d]);
            }
            float p = expf(sd * scale - L);
            ds = p * (dp - Dt);
        }
        int cnt = min(32, t - j0 + 1);
        for (int jj = 0; jj < cnt; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            const T* kp = bq + (size_t)(j0 + jj) * C3 + C;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int d = lane + 32 * i;
                if (d < HS) dq[i] += dsj * to_f<T>(kp[d]);
            }
        }
    }
    T* dst = dqkv + ((size_t)b * T_ + t) * C3 + h * HS;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int d = lane + 32 * i;
        if (d < HS) dst[d] = from_f<T>(dq[i] * scale);
    }
}

template <typename T>
__global__ void attn_bwd_dkdv_generic(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dbuf,
                                      int B, int T_, int NH, int HS, float scale) {
    __shared__ float ks[GW][128], vs[GW][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)blockIdx.x * GW + warp;
    if (row >= (long)B * NH * T_) return;
    const int j = (int)(row % T_); /* key */
    const int bh = (int)(row / T_), b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const T* bq = qkv + (size_t)b * T_ * C3 + h * HS;
    const T* bo = dout + (size_t)b * T_ * C + h * HS;
    for (int d = lane; d < HS; d += 32) {
        ks[warp][d] = to_f<T>(bq[(size_t)j * C3 + C + d]);
        vs[warp][d] = to_f<T>(bq[(size_t)j * C3 + 2 * C + d]);
    }
    __syncwarp();
    const float* L = lse + (size_t)bh * T_;
    const float* Dd = Dbuf + (size_t)bh * T_;
    float dk[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t0 = j; t0 < T_; t0 += 32) {
        int t = t0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (t < T_) {
            const T* qp = bq + (size_t)t * C3;
            const T* op = bo + (size_t)t * C;
            float sd = 0.0f, dp = 0.0f;
            for (int d = 0; d < HS; d++) {
                sd += to_f<T>(qp[d]) * ks[warp][d];
                dp += to_f<T>(op[d]) * vs[warp][d];
            }
            p = expf(sd * scale - L[t]);
            ds = p * (dp - Dd[t]);
        }
        int cnt = min(32, T_ - t0);
        for (int tt = 0; tt < cnt; tt++) {
            float pt = __shfl_sync(0xffffffffu, p, tt);
            float dst = __shfl_sync(0xffffffffu, ds, tt);
            const T* qp = bq + (size_t)(t0 + tt) * C3;
            const T* op = bo + (size_t)(t0 + tt) * C;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int d = lane + 32 * i;
                if (d < HS) {
                    dv[i] += pt * to_f<T>(op[d]);
                    dk[i] += dst * to_f<T>(qp[d]);
                }
            }
        }
    }
    T* dst = dqkv + ((size_t)b * T_ + j) * C3 + h * HS;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int d = lane + 32 * i;
        if (d < HS) {
            dst[C + d] = from_f<T>(dk[i] * scale);
            dst[2 * C + d] = from_f<T>(dv[i]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* dispatch                                                                 */
/* ------------------------------------------------------------------------ */
/* Kernel choice for the forward, dK/dV and dQ: the wgmma kernels
 * (attention_sm90.cu) on a compute capability 9.0 GPU with head size 64,
 * else the mma.sync kernels with 8, 4 and 4 warps a block (4 or 8 each: 64
 * or 128 own rows a block), the fastest measured (docs/CUDA.md). The
 * environment variable GPT2_CUDA_ATTN="fwd,dkdv,dq" overrides it for
 * benchmarking and tests: each 4 or 8 (mma.sync warps) or w (wgmma; head
 * size 64 only, other head sizes then take the default warps; one wgmma
 * kernel computes dK, dV and dQ, so the second and third are w together). */
template <int HS, int NW> static void attn_set_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_mma<HS, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem<HS, NW>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_mma<HS, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem<HS, NW>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_mma<HS, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem<HS, NW>()));
}

void cuda_attention_init(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    const int sm90 = c->sm90 && attn_sm90_init(be);
    for (int k = 0; k < 3; k++) c->attn_nw[k] = sm90 ? 0 : (k == 0 ? 8 : 4);
    const char* env = getenv("GPT2_CUDA_ATTN");
    if (env && *env) {
        char f[3][8];
        if (sscanf(env, "%7[^,],%7[^,],%7s", f[0], f[1], f[2]) != 3)
            fatal(
                "GPT2_CUDA_ATTN='%s': expected three choices, each 4, 8 (warps a block) or w (wgmma), e.g. 8,4,4",
                env);
        for (int k = 0; k < 3; k++) {
            if (!strcmp(f[k], "w") && sm90) c->attn_nw[k] = 0;
            else if (!strcmp(f[k], "w"))
                fatal(
                    "GPT2_CUDA_ATTN='%s': w (the wgmma kernels) needs a compute capability 9.0 GPU and a build "
                    "for sm_90a",
                    env);
            else if (!strcmp(f[k], "4") || !strcmp(f[k], "8")) c->attn_nw[k] = f[k][0] - '0';
            else fatal("GPT2_CUDA_ATTN='%s': '%s' is not 4, 8 (warps a block) or w (wgmma)", env, f[k]);
        }
        if ((c->attn_nw[1] == 0) != (c->attn_nw[2] == 0))
            fatal("GPT2_CUDA_ATTN='%s': w for dK/dV and dQ go together (one wgmma kernel computes both)", env);
    }
    attn_set_smem<64, 4>();
    attn_set_smem<64, 8>();
    attn_set_smem<128, 4>();
    attn_set_smem<128, 8>();
}

template <int HS, int NW>
static void attn_fwd_launch(cudaStream_t st, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                            float sl2) {
    dim3 grid((T + 16 * NW - 1) / (16 * NW), B * NH);
    attn_fwd_mma<HS, NW><<<grid, NW * 32, fwd_smem<HS, NW>(), st>>>(out, lse, qkv, T, NH, sl2);
    LAUNCH_CHECK();
}
template <int HS, int NW>
static void attn_dkdv_launch(cudaStream_t st, bf16* dq, const bf16* d, const bf16* q, const float* lse,
                             const float* Dbuf, int B, int T, int NH, float sl2, float scale) {
    dim3 grid((T + 16 * NW - 1) / (16 * NW), B * NH);
    attn_bwd_dkdv_mma<HS, NW>
        <<<grid, NW * 32, dkdv_smem<HS, NW>(), st>>>(dq, d, q, lse, Dbuf, T, NH, sl2, scale);
    LAUNCH_CHECK();
}
template <int HS, int NW>
static void attn_dq_launch(cudaStream_t st, bf16* dq, const bf16* d, const bf16* q, const float* lse,
                           const float* Dbuf, int B, int T, int NH, float sl2, float scale) {
    dim3 grid((T + 16 * NW - 1) / (16 * NW), B * NH);
    attn_bwd_dq_mma<HS, NW><<<grid, NW * 32, dq_smem<HS, NW>(), st>>>(dq, d, q, lse, Dbuf, T, NH, sl2, scale);
    LAUNCH_CHECK();
}

static void attn_check(int T, int C, int NH, const char* what) {
    if (NH <= 0 || C % NH != 0) fatal("%s: C=%d is not divisible by NH=%d", what, C, NH);
    if (C / NH > 128) fatal("%s: head size %d is larger than the CUDA backend supports (128)", what, C / NH);
    (void)T;
}

static bool use_mma(Backend* be, int HS, const void* a, const void* b, const void* c) {
    return be->dtype == DTYPE_BF16 && (HS == 64 || HS == 128) && aligned16(a) && aligned16(b) &&
           (c == nullptr || aligned16(c));
}

void cuda_attention_forward(Backend* be, void* out, float* lse, const void* qkv, int B, int T, int C, int NH) {
    attn_check(T, C, NH, "attention_forward");
    if (B == 0 || T == 0) return;
    cudaStream_t st = cuda_ctx(be)->stream;
    int HS = C / NH;
    float scale = 1.0f / sqrtf((float)HS);
    if (use_mma(be, HS, out, qkv, nullptr)) {
        int nw = cuda_ctx(be)->attn_nw[0];
        bf16* o = (bf16*)out;
        const bf16* q = (const bf16*)qkv;
        float sl2 = scale * LOG2E;
        if (nw == 0 && HS == 64) {
            attn_sm90_forward(st, o, lse, q, B, T, NH, sl2);
            return;
        }
        if (nw == 0) nw = 8;
        if (HS == 64) {
            if (nw == 8) attn_fwd_launch<64, 8>(st, o, lse, q, B, T, NH, sl2);
            else attn_fwd_launch<64, 4>(st, o, lse, q, B, T, NH, sl2);
        } else {
            if (nw == 8) attn_fwd_launch<128, 8>(st, o, lse, q, B, T, NH, sl2);
            else attn_fwd_launch<128, 4>(st, o, lse, q, B, T, NH, sl2);
        }
        return;
    } else {
        unsigned grid = cdiv((size_t)B * NH * T, GW);
        if (be->dtype == DTYPE_BF16)
            attn_fwd_generic<bf16>
                <<<grid, GW * 32, 0, st>>>((bf16*)out, lse, (const bf16*)qkv, B, T, NH, HS, scale);
        else
            attn_fwd_generic<float>
                <<<grid, GW * 32, 0, st>>>((float*)out, lse, (const float*)qkv, B, T, NH, HS, scale);
    }
    LAUNCH_CHECK();
}

void cuda_attention_backward(Backend* be, void* dqkv, void* dbias, const void* dout, const void* qkv,
                             const void* out, const float* lse, int B, int T, int C, int NH) {
    attn_check(T, C, NH, "attention_backward");
    if (B == 0 || T == 0) return;
    cudaStream_t st = cuda_ctx(be)->stream;
    int HS = C / NH;
    float scale = 1.0f / sqrtf((float)HS);
    size_t rows = (size_t)B * NH * T;
    const bool mma = use_mma(be, HS, dqkv, qkv, dout);
    int nw1 = cuda_ctx(be)->attn_nw[1], nw2 = cuda_ctx(be)->attn_nw[2];
    /* The wgmma backward (dK/dV and dQ are w together) and its scratch. The
     * qkv bias gradient: its epilogue leaves per-block column sums of what it
     * stores in partial ([B * nblk][3C], every element written once), summed
     * in a fixed order after it; elsewhere a column sum over dqkv after the
     * kernels. */
    const bool sm90 = mma && HS == 64 && nw1 == 0 && aligned16(out); /* its D pass reads out by 16 bytes */
    const bool fused_bias = dbias != nullptr && sm90;
    const int nblk = (T + 127) / 128;
    /* Dbuf and partial from one scratch call: a second call may reallocate
     * and free the first one's buffer. The wgmma kernel's D and lse go
     * together, in whole 64-query tiles (attn_sm90_backward). */
    const size_t Tp = (size_t)(T + 63) / 64 * 64;
    const size_t dbytes = ((sm90 ? (size_t)B * NH * Tp * 2 : rows) * sizeof(float) + 255) & ~(size_t)255;
    const size_t pbytes = fused_bias ? (size_t)B * nblk * 3 * C * sizeof(float) : 0;
    /* the wgmma kernel's fp32 dQ accumulator and turn counters */
    const size_t abytes = sm90 ? rows * 64 * sizeof(float) : 0;
    const size_t tbytes = sm90 ? ((size_t)B * NH * ((T + 63) / 64) + 1) * sizeof(int) : 0;
    char* scratch = (char*)cuda_scratch(be, dbytes + pbytes + abytes + tbytes);
    float* Dbuf = (float*)scratch;
    float* partial = fused_bias ? (float*)(scratch + dbytes) : nullptr;
    float* dqacc = (float*)(scratch + dbytes + pbytes);
    int* turn = (int*)(scratch + dbytes + pbytes + abytes);
    if (sm90) {
        /* D computed there, beside lse, in the layout its compute warps copy */
        attn_sm90_backward(be, (bf16*)dqkv, partial, dqacc, turn, (float*)Dbuf, (const bf16*)dout,
                           (const bf16*)out, (const bf16*)qkv, lse, B, T, NH, scale * LOG2E, scale);
    } else {
        const bool vec = be->dtype == DTYPE_BF16 && aligned16(dout) && aligned16(out);
        if (vec && HS == 64)
            attn_bwd_pre_vec<8><<<cdiv(rows * 8, 256), 256, 0, st>>>(
                Dbuf, (const bf16*)dout, (const bf16*)out, (long)rows, T, NH);
        else if (vec && HS == 128)
            attn_bwd_pre_vec<16><<<cdiv(rows * 16, 256), 256, 0, st>>>(
                Dbuf, (const bf16*)dout, (const bf16*)out, (long)rows, T, NH);
        else if (be->dtype == DTYPE_BF16)
            attn_bwd_pre<bf16>
                <<<cdiv(rows, 8), 256, 0, st>>>(Dbuf, (const bf16*)dout, (const bf16*)out, B, T, NH, HS);
        else
            attn_bwd_pre<float>
                <<<cdiv(rows, 8), 256, 0, st>>>(Dbuf, (const float*)dout, (const float*)out, B, T, NH, HS);
        LAUNCH_CHECK();
        if (mma) {
            const bf16* q = (const bf16*)qkv;
            const bf16* d = (const bf16*)dout;
            bf16* dq = (bf16*)dqkv;
            float sl2 = scale * LOG2E;
            if (HS == 64) {
                if (nw1 == 0) nw1 = 4; /* asked for the wgmma kernel, which cannot take this out */
                if (nw2 == 0) nw2 = 4;
                if (nw1 == 8) attn_dkdv_launch<64, 8>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                else if (nw1 == 4) attn_dkdv_launch<64, 4>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                if (nw2 == 8) attn_dq_launch<64, 8>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                else if (nw2 == 4) attn_dq_launch<64, 4>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
            } else {
                if (nw1 == 0) nw1 = 4;
                if (nw2 == 0) nw2 = 4;
                if (nw1 == 8) attn_dkdv_launch<128, 8>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                else attn_dkdv_launch<128, 4>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                if (nw2 == 8) attn_dq_launch<128, 8>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
                else attn_dq_launch<128, 4>(st, dq, d, q, lse, Dbuf, B, T, NH, sl2, scale);
            }
        } else {
            unsigned grid = cdiv(rows, GW);
            if (be->dtype == DTYPE_BF16) {
                attn_bwd_dq_generic<bf16><<<grid, GW * 32, 0, st>>>(
                    (bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, Dbuf, B, T, NH, HS, scale);
                LAUNCH_CHECK();
                attn_bwd_dkdv_generic<bf16><<<grid, GW * 32, 0, st>>>(
                    (bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, Dbuf, B, T, NH, HS, scale);
            } else {
                attn_bwd_dq_generic<float><<<grid, GW * 32, 0, st>>>(
                    (float*)dqkv, (const float*)dout, (const float*)qkv, lse, Dbuf, B, T, NH, HS, scale);
                LAUNCH_CHECK();
                attn_bwd_dkdv_generic<float><<<grid, GW * 32, 0, st>>>(
                    (float*)dqkv, (const float*)dout, (const float*)qkv, lse, Dbuf, B, T, NH, HS, scale);
            }
            LAUNCH_CHECK();
        }
    }
    /* after the kernels on the same stream; cuda_bias_colsum_add's own
     * scratch call may reuse Dbuf's memory (queued after the kernels that
     * read it) or grow it (synchronising the stream first) */
    if (fused_bias) cuda_bias_partials_add(be, dbias, partial, B * nblk, 3 * C);
    else if (dbias) cuda_bias_colsum_add(be, dbias, dqkv, B * T, 3 * C);
}
