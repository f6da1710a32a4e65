/* kernels/cuda/attention_sm90.cu — causal attention for Hopper (sm_90a),
 * bf16, head size 64: flash forward with online softmax, as attention.cu's
 * tensor-core kernels; the backward (after D = rowsum(dO*O)) in one pass,
 * a block per key block computing dK, dV and its share of each query
 * tile's dQ, the shares added in a fixed order (deterministic); the matrix
 * products on warpgroup MMA (wgmma, m64n64k16 and m64n32k16, bf16 in, fp32
 * accumulate).
 *
 * Shared-memory tiles: rows of 64 bf16 = 128 bytes, stored with the 128-byte
 * swizzle that wgmma reads (16-byte chunk c of row r at chunk c ^ (r & 7),
 * every tile 1024-byte aligned), filled by cp.async in the forward and by
 * the copy engine (TMA, the same swizzle) in the backward. One layout serves
 * both ways wgmma reads an operand:
 *  - K-major (the reduction runs along the row: Q, K, V, dO as A or B of
 *    S = Q K^T, dP = dO V^T): k-step kk starts 32 bytes further on;
 *  - MN-major (the reduction runs down the rows: V in O += P V, dO in
 *    dV += P^T dO, Q in dK += dS^T Q; dS^T and K in dQ += dS K): the
 *    operand is read transposed, k-step kk (16 rows) starts 2048 bytes
 *    further on.
 * The A operand is in registers but in dQ: P and dS straight from the
 * accumulators (the m64n64 accumulator layout, rounded to bf16, is the A
 * fragment layout), and the operands that stay the same over a block's loop
 * read with ldmatrix: K and V once before the backward's loop, Q at each of
 * the forward's tiles (see attn_fwd_sm90). dQ's share needs dS
 * with queries as rows, so dS^T goes to shared memory (stmatrix) and is read
 * transposed. In the backward the products are committed in groups and
 * waited for one group at a time, so that P is computed while dP runs and dS
 * while dV runs, and a tile's dK product is issued with the next tile's
 * first ones.
 *
 * A block computes with two warpgroups (256 threads); warpgroup w owns 64
 * rows (queries in the forward, keys in the backward) and the two share the
 * tiles of the other side, 64 rows each, in three stages. The backward has
 * a third warpgroup that loads and keeps the dQ turns (see attn_bwd_sm90).
 * Each warp holds 16 rows: lane (g = lane/4, t = lane%4) holds rows g and
 * g+8, columns 8j + 2t, +1.
 *
 * Asked for the qkv bias gradient, the backward kernel also sums the
 * columns of what it stores (the bf16 values as written) over the block's
 * rows, in a fixed order, into one row per block of a partial buffer that
 * attention.cu then sums in a fixed order: dqkv is not read again for it.
 *
 * These kernels exist only in the sm_90a machine code (wgmma is not in the
 * portable PTX); attention.cu calls them only on a compute capability 9.0
 * device, and elsewhere the mma.sync kernels run. */
#include "common.cuh"

#include <cuda.h> /* CUtensorMap (the driver's encoder is found at run time) */
#include <cudaTypedefs.h>

#include <math.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_SM90 1
#endif

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

static constexpr int HS = 64;         /* head size these kernels serve */
static constexpr int ROW = HS * 2;    /* bytes per tile row */
static constexpr int TILE = 64 * ROW; /* one 64-row tile: 8 KB */
static constexpr int NT = 256;        /* threads a block (the backward's compute warps): two warpgroups */
/* the backward: its two compute warpgroups and a producer warpgroup, of
 * which warp 8 loads the tiles and warp 9 keeps the dQ turns */
static constexpr int NT_BWD = NT + 128;

#ifdef ATTN_SM90
namespace {

static constexpr int LOAD_WARP = 8, TURN_WARP = 9;
/* the backward's named barriers */
static constexpr int BAR_CONS = 1; /* the compute warps (NT threads) */
static constexpr int BAR_GO = 2; /* a tile's dQ product may start: compute warps wait, the turn warp arrives */
static constexpr int BAR_DONE = 3; /* a tile's dQ share is written: compute warps arrive, the turn warp waits */
static constexpr int NT_TURN = NT + 32; /* threads at BAR_GO and BAR_DONE */

/* ---- shared-memory tiles ---- */
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* byte offset of 16-byte chunk c of row r in a swizzled tile */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return (uint32_t)(r * ROW + ((c ^ (r & 7)) << 4)); }

/* rows [t0, t0 + ROWS) of a head (base = row 0, stride in elements) into
 * the swizzled tile at shared address sm; rows >= T are zero-filled. Thread
 * x copies chunk x % 8 of rows x / 8 + 32 k: a loop whose trip count the
 * compiler sees (a loop from threadIdx.x to ROWS * 8 is compiled for any
 * block size: a remainder loop and a branch per copy, about 140
 * instructions a warp for the backward's two tiles) and whose row and
 * swizzle arithmetic is the same in every call. */
template <int ROWS>
__device__ __forceinline__ void load_tile(uint32_t sm, const bf16* base, int t0, int T, int stride) {
    static_assert((ROWS * 8) % NT == 0, "load_tile: whole passes of the block");
    const int r0 = threadIdx.x >> 3, c = threadIdx.x & 7;
#pragma unroll
    for (int k = 0; k < ROWS * 8 / NT; k++) {
        const int r = r0 + k * (NT / 8), t = t0 + r;
        const bool ok = t < T;
        const bf16* src = base + (size_t)(ok ? t : 0) * stride + c * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sm + sw128(r, c)), "l"(src),
                     "r"(ok ? 16 : 0));
    }
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* waits until at most n (0 or 1) of this thread's cp.async groups are in flight */
__device__ __forceinline__ void cp_wait_upto(bool one) {
    if (one) cp_wait<1>();
    else cp_wait<0>();
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
template <int N> __device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
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
 * the same over a kernel's loop (Q in the forward, K and V in the backward)
 * are read from shared memory once a tile or once in all, not by every MMA:
 * an A read from shared memory costs as many bytes as the B read again, and
 * the tensor cores then wait on shared memory. */
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

/* d += A * tile b now: the backward's last deferred product (dK),
 * issued and waited for */
__device__ __forceinline__ void mma_pb_wait(float (&d)[32], uint32_t (&a)[4][4], uint32_t b) {
    wg_fence();
    mma_pb(d, a, b);
    wg_commit();
    wg_wait0();
    reg_fence(d);
    reg_fence(a);
}

/* ---- the one-pass backward's dQ (attn_bwd_sm90) ---- */
/* the 16 accumulator operands of an m64n32 wgmma */
#define WG_D16(C)                                                                                       \
    C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), \
        C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15])
#define WG_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

/* d (64x32, fp32) [+]= A (64x16) * B (16x32), both from shared memory and
 * both MN-major: A stored as 16 rows of k, 64 columns of m; B as 16 rows
 * of k, 32 columns of n (half of a 64-column swizzled tile: its descriptor
 * starts 64 bytes into the row for the upper half). FIRST: d written only. */
template <bool FIRST> __device__ __forceinline__ void mma_ss_tt_n32(float (&d)[16], uint64_t a, uint64_t b) {
    if constexpr (FIRST)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " WG_REGS16
                     ", %16, %17, p, 1, 1, 1, 1;\n}\n"
                     : WG_D16("=f")
                     : "l"(a), "l"(b));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " WG_REGS16
                     ", %16, %17, p, 1, 1, 1, 1;\n}\n"
                     : WG_D16("+f")
                     : "l"(a), "l"(b));
}
/* the inverse of load_frags: this warp's 16 rows of A fragments (the
 * accumulator layout, rounded to bf16) into a swizzled 64-row tile */
__device__ __forceinline__ void store_frags(uint32_t tile, const uint32_t (&a)[4][4], int warp, int lane) {
    const int r = warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         tile + sw128(r, 2 * kk + (lane >> 4))),
                     "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                     : "memory");
}
/* 16 bytes of shared memory */
__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}
/* the order tokens of the dQ accumulation: a counter per (head, query
 * tile), read with acquire and passed on with release (GPU scope) */
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

/* ---- the backward's producer warps: mbarriers, the copy engine, named barriers ---- */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* one arrival that also expects `bytes` from the copy engine in this phase */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* waits until the phase of parity `parity` has completed (phases count
 * from 0: a waiter for the n-th completion passes n & 1) */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* whether the phase of parity `parity` has completed, without waiting */
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n.reg .pred done;\n"
                 "mbarrier.test_wait.parity.shared::cta.b64 done, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, done;\n}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}
/* one 64-row tile of a head (rows t0 .. t0 + 63; rows >= T read as zeros)
 * from the tensor map's [B][T][heads][64] view into the swizzled tile at
 * dst, completing on the mbarrier bar (8 KB of its expected bytes) */
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, int head, int t0, int b,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(head), "r"(t0), "r"(b), "r"(bar)
        : "memory");
}
/* named barriers among some warps of the block (id 0 is __syncthreads'):
 * sync waits for `count` threads in all, arrive counts this warp without
 * waiting. A barrier orders the shared and global accesses before it in
 * the arriving threads before those after it in the waiting ones. */
__device__ __forceinline__ void named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* ---- the qkv bias gradient's column sums (the backward's epilogues) ---- */
/* cs[2j + e] += the two bf16 of v (as pack_bf16 made them), columns 8j + 2t
 * + e of this thread's fragment: exactly the values stored */
template <int N> __device__ __forceinline__ void add_bf16x2(float (&cs)[N], int j, uint32_t v) {
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
 * A fixed order: the same bits every run. Every thread of the backward's two
 * compute warpgroups calls it (their named barrier inside). */
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
    named_sync(BAR_CONS, NT);
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

/* Both kernels keep three stages of the tiles they walk. In the forward the
 * loads for tile i + 1 go into the stage that tile i - 2 used, whose MMAs
 * every warp finished before tile i - 1's barrier: one barrier a tile. In
 * the backward a stage is free once each compute warp has waited for the
 * last product reading it (a tile's dK product, which runs on into the next
 * tile's first ones) and arrived on its empty mbarrier. */
static constexpr int NSTAGE = 3;
constexpr size_t SM90_SMEM_FWD = 1024 + 2 * TILE + 2 * NSTAGE * TILE; /* Q[128], K, V [NSTAGE][64] */

/* ------------------------------------------------------------------------ */
/* forward: a block per (128 queries, b, h), walking key tiles 0 .. diagonal */
/* ------------------------------------------------------------------------ */
__global__ void __launch_bounds__(NT)
    attn_fwd_sm90(bf16* out, float* lse, const bf16* qkv, int T, int NH, float sl2) {
#ifdef ATTN_SM90
    const uint32_t sQ = smem_base(), sK = sQ + 2 * TILE, sV = sK + NSTAGE * TILE;
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
    if (nkb > 1) {
        load_tile<64>(sK + TILE, base + C, 64, T, C3);
        load_tile<64>(sV + TILE, base + 2 * C, 64, T, C3);
        cp_commit();
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
    fence_async_smem();
    __syncthreads();

    /* Q as A fragments, read from its tile before each S product (four
     * ldmatrix a warp). Held in registers over the whole loop, which has a
     * branch (the mask), they were overwritten: ptxas 13.0 packed P into
     * their registers after S's product, and the next tile's S read P
     * (tools/sass_frag_check.py finds such writes in a kernel that holds its
     * fragments, as the backward does) */
    uint32_t qf[4][4];
    float s[32]; /* S of the tile being worked on, then its P */
    if (my_nkb > 0) {
        load_frags(qf, sQ + wg * TILE, warp, lane);
        wg_fence();
        mma_abt(s, qf, sK);
        wg_commit();
        wg_wait0();
        reg_fence(s);
    }
    float o[32];
    zero32(o);
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    uint32_t pa[4][4];
    /* A tile kb in three parts. (1) The softmax of S_kb, already in s, while
     * tile kb - 1's P V runs on the tensor cores; then that product's wait,
     * P's fragments and the output's rescale. (2) The block's one barrier a
     * tile: tile kb + 1 is loaded, and every warp is past tile kb - 1's
     * products, so that stage takes tile kb + 2's loads. (3) S_kb+1 = Q
     * K_kb+1^T and O += P_kb V_kb issued in that order, and S_kb+1 waited
     * for: it is ready for the next tile's softmax while P V still runs.
     * The warpgroup's last tile (the diagonal, with the mask) has no S_kb+1
     * and is a copy of the loop's body outside it: an MMA under a branch
     * inside the loop would make ptxas serialise them. */
    auto softmax_rescale = [&](bool diag, int kb) {
        if (diag) { /* the causal mask */
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int e = i & 3;
                if (kb * 64 + (i >> 2) * 8 + 2 * t4 + (e & 1) > qrow + (e >> 1) * 8) s[i] = -INFINITY;
            }
        }
        /* the running max is of the unscaled scores; the scale goes into
         * the exponent's multiply-add: p = 2^(s sl2 - max sl2) */
        float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
        for (int i = 0; i < 32; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
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
        }
        /* tile kb - 1's P V: its accumulators and P's fragments are free
         * from here */
        wg_wait0();
        reg_fence(o);
        reg_fence(pa);
        to_frags(pa, s);
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] *= alpha[(i >> 1) & 1];
    };
    auto barrier_and_load = [&](int kb) {
        if (kb + 1 < nkb) {
            cp_wait<0>(); /* this thread's loads of tile kb + 1 */
            fence_async_smem();
            __syncthreads();
            if (kb + 2 < nkb) {
                const int st2 = (kb + 2) % NSTAGE;
                load_tile<64>(sK + st2 * TILE, base + C, (kb + 2) * 64, T, C3);
                load_tile<64>(sV + st2 * TILE, base + 2 * C, (kb + 2) * 64, T, C3);
                cp_commit();
            }
        }
    };
    int kb = 0;
    for (; kb + 1 < my_nkb; kb++) {
        softmax_rescale(false, kb);
        barrier_and_load(kb);
        load_frags(qf, sQ + wg * TILE, warp, lane);
        wg_fence();
        reg_fence(o);
        mma_abt(s, qf, sK + ((kb + 1) % NSTAGE) * TILE);
        wg_commit();
        mma_pb(o, pa, sV + (kb % NSTAGE) * TILE);
        wg_commit();
        wg_wait<1>();
        reg_fence(s);
    }
    if (my_nkb > 0) {
        softmax_rescale(true, kb);
        barrier_and_load(kb);
        wg_fence();
        reg_fence(o);
        mma_pb(o, pa, sV + (kb % NSTAGE) * TILE);
        wg_commit();
        kb++;
    }
    /* the tiles only the other warpgroup needs (none past the next: a
     * barrier here could let its loads overwrite the stage the last P V
     * reads, so that product is waited for first) */
    for (; kb < nkb; kb++) {
        wg_wait0();
        barrier_and_load(kb);
    }
    wg_wait0();
    reg_fence(o);
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
/* backward: a block per (128 keys, b, h), walking query tiles from the      */
/* diagonal to the end: dK and dV of its keys, and each query tile's share   */
/* of dQ from its keys, dS K (five products a tile, where a dK/dV pass and a */
/* dQ pass recompute S and dP: seven). A query tile's shares are added in a  */
/* fixed order, the highest key block first, in an fp32 accumulator dqacc   */
/* ([B*NH][T][64]): the first share is stored, the middle ones added, and    */
/* key block 0's, always the last, is added to what it reads back, scaled    */
/* and stored in bf16. A counter per (head, query tile), its turn, says how  */
/* many shares are in; a block waits until it is its share's. BIAS: the      */
/* column sums of dK and dV, and of dQ (key block 0's, over all the queries) */
/* ------------------------------------------------------------------------ */
/* Three warpgroups. The two compute warpgroups (threads 0..255) own 64 keys
 * each; they load nothing of a tile that wgmma reads and never touch a turn
 * counter. In the producer warpgroup:
 *  - the load warp (one thread) brings K and V, then each query tile's Q and
 *    dO through the copy engine (tensor maps: rows past T read as zeros),
 *    NSTAGE stages deep: a stage's full mbarrier completes when its bytes
 *    have landed, its empty one when all 8 compute warps are done with it;
 *  - the turn warp waits for each tile's turn, lets the dQ product start
 *    (BAR_GO, an arrival), waits until every compute thread has written its
 *    share (BAR_DONE) and passes the turn on: the release's fence, hundreds
 *    of cycles, stalls no compute warp.
 * What the compute threads read with ordinary loads comes by cp.async, so
 * that the race checker sees each read ordered after its write by a barrier
 * (it does not follow mbarriers): a tile's (lse, D) pairs, 512 bytes, copied
 * two tiles ahead by compute warp 0 into three buffers and waited for before
 * the BAR_GO before their tile; and key block 0's accumulator values, each
 * thread copying only the 16 it adds to (so no barrier at all), once the
 * turn warp has seen the turn (the seen mbarrier, a release after its
 * acquire) or else after BAR_GO. The producer warpgroup keeps 40 registers a
 * thread (at 24 its loops spilled), the compute warps 232. */
/* K, V [128]; Q, dO [NSTAGE][64]; dS^T [2][128]; acc [8][NT] float pairs; (lse, D) [3][64]; mbarriers */
constexpr size_t SM90_SMEM_BWD =
    1024 + 4 * TILE + 2 * NSTAGE * TILE + 4 * TILE + 8 * NT * 8 + 3 * 64 * 8 + 8 * (2 * NSTAGE + 2);

template <bool BIAS>
__global__ void __launch_bounds__(NT_BWD, 1)
    attn_bwd_sm90(const __grid_constant__ CUtensorMap tm_qkv, const __grid_constant__ CUtensorMap tm_dout,
                  bf16* dqkv, float* partial, float* dqacc, int* turn, const float* ld, int T, int NH,
                  float sl2, float scale) {
#ifdef ATTN_SM90
    const uint32_t sK = smem_base(), sV = sK + 2 * TILE, sQ = sV + 2 * TILE, sO = sQ + NSTAGE * TILE;
    const uint32_t sS = sO + NSTAGE * TILE; /* dS^T of a tile: [128 keys][64 queries], two buffers */
    const uint32_t sA = sS + 4 * TILE;      /* key block 0: [8][NT] float pairs, a thread's own */
    const uint32_t sL = sA + 8 * NT * 8;    /* a query's (-log2(e) lse, D): [3][64] float pairs */
    /* mbarriers: a stage's full and empty, K and V loaded, a turn seen */
    const uint32_t full = sL + 3 * 64 * 8, empty = full + 8 * NSTAGE, kv_bar = empty + 8 * NSTAGE,
                   seen_bar = kv_bar + 8; /* key block 0: a tile's turn seen */
    extern __shared__ __align__(1024) unsigned char smraw[];
    const float* ld_s = (const float*)(smraw + (sL - smem_addr(smraw)));
    const float2* acc_s = (const float2*)(smraw + (sA - smem_addr(smraw)));
    const int nkb = gridDim.x, nqb = (T + 63) / 64;
    /* The block's work in the order blocks start (a ticket from a counter
     * after the turn counters): a head's key blocks from the last to the
     * first. A block waits only for the head's next key block, whose ticket
     * is smaller, so it has started, and it waits only for blocks with
     * smaller tickets still: every wait ends, whatever order the GPU starts
     * blocks in. */
    __shared__ int ticket_s;
    if (threadIdx.x == 0) {
        ticket_s = atomicAdd(turn + (size_t)gridDim.y * nqb, 1);
#pragma unroll
        for (int s = 0; s < NSTAGE; s++) {
            mbar_init(full + 8 * s, 1);  /* the load warp's, with the bytes to expect */
            mbar_init(empty + 8 * s, 8); /* one arrival a compute warp */
        }
        mbar_init(kv_bar, 1);
        mbar_init(seen_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int ticket = ticket_s;
    const int kb = nkb - 1 - ticket % nkb;
    const int bh = ticket / nkb, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const int wg = warpgroup(), lane = threadIdx.x & 31;
    const int k0 = kb * 128;
    const int qb0 = k0 / 64;
    const bool last = kb == 0; /* key block 0's share is always a query tile's last */
    float* acc_bh = dqacc + (size_t)bh * T * 64;

    if (wg == 2) {
        /* ---- the producer warpgroup ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        const int pw = threadIdx.x >> 5;
        if (pw == LOAD_WARP && lane == 0) {
            mbar_expect_tx(kv_bar, 4 * TILE);
            tma_tile(sK, &tm_qkv, NH + h, k0, b, kv_bar);
            tma_tile(sK + TILE, &tm_qkv, NH + h, k0 + 64, b, kv_bar);
            tma_tile(sV, &tm_qkv, 2 * NH + h, k0, b, kv_bar);
            tma_tile(sV + TILE, &tm_qkv, 2 * NH + h, k0 + 64, b, kv_bar);
            for (int qb = qb0; qb < nqb; qb++) {
                const int i = qb - qb0, st = i % NSTAGE;
                if (i >= NSTAGE) mbar_wait(empty + 8 * st, ((i / NSTAGE) - 1) & 1);
                mbar_expect_tx(full + 8 * st, 2 * TILE);
                tma_tile(sQ + st * TILE, &tm_qkv, h, qb * 64, b, full + 8 * st);
                tma_tile(sO + st * TILE, &tm_dout, h, qb * 64, b, full + 8 * st);
            }
        } else if (pw == TURN_WARP) {
            int* turn_bh = turn + (size_t)bh * nqb;
            for (int qb = qb0; qb < nqb; qb++) {
                const int first = qb >> 1;     /* the key block whose share comes first */
                const bool lead = kb == first; /* this block's share is the first */
                if (!lead) {
                    /* the shares of the key blocks first .. kb + 1 are in */
                    if (lane == 0)
                        while (ld_acquire(turn_bh + qb) != first - kb) __nanosleep(64);
                    /* key block 0: the compute warps may read the accumulator
                     * as soon as this phase (the (qb - 2)-th) completes (a
                     * release after the acquire), before BAR_GO if they look
                     * in time. The phase cannot be confused with the next
                     * one: this warp arrives for tile qb + 1 only after
                     * BAR_DONE, after every compute warp has looked. It
                     * waits on the phase itself because synccheck reports a
                     * phase that nobody waited for ("missing wait"), and a
                     * compute warp that looks too late never does. */
                    if (last && lane == 0) {
                        mbar_arrive(seen_bar);
                        mbar_wait(seen_bar, qb & 1);
                    }
                }
                __syncwarp();
                named_arrive(BAR_GO, NT_TURN);
                named_sync(BAR_DONE, NT_TURN);
                /* every compute thread's writes of the share came before
                 * BAR_DONE; the release is cumulative and passes them on */
                if (!last && lane == 0) st_release(turn_bh + qb, first - kb + 1);
            }
        }
        return;
    }

    /* ---- the compute warpgroups ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int warp = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int kw = k0 + wg * 64;
    const int my_qb0 = kw / 64;
    const int krow = kw + warp * 16 + g;

    /* a query tile's (lse, D) pairs, 512 bytes: warp 0 copies those of the
     * tile after next at a tile's start and waits for the next tile's before
     * BAR_GO (three buffers); the first two before the loop */
    const float* ld_bh = ld + (size_t)bh * nqb * 64 * 2;
    auto copy_ld = [&](int qb, int buf) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sL + buf * 64 * 8 + 16 * lane),
                     "l"(ld_bh + qb * 64 * 2 + 4 * lane));
        cp_commit();
    };
    const bool ld_warp = warp == 0 && wg == 0;
    if (ld_warp) {
        copy_ld(qb0, 0);
        if (qb0 + 1 < nqb) copy_ld(qb0 + 1, 1);
        cp_wait_upto(qb0 + 1 < nqb);
    }
    uint32_t kf[4][4], vf[4][4];
    mbar_wait(kv_bar, 0);
    load_frags(kf, sK + wg * TILE, warp, lane);
    load_frags(vf, sV + wg * TILE, warp, lane);
    named_sync(BAR_CONS, NT);

    float dk[32], dv[32];
    zero32(dk);
    zero32(dv);
    uint32_t pa[4][4], da[4][4];
    bool pend = false;
    int pend_st = 0;
    float csq[8]; /* BIAS, key block 0: sums of this thread's stored dQ (its 8 columns) */
    if constexpr (BIAS) {
#pragma unroll
        for (int i = 0; i < 8; i++) csq[i] = 0.0f;
    }
    /* Key block 0 after the others: what the accumulator holds of this
     * thread's 16 elements of the tile's dQ, copied once the turn is in into
     * slots of shared memory that only this thread writes and reads (pair k
     * of thread x at acc_s[k][x]: no bank conflict, no barrier, no registers
     * held): at the end of the tile's first products when the turn warp has
     * already seen the turn, else after BAR_GO, to land while the dQ
     * product runs. */
    const int col = 32 * wg + 2 * t4;
    auto copy_acc = [&](int qb) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int q = qb * 64 + warp * 16 + g + r * 8;
            const bool ok = q < T;
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(
                                 sA + ((r * 4 + jj) * NT + threadIdx.x) * 8),
                             "l"(acc_bh + (size_t)(ok ? q : 0) * 64 + col + 8 * jj), "r"(ok ? 8 : 0));
        }
        cp_commit();
    };
    for (int qb = qb0; qb < nqb; qb++) {
        const int i = qb - qb0, cur = i % NSTAGE;
        const int first = qb >> 1;     /* the key block whose share comes first */
        const bool lead = kb == first; /* this block's share is the first */
        const bool reads_acc = last && !lead;
        bool acc_sent = false;
        const uint32_t sSi = sS + (i & 1) * 2 * TILE;
        if (ld_warp && qb + 2 < nqb) copy_ld(qb + 2, (i + 2) % 3);
        if (qb >= my_qb0 && kw < T) {
            mbar_wait(full + 8 * cur, (i / NSTAGE) & 1);
            const uint32_t Qc = sQ + cur * TILE, Oc = sO + cur * TILE;
            const float* ldc = ld_s + (i % 3) * 64 * 2;
            float st[32], dpt[32];
            wg_fence();
            mma_abt(st, kf, Qc);
            wg_commit();
            mma_abt(dpt, vf, Oc);
            wg_commit();
            /* dK += dS^T Q, previous tile; the commit in both branches, so
             * that it goes with the last product (a commit after the branch
             * is an extra MMA instruction that carries it) */
            if (pend) {
                mma_pb(dk, da, sQ + pend_st * TILE);
                wg_commit();
            } else {
                wg_commit();
            }
            wg_wait<2>();
            reg_fence(st);
            const bool diag = qb == my_qb0;
            float nl[16], Dq[16];
#pragma unroll
            for (int j = 0; j < 8; j++) { /* queries 8j + 2t4, +1 (as two 8-byte loads: one of 16 left
                                             * the compute warps a few registers short) */
                const float2 v = *reinterpret_cast<const float2*>(ldc + 2 * (8 * j + 2 * t4));
                const float2 w = *reinterpret_cast<const float2*>(ldc + 2 * (8 * j + 2 * t4) + 2);
                nl[2 * j] = v.x;
                Dq[2 * j] = v.y;
                nl[2 * j + 1] = w.x;
                Dq[2 * j + 1] = w.y;
            }
#pragma unroll
            for (int i = 0; i < 32; i++) st[i] = ex2(fmaf(st[i], sl2, nl[(i >> 2) * 2 + (i & 1)])); /* P^T */
            /* the causal mask, on the diagonal tile only (a compare and a
             * select per element on every tile were 64 of a warp's ~870
             * instructions a tile) */
            if (diag) {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int e = i & 3;
                    if (krow + (e >> 1) * 8 > qb * 64 + (i >> 2) * 8 + 2 * t4 + (e & 1)) st[i] = 0.0f;
                }
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
            store_frags(sSi + wg * TILE, da, warp, lane); /* for the dQ share, both warpgroups' keys */
            pend = true;
            pend_st = cur;
            /* key block 0 reads its tiles 2, 3, ...: the (qb - 2)-th phase */
            if (reads_acc && mbar_test(seen_bar, qb & 1)) {
                copy_acc(qb);
                acc_sent = true;
            }
        }
        /* the tile before's stage: its last reader, that tile's dK product,
         * was waited for above (a warpgroup computes every tile from its
         * first on, so nothing of it is still pending otherwise) */
        if (i > 0 && lane == 0) mbar_arrive(empty + 8 * ((i - 1) % NSTAGE));
        if (ld_warp && qb + 1 < nqb) cp_wait_upto(qb + 2 < nqb); /* the next tile's */
        fence_async_smem();
        /* both warpgroups' dS^T stored, and the share's turn come (the turn
         * warp arrives when it has seen it). dS^T has two buffers: the one
         * this tile writes was last read by the dQ product two tiles ago,
         * which every warp waited for before this barrier's last phase. */
        named_sync(BAR_GO, NT_TURN);
        if (reads_acc && !acc_sent) copy_acc(qb);

        /* this tile's share of dQ: 64 queries x this warpgroup's 32 columns,
         * over the block's keys that see the tile (the second warpgroup's
         * from the tile after its diagonal). Two straight sequences: a
         * branch between MMAs of one group makes the compiler fence and
         * commit each on its own. */
        float dqs[16];
        {
            const uint64_t ad = desc(sSi), bd = desc(sK + wg * 64);
            wg_fence();
            mma_ss_tt_n32<true>(dqs, ad, bd);
            if (qb > qb0 && k0 + 64 < T) {
#pragma unroll
                for (int kk = 1; kk < 8; kk++)
                    mma_ss_tt_n32<false>(dqs, ad + kk * KSTEP_MN, bd + kk * KSTEP_MN);
                wg_commit();
            } else {
#pragma unroll
                for (int kk = 1; kk < 4; kk++)
                    mma_ss_tt_n32<false>(dqs, ad + kk * KSTEP_MN, bd + kk * KSTEP_MN);
                wg_commit();
            }
        }
        wg_wait0();
        reg_fence(dqs);
        /* the share into the accumulator, in one of three ways (a choice
         * the same for every thread, made once a tile, not per element) */
        if (!last) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int q = qb * 64 + warp * 16 + g + r * 8;
                float* ap = acc_bh + (size_t)q * 64 + col;
                if (q < T) {
                    if (lead) { /* the first share: stored */
#pragma unroll
                        for (int jj = 0; jj < 4; jj++)
                            __stcg(reinterpret_cast<float2*>(ap + 8 * jj),
                                   make_float2(dqs[4 * jj + 2 * r], dqs[4 * jj + 2 * r + 1]));
                    } else { /* a middle one: added */
#pragma unroll
                        for (int jj = 0; jj < 4; jj++)
                            red_add2(ap + 8 * jj, dqs[4 * jj + 2 * r], dqs[4 * jj + 2 * r + 1]);
                    }
                }
            }
        } else { /* key block 0's, the last: added to what the accumulator holds, scaled, stored in bf16 */
            if (!lead) cp_wait<0>();
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int tr = warp * 16 + g + r * 8, q = qb * 64 + tr;
                if (q >= T) continue;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    float x = dqs[4 * jj + 2 * r], y = dqs[4 * jj + 2 * r + 1];
                    if (!lead) {
                        const float2 o = acc_s[(r * 4 + jj) * NT + threadIdx.x];
                        x = o.x + x;
                        y = o.y + y;
                    }
                    const uint32_t q2 = pack_bf16(x * scale, y * scale);
                    *reinterpret_cast<uint32_t*>(dqkv + ((size_t)b * T + q) * C3 + h * HS + col + 8 * jj) = q2;
                    if constexpr (BIAS) add_bf16x2(csq, jj, q2);
                }
            }
        }
        named_arrive(BAR_DONE, NT_TURN);
    }
    if (pend) mma_pb_wait(dk, da, sQ + pend_st * TILE); /* the last tile's dK */
    /* every compute warp is done with K's tiles (read by the dQ products) */
    named_sync(BAR_CONS, NT);
    /* dK (scaled) and dV in bf16 as A fragments, their rows stored into K's
     * and V's tiles (stmatrix), then copied out in 16-byte pieces: a thread
     * writing its fragments straight to dqkv needs 32 four-byte stores */
    uint32_t kfr[4][4], vfr[4][4];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] *= scale;
    to_frags(kfr, dk);
    to_frags(vfr, dv);
    float cs[3][16]; /* BIAS: sums of this thread's stored rows of dQ (key block 0), dK, dV */
    if constexpr (BIAS) {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            cs[0][i] = (i >> 3) == wg ? csq[i & 7] : 0.0f; /* columns 32 wg .. */
            cs[1][i] = cs[2][i] = 0.0f;
        }
        /* fragment kfr[kc][x]: row krow + 8 (x & 1), columns 8 (2 kc + x / 2) + 2 t4, +1 */
#pragma unroll
        for (int kc = 0; kc < 4; kc++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                if (krow + 8 * (x & 1) < T) {
                    add_bf16x2(cs[1], 2 * kc + (x >> 1), kfr[kc][x]);
                    add_bf16x2(cs[2], 2 * kc + (x >> 1), vfr[kc][x]);
                }
    }
    store_frags(sK + wg * TILE, kfr, warp, lane);
    store_frags(sV + wg * TILE, vfr, warp, lane);
    named_sync(BAR_CONS, NT);
#pragma unroll
    for (int k = 0; k < 128 * 8 / NT; k++) {
        const int i = threadIdx.x + k * NT, r = i >> 3, c = i & 7, key = k0 + r;
        if (key < T) {
            bf16* dst = dqkv + ((size_t)b * T + key) * C3 + h * HS + c * 8;
            *reinterpret_cast<uint4*>(dst + C) = lds128(sK + sw128(r, c));
            *reinterpret_cast<uint4*>(dst + 2 * C) = lds128(sV + sw128(r, c));
        }
    }
    if constexpr (BIAS) {
        float* red = (float*)(smraw + (sS - smem_addr(smraw)));
        block_colsum<3>(cs, red, partial + ((size_t)b * nkb + kb) * C3 + h * HS, C);
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
    CudaCtx* c = cuda_ctx(be);
    cudaStream_t st = c->stream;
    int* dflag = (int*)cuda_scratch(be, sizeof(int));
    int flag = 0;
    attn_sm90_probe<<<1, 1, 0, st>>>(dflag);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(&flag, dflag, sizeof(int), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (!flag) return false;
    /* the backward's tensor maps are made by the driver's encoder, looked
     * up here (no link against the driver library); without it the mma.sync
     * kernels run */
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return false;
    }
    c->tmap_encode = fn;
    CUDA_CHECK(
        cudaFuncSetAttribute(attn_fwd_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM90_SMEM_FWD));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_sm90<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_BWD));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_sm90<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SM90_SMEM_BWD));
    return true;
}

void attn_sm90_forward(cudaStream_t st, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                       float sl2) {
    dim3 grid((T + 127) / 128, B * NH);
    attn_fwd_sm90<<<grid, NT, SM90_SMEM_FWD, st>>>(out, lse, qkv, T, NH, sl2);
    LAUNCH_CHECK();
}

/* A tensor map of 64-row tiles of one head: base viewed as [B][T][heads][64]
 * bf16 (a row of T holds `heads` heads of 64), boxes of 64 x 64 with the
 * 128-byte swizzle the kernels' tiles use, rows past T filled with zeros. */
static CUtensorMap head_tile_map(CudaCtx* c, const bf16* base, int heads, int T, int B) {
    CUtensorMap m;
    const cuuint64_t dims[4] = {64, (cuuint64_t)heads, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[3] = {64 * sizeof(bf16), (cuuint64_t)heads * 64 * sizeof(bf16),
                                   (cuuint64_t)T * heads * 64 * sizeof(bf16)};
    const cuuint32_t box[4] = {64, 1, 64, 1}, estr[4] = {1, 1, 1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode)(
        &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)base, dims, strides, box, estr,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fatal("attention backward: the tensor map of %d heads x %d rows x %d sequences was refused (error %d)",
              heads, T, B, (int)r);
    return m;
}

/* The backward's per-query values, a query tile's 64 pairs in one 512-byte
 * piece: ld[2 (bh Tp + t)] = -log2(e) lse and ld[2 (bh Tp + t) + 1] = D =
 * rowsum(dO * O) of query t of head bh, for t < Tp = T rounded up to 64 (0
 * past T). D by common.cuh's attn_row_dot, 8 lanes a query, as the other
 * attention kernels' D pass. */
__global__ void attn_bwd_pre_sm90(float* ld, const bf16* dout, const bf16* out, const float* lse, long rows,
                                  int T, int Tp, int NH) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long row = i / 8; /* bh Tp + t */
    const int c = (int)(i % 8), t = (int)(row % Tp);
    const long bh = row / Tp;
    const float s =
        attn_row_dot<HS / 8>(dout, out, (int)(bh / NH), t, (int)(bh % NH), T, NH, c, row < rows && t < T);
    if (row < rows && c == 0) {
        const float l = t < T ? lse[bh * T + t] : 0.0f;
        *reinterpret_cast<float2*>(ld + 2 * row) = make_float2(-LOG2E * l, s);
    }
}

void attn_sm90_backward(Backend* be, bf16* dqkv, float* partial, float* dqacc, int* turn, float* ld,
                        const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, int B, int T,
                        int NH, float sl2, float scale) {
    CudaCtx* c = cuda_ctx(be);
    cudaStream_t st = c->stream;
    const int Tp = (T + 63) / 64 * 64;
    const long rows = (long)B * NH * Tp;
    attn_bwd_pre_sm90<<<cdiv(rows * 8, 256), 256, 0, st>>>(ld, dout, out, lse, rows, T, Tp, NH);
    LAUNCH_CHECK();
    const CUtensorMap tq = head_tile_map(c, qkv, 3 * NH, T, B), td = head_tile_map(c, dout, NH, T, B);
    CUDA_CHECK(cudaMemsetAsync(turn, 0, ((size_t)B * NH * ((T + 63) / 64) + 1) * sizeof(int), st));
    dim3 grid((T + 127) / 128, B * NH);
    auto kern = partial ? attn_bwd_sm90<true> : attn_bwd_sm90<false>;
    kern<<<grid, NT_BWD, SM90_SMEM_BWD, st>>>(tq, td, dqkv, partial, dqacc, turn, ld, T, NH, sl2, scale);
    LAUNCH_CHECK();
}
