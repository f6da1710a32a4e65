/* kernels/cuda/sm90.cuh — the Hopper (sm_90a) primitives that the wgmma
 * kernels share (attention_sm90.cu, matmul_sm90.cu): shared-memory tiles of
 * 128-byte rows in the 128-byte swizzle that both wgmma and the copy engine
 * (TMA) use, wgmma's matrix descriptors and its fence / commit / wait,
 * mbarriers, the copy engine's 2-D tile loads (to one block or multicast to
 * the blocks of a cluster) and stores, named barriers, cluster barriers.
 *
 * SM90A is defined in device code compiled for sm_90a only (wgmma, setmaxnreg
 * and the tensor copies are not in the portable PTX); the kernels that use
 * these compile to empty bodies elsewhere and are launched only where
 * CudaCtx.sm90 says their machine code runs (backend.cu). */
#ifndef KERNELS_CUDA_SM90_CUH
#define KERNELS_CUDA_SM90_CUH

#include <cuda.h> /* CUtensorMap (the driver's encoder is found at run time) */
#include <cudaTypedefs.h>

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90A 1
#endif

#ifdef SM90A
namespace {

/* ---- shared-memory tiles ---- */
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* byte offset of 16-byte chunk c of row r in a swizzled tile of 128-byte rows */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* shared-memory writes of this thread (st.shared, cp.async, stmatrix) become
 * visible to the async proxy (wgmma, the copy engine) after this, in every
 * writing thread, then a barrier */
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

/* 16 bytes of shared memory */
__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
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

/* ---- mbarriers, the copy engine, named barriers ---- */
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
/* ---- clusters ---- */
/* every thread of the cluster waits here for all of its threads that have
 * not exited; the shared-memory writes before it (this block's and the
 * others') are visible after it */
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* one arrival on the mbarrier at shared address bar (an offset in this
 * block's shared memory) of block `cta` of the cluster, this one included */
__device__ __forceinline__ void mbar_arrive_cta(uint32_t bar, uint32_t cta) {
    asm volatile("{\n.reg .b32 a;\nmapa.shared::cluster.u32 a, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [a];\n}\n" ::"r"(bar),
                 "r"(cta)
                 : "memory");
}

/* the 2-D tile of map at coordinates (c0 inner, c1) into shared memory at
 * dst, completing on the mbarrier bar (the tile's bytes count against its
 * expected bytes) */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
/* the same, into the same offset dst of every block of the cluster in
 * `ctas` (a bit a block), each completing on its own mbarrier at offset bar */
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                                      uint32_t bar, uint16_t ctas) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::"
                 "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(ctas)
                 : "memory");
}
/* shared memory at src to the 2-D tile of map at (c0, c1) (parts outside the
 * tensor are not written), in this thread's current bulk group */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, uint32_t src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until this thread's bulk stores have read their shared memory (READ) or
 * are complete */
template <bool READ> __device__ __forceinline__ void bulk_wait_all() {
    if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
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

} // namespace
#endif

#endif
