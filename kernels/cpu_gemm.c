/* kernels/cpu_gemm.c — the packed GEMM of kernels/cpu_gemm.h (GotoBLAS-style
 * blocking): blocks of A and B are packed into contiguous micro-panels and a
 * register-tiled micro-kernel updates an mr x nr tile of C, broadcasting one
 * A value per row and multiplying it into nr columns of B per k-step.
 *
 * Every kernel adds with a fused multiply-add and in the same k order, so
 * they agree bit for bit (test_kernels checks it on every kernel the machine
 * runs). The x86 kernels are compiled for their instruction set with a target
 * attribute and chosen at run time; the portable one uses fmaf, which the
 * compiler turns into the machine's FMA where the build targets one (and the
 * C library computes exactly otherwise). */
#include "cpu_gemm.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#else
#define GEMM_X86 0
#endif

#ifndef GEMM_MC
#define GEMM_MC 96 /* rows of A per task: a multiple of every kernel's mr (4, 6, 12) */
#endif
#ifndef GEMM_KC
#define GEMM_KC 256 /* k-block: an mr x KC A panel and a KC x nr B panel sit in L1/L2 */
#endif
#define GEMM_TILE_MAX (12 * 32) /* the largest mr x nr */

/* ------------------------------------------------------------ micro-kernels */

static void micro_portable(int kc, const float* restrict Ap, const float* restrict Bp, float* restrict Cc,
                           ptrdiff_t ldc, const float* restrict init_row) {
    enum { MR = 4, NR = 16 };
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = init_row ? init_row[j] : Cc[r * ldc + j];
    for (int k = 0; k < kc; k++) {
        const float* a = Ap + (size_t)k * MR;
        const float* b = Bp + (size_t)k * NR;
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] = fmaf(a[r], b[j], acc[r][j]);
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) Cc[r * ldc + j] = acc[r][j];
}

#if GEMM_X86
/* 6 x 16: 12 ymm accumulators, 2 for B, 1 broadcast (of 16 registers) */
__attribute__((target("avx2,fma"))) static void micro_avx2(int kc, const float* restrict Ap,
                                                           const float* restrict Bp, float* restrict Cc,
                                                           ptrdiff_t ldc, const float* restrict init_row) {
    enum { MR = 6 };
    __m256 c0[MR], c1[MR];
    if (init_row) {
        const __m256 i0 = _mm256_load_ps(init_row), i1 = _mm256_load_ps(init_row + 8);
        for (int r = 0; r < MR; r++) c0[r] = i0, c1[r] = i1;
    } else {
        for (int r = 0; r < MR; r++)
            c0[r] = _mm256_loadu_ps(Cc + r * ldc), c1[r] = _mm256_loadu_ps(Cc + r * ldc + 8);
    }
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(Bp + (size_t)k * 16), b1 = _mm256_load_ps(Bp + (size_t)k * 16 + 8);
        const float* a = Ap + (size_t)k * MR;
        for (int r = 0; r < MR; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + r);
            c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
        }
    }
    for (int r = 0; r < MR; r++)
        _mm256_storeu_ps(Cc + r * ldc, c0[r]), _mm256_storeu_ps(Cc + r * ldc + 8, c1[r]);
}

/* 12 x 32: 24 zmm accumulators, 2 for B, 1 broadcast (of 32 registers) */
__attribute__((target("avx512f"))) static void micro_avx512(int kc, const float* restrict Ap,
                                                            const float* restrict Bp, float* restrict Cc,
                                                            ptrdiff_t ldc, const float* restrict init_row) {
    enum { MR = 12 };
    __m512 c0[MR], c1[MR];
    if (init_row) {
        const __m512 i0 = _mm512_load_ps(init_row), i1 = _mm512_load_ps(init_row + 16);
        for (int r = 0; r < MR; r++) c0[r] = i0, c1[r] = i1;
    } else {
        for (int r = 0; r < MR; r++)
            c0[r] = _mm512_loadu_ps(Cc + r * ldc), c1[r] = _mm512_loadu_ps(Cc + r * ldc + 16);
    }
    for (int k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(Bp + (size_t)k * 32), b1 = _mm512_load_ps(Bp + (size_t)k * 32 + 16);
        const float* a = Ap + (size_t)k * MR;
        for (int r = 0; r < MR; r++) {
            const __m512 ar = _mm512_set1_ps(a[r]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
        }
    }
    for (int r = 0; r < MR; r++)
        _mm512_storeu_ps(Cc + r * ldc, c0[r]), _mm512_storeu_ps(Cc + r * ldc + 16, c1[r]);
}
#endif

/* fastest first */
static const GemmKernel gemm_kernels[] = {
#if GEMM_X86
    {"avx512", 12, 32, micro_avx512},
    {"avx2", 6, 16, micro_avx2},
#endif
    {"portable", 4, 16, micro_portable},
};
enum { GEMM_NKERNELS = sizeof gemm_kernels / sizeof gemm_kernels[0] };

static int gemm_kernel_runs(const GemmKernel* k) {
#if GEMM_X86
    __builtin_cpu_init();
    if (strcmp(k->name, "avx512") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(k->name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return strcmp(k->name, "portable") == 0;
}

const GemmKernel* gemm_kernel_named(const char* name) {
    for (int i = 0; i < GEMM_NKERNELS; i++)
        if (strcmp(gemm_kernels[i].name, name) == 0)
            return gemm_kernel_runs(&gemm_kernels[i]) ? &gemm_kernels[i] : NULL;
    return NULL;
}

const GemmKernel* gemm_kernel_best(void) {
    for (int i = 0; i < GEMM_NKERNELS; i++)
        if (gemm_kernel_runs(&gemm_kernels[i])) return &gemm_kernels[i];
    return &gemm_kernels[GEMM_NKERNELS - 1];
}

/* ------------------------------------------------------------------ packing */

/* buf grown to at least floats (its contents are not kept) */
static float* gemm_scratch_grow(float** buf, size_t* have, size_t floats) {
    if (*have >= floats) return *buf;
    free(*buf);
    *buf = NULL;
    *have = 0;
    void* p = NULL;
    if (posix_memalign(&p, 64, floats * sizeof(float)) != 0 || !p)
        fatal("cpu backend: out of host memory allocating %zu bytes of GEMM scratch", floats * sizeof(float));
    *buf = p;
    *have = floats;
    return *buf;
}

void gemm_scratch_free(GemmScratch* s) {
    free(s->a);
    free(s->b);
    *s = (GemmScratch){0};
}

/* Pack rows [i0, i0+mc) x cols [k0, k0+kc) of A into mr-row micro-panels:
 * panel p, step k, row r at Ap[p*mr*kc + k*mr + r]; rows past mc are 0. */
static void gemm_pack_a(const GemmArgs* g, int mr, float* restrict Ap, int i0, int mc, int k0, int kc) {
    for (int ip = 0; ip < mc; ip += mr) {
        float* dst = Ap + (size_t)ip * kc;
        int rows = mc - ip < mr ? mc - ip : mr;
        if (g->a_cs == 1) {
            for (int r = 0; r < mr; r++) {
                if (r < rows) {
                    const float* src = g->A + (ptrdiff_t)(i0 + ip + r) * g->a_rs + k0;
                    for (int k = 0; k < kc; k++) dst[(size_t)k * mr + r] = src[k];
                } else {
                    for (int k = 0; k < kc; k++) dst[(size_t)k * mr + r] = 0.0f;
                }
            }
        } else {
            for (int k = 0; k < kc; k++) {
                const float* src = g->A + (ptrdiff_t)(i0 + ip) * g->a_rs + (ptrdiff_t)(k0 + k) * g->a_cs;
                for (int r = 0; r < mr; r++) dst[(size_t)k * mr + r] = r < rows ? src[r * g->a_rs] : 0.0f;
            }
        }
    }
}

/* Pack rows [k0, k0+kc) x cols [j0, j0+nr) of B (cols past N are 0) into
 * one micro-panel: step k, col j at dst[k*nr + j]. */
static void gemm_pack_b_panel(const GemmArgs* g, int nr, float* restrict dst, int j0, int k0, int kc) {
    const int cols = g->N - j0 < nr ? g->N - j0 : nr;
    if (g->b_cs == 1) {
        for (int k = 0; k < kc; k++) {
            const float* src = g->B + (ptrdiff_t)(k0 + k) * g->b_rs + j0;
            float* d = dst + (size_t)k * nr;
            for (int j = 0; j < cols; j++) d[j] = src[j];
            for (int j = cols; j < nr; j++) d[j] = 0.0f;
        }
    } else {
        for (int j = 0; j < nr; j++) {
            if (j < cols) {
                const float* src = g->B + (ptrdiff_t)(j0 + j) * g->b_cs + (ptrdiff_t)k0 * g->b_rs;
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + j] = src[(ptrdiff_t)k * g->b_rs];
            } else {
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + j] = 0.0f;
            }
        }
    }
}

/* ------------------------------------------------------------------- driver */

/* Blocking: columns of C in blocks of up to NCB; within one, k in ranges of
 * up to kcb (as much as fits GEMM_BPACK floats, a multiple of KC; all of K
 * when it fits); within one, rows in blocks of up to mcb (as many as fit
 * GEMM_APACK floats, a multiple of MC; all of M when they fit). For each
 * (column block, k-range) all threads pack that block of B into a shared
 * buffer. Tasks of MC rows x nctw columns (nctw: NCT, or less when that gives
 * too few tasks for the threads) then run the k-range KC at a time, so a
 * task's C tile stays in cache across the k-blocks. A is packed once per row
 * block into a second shared buffer when the columns are split over several
 * tasks (each would pack the same rows again); otherwise each task packs its
 * own MC x KC panel, which stays in its core's cache. Which thread takes which task does not change any result: every
 * C element sees its k-blocks in order (k-ranges are separated by
 * barriers). */
#ifndef GEMM_NCB
#define GEMM_NCB 4096 /* columns of a shared packed B block: a multiple of every nr */
#endif
#ifndef GEMM_NCT
#define GEMM_NCT 1024 /* columns of one task at most: 128 times a power of two */
#endif
#ifndef GEMM_BPACK
#define GEMM_BPACK ((size_t)2 << 20) /* floats in the shared packed B block (8 MB) */
#endif
#ifndef GEMM_APACK
#define GEMM_APACK ((size_t)2 << 20) /* floats in the shared packed A block (8 MB) */
#endif
/* kcb * ncb <= GEMM_BPACK and kcb * mcb <= GEMM_APACK, or they are one KC and one MC */

/* One (column block, k-range, row block) of the blocking above: its packed
 * operands and their extent. In the packed A block, k-block s of the range
 * starts at Ap + s*KC*mcb and the MC-row task r of the row block at + r*MC*kc;
 * in the packed B block, k-block s at Bp + s*KC*ncb and its panel p at +
 * p*nr*kc. */
typedef struct {
    const float *Ap, *Bp;
    int mcb, ncb;   /* row and column capacities of the packed blocks */
    int i0, mc_blk; /* rows [i0, i0+mc_blk) */
    int j0, nc;     /* columns [j0, j0+nc) */
    int kr0, krn;   /* k in [kr0, kr0+krn) */
} GemmBlock;

/* Task (r, columns [jt0, jt1) of the block) over the whole k-range. With
 * own_a (MC x KC floats) the task packs its rows of A there itself, k-block
 * by k-block (they stay in its core's cache); without, it reads them from
 * the shared packed A block. */
static void gemm_task(const GemmKernel* kern, const GemmArgs* g, const GemmBlock* b, int r, int jt0, int jt1,
                      float* own_a, float* tile, float* init) {
    const int mr = kern->mr, nr = kern->nr;
    const int i0 = b->i0 + r * GEMM_MC;
    const int mc = b->i0 + b->mc_blk - i0 < GEMM_MC ? b->i0 + b->mc_blk - i0 : GEMM_MC;
    const int nsub = (b->krn + GEMM_KC - 1) / GEMM_KC;
    for (int s = 0; s < nsub; s++) {
        const int k0 = b->kr0 + s * GEMM_KC;
        const int kc = b->kr0 + b->krn - k0 < GEMM_KC ? b->kr0 + b->krn - k0 : GEMM_KC;
        const int first = (k0 == 0) && !g->accumulate;
        const float* ablk = own_a ? own_a : b->Ap + (size_t)s * GEMM_KC * b->mcb + (size_t)r * GEMM_MC * kc;
        if (own_a) gemm_pack_a(g, mr, own_a, i0, mc, k0, kc);
        const float* bblk = b->Bp + (size_t)s * GEMM_KC * b->ncb;
        for (int jp = jt0; jp < jt1; jp += nr) {
            const int cols = jt1 - jp < nr ? jt1 - jp : nr;
            if (first)
                for (int j = 0; j < nr; j++) init[j] = (g->bias && j < cols) ? g->bias[b->j0 + jp + j] : 0.0f;
            const float* bpan = bblk + (size_t)jp * kc;
            for (int ip = 0; ip < mc; ip += mr) {
                const int rows = mc - ip < mr ? mc - ip : mr;
                const float* apan = ablk + (size_t)ip * kc;
                float* Cc = g->C + (ptrdiff_t)(i0 + ip) * g->ldc + b->j0 + jp;
                if (rows == mr && cols == nr) {
                    kern->micro(kc, apan, bpan, Cc, g->ldc, first ? init : NULL);
                } else {
                    /* an edge tile: through a full-size copy */
                    if (!first) {
                        memset(tile, 0, sizeof(float) * mr * nr);
                        for (int q = 0; q < rows; q++)
                            memcpy(tile + q * nr, Cc + (ptrdiff_t)q * g->ldc, sizeof(float) * cols);
                    }
                    kern->micro(kc, apan, bpan, tile, nr, first ? init : NULL);
                    for (int q = 0; q < rows; q++)
                        memcpy(Cc + (ptrdiff_t)q * g->ldc, tile + q * nr, sizeof(float) * cols);
                }
            }
        }
    }
}

void gemm_run(const GemmKernel* kern, GemmScratch* scr, const GemmArgs* g) {
    const int M = g->M, N = g->N, K = g->K, nr = kern->nr;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!g->accumulate)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) g->C[(ptrdiff_t)i * g->ldc + j] = g->bias ? g->bias[j] : 0.0f;
        return;
    }
    const int npad = (N + nr - 1) / nr * nr;
    const int ncb = npad < GEMM_NCB ? npad : GEMM_NCB;
    size_t kcb_s = GEMM_BPACK / (size_t)ncb;
    if (kcb_s > GEMM_APACK / GEMM_MC) kcb_s = GEMM_APACK / GEMM_MC;
    kcb_s = kcb_s / GEMM_KC * GEMM_KC;
    if (kcb_s < GEMM_KC) kcb_s = GEMM_KC;
    const int kcb = kcb_s >= (size_t)K ? K : (int)kcb_s;
    const int mpad = (M + GEMM_MC - 1) / GEMM_MC * GEMM_MC;
    size_t mcb_s = GEMM_APACK / (size_t)kcb / GEMM_MC * GEMM_MC;
    if (mcb_s < GEMM_MC) mcb_s = GEMM_MC;
    const int mcb = mcb_s >= (size_t)mpad ? mpad : (int)mcb_s;
    /* columns per task: the widest (GEMM_NCT, halved down to 128) that still gives each thread
     * about four tasks, so that 16 threads are not left with 11 tasks of a [1024, 768] output */
    const int want = 4 * omp_get_max_threads();
    const int mt = (mcb + GEMM_MC - 1) / GEMM_MC;
    int nctw = GEMM_NCT;
    while (nctw > 128 && (long)mt * ((ncb + nctw - 1) / nctw) < want) nctw /= 2;
    /* A is packed once into the shared block when the columns are split over several tasks (each
     * would pack the same rows again), else by each task into its own panel */
    const int share_a = (ncb + nctw - 1) / nctw > 1;
    const int nth = omp_get_max_threads();
    float* Bp = gemm_scratch_grow(&scr->b, &scr->b_floats, (size_t)kcb * ncb);
    float* Ap = share_a ? gemm_scratch_grow(&scr->a, &scr->a_floats, (size_t)kcb * mcb)
                        : gemm_scratch_grow(&scr->a, &scr->a_floats, (size_t)nth * GEMM_MC * GEMM_KC);
#pragma omp parallel
    {
        float tile[GEMM_TILE_MAX] __attribute__((aligned(64)));
        float init[32] __attribute__((aligned(64)));
        GemmBlock b = {.Ap = Ap, .Bp = Bp, .mcb = mcb, .ncb = ncb};
        float* own_a = share_a ? NULL : Ap + (size_t)omp_get_thread_num() * GEMM_MC * GEMM_KC;
        for (b.j0 = 0; b.j0 < N; b.j0 += ncb) {
            b.nc = N - b.j0 < ncb ? N - b.j0 : ncb;
            const int npan = (b.nc + nr - 1) / nr;
            const int nct = (b.nc + nctw - 1) / nctw;
            for (b.kr0 = 0; b.kr0 < K; b.kr0 += kcb) {
                b.krn = K - b.kr0 < kcb ? K - b.kr0 : kcb;
                const int nsub = (b.krn + GEMM_KC - 1) / GEMM_KC;
#pragma omp for schedule(static)
                for (int t = 0; t < nsub * npan; t++) {
                    const int s = t / npan, p = t % npan;
                    const int k0 = b.kr0 + s * GEMM_KC;
                    const int kc = b.kr0 + b.krn - k0 < GEMM_KC ? b.kr0 + b.krn - k0 : GEMM_KC;
                    gemm_pack_b_panel(g, nr, Bp + (size_t)s * GEMM_KC * ncb + (size_t)p * nr * kc,
                                      b.j0 + p * nr, k0, kc);
                }
                for (b.i0 = 0; b.i0 < M; b.i0 += mcb) {
                    b.mc_blk = M - b.i0 < mcb ? M - b.i0 : mcb;
                    const int nrt = (b.mc_blk + GEMM_MC - 1) / GEMM_MC;
                    if (share_a) { /* the same on every thread: all or none reach the loop */
#pragma omp for schedule(static)
                        for (int t = 0; t < nsub * nrt; t++) {
                            const int s = t / nrt, r = t % nrt;
                            const int k0 = b.kr0 + s * GEMM_KC;
                            const int kc = b.kr0 + b.krn - k0 < GEMM_KC ? b.kr0 + b.krn - k0 : GEMM_KC;
                            const int i0 = b.i0 + r * GEMM_MC;
                            const int mc = b.i0 + b.mc_blk - i0 < GEMM_MC ? b.i0 + b.mc_blk - i0 : GEMM_MC;
                            gemm_pack_a(g, kern->mr, Ap + (size_t)s * GEMM_KC * mcb + (size_t)r * GEMM_MC * kc,
                                        i0, mc, k0, kc);
                        }
                    }
#pragma omp for schedule(dynamic, 1)
                    for (int task = 0; task < nrt * nct; task++) {
                        const int jt0 = (task % nct) * nctw;
                        const int jt1 = b.nc - jt0 < nctw ? b.nc : jt0 + nctw;
                        gemm_task(kern, g, &b, task / nct, jt0, jt1, own_a, tile, init);
                    }
                }
            }
        }
    }
}
