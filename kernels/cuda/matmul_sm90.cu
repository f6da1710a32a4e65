/* kernels/cuda/matmul_sm90.cu — the fc forward on Hopper (sm_90a), bf16:
 * pre = inp @ w^T + bias and out = gelu(pre), both [M, N] and both written,
 * from inp [M, K] and w [N, K] (row-major, the layout of matmul_forward; K a
 * multiple of 64 and N of 256).
 *
 * Why a kernel of our own: cuBLASLt's GELU_AUX_BIAS epilogue takes about 1.4x
 * the time of the same GEMM without it (1.64x at the power limit), because
 * the GELU and the second store of each element run while the tensor cores
 * wait. Here a warpgroup of its own does that work while the next tile's
 * products run.
 *
 * A persistent kernel, one block of 384 threads a multiprocessor, in
 * clusters of two blocks that walk the output in pairs of 128 x 256 tiles,
 * the two m-blocks above each other (the clusters at work at once share
 * rows of inp, and w stays in L2). The two tiles of a pair need the same
 * 256 rows of w: each block loads half of them for both (the copy engine's
 * multicast), so a k-step takes 32 KB from L2 a block instead of 48. A
 * block works in three roles:
 *  - warp 0, one thread (the producer): the copy engine loads each k-step's
 *    tiles (inp 128 x 64, and w's 128 x 64 half into both blocks) into one of
 *    STAGES buffers, once the consumers of both blocks have released it;
 *  - warpgroups 1 and 2 (the consumers): 64 rows of the tile each,
 *    d (64 x 256 fp32, 128 registers a thread) += A B^T by wgmma m64n256k16
 *    with both operands in shared memory; at the tile's end they add the
 *    bias and write the bf16 pre-activation into a staging tile (stmatrix);
 *  - warps 1-3 (the epilogue): store the staging tile as pre (the copy
 *    engine), then replace it by its gelu and store that as out (the copy
 *    engine again), then release it, which the consumers wait for only at
 *    the end of their next tile.
 * (All roles compile to the 168 registers a thread of a 384-thread block:
 * the consumers' 128 accumulators fit without setmaxnreg. A fourth
 * warpgroup would leave 128, too few for them.)
 * gelu is computed from the bf16 pre-activation with common.cuh's gelu_f,
 * as gelu_forward would from pre. Each output's k-sum runs in order in fp32
 * within one block: the same bits every run.
 *
 * Shared-memory tiles have rows of 64 bf16 (128 bytes) in the 128-byte
 * swizzle that wgmma and the copy engine share (sm90.cuh). */
#include "common.cuh"
#include "sm90.cuh"

static constexpr int BM = 128, BN = 256, BK = 64; /* the output tile; a k-step */
static constexpr int STAGES = 3;
static constexpr int CLUSTER = 2;                                  /* blocks a cluster: the tiles of a pair */
static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2; /* 16 + 32 KB a stage */
static constexpr int STG_BLOCK = BM * 128;                         /* 64 columns of the staging tile: 16 KB */
static constexpr int NTHREADS = 384; /* the producer and epilogue warpgroup, two consumer warpgroups */
/* the stages; the staging tile (four 64-column blocks); full and empty
 * mbarriers a stage, then the staging tile's */
static constexpr size_t SMEM = 1024 + STAGES * (A_BYTES + B_BYTES) + 4 * STG_BLOCK + 8 * (2 * STAGES + 2);

#ifdef SM90A
namespace {
constexpr int NT_EPI = 96; /* the epilogue's threads (warps 1-3) */
constexpr int BAR_EPI = 1; /* their named barrier */

/* the 128 accumulator operands of an m64n256 wgmma */
#define WG_D128(C)                                                                                           \
    C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]),      \
        C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]),  \
        C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]),  \
        C(d[31]), C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), C(d[40]),  \
        C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]),  \
        C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]),  \
        C(d[61]), C(d[62]), C(d[63]), C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]),  \
        C(d[71]), C(d[72]), C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), C(d[80]),  \
        C(d[81]), C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87]), C(d[88]), C(d[89]), C(d[90]),  \
        C(d[91]), C(d[92]), C(d[93]), C(d[94]), C(d[95]), C(d[96]), C(d[97]), C(d[98]), C(d[99]), C(d[100]), \
        C(d[101]), C(d[102]), C(d[103]), C(d[104]), C(d[105]), C(d[106]), C(d[107]), C(d[108]), C(d[109]),   \
        C(d[110]), C(d[111]), C(d[112]), C(d[113]), C(d[114]), C(d[115]), C(d[116]), C(d[117]), C(d[118]),   \
        C(d[119]), C(d[120]), C(d[121]), C(d[122]), C(d[123]), C(d[124]), C(d[125]), C(d[126]), C(d[127])
#define WG_REGS128                                                                                   \
    "{"                                                                                              \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "               \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "               \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
    "}"

/* d (64 x 256, fp32) [+]= A (64 x 16) B^T (B: 256 rows of n, 16 of k), both
 * K-major in shared memory; acc 0: d = A B^T */
__device__ __forceinline__ void mma_n256(float (&d)[128], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_REGS128
                 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WG_D128("+f")
                 : "l"(a), "l"(b), "r"(acc));
}

/* bias[col], bias[col + 1] as floats (0 without a bias) */
__device__ __forceinline__ float2 bias_pair(const bf16* bias, int col) {
    if (!bias) return make_float2(0.0f, 0.0f);
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + col));
}

/* a stage's mbarrier `empty` at offset bar, arrived on in every block of the
 * cluster: both blocks' producers write into each block's stage */
__device__ __forceinline__ void release_stage(uint32_t bar) {
#pragma unroll
    for (int c = 0; c < CLUSTER; c++) mbar_arrive_cta(bar, c);
}

/* gelu of 8 bf16 (16 bytes) */
__device__ __forceinline__ uint4 gelu8(uint4 v) {
    uint32_t* p = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&p[i]));
        p[i] = pack_bf16(gelu_f(x.x), gelu_f(x.y));
    }
    return v;
}
} // namespace
#endif

__global__ void __launch_bounds__(NTHREADS, 1) __cluster_dims__(CLUSTER, 1, 1)
    fc_gelu_kernel(const __grid_constant__ CUtensorMap tm_inp, const __grid_constant__ CUtensorMap tm_w,
                   const __grid_constant__ CUtensorMap tm_pre, const __grid_constant__ CUtensorMap tm_out,
                   const bf16* bias, int M, int N, int K) {
#ifdef SM90A
    const uint32_t sA = smem_base(), sB = sA + STAGES * A_BYTES, sP = sB + STAGES * B_BYTES;
    const uint32_t full = sP + 4 * STG_BLOCK, empty = full + 8 * STAGES;
    const uint32_t pfull = empty + 8 * STAGES, pempty = pfull + 8; /* the staging tile's */
    /* pair p of the cluster's walk: m-blocks 2 (p / nb) and the next, n-block
     * p % nb; this block (its rank in the cluster: blockIdx.x % 2) takes
     * the m-block of its rank (one past M reads zeros and writes nothing) */
    const int nb = N / BN, npairs = ((M + BM - 1) / BM + CLUSTER - 1) / CLUSTER * nb, nk = K / BK;
    const int rank = blockIdx.x % CLUSTER, pair0 = blockIdx.x / CLUSTER, pairs_step = gridDim.x / CLUSTER;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + 8 * s, 1);            /* the producer's, with the bytes to expect */
            mbar_init(empty + 8 * s, 8 * CLUSTER); /* one arrival a consumer warp of each block */
        }
        mbar_init(pfull, 256);     /* every consumer thread */
        mbar_init(pempty, NT_EPI); /* every epilogue thread */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync(); /* the other block's barriers are set up before this one's copies and arrivals reach them */
    const int wg = warpgroup(), lane = threadIdx.x & 31;

    if (wg == 0 && threadIdx.x < 32) {
        /* ---- the producer ---- */
        if (threadIdx.x == 0) {
            int it = 0; /* k-steps of this block so far: stage it % STAGES */
            for (int p = pair0; p < npairs; p += pairs_step) {
                const int m0 = (p / nb * CLUSTER + rank) * BM, n0 = p % nb * BN;
                for (int kb = 0; kb < nk; kb++, it++) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(empty + 8 * s, (it / STAGES - 1) & 1);
                    /* both halves of w's tile count here: this block's own
                     * and the other block's multicast */
                    mbar_expect_tx(full + 8 * s, A_BYTES + B_BYTES);
                    /* rows past M are read as zeros (and counted in the bytes) */
                    tma_load_2d(sA + s * A_BYTES, &tm_inp, kb * BK, m0, full + 8 * s);
                    tma_load_2d_multicast(sB + s * B_BYTES + rank * (B_BYTES / CLUSTER), &tm_w, kb * BK,
                                          n0 + rank * (BN / CLUSTER), full + 8 * s, (1u << CLUSTER) - 1);
                }
            }
        }
    } else if (wg == 0) {
        /* ---- the epilogue: pre by the copy engine, out = gelu(pre) ---- */
        const int e = threadIdx.x - 32;
        int tc = 0; /* tiles of this block so far */
        for (int p = pair0; p < npairs; p += pairs_step, tc++) {
            const int m0 = (p / nb * CLUSTER + rank) * BM, n0 = p % nb * BN;
            mbar_wait(pfull, tc & 1);
            /* the staging tile to pre (rows past M are not written), then,
             * once the copy engine has read it, gelu in place and the tile
             * to out */
            if (e == 0) {
                for (int cb = 0; cb < 4; cb++) tma_store_2d(&tm_pre, n0 + 64 * cb, m0, sP + cb * STG_BLOCK);
                bulk_commit();
                bulk_wait_all<true>();
            }
            named_sync(BAR_EPI, NT_EPI);
            /* 16-byte chunk q of the tile (a warp's 32 chunks: 4 whole rows
             * of 64 columns) */
#pragma unroll 4
            for (int q = e; q < 4 * BM * 8; q += NT_EPI) {
                const uint32_t a = sP + (q >> 10) * STG_BLOCK + sw128((q >> 3) & (BM - 1), q & 7);
                sts128(a, gelu8(lds128(a)));
            }
            fence_async_smem(); /* for the copy engine's store */
            named_sync(BAR_EPI, NT_EPI);
            if (e == 0) {
                for (int cb = 0; cb < 4; cb++) tma_store_2d(&tm_out, n0 + 64 * cb, m0, sP + cb * STG_BLOCK);
                bulk_commit();
                bulk_wait_all<true>(); /* the copy engine has read the tile */
            }
            mbar_arrive(pempty); /* complete once thread 0 has arrived too */
        }
        if (e == 0) bulk_wait_all<false>();
    } else {
        /* ---- the consumers ---- */
        const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, t4 = lane & 3;
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        int it = 0, tc = 0;
        for (int p = pair0; p < npairs; p += pairs_step, tc++) {
            const int n0 = p % nb * BN;
            for (int kb = 0; kb < nk; kb++, it++) {
                const int s = it % STAGES;
                mbar_wait(full + 8 * s, (it / STAGES) & 1);
                const uint64_t da = desc(sA + s * A_BYTES + cw * (64 * 128)), db = desc(sB + s * B_BYTES);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) mma_n256(d, da + kk * KSTEP_K, db + kk * KSTEP_K, kb | kk);
                wg_commit();
                /* the previous k-step's products are done: its stage is free */
                if (kb > 0) {
                    wg_wait<1>();
                    if (lane == 0) release_stage(empty + 8 * ((it - 1) % STAGES));
                }
            }
            wg_wait<0>();
            reg_fence(d);
            if (lane == 0) release_stage(empty + 8 * ((it - 1) % STAGES));

            /* d + bias, rounded to bf16, into the staging tile once the epilogue
             * has done with the previous tile's: lane l addresses row l % 16 of
             * the warp's 16, the 8 columns of block 2 jj + l / 16 (stmatrix's four
             * 8 x 8 matrices: rows 0-7 and 8-15 of block 2 jj, then of 2 jj + 1) */
            if (tc > 0) mbar_wait(pempty, (tc - 1) & 1);
            const int r = cw * 64 + warp * 16 + (lane & 15);
#pragma unroll
            for (int jj = 0; jj < 16; jj++) {
                const float2 b0 = bias_pair(bias, n0 + 16 * jj + 2 * t4),
                             b1 = bias_pair(bias, n0 + 16 * jj + 8 + 2 * t4);
                const uint32_t v0 = pack_bf16(d[8 * jj + 0] + b0.x, d[8 * jj + 1] + b0.y);
                const uint32_t v1 = pack_bf16(d[8 * jj + 2] + b0.x, d[8 * jj + 3] + b0.y);
                const uint32_t v2 = pack_bf16(d[8 * jj + 4] + b1.x, d[8 * jj + 5] + b1.y);
                const uint32_t v3 = pack_bf16(d[8 * jj + 6] + b1.x, d[8 * jj + 7] + b1.y);
                const int j = 2 * jj + (lane >> 4);
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 sP + (j / 8) * STG_BLOCK + sw128(r, j % 8)),
                             "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                             : "memory");
            }
            fence_async_smem(); /* for the copy engine's store */
            mbar_arrive(pfull);
        }
    }
    /* no block leaves while the other may still arrive on its barriers */
    cluster_sync();
#endif
}

/* A 2-D tensor map of a row-major bf16 matrix [outer][inner] in boxes of
 * box_outer x 64, the 128-byte swizzle of the kernel's tiles */
static CUtensorMap tile_map(CudaCtx* c, const void* base, int inner, int outer, int box_outer) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    const cuuint64_t strides[1] = {(cuuint64_t)inner * sizeof(bf16)};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_outer}, estr[2] = {1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode)(
        &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)base, dims, strides, box, estr,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fatal("fc forward: the tensor map of a %d x %d matrix was refused (error %d)", outer, inner, (int)r);
    return m;
}

void fc_gelu_sm90_init(Backend* be) {
    CudaCtx* c = cuda_ctx(be);
    CUDA_CHECK(cudaFuncSetAttribute(fc_gelu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    /* how many clusters fit at once (not always num_sms / 2: a cluster's
     * blocks run in one group of multiprocessors) */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(CLUSTER * c->num_sms);
    cfg.blockDim = dim3(NTHREADS);
    cfg.dynamicSmemBytes = SMEM;
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, fc_gelu_kernel, &cfg));
    if (n < 1) fatal("fc forward: the wgmma kernel's clusters of %d blocks do not fit this GPU", CLUSTER);
    c->fc_clusters = n;
    if (c->gemm_tune == 2)
        fprintf(stderr, "fc forward: the wgmma kernel, %d clusters of %d blocks at once (%d multiprocessors)\n",
                n, CLUSTER, c->num_sms);
}

bool fc_gelu_sm90_fits(const void* out, const void* pre, const void* inp, const void* w, const void* bias,
                       int M, int K, int N) {
    return M > 0 && K > 0 && K % BK == 0 && N % BN == 0 && aligned16(out) && aligned16(pre) && aligned16(inp) &&
           aligned16(w) && ((uintptr_t)bias & 3) == 0;
}

void fc_gelu_sm90(Backend* be, bf16* out, bf16* pre, const bf16* inp, const bf16* w, const bf16* bias, int M,
                  int K, int N) {
    CudaCtx* c = cuda_ctx(be);
    const CUtensorMap ti = tile_map(c, inp, K, M, BM), tw = tile_map(c, w, K, N, BN / CLUSTER),
                      tp = tile_map(c, pre, N, M, BM), to = tile_map(c, out, N, M, BM);
    const int npairs = ((M + BM - 1) / BM + CLUSTER - 1) / CLUSTER * (N / BN);
    const int grid = CLUSTER * (npairs < c->fc_clusters ? npairs : c->fc_clusters);
    fc_gelu_kernel<<<grid, NTHREADS, SMEM, c->stream>>>(ti, tw, tp, to, bias, M, N, K);
    LAUNCH_CHECK();
}
