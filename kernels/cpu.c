/* kernels/cpu.c — the CPU backend of kernels/kernels.h: fp32 kernels,
 * OpenMP-parallel, the reference that CI runs and the CUDA backend is
 * checked against.
 *
 * Determinism: the order of the floating-point operations behind every
 * output element is fixed by the shapes alone, never by the number of
 * threads or by which thread takes which block. A reduction is never split
 * across threads: we parallelise over the other dimension (layernorm dw/db
 * and encoder dwte/dwpe over channels, attention dk/dv over (batch, head),
 * matmul over blocks of C, each summing k in order). Sums that use several
 * partial accumulators ("lanes") put element i in lane i % L for a
 * compile-time L and combine the lanes in a fixed order; grad_sumsq sums
 * fixed-size chunks in double and adds the chunk sums in order. The build
 * uses -ffp-contract=off and no -ffast-math, so the compiler reassociates
 * nothing and fuses no multiply-add on its own: the bits are the same for
 * any thread count, and for any SIMD width.
 *
 * The matmuls are the packed GEMM of cpu_gemm.h, which fuses its
 * multiply-adds explicitly (the same bits from each of its micro-kernels,
 * picked at run time by what the CPU supports). exp is our own (exp_f:
 * add/mul only) so the softmax and GELU loops vectorise. */
#include "kernels.h"
#include "cpu_gemm.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LN_EPS 1e-5
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE 0.044715f

/* the backend's private state (be->ctx) */
typedef struct {
    const GemmKernel* gemm;   /* picked at creation by what the CPU runs (cpu_gemm.h) */
    GemmScratch gemm_scratch; /* the GEMM's packing buffers, reused by every matmul */
} CpuCtx;

/* ------------------------------------------------------------------ memory */

static void* cpu_alloc(Backend* be, size_t bytes, MemCategory cat) {
    void* p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    if (posix_memalign(&p, 64, rounded) != 0 || !p)
        fatal("cpu backend: out of host memory allocating %zu bytes for %s", bytes, mem_category_name[cat]);
    memset(p, 0, rounded);
    mem_track_alloc(&be->mem, cat, bytes);
    return p;
}

static void cpu_release(Backend* be, void* p, size_t bytes, MemCategory cat) {
    if (!p) return;
    free(p);
    mem_track_free(&be->mem, cat, bytes);
}

/* Large fills and copies (the gradient buffer every step, 0.5 GB for d12) are
 * split over the threads: one thread's memset reaches a fraction of the
 * memory bandwidth. */
#define CPU_PAR_BYTES ((size_t)1 << 20) /* per piece; smaller calls stay on one thread */

static void cpu_zero(Backend* be, void* p, size_t bytes) {
    (void)be;
    const size_t np = (bytes + CPU_PAR_BYTES - 1) / CPU_PAR_BYTES;
#pragma omp parallel for schedule(static) if (np > 1)
    for (size_t i = 0; i < np; i++) {
        const size_t off = i * CPU_PAR_BYTES;
        memset((char*)p + off, 0, bytes - off < CPU_PAR_BYTES ? bytes - off : CPU_PAR_BYTES);
    }
}

static void cpu_memcpy(Backend* be, void* dst, const void* src, size_t bytes) {
    (void)be;
    if (dst == src) return;
    const size_t np = (bytes + CPU_PAR_BYTES - 1) / CPU_PAR_BYTES;
#pragma omp parallel for schedule(static) if (np > 1)
    for (size_t i = 0; i < np; i++) {
        const size_t off = i * CPU_PAR_BYTES;
        memcpy((char*)dst + off, (const char*)src + off,
               bytes - off < CPU_PAR_BYTES ? bytes - off : CPU_PAR_BYTES);
    }
}

static void cpu_synchronize(Backend* be) { (void)be; }

static size_t cpu_peak_reserved(Backend* be) {
    (void)be;
    return mem_peak_rss();
}

static void cpu_reset_peak(Backend* be) { be->mem.peak = be->mem.total_current; }

static void cpu_destroy(Backend* be) {
    if (!be) return;
    gemm_scratch_free(&((CpuCtx*)be->ctx)->gemm_scratch);
    free(be->ctx);
    free(be);
}

static void cpu_x_to_f32(Backend* be, float* dst, const void* src, size_t n) {
    cpu_memcpy(be, dst, src, n * sizeof(float));
}

static void cpu_f32_to_x(Backend* be, void* dst, const float* src, size_t n) {
    cpu_memcpy(be, dst, src, n * sizeof(float));
}

/* Scratch for one thread inside a parallel region (not tracked: transient). */
static void* cpu_scratch(size_t bytes) {
    void* p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0 || !p)
        fatal("cpu backend: out of host memory allocating %zu bytes of scratch", bytes);
    return p;
}

/* ------------------------------------------------------- fixed-order sums */

/* Sums in double with 8 lanes (element i -> lane i % 8), lanes combined in
 * order, then the tail: same bits whatever the caller's threading. */
#define SUM_LANES 8

static double sum_f64(const float* x, int n) {
    double acc[SUM_LANES] = {0};
    int i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++) acc[j] += (double)x[i + j];
    double s = 0.0;
    for (int j = 0; j < SUM_LANES; j++) s += acc[j];
    for (; i < n; i++) s += (double)x[i];
    return s;
}

/* sum (x - m)^2 */
static double sumsq_dev_f64(const float* x, double m, int n) {
    double acc[SUM_LANES] = {0};
    int i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++) {
            double d = (double)x[i + j] - m;
            acc[j] += d * d;
        }
    double s = 0.0;
    for (int j = 0; j < SUM_LANES; j++) s += acc[j];
    for (; i < n; i++) {
        double d = (double)x[i] - m;
        s += d * d;
    }
    return s;
}

static double dot_f64(const float* a, const float* b, size_t n) {
    double acc[SUM_LANES] = {0};
    size_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++) acc[j] += (double)a[i + j] * (double)b[i + j];
    double s = 0.0;
    for (int j = 0; j < SUM_LANES; j++) s += acc[j];
    for (; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* max over x[0..n) with 16 lanes (max is exact: any order gives the same
 * value); -inf for n == 0. */
static float max_f(const float* x, int n) {
    float m[16];
    for (int j = 0; j < 16; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = -INFINITY;
    for (int j = 0; j < 16; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* --------------------------------------------------------- exp, sigmoid */

/* exp(x) from IEEE add/mul/floor only, so that loops calling it vectorise
 * (libm's expf does not, without -ffast-math) and the bits are the same on
 * every machine. x = n ln2 + r (Cody-Waite: n*LN2_HI is exact), |r| <= ln2/2,
 * e^r by its degree-7 Taylor polynomial (truncation < 6e-9 relative), times
 * 2^n built in the exponent bits. Input clamped to [-87, 88] so 2^n stays a
 * normal float: exp_f(-inf) is 1.6e-38, not 0, which no caller minds. About
 * 2 ulp. NaN stays NaN (the comparisons below let it through). */
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (no libm call) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale;
    /* NaN to int is undefined behaviour: any exponent will do, p is NaN already */
    scale.i = ((n == n ? (int32_t)n : 0) + 127) << 23;
    return p * scale.f;
}

/* -------------------------------------------------------------------- GELU */

/* gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). We use
 * 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^{-2u}), the same function
 * without the cancellation of 1 + tanh(u) for negative u, and e^{-2u} is
 * clamped to [e^-80, e^80] so nothing goes subnormal. */
static inline float gelu_f(float x) {
    float u2 = 2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x);
    float a = -u2;
    a = a > 80.0f ? 80.0f : a;
    a = a < -80.0f ? -80.0f : a;
    return x / (1.0f + exp_f(a));
}

/* d gelu / dx = s + x * 0.5 (1 - tanh^2(u)) du/dx with s = sigmoid(2u);
 * 0.5 (1 - tanh^2) = 2 s (1 - s) and 1 - s = e s with e = e^{-2u}. */
static inline float gelu_grad_f(float x) {
    float u2 = 2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x);
    float a = -u2;
    a = a > 80.0f ? 80.0f : a;
    a = a < -80.0f ? -80.0f : a;
    const float e = exp_f(a);
    const float s = 1.0f / (1.0f + e);
    const float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return s + 2.0f * x * (s * (e * s)) * du;
}

static void cpu_gelu_forward(Backend* be, void* out_, const void* inp_, size_t n) {
    (void)be;
    float* out = out_;
    const float* inp = inp_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gelu_f(inp[i]);
}

static void cpu_gelu_backward(Backend* be, void* dinp_, const void* inp_, const void* dout_, size_t n) {
    (void)be;
    float* dinp = dinp_;
    const float* inp = inp_;
    const float* dout = dout_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * gelu_grad_f(inp[i]);
}

/* -------------------------------------------------------------------- GEMM */

/* C = A B of g with the backend's micro-kernel and packing buffers */
static void cpu_gemm_run(Backend* be, const GemmArgs* g) {
    CpuCtx* ctx = be->ctx;
    gemm_run(ctx->gemm, &ctx->gemm_scratch, g);
}

static void cpu_matmul_forward(Backend* be, void* out_, void* pre_gelu_, const void* inp, const void* w,
                               const void* bias, int N, int C, int OC) {
    float* out = out_;
    float* pre = pre_gelu_ ? (float*)pre_gelu_ : out;
    /* clang-format off */
    GemmArgs g = {.M = N, .N = OC, .K = C,
                  .A = inp, .a_rs = C, .a_cs = 1, /* inp[N,C] */
                  .B = w, .b_rs = 1, .b_cs = C,   /* w^T: w[OC,C] read by columns */
                  .C = pre, .ldc = OC, .accumulate = 0, .bias = bias};
    /* clang-format on */
    cpu_gemm_run(be, &g);
    if (pre_gelu_) cpu_gelu_forward(be, out, pre, (size_t)N * OC);
}

/* dw[OC,C] += dout[:, 0:OC]^T @ inp[N,C], dout rows ld_dout apart. Each
 * element dw[o,c] starts from its value and adds dout[n,o]*inp[n,c] for
 * n = 0..N-1 in order (gemm_run: the k-blocking depends on N and C only,
 * never on OC or ld_dout), so a column slice gives exactly the bits of the
 * same rows of a full-width call. */
static void cpu_matmul_backward_weight(Backend* be, void* dw, const void* dout, int ld_dout, const void* inp,
                                       int N, int C, int OC) {
    /* clang-format off */
    GemmArgs gw = {.M = OC, .N = C, .K = N,
                   .A = dout, .a_rs = 1, .a_cs = ld_dout, /* dout^T */
                   .B = inp, .b_rs = C, .b_cs = 1,        /* inp[N,C] */
                   .C = dw, .ldc = C, .accumulate = 1, .bias = NULL};
    /* clang-format on */
    cpu_gemm_run(be, &gw);
}

/* dbias[o] += sum_n dout[n,o]: per column, rows in order, in double (the
 * same bits however the columns fall to threads). The bias gradient of
 * matmul_backward, attention_backward (the qkv bias) and layernorm_backward
 * (dsum) alike. */
static void cpu_bias_colsum_add(float* dbias, const float* dout, int N, int OC) {
    enum { CH = 64 };
    int nch = (OC + CH - 1) / CH;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < nch; ch++) {
        int o0 = ch * CH, cnt = OC - o0 < CH ? OC - o0 : CH;
        double acc[CH] = {0};
        for (int n = 0; n < N; n++) {
            const float* row = dout + (size_t)n * OC + o0;
            for (int j = 0; j < cnt; j++) acc[j] += (double)row[j];
        }
        for (int j = 0; j < cnt; j++) dbias[o0 + j] += (float)acc[j];
    }
}

static void cpu_matmul_backward(Backend* be, void* dinp_, void* dw_, void* dbias_, const void* dout_,
                                const void* inp, const void* w, const void* pre_gelu_, int N, int C, int OC) {
    float* dinp = dinp_;
    const float* dout = dout_;
    /* dW first: dinp may be inp */
    if (dw_) cpu_matmul_backward_weight(be, dw_, dout, OC, inp, N, C, OC);
    if (dinp) {
        /* dinp[N,C] = dout[N,OC] @ w[OC,C] */
        /* clang-format off */
        GemmArgs gi = {.M = N, .N = C, .K = OC,
                       .A = dout, .a_rs = OC, .a_cs = 1, /* dout[N,OC] */
                       .B = w, .b_rs = C, .b_cs = 1,     /* w[OC,C] */
                       .C = dinp, .ldc = C, .accumulate = 0, .bias = NULL};
        /* clang-format on */
        cpu_gemm_run(be, &gi);
        if (pre_gelu_) {
            const float* pre = pre_gelu_;
            size_t n = (size_t)N * C;
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++) dinp[i] = dinp[i] * gelu_grad_f(pre[i]);
        }
    }
    if (dbias_) cpu_bias_colsum_add(dbias_, dout, N, OC);
}

/* ---------------------------------------------------------------- encoder */

static void cpu_encoder_forward(Backend* be, void* out_, const int* inp, const void* wte_, const void* wpe_,
                                int B, int T, int C) {
    (void)be;
    float* out = out_;
    const float* wte = wte_;
    const float* wpe = wpe_;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float* e = wte + (size_t)inp[bt] * C;
        const float* p = wpe + (size_t)t * C;
        float* o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* Parallel over channel blocks: every element of dwte/dwpe gets its
 * contributions in (b, t) order, whatever the threading. Token rows outside
 * [v0, v1) are skipped (dwte points at row v0); a NULL dwte or dwpe skips
 * that half. */
static void cpu_encoder_backward_range(Backend* be, void* dwte_, void* dwpe_, const void* dout_, const int* inp,
                                       int B, int T, int C, int v0, int v1) {
    (void)be;
    float* dwte = dwte_;
    float* dwpe = dwpe_;
    const float* dout = dout_;
    enum { CH = 64 };
    int nch = (C + CH - 1) / CH;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < nch; ch++) {
        int c0 = ch * CH, cnt = C - c0 < CH ? C - c0 : CH;
        for (int bt = 0; bt < B * T; bt++) {
            int t = bt % T;
            const float* d = dout + (size_t)bt * C + c0;
            if (dwte && inp[bt] >= v0 && inp[bt] < v1) {
                float* we = dwte + (size_t)(inp[bt] - v0) * C + c0;
                for (int j = 0; j < cnt; j++) we[j] += d[j];
            }
            if (dwpe) {
                float* wp = dwpe + (size_t)t * C + c0;
                for (int j = 0; j < cnt; j++) wp[j] += d[j];
            }
        }
    }
}

static void cpu_encoder_backward(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B,
                                 int T, int C) {
    cpu_encoder_backward_range(be, dwte, dwpe, dout, inp, B, T, C, 0, INT_MAX);
}

/* -------------------------------------------------------------- layernorm */

static inline void layernorm_row(float* out, float* mean, float* rstd, const float* x, const float* w,
                                 const float* b, int C) {
    float m = (float)(sum_f64(x, C) / C);
    double var = sumsq_dev_f64(x, (double)m, C) / C; /* biased */
    float rs = (float)(1.0 / sqrt(var + LN_EPS));
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * rs * w[c] + b[c];
    *mean = m;
    *rstd = rs;
}

static void cpu_layernorm_forward(Backend* be, void* out_, float* mean, float* rstd, const void* inp_,
                                  const void* w, const void* b, int N, int C) {
    (void)be;
    float* out = out_;
    const float* inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b, C);
}

static void cpu_residual_layernorm_forward(Backend* be, void* residual_, void* out_, float* mean, float* rstd,
                                           const void* inp1_, const void* inp2_, const void* w, const void* b,
                                           int N, int C) {
    (void)be;
    float* residual = residual_;
    float* out = out_;
    const float* inp1 = inp1_;
    const float* inp2 = inp2_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* r = residual + (size_t)n * C;
        const float* a = inp1 + (size_t)n * C;
        const float* c2 = inp2 + (size_t)n * C;
        for (int c = 0; c < C; c++) r[c] = a[c] + c2[c];
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, r, w, b, C);
    }
}

static void cpu_residual_forward(Backend* be, void* out_, const void* inp1_, const void* inp2_, size_t n) {
    (void)be;
    float* out = out_;
    const float* a = inp1_;
    const float* b = inp2_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_layernorm_backward(Backend* be, void* dinp_, void* dw_, void* db_, void* dsum,
                                   const void* dout_, const void* inp_, const void* w_, const float* mean,
                                   const float* rstd, int N, int C) {
    (void)be;
    float* dinp = dinp_;
    float* dw = dw_;
    float* db = db_;
    const float* dout = dout_;
    const float* inp = inp_;
    const float* w = w_;
    enum { CH = 64 };
    const int nch = (C + CH - 1) / CH;
#pragma omp parallel
    {
        float* dnorm = cpu_scratch(sizeof(float) * (size_t)C * 2);
        float* norm = dnorm + C;
        /* dinp: one row per iteration */
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            const float* d = dout + (size_t)n * C;
            float* di = dinp + (size_t)n * C;
            const float m = mean[n], rs = rstd[n];
            for (int c = 0; c < C; c++) {
                norm[c] = (x[c] - m) * rs;
                dnorm[c] = w[c] * d[c];
            }
            const float dnorm_mean = (float)(sum_f64(dnorm, C) / C);
            const float dnorm_norm_mean = (float)(dot_f64(dnorm, norm, (size_t)C) / C);
            for (int c = 0; c < C; c++) di[c] += (dnorm[c] - dnorm_mean - norm[c] * dnorm_norm_mean) * rs;
        }
        /* dw, db: one block of channels per iteration, rows in order, double */
#pragma omp for schedule(static)
        for (int ch = 0; ch < nch; ch++) {
            const int c0 = ch * CH, cnt = C - c0 < CH ? C - c0 : CH;
            double aw[CH] = {0}, ab[CH] = {0};
            for (int n = 0; n < N; n++) {
                const float* x = inp + (size_t)n * C + c0;
                const float* d = dout + (size_t)n * C + c0;
                const float m = mean[n], rs = rstd[n];
                for (int j = 0; j < cnt; j++) {
                    float nv = (x[j] - m) * rs;
                    aw[j] += (double)(d[j] * nv);
                    ab[j] += (double)d[j];
                }
            }
            for (int j = 0; j < cnt; j++) {
                dw[c0 + j] += (float)aw[j];
                db[c0 + j] += (float)ab[j];
            }
        }
        free(dnorm);
    }
    /* the bias gradient: the same sum (and bits) as matmul_backward's */
    if (dsum) cpu_bias_colsum_add(dsum, dinp, N, C);
}

/* -------------------------------------------------------------- attention */

static int attention_head_size(int C, int NH) {
    if (NH <= 0 || C % NH != 0) fatal("attention: C=%d is not divisible by NH=%d", C, NH);
    return C / NH;
}

/* The attention loops work in blocks of AB floats, one vector register of
 * the build's target (16 with AVX-512, 8 with AVX, else 4), four blocks at a time so that four
 * independent sums are in flight: a block of scores accumulates over the
 * head's dimensions, a block of an output row over the keys, each element's
 * sum in the same order as the one-at-a-time loop, so the bits do not depend
 * on the blocking. */
#if defined(__AVX512F__)
#define AB 16
#elif defined(__AVX__)
#define AB 8
#else
#define AB 4
#endif
#define AB4 (4 * AB)

/* AB floats as one value: one register */
typedef float attn_vec __attribute__((vector_size(AB * sizeof(float))));
static inline attn_vec attn_load(const float* p) {
    attn_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc[j] = sum over d < n in order of x[d] * rows[d*ld + j], j < AB4 (from 0) */
static inline void attn_dot4(float* restrict acc, const float* restrict x, const float* restrict rows,
                             size_t ld, int n) {
    attn_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int d = 0; d < n; d++) {
        const float xd = x[d];
        const float* r = rows + (size_t)d * ld;
        a0 += xd * attn_load(r);
        a1 += xd * attn_load(r + AB);
        a2 += xd * attn_load(r + 2 * AB);
        a3 += xd * attn_load(r + 3 * AB);
    }
    memcpy(acc, &a0, sizeof a0);
    memcpy(acc + AB, &a1, sizeof a1);
    memcpy(acc + 2 * AB, &a2, sizeof a2);
    memcpy(acc + 3 * AB, &a3, sizeof a3);
}

/* out[d] = sum over s < ns in order of w[s] * rows[s*hs + d], d < hs (from
 * 0); rows contiguous, hs apart */
static inline void attn_mix(float* restrict out, const float* restrict w, const float* restrict rows, int ns,
                            int hs) {
    int d0 = 0;
    for (; d0 + AB4 <= hs; d0 += AB4) {
        attn_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int s = 0; s < ns; s++) {
            const float ws = w[s];
            const float* r = rows + (size_t)s * hs + d0;
            a0 += ws * attn_load(r);
            a1 += ws * attn_load(r + AB);
            a2 += ws * attn_load(r + 2 * AB);
            a3 += ws * attn_load(r + 3 * AB);
        }
        memcpy(out + d0, &a0, sizeof a0);
        memcpy(out + d0 + AB, &a1, sizeof a1);
        memcpy(out + d0 + 2 * AB, &a2, sizeof a2);
        memcpy(out + d0 + 3 * AB, &a3, sizeof a3);
    }
    for (; d0 + AB <= hs; d0 += AB) {
        attn_vec a = {0};
        for (int s = 0; s < ns; s++) a += w[s] * attn_load(rows + (size_t)s * hs + d0);
        memcpy(out + d0, &a, sizeof a);
    }
    for (; d0 < hs; d0++) {
        float a = 0.0f;
        for (int s = 0; s < ns; s++) a += w[s] * rows[(size_t)s * hs + d0];
        out[d0] = a;
    }
}

/* dk[s][d] += (ds[s] * scale) * q[d] and dv[s][d] += p[s] * g[d] for s < ns,
 * d < hs (rows hs apart): the t-th term of the sums over queries behind dK
 * and dV, q and g held in registers across the keys. */
static inline void attn_rank1(float* restrict dk, float* restrict dv, const float* restrict ds, float scale,
                              const float* restrict p, const float* restrict q, const float* restrict g, int ns,
                              int hs) {
    int d0 = 0;
    for (; d0 + AB4 <= hs; d0 += AB4) {
        const attn_vec q0 = attn_load(q + d0), q1 = attn_load(q + d0 + AB), q2 = attn_load(q + d0 + 2 * AB),
                       q3 = attn_load(q + d0 + 3 * AB);
        const attn_vec g0 = attn_load(g + d0), g1 = attn_load(g + d0 + AB), g2 = attn_load(g + d0 + 2 * AB),
                       g3 = attn_load(g + d0 + 3 * AB);
        for (int s = 0; s < ns; s++) {
            const float dss = ds[s] * scale, ps = p[s];
            float* k = dk + (size_t)s * hs + d0;
            float* v = dv + (size_t)s * hs + d0;
            attn_vec x;
            x = attn_load(k) + dss * q0, memcpy(k, &x, sizeof x);
            x = attn_load(k + AB) + dss * q1, memcpy(k + AB, &x, sizeof x);
            x = attn_load(k + 2 * AB) + dss * q2, memcpy(k + 2 * AB, &x, sizeof x);
            x = attn_load(k + 3 * AB) + dss * q3, memcpy(k + 3 * AB, &x, sizeof x);
            x = attn_load(v) + ps * g0, memcpy(v, &x, sizeof x);
            x = attn_load(v + AB) + ps * g1, memcpy(v + AB, &x, sizeof x);
            x = attn_load(v + 2 * AB) + ps * g2, memcpy(v + 2 * AB, &x, sizeof x);
            x = attn_load(v + 3 * AB) + ps * g3, memcpy(v + 3 * AB, &x, sizeof x);
        }
    }
    for (; d0 < hs; d0++)
        for (int s = 0; s < ns; s++) {
            dk[(size_t)s * hs + d0] += (ds[s] * scale) * q[d0];
            dv[(size_t)s * hs + d0] += p[s] * g[d0];
        }
}

/* One head's keys (and values) gathered from qkv's rows: transposed into
 * kt[d][s] (rows Tp apart; columns T..Tp-1 stay 0) and, where the pointers
 * are given, as contiguous rows kr[s][d], vt[d][s], vr[s][d]. */
static void attn_gather(float* kt, float* kr, float* vt, float* vr, const float* base, size_t C3, int C, int h,
                        int T, int hs, size_t Tp) {
    for (int s = 0; s < T; s++) {
        const float* k = base + (size_t)s * C3 + C + (size_t)h * hs;
        const float* v = k + C;
        for (int d = 0; d < hs; d++) kt[(size_t)d * Tp + s] = k[d];
        if (kr) memcpy(kr + (size_t)s * hs, k, sizeof(float) * hs);
        if (vt)
            for (int d = 0; d < hs; d++) vt[(size_t)d * Tp + s] = v[d];
        if (vr) memcpy(vr + (size_t)s * hs, v, sizeof(float) * hs);
    }
}

/* Parallel over (b, h). Per head, the keys are transposed into kt[d][s]
 * (rows of Tp = T rounded up to AB4, so that a block may run past the last
 * key) and the scores of AB4 keys at a time are summed over d in order; the
 * output row is summed over s in order from contiguous value rows. */
static void cpu_attention_forward(Backend* be, void* out_, float* lse, const void* qkv_, int B, int T, int C,
                                  int NH) {
    (void)be;
    float* out = out_;
    const float* qkv = qkv_;
    const int hs = attention_head_size(C, NH);
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t C3 = (size_t)3 * C;
    const size_t Tp = ((size_t)T + AB4 - 1) / AB4 * AB4;
#pragma omp parallel
    {
        float* kt = cpu_scratch(sizeof(float) * (size_t)hs * Tp);
        float* vr = cpu_scratch(sizeof(float) * (size_t)hs * T);
        float* sc = cpu_scratch(sizeof(float) * Tp);
        memset(kt, 0, sizeof(float) * (size_t)hs * Tp);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH, h = bh % NH;
            const float* base = qkv + (size_t)b * T * C3;
            attn_gather(kt, NULL, NULL, vr, base, C3, C, h, T, hs, Tp);
            for (int t = 0; t < T; t++) {
                const float* q = base + (size_t)t * C3 + (size_t)h * hs;
                const int ns = t + 1;
                for (int s0 = 0; s0 < ns; s0 += AB4) attn_dot4(sc + s0, q, kt + s0, Tp, hs);
                for (int s = 0; s < ns; s++) sc[s] *= scale;
                const float mx = max_f(sc, ns);
                for (int s = 0; s < ns; s++) sc[s] = exp_f(sc[s] - mx);
                const double sum = sum_f64(sc, ns);
                lse[(size_t)bh * T + t] = (float)((double)mx + log(sum));
                const float inv = (float)(1.0 / sum);
                for (int s = 0; s < ns; s++) sc[s] *= inv;
                attn_mix(out + ((size_t)b * T + t) * C + (size_t)h * hs, sc, vr, ns, hs);
            }
        }
        free(kt);
        free(vr);
        free(sc);
    }
}

/* Flash-style backward, parallel over (b, h): the thread of a head owns its
 * dq, dk, dv columns. Per query t: P = exp(S - lse) recomputed, dP = dout_t
 * . v_s, D = dout_t . out_t, dS = P (dP - D); dq_t = scale sum_s dS k_s;
 * dk_s += scale dS q_t and dv_s += P dout_t over t in order, in contiguous
 * per-thread rows that are written out when the head is done. */
static void cpu_attention_backward(Backend* be, void* dqkv_, void* dbias, const void* dout_, const void* qkv_,
                                   const void* out_, const float* lse, int B, int T, int C, int NH) {
    (void)be;
    float* dqkv = dqkv_;
    const float* dout = dout_;
    const float* qkv = qkv_;
    const float* out = out_;
    const int hs = attention_head_size(C, NH);
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t C3 = (size_t)3 * C;
    const size_t th = (size_t)T * hs;
    const size_t Tp = ((size_t)T + AB4 - 1) / AB4 * AB4;
#pragma omp parallel
    {
        float* kt = cpu_scratch(sizeof(float) * (size_t)hs * Tp); /* k transposed [hs][Tp] */
        float* vt = cpu_scratch(sizeof(float) * (size_t)hs * Tp); /* v transposed [hs][Tp] */
        float* kr = cpu_scratch(sizeof(float) * th);              /* k rows [T][hs] */
        float* dk = cpu_scratch(sizeof(float) * th);              /* [T][hs] */
        float* dv = cpu_scratch(sizeof(float) * th);              /* [T][hs] */
        float* p = cpu_scratch(sizeof(float) * Tp);
        float* dp = cpu_scratch(sizeof(float) * Tp);
        float* dq = cpu_scratch(sizeof(float) * (size_t)hs);
        memset(kt, 0, sizeof(float) * (size_t)hs * Tp);
        memset(vt, 0, sizeof(float) * (size_t)hs * Tp);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH, h = bh % NH;
            const float* base = qkv + (size_t)b * T * C3;
            float* dbase = dqkv + (size_t)b * T * C3;
            attn_gather(kt, kr, vt, NULL, base, C3, C, h, T, hs, Tp);
            memset(dk, 0, sizeof(float) * th);
            memset(dv, 0, sizeof(float) * th);
            for (int t = 0; t < T; t++) {
                const float* q = base + (size_t)t * C3 + (size_t)h * hs;
                const float* dot = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const float* ot = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                const int ns = t + 1;
                const float l = lse[(size_t)bh * T + t];
                for (int s0 = 0; s0 < ns; s0 += AB4) {
                    attn_dot4(p + s0, q, kt + s0, Tp, hs);
                    attn_dot4(dp + s0, dot, vt + s0, Tp, hs);
                }
                const float D = (float)dot_f64(dot, ot, (size_t)hs);
                for (int s = 0; s < ns; s++) {
                    p[s] = exp_f(p[s] * scale - l);
                    dp[s] = p[s] * (dp[s] - D); /* dS */
                }
                attn_mix(dq, dp, kr, ns, hs); /* sum_s dS k_s */
                float* dqo = dbase + (size_t)t * C3 + (size_t)h * hs;
                for (int d = 0; d < hs; d++) dqo[d] = dq[d] * scale;
                attn_rank1(dk, dv, dp, scale, p, q, dot, ns, hs);
            }
            for (int s = 0; s < T; s++) {
                float* dks = dbase + (size_t)s * C3 + C + (size_t)h * hs;
                memcpy(dks, dk + (size_t)s * hs, sizeof(float) * hs);
                memcpy(dks + C, dv + (size_t)s * hs, sizeof(float) * hs);
            }
        }
        free(kt);
        free(vt);
        free(kr);
        free(dk);
        free(dv);
        free(p);
        free(dp);
        free(dq);
    }
    /* the qkv bias gradient: the summation matmul_backward's dbias does, so
     * the bits are those of the unfused qkv matmul_backward's */
    if (dbias) cpu_bias_colsum_add(dbias, dqkv, B * T, 3 * C);
}

/* ------------------------------------------------------------- classifier */

static void cpu_fused_classifier(Backend* be, void* logits_, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp) {
    (void)be;
    float* logits = logits_;
#pragma omp parallel
    {
        float* e = cpu_scratch(sizeof(float) * (size_t)V);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            float* x = logits + (size_t)n * Vp;
            const int tgt = targets[n];
            const float mx = max_f(x, V);
            for (int i = 0; i < V; i++) e[i] = exp_f(x[i] - mx);
            const double sum = sum_f64(e, V);
            losses[n] = (float)((double)mx + log(sum) - (double)x[tgt]);
            if (dloss != 0.0f) {
                const float inv = (float)(1.0 / sum);
                for (int i = 0; i < V; i++) x[i] = e[i] * inv * dloss;
                x[tgt] = (e[tgt] * inv - 1.0f) * dloss;
                for (int i = V; i < Vp; i++) x[i] = 0.0f;
            }
        }
        free(e);
    }
}

/* -------------------------------------------------------------- optimizer */

#define SUMSQ_CHUNK 8192

/* Fixed chunks of SUMSQ_CHUNK elements of each piece, each summed in double
 * (8 lanes), then the chunk sums added in order. */
static double cpu_grad_sumsq(Backend* be, const void* grads_, const OptPiece* pieces, int npieces) {
    (void)be;
    const float* grads = grads_;
    size_t nchunks = 0;
    for (int p = 0; p < npieces; p++) nchunks += (pieces[p].len + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return 0.0;
    double* sums = xmalloc(sizeof(double) * nchunks);
    size_t* start = xmalloc(sizeof(size_t) * nchunks);
    size_t* len = xmalloc(sizeof(size_t) * nchunks);
    size_t k = 0;
    for (int p = 0; p < npieces; p++)
        for (size_t off = 0; off < pieces[p].len; off += SUMSQ_CHUNK) {
            start[k] = pieces[p].grad_off + off;
            len[k] = pieces[p].len - off < SUMSQ_CHUNK ? pieces[p].len - off : SUMSQ_CHUNK;
            k++;
        }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        const float* g = grads + start[c];
        sums[c] = dot_f64(g, g, len[c]);
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += sums[c];
    free(sums);
    free(start);
    free(len);
    return total;
}

static void cpu_adamw(Backend* be, void* params_, const void* grads_, float* master, float* m, float* v,
                      const OptPiece* pieces, int npieces, const AdamWArgs* a) {
    (void)be;
    float* params = params_;
    const float* grads = grads_;
    const float beta1 = a->beta1, beta2 = a->beta2, lr = a->lr, eps = a->eps;
    const float wd = a->weight_decay, gs = a->grad_scale;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)a->t));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)a->t));
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
#pragma omp parallel
    for (int p = 0; p < npieces; p++) {
        const OptPiece pc = pieces[p];
        float* pp = params + pc.buf_off;
        const float* gp = grads + pc.grad_off;
        float* ms = master + pc.state_off;
        float* mm = m + pc.state_off;
        float* vv = v + pc.state_off;
        const float dec = pc.decay ? wd : 0.0f;
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < pc.len; i++) {
            const float g = gp[i] * gs;
            const float mi = beta1 * mm[i] + omb1 * g;
            const float vi = beta2 * vv[i] + omb2 * g * g;
            const float mhat = mi / bc1, vhat = vi / bc2;
            const float w = ms[i];
            const float nw = w - lr * (mhat / (sqrtf(vhat) + eps) + dec * w);
            mm[i] = mi;
            vv[i] = vi;
            ms[i] = nw;
            pp[i] = nw;
        }
    }
}

/* ------------------------------------------------------------ constructor */

Backend* backend_cpu_create_gemm(const GemmKernel* gemm) {
    Backend* be = xcalloc(1, sizeof(Backend));
    be->name = "cpu";
    be->dtype = DTYPE_FP32;
    CpuCtx* ctx = xcalloc(1, sizeof *ctx);
    ctx->gemm = gemm ? gemm : gemm_kernel_best();
    be->ctx = ctx;
    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->zero = cpu_zero;
    be->to_device = cpu_memcpy;
    be->to_host = cpu_memcpy;
    be->copy = cpu_memcpy;
    be->synchronize = cpu_synchronize;
    be->peak_reserved = cpu_peak_reserved;
    be->reset_peak = cpu_reset_peak;
    be->destroy = cpu_destroy;
    be->x_to_f32 = cpu_x_to_f32;
    be->f32_to_x = cpu_f32_to_x;
    be->encoder_forward = cpu_encoder_forward;
    be->layernorm_forward = cpu_layernorm_forward;
    be->residual_layernorm_forward = cpu_residual_layernorm_forward;
    be->residual_forward = cpu_residual_forward;
    be->matmul_forward = cpu_matmul_forward;
    be->attention_forward = cpu_attention_forward;
    be->gelu_forward = cpu_gelu_forward;
    be->fused_classifier = cpu_fused_classifier;
    be->encoder_backward = cpu_encoder_backward;
    be->layernorm_backward = cpu_layernorm_backward;
    be->matmul_backward = cpu_matmul_backward;
    be->attention_backward = cpu_attention_backward;
    be->gelu_backward = cpu_gelu_backward;
    be->grad_sumsq = cpu_grad_sumsq;
    be->adamw = cpu_adamw;
    be->compute_stream = NULL;
    be->comm_stream = NULL;
    be->matmul_backward_weight = cpu_matmul_backward_weight;
    be->encoder_backward_range = cpu_encoder_backward_range;
    return be;
}

Backend* backend_cpu_create(void) { return backend_cpu_create_gemm(NULL); }
