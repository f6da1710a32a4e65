/* kernels/cuda/attention_sm90.cu — causal attention for Hopper (sm_90a),
 * bf16, head size 64: the same algorithm as attention.cu's tensor-core
 * kernels (flash forward with online softmax; backward as D = rowsum(dO*O),
 * a dK/dV kernel per key block and a dQ kernel per query block, each output
 * written once: deterministic), with the matrix products on warpgroup MMA
 * (wgmma, m64n64k16, bf16 in, fp32 accumulate).
 *
 * Shared-memory tiles: rows of 64 bf16 = 128 bytes, stored with the 128-byte
 * swizzle that wgmma reads (16-byte chunk c of row r at chunk c ^ (r & 7),
 * every tile 1024-byte aligned), filled by cp.async. One tile layout serves
 * both ways wgmma reads an operand:
 *  - K-major (the reduction runs along the row: Q, K, V, dO as A or B of
 *    S = Q K^T, dP = dO V^T): k-step kk starts 32 bytes further on;
 *  - MN-major (the reduction runs down the rows: V in O += P V, dO in
 *    dV += P^T dO, Q in dK += dS^T Q, K in dQ += dS K): the B operand is
 *    read transposed, k-step kk (16 rows) starts 2048 bytes further on.
 * The A operand is always in registers: P and dS straight from the
 * accumulators (the m64n64 accumulator layout, rounded to bf16, is the A
 * fragment layout), and the operands that stay the same over a block's loop
 * (Q; K and V; Q and dO) loaded once with ldmatrix before it. In the
 * backward the products are committed in groups and waited for one group at
 * a time, so that P is computed while dP runs and dS while dV runs, and a
 * tile's last product (dK, dQ) is issued with the next tile's first ones.
 *
 * A block is two warpgroups (256 threads); warpgroup w owns 64 rows (queries
 * in the forward and dQ kernels, keys in dK/dV) and the two share the tiles
 * of the other side, 64 rows each (two stages in the forward, three in the
 * backward). Each warp holds 16 rows:
 * lane (g = lane/4, t = lane%4) holds rows g and g+8, columns 8j + 2t, +1.
 *
 * Asked for the qkv bias gradient, the backward kernels also sum the
 * columns of what they store (the bf16 values as written) over the block's
 * rows, in a fixed order, into one row per block of a partial buffer that
 * attention.cu then sums in a fixed order: dqkv is not read again for it.
 *
 * These kernels exist only in the sm_90a machine code (wgmma is not in the
 * portable PTX); attention.cu calls them only on a compute capability 9.0
 * device, and elsewhere the mma.sync kernels run. */
#include "common.cuh"

#include <math.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_SM90 1
#endif

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

static constexpr int HS = 64;         /* head size these kernels serve */
static constexpr int ROW = HS * 2;    /* bytes per tile row */
static constexpr int TILE = 64 * ROW; /* one 64-row tile: 8 KB */
static constexpr int NT = 256;        /* threads a block: two warpgroups */

#ifdef ATTN_SM90
namespace {

/* ---- shared-memory tiles ---- */
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* byte offset of 16-byte chunk c of row r in a swizzled tile */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return (uint32_t)(r * ROW + ((c ^ (r & 7)) << 4)); }

/* rows [t0, t0 + ROWS) of a head (base = row 0, stride in elements) into
 * the swizzled tile at shared address sm; rows >= T are zero-filled. */
template <int ROWS>
__device__ __forceinline__ void load_tile(uint32_t sm, const bf16* base, int t0, int T, int stride) {
    for (int i = threadIdx.x; i < ROWS * 8; i += NT) {
        int r = i >> 3, c = i & 7;
        int t = t0 + r;
        bool ok = t < T;
        const bf16* src = base + (size_t)(ok ? t : 0) * stride + c * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sm + sw128(r, c)), "l"(src),
                     "r"(ok ? 16 : 0));
    }
}
/* values [t0, t0 + 64) of a per-query vector (lse, D) into 64 floats at
 * shared address sm, 4 bytes a thread (threads 0..63, in the same cp.async
 * group as the tiles); rows >= T read as 0 */
__device__ __forceinline__ void load_row_values(uint32_t sm, const float* src, int t0, int T) {
    if (threadIdx.x < 64) {
        const int t = t0 + (int)threadIdx.x;
        const bool ok = t < T;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sm + 4 * threadIdx.x),
                     "l"(src + (ok ? t : 0)), "r"(ok ? 4 : 0));
    }
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* cp.async's writes become visible to wgmma (the async proxy) after this in
 * every writing thread, then a barrier */
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- wgmma ---- */
/* Matrix descriptor of a swizzled tile at shared address a: start address,
 * leading and stride byte offsets (the stride between 8-row groups is 1024;
 * the leading offset is unused by these shapes and set to the same), 128-byte
 * swizzle. Adding n to it moves the start by 16 n bytes. */
__device__ __forceinline__ uint64_t desc(uint32_t a) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}
constexpr uint64_t KSTEP_K = 32 >> 4;    /* K-major operand: next 16 columns */
constexpr uint64_t KSTEP_MN = 2048 >> 4; /* MN-major operand: next 16 rows */

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* wait until at most N committed groups are still running (groups finish in
 * the order they were committed) */
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
/* keeps the compiler from moving accumulator reads or writes across the
 * asynchronous MMA's issue and wait */
__device__ __forceinline__ void reg_fence(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* the A fragments of an MMA are read while it runs: this use after its wait
 * keeps their registers from being reused before then */
__device__ __forceinline__ void reg_fence(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

/* the 32 accumulator operands of an m64n64 wgmma, with constraint C: "+f"
 * (read and written) or "=f" (written only) */
#define WG_D32(C)                                                                                           \
    C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]),     \
        C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), \
        C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), \
        C(d[31])
#define WG_REGS32                                                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

/* d (64x64, fp32) = [d +] A (64x16, bf16 pairs in registers, the
 * accumulator layout) * B (16x64, shared; TRANS_B 0: K-major, stored as 64
 * rows of n, 16 columns of k; 1: MN-major, 16 rows of k, 64 columns of n) */
template <int TRANS_B>
__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : WG_D32("+f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TRANS_B));
}

/* d = A * B (K-major B): mma_rs's first k-step, d written only (no register
 * of d is read, so none needs defining first: an instruction that defined
 * one while earlier MMAs run would make ptxas serialise them) */
__device__ __forceinline__ void mma_rs_first(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : WG_D32("=f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* 2^x, one MUFU instruction (subnormal results flushed to 0) */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
/* accumulator columns 16kc .. 16kc+15 of this thread's rows as the A
 * fragment of k-step kc */
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&s)[32], int kc) {
    a[0] = pack_bf16(s[8 * kc + 0], s[8 * kc + 1]);
    a[1] = pack_bf16(s[8 * kc + 2], s[8 * kc + 3]);
    a[2] = pack_bf16(s[8 * kc + 4], s[8 * kc + 5]);
    a[3] = pack_bf16(s[8 * kc + 6], s[8 * kc + 7]);
}
__device__ __forceinline__ void zero32(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
}

/* the warpgroup's index, read through a shuffle so that the compiler knows it
 * is the same in every lane: wgmma under a branch it takes for divergent
 * gets serialised */
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0); }

/* the block's dynamic shared memory, its start rounded up to 1024 bytes */
__device__ __forceinline__ uint32_t smem_base() {
    extern __shared__ __align__(1024) unsigned char smraw[];
    return (smem_addr(smraw) + 1023u) & ~1023u;
}

/* A operand in registers: this warp's 16 rows of a swizzled 64-row tile as
 * the A fragments of the four k-steps (ldmatrix: lane l gives the address of
 * row l % 16, 8 columns at 8 (l / 16) within the k-step). Operands that stay
 * the same over a kernel's loop (Q in the forward, K and V in dK/dV, Q and
 * dO in dQ) are read from shared memory once instead of by every MMA: an A
 * read from shared memory costs as many bytes as the B read again, and the
 * tensor cores then wait on shared memory. */
__device__ __forceinline__ void load_frags(uint32_t (&a)[4][4], uint32_t tile, int warp, int lane) {
    const int r = warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a[kk][0]), "=r"(a[kk][1]), "=r"(a[kk][2]), "=r"(a[kk][3])
                     : "r"(tile + sw128(r, 2 * kk + (lane >> 4))));
}
/* d = A B^T for a warpgroup: A (64 x 64, fragments) against the 64 rows of
 * tile b (K-major): S = Q K^T and its kin */
__device__ __forceinline__ void mma_abt(float (&d)[32], const uint32_t (&a)[4][4], uint32_t b) {
    const uint64_t db = desc(b);
    mma_rs_first(d, a[0], db);
#pragma unroll
    for (int kk = 1; kk < HS / 16; kk++) mma_rs<0>(d, a[kk], db + kk * KSTEP_K, 1);
}
/* s (64 x 64 accumulators) rounded to bf16 as the A fragments of the four
 * k-steps; done before wg_fence so that no register the MMA reads is written
 * after it (else the compiler inserts its own waits) */
__device__ __forceinline__ void to_frags(uint32_t (&a)[4][4], const float (&s)[32]) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) to_a(a[kc], s, kc);
}
/* d += A (fragments, 64 x 64) * tile b (64 rows of k, MN-major) */
__device__ __forceinline__ void mma_pb(float (&d)[32], const uint32_t (&a)[4][4], uint32_t b) {
    uint64_t db = desc(b);
#pragma unroll
    for (int kc = 0; kc < 4; kc++) mma_rs<1>(d, a[kc], db + kc * KSTEP_MN, 1);
}

/* d += A * tile b now: a backward kernel's last deferred product (dK, dQ),
 * issued and waited for */
__device__ __forceinline__ void mma_pb_wait(float (&d)[32], uint32_t (&a)[4][4], uint32_t b) {
    wg_fence();
    mma_pb(d, a, b);
    wg_commit();
    wg_wait0();
    reg_fence(d);
    reg_fence(a);
}

/* ---- the qkv bias gradient's column sums (the backward's epilogues) ---- */
/* cs[2j + e] += the two bf16 of v (as pack_bf16 made them), columns 8j + 2t
 * + e of this thread's fragment: exactly the values stored */
__device__ __forceinline__ void add_bf16x2(float (&cs)[16], int j, uint32_t v) {
    cs[2 * j] += __uint_as_float(v << 16);
    cs[2 * j + 1] += __uint_as_float(v & 0xFFFF0000u);
}
/* one step of block_colsum's halving: v[0, 2N) -> v[0, N), the lane with
 * the mask's bit keeping the upper half (compile-time indices: registers) */
template <int N, int V> __device__ __forceinline__ void halve(float (&v)[V], int lane, int mask) {
    const bool up = (lane & mask) != 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float send = up ? v[i] : v[i + N];
        const float keep = up ? v[i + N] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
}
/* The block's column sums of NQ outputs of 64 columns each (cs[q]: this
 * thread's sum over its rows, as add_bf16x2 leaves it) into dst[q * qstride
 * + column]: over the 8 lanes that hold a column (lane bits 4, 3, 2) by
 * halving: at each step a lane keeps half of its values, sends the other
 * half to its partner and adds what it gets (28 shuffles for 32 values
 * instead of 96: this runs in every block's tail, where nothing hides it),
 * leaving each lane the sums of NQ * 2 of the columns; then over the
 * block's 8 warps in warp order through red (shared, NQ * 8 * 64 floats).
 * A fixed order: the same bits every run. Every thread of the block calls
 * it (a barrier inside). */
template <int NQ>
__device__ __forceinline__ void block_colsum(float (&cs)[NQ][16], float* red, float* dst, int qstride) {
    static_assert(NT == 256, "block_colsum adds the 8 warps of a two-warpgroup block");
    constexpr int V = NQ * 16;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float v[V];
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int i = 0; i < 16; i++) v[q * 16 + i] = cs[q][i];
    halve<V / 2>(v, lane, 16);
    halve<V / 4>(v, lane, 8);
    halve<V / 8>(v, lane, 4);
    /* v[i] is now the sum of value base + i (q * 16 + 2j + e: column 8j +
     * 2t + e of output q) over the 8 lanes */
    const int base = ((lane >> 4) & 1) * (V / 2) + ((lane >> 3) & 1) * (V / 4) + ((lane >> 2) & 1) * (V / 8);
#pragma unroll
    for (int i = 0; i < V / 8; i++) {
        const int o = base + i, q = o >> 4, r = o & 15;
        red[(q * 8 + w) * 64 + 8 * (r >> 1) + 2 * (lane & 3) + (r & 1)] = v[i];
    }
    __syncthreads();
    if (threadIdx.x < NQ * 64) {
        const int q = threadIdx.x >> 6, col = threadIdx.x & 63;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) s += red[(q * 8 + k) * 64 + col];
        dst[q * qstride + col] = s;
    }
}

} // namespace
#endif

/* The backward kernels keep three stages of the tiles they walk: the loads
 * for tile i + 1 go into the stage that tile i - 2 used, whose MMAs are known
 * to be complete, so that a tile's last MMA (dK, dQ) runs on into the next
 * tile's first ones instead of being waited for before the barrier. */
static constexpr int NSTAGE = 3;
constexpr size_t SM90_SMEM_FWD = 1024 + 2 * TILE + 4 * TILE;         /* Q[128], K[2][64], V[2][64] */
constexpr size_t SM90_SMEM_DQ = 1024 + 4 * TILE + 2 * NSTAGE * TILE; /* Q, dO [128]; K, V [3][64] */
constexpr size_t SM90_SMEM_DKDV =
    1024 + 4 * TILE + 2 * NSTAGE * TILE + 2 * NSTAGE * 64 * 4; /* K, V [128]; Q, dO [3][64]; lse, D [3][64] */

/* ------------------------------------------------------------------------ */
/* forward: a block per (128 queries, b, h), walking key tiles 0 .. diagonal */
/* ------------------------------------------------------------------------ */
__global__ void __launch_bounds__(NT)
    attn_fwd_sm90(bf16* out, float* lse, const bf16* qkv, int T, int NH, float sl2) {
#ifdef ATTN_SM90
    const uint32_t sQ = smem_base(), sK = sQ + 2 * TILE, sV = sK + 2 * TILE;
    const int qb = gridDim.x - 1 - blockIdx.x; /* heavy blocks first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const int wg = warpgroup(), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qb * 128, qw = q0 + wg * 64; /* block's and warpgroup's first query */
    const int nkb = (min(q0 + 128, T) - 1) / 64 + 1;
    const int my_nkb = qw < T ? qw / 64 + 1 : 0; /* key tiles this warpgroup needs */
    const int qrow = qw + warp * 16 + g;         /* this thread's rows: qrow, qrow + 8 */

    load_tile<128>(sQ, base, q0, T, C3);
    cp_commit();
    load_tile<64>(sK, base + C, 0, T, C3);
    load_tile<64>(sV, base + 2 * C, 0, T, C3);
    cp_commit();
    /* Q as A fragments, once */
    uint32_t qf[4][4];
    cp_wait<1>();
    __syncthreads();
    load_frags(qf, sQ + wg * TILE, warp, lane);

    float o[32];
    zero32(o);
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    for (int kb = 0; kb < nkb; kb++) {
        const int cur = kb & 1;
        if (kb + 1 < nkb) {
            load_tile<64>(sK + (cur ^ 1) * TILE, base + C, (kb + 1) * 64, T, C3);
            load_tile<64>(sV + (cur ^ 1) * TILE, base + 2 * C, (kb + 1) * 64, T, C3);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        fence_async_smem();
        __syncthreads();
        if (kb < my_nkb) {
            float s[32];
            zero32(s);
            wg_fence();
            mma_abt(s, qf, sK + cur * TILE);
            wg_commit();
            wg_wait0();
            reg_fence(s);
            const bool diag = kb == my_nkb - 1;
            /* the running max is of the unscaled scores; the scale goes into
             * the exponent's multiply-add: p = 2^(s sl2 - max sl2) */
            float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int e = i & 3;
                if (diag && kb * 64 + (i >> 2) * 8 + 2 * t4 + (e & 1) > qrow + (e >> 1) * 8) s[i] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[i]);
            }
            float alpha[2], msc[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                /* a row's first tile always has an unmasked key (key 0), so mx
                 * is finite here and mrow - mx is -inf (alpha 0) or finite */
                alpha[r] = ex2((mrow[r] - mx[r]) * sl2);
                mrow[r] = mx[r];
                msc[r] = mx[r] * sl2;
                lrow[r] *= alpha[r];
            }
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int r = (i >> 1) & 1;
                float p = ex2(fmaf(s[i], sl2, -msc[r]));
                s[i] = p;
                lrow[r] += p;
                o[i] *= alpha[r];
            }
            uint32_t pa[4][4];
            to_frags(pa, s);
            wg_fence();
            reg_fence(o);
            mma_pb(o, pa, sV + cur * TILE);
            wg_commit();
            wg_wait0();
            reg_fence(o);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = 1.0f / l;
        const int q = qrow + r * 8;
        if (q < T) {
            bf16* dst = out + ((size_t)b * T + q) * C + h * HS + 2 * t4;
#pragma unroll
            for (int j = 0; j < 8; j++)
                *reinterpret_cast<uint32_t*>(dst + j * 8) =
                    pack_bf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
            if (t4 == 0) lse[(size_t)bh * T + q] = (mrow[r] * sl2 + log2f(l)) * LN2;
        }
    }
#endif
}

/* ------------------------------------------------------------------------ */
/* backward dK, dV: a block per (128 keys, b, h), walking query tiles from    */
/* the diagonal to the end. BIAS: also the column sums of the dK and dV it    */
/* stores, into partial row b * gridDim.x + kb, columns C + h*64 .. and       */
/* 2C + h*64 .. (BIAS false: no sums, no extra work)                         */
/* ------------------------------------------------------------------------ */
template <bool BIAS>
__global__ void __launch_bounds__(NT, 1)
    attn_bwd_dkdv_sm90(bf16* dqkv, float* partial, const bf16* dout, const bf16* qkv, const float* lse,
                       const float* Dbuf, int T, int NH, float sl2, float scale) {
#ifdef ATTN_SM90
    const uint32_t sK = smem_base(), sV = sK + 2 * TILE, sQ = sV + 2 * TILE, sO = sQ + NSTAGE * TILE;
    const uint32_t sL = sO + NSTAGE * TILE, sDv = sL + NSTAGE * 64 * 4; /* lse, D: [NSTAGE][64] floats */
    extern __shared__ __align__(1024) unsigned char smraw[];
    const float* lse_s = (const float*)(smraw + (sL - smem_addr(smraw)));
    const float* D_s = (const float*)(smraw + (sDv - smem_addr(smraw)));
    const int kb = blockIdx.x; /* low key blocks have the most work: first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const bf16* obase = dout + (size_t)b * T * C + h * HS;
    const float* lse_bh = lse + (size_t)bh * T;
    const float* D_bh = Dbuf + (size_t)bh * T;
    const int wg = warpgroup(), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int k0 = kb * 128, kw = k0 + wg * 64; /* block's and warpgroup's first key */
    const int nqb = (T + 63) / 64;
    const int qb0 = k0 / 64;
    const int my_qb0 = kw / 64; /* first query tile this warpgroup needs */
    const int krow = kw + warp * 16 + g;

    /* query tile qb into stage st: Q, dO, and its lse and D (the rows >= T
     * read as zeros: with Q and dO rows of zeros their P is 1, but every
     * product it enters is then 0: dV += P^T dO adds 0, dP^T and so dS^T
     * are 0) */
    auto load_q_tile = [&](int qb, int st) {
        load_tile<64>(sQ + st * TILE, base, qb * 64, T, C3);
        load_tile<64>(sO + st * TILE, obase, qb * 64, T, C);
        load_row_values(sL + st * 256, lse_bh, qb * 64, T);
        load_row_values(sDv + st * 256, D_bh, qb * 64, T);
    };
    load_tile<128>(sK, base + C, k0, T, C3);
    load_tile<128>(sV, base + 2 * C, k0, T, C3);
    cp_commit();
    load_q_tile(qb0, 0);
    cp_commit();

    /* this warpgroup's K and V rows as A fragments, once */
    uint32_t kf[4][4], vf[4][4];
    cp_wait<1>();
    __syncthreads();
    load_frags(kf, sK + wg * TILE, warp, lane);
    load_frags(vf, sV + wg * TILE, warp, lane);

    float dk[32], dv[32];
    zero32(dk);
    zero32(dv);
    /* A tile's dK product is issued in the next tile's first group, so that
     * it runs while that tile's P^T is computed: pend says one is due, with
     * its A fragments in da and its Q tile in stage pend_st (tile i's stage
     * is next written by the loads for tile i + 3, issued in tile i + 2) */
    uint32_t pa[4][4], da[4][4];
    bool pend = false;
    int pend_st = 0;
    for (int qb = qb0; qb < nqb; qb++) {
        const int cur = (qb - qb0) % NSTAGE;
        /* tile qb has landed (its group is the only one outstanding); after
         * the barrier every warpgroup is done with tile qb - 2 (its last MMA
         * was waited for in tile qb - 1), whose stage takes tile qb + 1 */
        cp_wait<0>();
        fence_async_smem();
        __syncthreads();
        if (qb + 1 < nqb) {
            load_q_tile(qb + 1, (qb + 1 - qb0) % NSTAGE);
            cp_commit();
        }
        if (qb >= my_qb0 && kw < T) {
            const uint32_t Qc = sQ + cur * TILE, Oc = sO + cur * TILE;
            const float* lsec = lse_s + cur * 64;
            const float* Dc = D_s + cur * 64;
            /* S^T = K_w Q^T and dP^T = V_w dO^T: 64 keys x 64 queries (not
             * zeroed: the first k-step overwrites) */
            float st[32], dpt[32];
            /* groups: S^T, dP^T, the previous tile's dK (empty if none),
             * then dV. P^T is computed while dP^T and dK run, dS^T while dV
             * runs. */
            wg_fence();
            mma_abt(st, kf, Qc);
            wg_commit();
            mma_abt(dpt, vf, Oc);
            wg_commit();
            if (pend) mma_pb(dk, da, sQ + pend_st * TILE); /* dK += dS^T Q, previous tile */
            wg_commit();
            wg_wait<2>();
            reg_fence(st);
            const bool diag = qb == my_qb0;
            /* this thread's 16 query columns: 8j + 2t4 + e */
            float nl[16], Dq[16];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 l2 = *reinterpret_cast<const float2*>(lsec + 8 * j + 2 * t4);
                const float2 d2 = *reinterpret_cast<const float2*>(Dc + 8 * j + 2 * t4);
                nl[2 * j] = -LOG2E * l2.x;
                nl[2 * j + 1] = -LOG2E * l2.y;
                Dq[2 * j] = d2.x;
                Dq[2 * j + 1] = d2.y;
            }
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int e = i & 3;
                const int qc = (i >> 2) * 8 + 2 * t4 + (e & 1); /* query column in the tile */
                float p = ex2(fmaf(st[i], sl2, nl[(i >> 2) * 2 + (e & 1)]));
                if (diag && krow + (e >> 1) * 8 > qb * 64 + qc) p = 0.0f;
                st[i] = p; /* P^T */
            }
            to_frags(pa, st);
            wg_fence();
            reg_fence(dv);
            mma_pb(dv, pa, Oc); /* dV += P^T dO */
            wg_commit();
            wg_wait<2>();
            reg_fence(dpt);
#pragma unroll
            for (int i = 0; i < 32; i++) dpt[i] = st[i] * (dpt[i] - Dq[(i >> 2) * 2 + (i & 1)]); /* dS^T */
            wg_wait0();
            reg_fence(dk);
            reg_fence(dv);
            reg_fence(pa);
            reg_fence(da);
            to_frags(da, dpt);
            pend = true;
            pend_st = cur;
        }
    }
    if (pend) mma_pb_wait(dk, da, sQ + pend_st * TILE); /* the last tile's dK */
    float cs[2][16];                                    /* BIAS: sums of this thread's stored rows of dK, dV */
    if constexpr (BIAS) {
#pragma unroll
        for (int i = 0; i < 16; i++) cs[0][i] = cs[1][i] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = krow + r * 8;
        if (key < T) {
            bf16* dst = dqkv + ((size_t)b * T + key) * C3 + h * HS + 2 * t4;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t k2 = pack_bf16(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale);
                *reinterpret_cast<uint32_t*>(dst + C + j * 8) = k2;
                const uint32_t v2 = pack_bf16(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
                *reinterpret_cast<uint32_t*>(dst + 2 * C + j * 8) = v2;
                if constexpr (BIAS) {
                    add_bf16x2(cs[0], j, k2);
                    add_bf16x2(cs[1], j, v2);
                }
            }
        }
    }
    if constexpr (BIAS) {
        /* Rows >= T add nothing; a warpgroup with no key < T sums zeros, so
         * every block writes all its 128 columns of partial. The K tile is
         * free: it was read once, by load_frags before the loop's first
         * barrier (the MMAs read only the Q and dO stages). */
        float* red = (float*)(smraw + (sK - smem_addr(smraw)));
        block_colsum<2>(cs, red, partial + ((size_t)b * gridDim.x + kb) * C3 + C + h * HS, C);
    }
#endif
}

/* ------------------------------------------------------------------------ */
/* backward dQ: a block per (128 queries, b, h), walking key tiles 0 ..      */
/* diagonal. BIAS: also the column sums of the dQ it stores, into partial     */
/* row b * gridDim.x + qb, columns h*64 ..                                    */
/* ------------------------------------------------------------------------ */
template <bool BIAS>
__global__ void __launch_bounds__(NT)
    attn_bwd_dq_sm90(bf16* dqkv, float* partial, const bf16* dout, const bf16* qkv, const float* lse,
                     const float* Dbuf, int T, int NH, float sl2, float scale) {
#ifdef ATTN_SM90
    const uint32_t sQ = smem_base(), sO = sQ + 2 * TILE, sK = sO + 2 * TILE, sV = sK + NSTAGE * TILE;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const bf16* base = qkv + (size_t)b * T * C3 + h * HS;
    const bf16* obase = dout + (size_t)b * T * C + h * HS;
    const int wg = warpgroup(), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qb * 128, qw = q0 + wg * 64;
    const int nkb = (min(q0 + 128, T) - 1) / 64 + 1;
    const int my_nkb = qw < T ? qw / 64 + 1 : 0;
    const int qrow = qw + warp * 16 + g;

    load_tile<128>(sQ, base, q0, T, C3);
    load_tile<128>(sO, obase, q0, T, C);
    cp_commit();
    load_tile<64>(sK, base + C, 0, T, C3);
    load_tile<64>(sV, base + 2 * C, 0, T, C3);
    cp_commit();
    float lse2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int q = qrow + r * 8;
        lse2[r] = q < T ? lse[(size_t)bh * T + q] * LOG2E : INFINITY;
        Dr[r] = q < T ? Dbuf[(size_t)bh * T + q] : 0.0f;
    }

    /* this warpgroup's Q and dO rows as A fragments, once */
    uint32_t qf[4][4], of[4][4];
    cp_wait<1>();
    __syncthreads();
    load_frags(qf, sQ + wg * TILE, warp, lane);
    load_frags(of, sO + wg * TILE, warp, lane);

    float dq[32];
    zero32(dq);
    /* as dK in dK/dV: a tile's dQ product is issued in the next tile's first
     * group (pend: one is due, A fragments in da, K tile in stage pend_st) */
    uint32_t da[4][4];
    bool pend = false;
    int pend_st = 0;
    for (int kb = 0; kb < nkb; kb++) {
        const int cur = kb % NSTAGE;
        /* as in dK/dV: tile kb has landed, and tile kb - 2's stage takes
         * tile kb + 1 */
        cp_wait<0>();
        fence_async_smem();
        __syncthreads();
        if (kb + 1 < nkb) {
            const int nx = (kb + 1) % NSTAGE;
            load_tile<64>(sK + nx * TILE, base + C, (kb + 1) * 64, T, C3);
            load_tile<64>(sV + nx * TILE, base + 2 * C, (kb + 1) * 64, T, C3);
            cp_commit();
        }
        if (kb < my_nkb) {
            const uint32_t Kc = sK + cur * TILE;
            float s[32], dp[32]; /* not zeroed: the first k-step overwrites */
            /* groups: S, dP, the previous tile's dQ (empty if none); P is
             * computed while dP and dQ run, dS while dQ runs */
            wg_fence();
            mma_abt(s, qf, Kc);
            wg_commit();
            mma_abt(dp, of, sV + cur * TILE);
            wg_commit();
            if (pend) mma_pb(dq, da, sK + pend_st * TILE); /* dQ += dS K, previous tile */
            wg_commit();
            wg_wait<2>();
            reg_fence(s);
            const bool diag = kb == my_nkb - 1;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int e = i & 3;
                float p = ex2(fmaf(s[i], sl2, -lse2[e >> 1]));
                if (diag && kb * 64 + (i >> 2) * 8 + 2 * t4 + (e & 1) > qrow + (e >> 1) * 8) p = 0.0f;
                s[i] = p;
            }
            wg_wait<1>();
            reg_fence(dp);
#pragma unroll
            for (int i = 0; i < 32; i++) dp[i] = s[i] * (dp[i] - Dr[(i >> 1) & 1]); /* dS */
            wg_wait0();
            reg_fence(dq);
            reg_fence(da);
            to_frags(da, dp);
            pend = true;
            pend_st = cur;
        }
    }
    if (pend) mma_pb_wait(dq, da, sK + pend_st * TILE); /* the last tile's dQ */
    float cs[1][16];                                    /* BIAS: sums of this thread's stored rows of dQ */
    if constexpr (BIAS) {
#pragma unroll
        for (int i = 0; i < 16; i++) cs[0][i] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = qrow + r * 8;
        if (q < T) {
            bf16* dst = dqkv + ((size_t)b * T + q) * C3 + h * HS + 2 * t4;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t q2 = pack_bf16(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale);
                *reinterpret_cast<uint32_t*>(dst + j * 8) = q2;
                if constexpr (BIAS) add_bf16x2(cs[0], j, q2);
            }
        }
    }
    if constexpr (BIAS) {
        /* as in dK/dV: rows >= T add nothing, every block writes its 64
         * columns, and the Q tile is free (read once, by load_frags) */
        extern __shared__ __align__(1024) unsigned char smraw[];
        float* red = (float*)(smraw + (sQ - smem_addr(smraw)));
        block_colsum<1>(cs, red, partial + ((size_t)b * gridDim.x + qb) * C3 + h * HS, 0);
    }
#endif
}

/* ------------------------------------------------------------------------ */
/* launchers (attention.cu decides when these run)                          */
/* ------------------------------------------------------------------------ */
/* writes 1 where the wgmma kernels were compiled (sm_90a machine code) */
__global__ void attn_sm90_probe(int* flag) {
#ifdef ATTN_SM90
    *flag = 1;
#else
    *flag = 0;
#endif
}

bool attn_sm90_init(Backend* be) {
    cudaStream_t st = cuda_ctx(be)->stream;
    int* dflag = (int*)cuda_scratch(be, sizeof(int));
    int flag = 0;
    attn_sm90_probe<<<1, 1, 0, st>>>(dflag);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(&flag, dflag, sizeof(int), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (!flag) return false;
    CUDA_CHECK(
        cudaFuncSetAttribute(attn_fwd_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM90_SMEM_FWD));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_sm90<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_DKDV));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_sm90<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_DKDV));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_sm90<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_DQ));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_sm90<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_DQ));
    return true;
}

void attn_sm90_forward(cudaStream_t st, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                       float sl2) {
    dim3 grid((T + 127) / 128, B * NH);
    attn_fwd_sm90<<<grid, NT, SM90_SMEM_FWD, st>>>(out, lse, qkv, T, NH, sl2);
    LAUNCH_CHECK();
}

void attn_sm90_backward(cudaStream_t st, bf16* dqkv, float* partial, const bf16* dout, const bf16* qkv,
                        const float* lse, const float* Dbuf, int B, int T, int NH, float sl2, float scale,
                        bool dkdv, bool dq) {
    /* partial's every element comes from one of the two kernels */
    if (partial && !(dkdv && dq)) fatal("internal: attn_sm90_backward: column sums need both kernels");
    dim3 grid((T + 127) / 128, B * NH);
    if (dkdv) {
        auto kern = partial ? attn_bwd_dkdv_sm90<true> : attn_bwd_dkdv_sm90<false>;
        kern<<<grid, NT, SM90_SMEM_DKDV, st>>>(dqkv, partial, dout, qkv, lse, Dbuf, T, NH, sl2, scale);
        LAUNCH_CHECK();
    }
    if (dq) {
        auto kern = partial ? attn_bwd_dq_sm90<true> : attn_bwd_dq_sm90<false>;
        kern<<<grid, NT, SM90_SMEM_DQ, st>>>(dqkv, partial, dout, qkv, lse, Dbuf, T, NH, sl2, scale);
        LAUNCH_CHECK();
    }
}
