/* kernels/cpu_gemm.h — the packed fp32 GEMM behind the CPU backend's matmuls.
 *
 * C[M,N] (=|+=) A[M,K] B[K,N], A and B given by strides (so either may be
 * read transposed), C row-major. The arithmetic behind every element of C is
 * fixed by the shapes alone: it starts from its initial value (the bias or 0,
 * or C itself when accumulating) and adds a(i,k) * b(k,j) for k = 0..K-1 in
 * order, each addition a fused multiply-add (one rounding). Partial sums are
 * stored to C between k-blocks, which keeps them fp32 and changes no bit.
 * So the result is the same for any thread count, whichever thread takes
 * which block, and for every micro-kernel below: the AVX-512 and AVX2 kernels
 * and the portable one (fmaf) give the same bits, on any machine.
 *
 * The micro-kernel is picked once, when the backend is created, by what the
 * CPU supports at run time (not by the compiler flags): a build for a generic
 * x86-64 still runs the AVX-512 kernel where the CPU has it. */
#ifndef KERNELS_CPU_GEMM_H
#define KERNELS_CPU_GEMM_H

#include <stddef.h>

/* A micro-kernel computes one mr x nr tile of C over kc packed k-steps.
 * Ap: kc steps of mr values of A (step k, row r at Ap[k*mr + r]); Bp: kc
 * steps of nr values of B (Bp[k*nr + j]), 64-byte aligned. The tile starts
 * from init_row (nr values, every row; 64-byte aligned) when it is not NULL,
 * else from the tile at Cc (rows ldc apart), and ends stored at Cc. */
typedef void (*GemmMicroFn)(int kc, const float* Ap, const float* Bp, float* Cc, ptrdiff_t ldc,
                            const float* init_row);

typedef struct GemmKernel {
    const char* name; /* "avx512", "avx2", "portable" */
    int mr, nr;       /* tile rows and columns; nr a multiple of 16 */
    GemmMicroFn micro;
} GemmKernel;

/* The fastest kernel this CPU runs. */
const GemmKernel* gemm_kernel_best(void);
/* The kernel of that name if this CPU runs it, else NULL. */
const GemmKernel* gemm_kernel_named(const char* name);

typedef struct {
    int M, N, K;
    const float* A; /* A(i,k) = A[i*a_rs + k*a_cs] */
    ptrdiff_t a_rs, a_cs;
    const float* B; /* B(k,j) = B[k*b_rs + j*b_cs] */
    ptrdiff_t b_rs, b_cs;
    float* C; /* C(i,j) = C[i*ldc + j] */
    ptrdiff_t ldc;
    int accumulate;    /* 0: C = bias (or 0) + A B; 1: C += A B */
    const float* bias; /* [N] or NULL; only with accumulate = 0 */
} GemmArgs;

/* The packing buffers of gemm_run, kept from call to call and grown when a
 * call needs more (B's at most 8 MB; A's at most 8 MB, or one 96 KB panel a
 * thread): several MB allocated afresh per call would cost their page faults
 * every time. Start it zeroed; one scratch serves one gemm_run at a time. */
typedef struct {
    float *a, *b;
    size_t a_floats, b_floats;
} GemmScratch;
void gemm_scratch_free(GemmScratch* s);

/* Runs g with kernel k on the calling thread's OpenMP team (it opens a
 * parallel region). fatal() if scratch memory runs out. */
void gemm_run(const GemmKernel* k, GemmScratch* s, const GemmArgs* g);

#endif
