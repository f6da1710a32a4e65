/* test/test_kernels.c — tests of the CPU backend (kernels/cpu.c).
 *
 * Every kernel runs on fresh random inputs (a new seed per case, several
 * sizes including odd ones) and is compared with a naive double-precision
 * reference written here (relative error by norm). Gradients are also
 * checked against central finite differences of the double reference on
 * small sizes. Outputs that the kernel must overwrite are poisoned with NaN
 * first (an unwritten or accumulated-into element fails); outputs that it
 * must accumulate into are pre-filled with random values. Determinism: each
 * case runs again with 2, 1 and 3 OpenMP threads and must give the same
 * bits. Ends with a GFLOP/s figure for the matmuls. Also the two entries
 * added for ZeRO-2's embedding chunks (matmul_backward_weight on a column
 * slice, encoder_backward_range) and matmul_backward with dinp or dw NULL:
 * against the references and bit for bit against the full calls. */
#include "../kernels/kernels.h"
#include "../kernels/cpu_gemm.h"
#include "test.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOL_FWD 1e-5
#define TOL_BWD 1e-5
#define TOL_FD 1e-4
#define FD_H 1e-4

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */

typedef struct {
    Backend* be;
    uint64_t seed; /* next case seed */
} Ctx;

static void case_rng(Ctx* cx, Rng* r) { rng_seed(r, 0x5eed0000ull + 7919ull * cx->seed++); }

/* ---------------------------------------------------------------- helpers */

static float* falloc(size_t n) { return xmalloc(sizeof(float) * (n ? n : 1)); }
static double* dalloc(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }

static void fill_normal(Rng* r, float* x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(r);
}
static void fill_nan(float* x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static double* to_double(const float* x, size_t n) {
    double* d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
/* ||got - ref|| / ||ref|| (absolute when ref is 0); NaN propagates. */
static double rel_err(const float* got, const double* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
}
static double rel_err_dd(const double* got, const double* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
}

/* Runs fn (which fills out[0..nout)) with 2 threads, then again with 2, 1,
 * 3 and 8 threads (the GEMM's tasks narrow with more threads); every run
 * must give the same bits. */
typedef void (*RunFn)(Backend* be, void* st, float* out);
static void check_determinism(Backend* be, const char* what, RunFn fn, void* st, size_t nout) {
    float* a = falloc(nout);
    float* b = falloc(nout);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    fill_nan(a, nout);
    fn(be, st, a);
    const int th[4] = {2, 1, 3, 8};
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(th[k]);
        fill_nan(b, nout);
        fn(be, st, b);
        CHECK(memcmp(a, b, sizeof(float) * nout) == 0, "%s: results differ in bits with %d threads", what,
              th[k]);
    }
    omp_set_num_threads(saved);
    free(a);
    free(b);
}

/* Central differences of loss(st) over x[0..n) (a double array that loss
 * reads), into g. */
typedef double (*LossFn)(void* st);
static void fd_grad(LossFn loss, void* st, double* x, size_t n, double* g) {
    for (size_t i = 0; i < n; i++) {
        const double keep = x[i];
        x[i] = keep + FD_H;
        const double lp = loss(st);
        x[i] = keep - FD_H;
        const double lm = loss(st);
        x[i] = keep;
        g[i] = (lp - lm) / (2.0 * FD_H);
    }
}

/* ------------------------------------------------------ double references */

static double ref_gelu(double x) { return 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x))); }
static double ref_gelu_grad(double x) {
    double u = GELU_K * (x + 0.044715 * x * x * x);
    double th = tanh(u);
    double du = GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

static void ref_encoder(double* out, const int* inp, const double* wte, const double* wpe, int B, int T,
                        int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] = wte[(size_t)inp[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

static void ref_layernorm(double* out, double* mean, double* rstd, const double* x, const double* w,
                          const double* b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double* xr = x + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (xr[c] - m) * rs * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = rs;
    }
}

/* gradients of sum(dout * layernorm(x)) (overwrite) */
static void ref_layernorm_backward(double* dx, double* dw, double* db, const double* dout, const double* x,
                                   const double* w, int N, int C) {
    for (int c = 0; c < C; c++) dw[c] = db[c] = 0.0;
    for (int n = 0; n < N; n++) {
        const double* xr = x + (size_t)n * C;
        const double* d = dout + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        double a = 0.0, bb = 0.0;
        for (int c = 0; c < C; c++) {
            double nx = (xr[c] - m) * rs;
            a += d[c] * w[c];
            bb += d[c] * w[c] * nx;
            dw[c] += d[c] * nx;
            db[c] += d[c];
        }
        a /= C;
        bb /= C;
        for (int c = 0; c < C; c++) {
            double nx = (xr[c] - m) * rs;
            dx[(size_t)n * C + c] = rs * (d[c] * w[c] - a - nx * bb);
        }
    }
}

/* pre = inp @ w^T + bias; out = gelu(pre) if gelu else pre */
static void ref_matmul(double* out, double* pre, const double* inp, const double* w, const double* bias, int N,
                       int C, int OC, int gelu) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            if (pre) pre[(size_t)n * OC + o] = s;
            out[(size_t)n * OC + o] = gelu ? ref_gelu(s) : s;
        }
}

/* dinp = (dout @ w) [* gelu'(pre_gelu)], dw = dout^T inp, db = colsum (overwrite) */
static void ref_matmul_backward(double* dinp, double* dw, double* db, const double* dout, const double* inp,
                                const double* w, const double* pre_gelu, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += dout[(size_t)n * OC + o] * w[(size_t)o * C + c];
            if (pre_gelu) s *= ref_gelu_grad(pre_gelu[(size_t)n * C + c]);
            dinp[(size_t)n * C + c] = s;
        }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o] * inp[(size_t)n * C + c];
            dw[(size_t)o * C + c] = s;
        }
        double s = 0.0;
        for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
        db[o] = s;
    }
}

static void ref_attention(double* out, double* lse, const double* qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double* sc = dalloc((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double* q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double* k = qkv + ((size_t)b * T + s) * 3 * C + C + (size_t)h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) d += q[i] * k[i];
                    sc[s] = d * scale;
                    if (sc[s] > mx) mx = sc[s];
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) sum += exp(sc[s] - mx);
                if (lse) lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int s = 0; s <= t; s++) {
                        const double* v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + (size_t)h * hs;
                        o += exp(sc[s] - mx) / sum * v[i];
                    }
                    out[((size_t)b * T + t) * C + (size_t)h * hs + i] = o;
                }
            }
    free(sc);
}

/* naive backward through the full probability matrix (overwrite dqkv) */
static void ref_attention_backward(double* dqkv, const double* dout, const double* qkv, int B, int T, int C,
                                   int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    const size_t C3 = (size_t)3 * C;
    double* P = dalloc((size_t)T * T);
    double* dP = dalloc((size_t)T * T);
    memset(dqkv, 0, sizeof(double) * (size_t)B * T * C3);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double* base = qkv + (size_t)b * T * C3;
            double* dbase = dqkv + (size_t)b * T * C3;
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) d += base[t * C3 + h * hs + i] * base[s * C3 + C + h * hs + i];
                    P[t * T + s] = d * scale;
                    if (P[t * T + s] > mx) mx = P[t * T + s];
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) sum += exp(P[t * T + s] - mx);
                for (int s = 0; s <= t; s++) P[t * T + s] = exp(P[t * T + s] - mx) / sum;
                const double* g = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                double rowdot = 0.0;
                for (int s = 0; s <= t; s++) {
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) d += g[i] * base[s * C3 + 2 * C + h * hs + i];
                    dP[t * T + s] = d;
                    rowdot += P[t * T + s] * d;
                }
                for (int s = 0; s <= t; s++) {
                    double dS = P[t * T + s] * (dP[t * T + s] - rowdot);
                    for (int i = 0; i < hs; i++) {
                        dbase[t * C3 + h * hs + i] += scale * dS * base[s * C3 + C + h * hs + i];
                        dbase[s * C3 + C + h * hs + i] += scale * dS * base[t * C3 + h * hs + i];
                        dbase[s * C3 + 2 * C + h * hs + i] += P[t * T + s] * g[i];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

/* losses and, when dlogits != NULL, (softmax - onehot) * dloss (pad = 0) */
static void ref_classifier(double* losses, double* dlogits, const double* logits, const int* targets,
                           double dloss, int N, int V, int Vp) {
    for (int n = 0; n < N; n++) {
        const double* x = logits + (size_t)n * Vp;
        double mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (x[i] > mx) mx = x[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp(x[i] - mx);
        double lse = mx + log(sum);
        losses[n] = lse - x[targets[n]];
        if (dlogits) {
            for (int i = 0; i < Vp; i++)
                dlogits[(size_t)n * Vp + i] =
                    i < V ? (exp(x[i] - lse) - (i == targets[n] ? 1.0 : 0.0)) * dloss : 0.0;
        }
    }
}

/* ----------------------------------------------------------------- memory */

static void test_memory(Ctx* cx) {
    Backend* be = cx->be;
    CHECK(strcmp(be->name, "cpu") == 0, "backend name is '%s'", be->name);
    CHECK(be->dtype == DTYPE_FP32, "cpu dtype is not fp32");
    CHECK(be->alloc && be->release && be->zero && be->to_device && be->to_host && be->copy && be->synchronize &&
              be->peak_reserved && be->reset_peak && be->destroy,
          "a memory function pointer is NULL");
    CHECK(be->x_to_f32 && be->f32_to_x, "a conversion function pointer is NULL");
    CHECK(be->encoder_forward && be->layernorm_forward && be->residual_layernorm_forward &&
              be->residual_forward && be->matmul_forward && be->attention_forward && be->gelu_forward &&
              be->fused_classifier,
          "a forward function pointer is NULL");
    CHECK(be->encoder_backward && be->layernorm_backward && be->matmul_backward && be->attention_backward &&
              be->gelu_backward,
          "a backward function pointer is NULL");
    CHECK(be->grad_sumsq && be->adamw, "an optimizer function pointer is NULL");
    CHECK(be->matmul_backward_weight && be->encoder_backward_range, "an entry added for ZeRO-2 is NULL");
    CHECK(be->compute_stream == NULL && be->comm_stream == NULL, "cpu streams must be NULL");

    const size_t t0 = be->mem.total_current;
    float* p = be->alloc(be, 1000, MEM_PARAMS);
    float* g = be->alloc(be, 5000 * sizeof(float), MEM_GRADS);
    CHECK(((uintptr_t)p % 64) == 0 && ((uintptr_t)g % 64) == 0, "alloc is not 64-byte aligned");
    CHECK(be->mem.current[MEM_PARAMS] == 1000, "tracker params %zu, want 1000", be->mem.current[MEM_PARAMS]);
    CHECK(be->mem.current[MEM_GRADS] == 20000, "tracker grads %zu", be->mem.current[MEM_GRADS]);
    CHECK(be->mem.total_current == t0 + 21000, "tracker total %zu", be->mem.total_current);
    CHECK(be->mem.peak >= t0 + 21000, "tracker peak %zu", be->mem.peak);

    Rng r;
    case_rng(cx, &r);
    float* host = falloc(5000);
    float* back = falloc(5000);
    fill_normal(&r, host, 5000, 1.0f);
    be->to_device(be, g, host, 5000 * sizeof(float));
    fill_nan(back, 5000);
    be->to_host(be, back, g, 5000 * sizeof(float));
    CHECK(memcmp(host, back, 5000 * sizeof(float)) == 0, "to_device/to_host round trip differs");
    be->copy(be, p, g + 10, 250 * sizeof(float));
    CHECK(memcmp(p, host + 10, 250 * sizeof(float)) == 0, "copy differs");
    float conv[250];
    be->x_to_f32(be, conv, p, 250);
    CHECK(memcmp(conv, host + 10, sizeof conv) == 0, "x_to_f32 differs");
    fill_nan(g, 250);
    be->f32_to_x(be, g, conv, 250);
    CHECK(memcmp(g, host + 10, sizeof conv) == 0, "f32_to_x differs");
    be->zero(be, g, 5000 * sizeof(float));
    int allzero = 1;
    for (int i = 0; i < 5000; i++) allzero &= (g[i] == 0.0f);
    CHECK(allzero, "zero left non-zero elements");
    be->synchronize(be);

    be->release(be, p, 1000, MEM_PARAMS);
    CHECK(be->mem.current[MEM_PARAMS] == 0 && be->mem.total_current == t0 + 20000,
          "release did not update the tracker");
    CHECK(be->mem.peak >= t0 + 21000, "peak fell after release");
    be->reset_peak(be);
    CHECK(be->mem.peak == be->mem.total_current, "reset_peak: peak %zu, current %zu", be->mem.peak,
          be->mem.total_current);
    be->release(be, g, 5000 * sizeof(float), MEM_GRADS);
    CHECK(be->mem.total_current == t0, "tracker total after releases %zu", be->mem.total_current);
    CHECK(be->peak_reserved(be) > 0, "peak_reserved is 0");
    printf("memory: aligned alloc, tracker, copies, peak_reserved %.1f MB\n", be->peak_reserved(be) / 1e6);
    free(host);
    free(back);
}

/* ---------------------------------------------------------------- encoder */

typedef struct {
    int B, T, C, V, maxT;
    int* inp;
    float *wte, *wpe, *dout, *dwte0, *dwpe0;
} EncSt;

/* out: [out B*T*C | dwte V*C | dwpe maxT*C] */
static void enc_run(Backend* be, void* p, float* o) {
    EncSt* s = p;
    const size_t no = (size_t)s->B * s->T * s->C;
    float* out = o;
    float* dwte = o + no;
    float* dwpe = dwte + (size_t)s->V * s->C;
    fill_nan(out, no);
    be->encoder_forward(be, out, s->inp, s->wte, s->wpe, s->B, s->T, s->C);
    memcpy(dwte, s->dwte0, sizeof(float) * s->V * s->C);
    memcpy(dwpe, s->dwpe0, sizeof(float) * s->maxT * s->C);
    be->encoder_backward(be, dwte, dwpe, s->dout, s->inp, s->B, s->T, s->C);
}

typedef struct {
    int B, T, C;
    const int* inp;
    double *wte, *wpe, *G, *out;
} EncLoss;
static double enc_loss(void* p) {
    EncLoss* s = p;
    size_t n = (size_t)s->B * s->T * s->C;
    ref_encoder(s->out, s->inp, s->wte, s->wpe, s->B, s->T, s->C);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += s->G[i] * s->out[i];
    return L;
}

static void test_encoder_case(Ctx* cx, int B, int T, int C, int V, int fd) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    EncSt s = {B, T, C, V, T + 3, NULL, NULL, NULL, NULL, NULL, NULL};
    const size_t no = (size_t)B * T * C, nte = (size_t)V * C, npe = (size_t)s.maxT * C;
    s.inp = xmalloc(sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) s.inp[i] = (int)(rng_u64(&r) % (uint64_t)V);
    s.wte = falloc(nte);
    s.wpe = falloc(npe);
    s.dout = falloc(no);
    s.dwte0 = falloc(nte);
    s.dwpe0 = falloc(npe);
    fill_normal(&r, s.wte, nte, 1.0f);
    fill_normal(&r, s.wpe, npe, 1.0f);
    fill_normal(&r, s.dout, no, 1.0f);
    fill_normal(&r, s.dwte0, nte, 1.0f);
    fill_normal(&r, s.dwpe0, npe, 1.0f);

    const size_t nout = no + nte + npe;
    float* o = falloc(nout);
    enc_run(be, &s, o);

    double* wte = to_double(s.wte, nte);
    double* wpe = to_double(s.wpe, npe);
    double* ref = dalloc(no);
    ref_encoder(ref, s.inp, wte, wpe, B, T, C);
    double e_out = rel_err(o, ref, no);
    /* accumulate: dwte = dwte0 + scatter, dwpe = dwpe0 + sum over b */
    double* rte = to_double(s.dwte0, nte);
    double* rpe = to_double(s.dwpe0, npe);
    int* used = xcalloc((size_t)V, sizeof(int));
    for (int bt = 0; bt < B * T; bt++) {
        used[s.inp[bt]] = 1;
        for (int c = 0; c < C; c++) {
            rte[(size_t)s.inp[bt] * C + c] += s.dout[(size_t)bt * C + c];
            rpe[(size_t)(bt % T) * C + c] += s.dout[(size_t)bt * C + c];
        }
    }
    double e_te = rel_err(o + no, rte, nte), e_pe = rel_err(o + no + nte, rpe, npe);
    int untouched = 1;
    for (int v = 0; v < V; v++)
        if (!used[v])
            untouched &= memcmp(o + no + (size_t)v * C, s.dwte0 + (size_t)v * C, sizeof(float) * C) == 0;
    untouched &= memcmp(o + no + nte + (size_t)T * C, s.dwpe0 + (size_t)T * C, sizeof(float) * 3 * C) == 0;
    printf("encoder B=%d T=%d C=%d V=%d: fwd %.2e dwte %.2e dwpe %.2e\n", B, T, C, V, e_out, e_te, e_pe);
    CHECK(e_out <= TOL_FWD, "encoder_forward error %.3e", e_out);
    CHECK(e_te <= TOL_BWD && e_pe <= TOL_BWD, "encoder_backward error %.3e %.3e", e_te, e_pe);
    CHECK(untouched, "encoder_backward touched rows it should not (unused tokens or t >= T)");
    check_determinism(be, "encoder", enc_run, &s, nout);

    if (fd) {
        /* kernel gradients from zero, against central differences of the reference */
        float* gte = falloc(nte);
        float* gpe = falloc(npe);
        memset(gte, 0, sizeof(float) * nte);
        memset(gpe, 0, sizeof(float) * npe);
        be->encoder_backward(be, gte, gpe, s.dout, s.inp, B, T, C);
        EncLoss L = {B, T, C, s.inp, wte, wpe, to_double(s.dout, no), dalloc(no)};
        double* fte = dalloc(nte);
        double* fpe = dalloc(npe);
        fd_grad(enc_loss, &L, wte, nte, fte);
        fd_grad(enc_loss, &L, wpe, npe, fpe);
        double f1 = rel_err(gte, fte, nte), f2 = rel_err(gpe, fpe, npe);
        printf("encoder finite differences: dwte %.2e dwpe %.2e\n", f1, f2);
        CHECK(f1 <= TOL_FD && f2 <= TOL_FD, "encoder finite differences %.3e %.3e", f1, f2);
        free(gte);
        free(gpe);
        free(L.G);
        free(L.out);
        free(fte);
        free(fpe);
    }
    free(s.inp);
    free(s.wte);
    free(s.wpe);
    free(s.dout);
    free(s.dwte0);
    free(s.dwpe0);
    free(o);
    free(wte);
    free(wpe);
    free(ref);
    free(rte);
    free(rpe);
    free(used);
}

/* encoder_backward_range (ZeRO-2's wte chunks): dwte points at row
 * v0 and holds rows [v0, v1) only (with guard rows around it that must stay
 * as they were), tokens outside the range skipped; dwte or dwpe NULL skips
 * that half. Against the double reference, and calls over ranges tiling
 * [0, V) (after a dwpe-only call) must give encoder_backward's bits. Token
 * ids are drawn so that some rows get many tokens and some none. */
static void test_encoder_range_case(Ctx* cx, int B, int T, int C, int V) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const int BT = B * T, maxT = T + 2;
    const size_t no = (size_t)BT * C, nte = (size_t)V * C, npe = (size_t)maxT * C;
    int* inp = xmalloc(sizeof(int) * BT);
    for (int i = 0; i < BT; i++)
        inp[i] = (int)(rng_u64(&r) % 4 == 0 ? rng_u64(&r) % 3 : rng_u64(&r) % (uint64_t)V);
    float* dout = falloc(no);
    float* te0 = falloc(nte);
    float* pe0 = falloc(npe);
    fill_normal(&r, dout, no, 1.0f);
    fill_normal(&r, te0, nte, 1.0f);
    fill_normal(&r, pe0, npe, 1.0f);
    /* whole: encoder_backward */
    float* te_all = falloc(nte);
    float* pe_all = falloc(npe);
    memcpy(te_all, te0, sizeof(float) * nte);
    memcpy(pe_all, pe0, sizeof(float) * npe);
    be->encoder_backward(be, te_all, pe_all, dout, inp, B, T, C);
    /* tiled: dwpe alone, then ranges of rows into separate buffers with guards */
    float* te_t = falloc(nte);
    float* pe_t = falloc(npe);
    memcpy(te_t, te0, sizeof(float) * nte);
    memcpy(pe_t, pe0, sizeof(float) * npe);
    be->encoder_backward_range(be, NULL, pe_t, dout, inp, B, T, C, 0, 0);
    int pe_same = memcmp(pe_t, pe_all, sizeof(float) * npe) == 0;
    int cuts[5] = {0, 1, V / 3 + 1, V - V / 4, V};
    int guard_ok = 1;
    const int G = 2; /* guard rows either side */
    for (int k = 0; k < 4; k++) {
        int v0 = cuts[k], v1 = cuts[k + 1];
        if (v1 <= v0) continue;
        size_t nr = (size_t)(v1 - v0) * C;
        float* buf = falloc(nr + 2 * (size_t)G * C);
        for (size_t i = 0; i < (size_t)G * C; i++) buf[i] = buf[(size_t)G * C + nr + i] = -777.0f;
        memcpy(buf + (size_t)G * C, te_t + (size_t)v0 * C, sizeof(float) * nr);
        be->encoder_backward_range(be, buf + (size_t)G * C, NULL, dout, inp, B, T, C, v0, v1);
        for (size_t i = 0; i < (size_t)G * C; i++)
            guard_ok &= buf[i] == -777.0f && buf[(size_t)G * C + nr + i] == -777.0f;
        memcpy(te_t + (size_t)v0 * C, buf + (size_t)G * C, sizeof(float) * nr);
        free(buf);
    }
    int te_same = memcmp(te_t, te_all, sizeof(float) * nte) == 0;
    /* one middle range against the double reference: rows outside untouched */
    int v0 = cuts[2] > 1 ? 1 : 0, v1 = cuts[2];
    float* te_r = falloc(nte);
    memcpy(te_r, te0, sizeof(float) * nte);
    be->encoder_backward_range(be, te_r + (size_t)v0 * C, NULL, dout, inp, B, T, C, v0, v1);
    double* ref = to_double(te0, nte);
    for (int bt = 0; bt < BT; bt++)
        if (inp[bt] >= v0 && inp[bt] < v1)
            for (int c = 0; c < C; c++) ref[(size_t)inp[bt] * C + c] += dout[(size_t)bt * C + c];
    double e = rel_err(te_r, ref, nte);
    int outside_same =
        memcmp(te_r, te0, sizeof(float) * (size_t)v0 * C) == 0 &&
        memcmp(te_r + (size_t)v1 * C, te0 + (size_t)v1 * C, sizeof(float) * (size_t)(V - v1) * C) == 0;
    printf(
        "encoder_backward_range B=%d T=%d C=%d V=%d: rows [%d,%d) %.2e | 4 ranges + dwpe-only = encoder_backward %s\n",
        B, T, C, V, v0, v1, e, te_same && pe_same ? "yes" : "NO");
    CHECK(e <= TOL_BWD && outside_same, "encoder_backward_range rows [%d,%d): error %.3e, rows outside %s", v0,
          v1, e, outside_same ? "untouched" : "WRITTEN");
    CHECK(guard_ok, "encoder_backward_range wrote outside its rows");
    CHECK(te_same, "encoder_backward_range over ranges tiling [0, V): dwte differs from encoder_backward");
    CHECK(pe_same, "encoder_backward_range with dwte NULL: dwpe differs from encoder_backward");
    free(inp);
    free(dout);
    free(te0);
    free(pe0);
    free(te_all);
    free(pe_all);
    free(te_t);
    free(pe_t);
    free(te_r);
    free(ref);
}

/* -------------------------------------------------------------- layernorm */

typedef struct {
    int N, C;
    float *inp, *w, *b, *dout, *dinp0, *dw0, *db0, *ds0;
} LnSt;

/* out: [out N*C | mean N | rstd N | dinp N*C | dw C | db C | dsum C] */
static void ln_run(Backend* be, void* p, float* o) {
    LnSt* s = p;
    const size_t nc = (size_t)s->N * s->C;
    float* out = o;
    float* mean = out + nc;
    float* rstd = mean + s->N;
    float* dinp = rstd + s->N;
    float* dw = dinp + nc;
    float* db = dw + s->C;
    float* ds = db + s->C;
    fill_nan(o, 2 * (size_t)s->N + nc);
    be->layernorm_forward(be, out, mean, rstd, s->inp, s->w, s->b, s->N, s->C);
    memcpy(dinp, s->dinp0, sizeof(float) * nc);
    memcpy(dw, s->dw0, sizeof(float) * s->C);
    memcpy(db, s->db0, sizeof(float) * s->C);
    memcpy(ds, s->ds0, sizeof(float) * s->C);
    be->layernorm_backward(be, dinp, dw, db, ds, s->dout, s->inp, s->w, mean, rstd, s->N, s->C);
}

typedef struct {
    int N, C;
    double *x, *w, *b, *G, *out;
} LnLoss;
static double ln_loss(void* p) {
    LnLoss* s = p;
    ref_layernorm(s->out, NULL, NULL, s->x, s->w, s->b, s->N, s->C);
    double L = 0.0;
    for (size_t i = 0; i < (size_t)s->N * s->C; i++) L += s->G[i] * s->out[i];
    return L;
}

static void test_layernorm_case(Ctx* cx, int N, int C, int fd) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t nc = (size_t)N * C;
    LnSt s = {N, C, falloc(nc), falloc(C), falloc(C), falloc(nc), falloc(nc), falloc(C), falloc(C), falloc(C)};
    fill_normal(&r, s.inp, nc, 2.0f);
    for (int n = 0; n < N; n++) /* per-row offsets: the mean matters */
        for (int c = 0; c < C; c++) s.inp[(size_t)n * C + c] += 0.5f * (float)(n % 5);
    fill_normal(&r, s.w, C, 1.0f);
    fill_normal(&r, s.b, C, 1.0f);
    fill_normal(&r, s.dout, nc, 1.0f);
    fill_normal(&r, s.dinp0, nc, 1.0f);
    fill_normal(&r, s.dw0, C, 1.0f);
    fill_normal(&r, s.db0, C, 1.0f);
    fill_normal(&r, s.ds0, C, 1.0f);
    const size_t nout = 2 * nc + 2 * (size_t)N + 3 * (size_t)C;
    float* o = falloc(nout);
    ln_run(be, &s, o);

    double* x = to_double(s.inp, nc);
    double* w = to_double(s.w, C);
    double* b = to_double(s.b, C);
    double* G = to_double(s.dout, nc);
    double* out = dalloc(nc);
    double* mean = dalloc(N);
    double* rstd = dalloc(N);
    ref_layernorm(out, mean, rstd, x, w, b, N, C);
    double* dx = dalloc(nc);
    double* dw = dalloc(C);
    double* db = dalloc(C);
    ref_layernorm_backward(dx, dw, db, G, x, w, N, C);
    for (size_t i = 0; i < nc; i++) dx[i] += s.dinp0[i];
    double* ds = dalloc(C); /* dsum: ds0 + the column sums of the final dinp */
    for (int c = 0; c < C; c++) {
        dw[c] += s.dw0[c];
        db[c] += s.db0[c];
        ds[c] = s.ds0[c];
        for (int n = 0; n < N; n++) ds[c] += dx[(size_t)n * C + c];
    }
    const float* ko = o;
    const float* km = o + nc;
    const float* kr = km + N;
    const float* kdx = kr + N;
    const float* kdw = kdx + nc;
    const float* kdb = kdw + C;
    const float* kds = kdb + C;
    double e_out = rel_err(ko, out, nc), e_m = rel_err(km, mean, N), e_r = rel_err(kr, rstd, N);
    double e_dx = rel_err(kdx, dx, nc), e_dw = rel_err(kdw, dw, C), e_db = rel_err(kdb, db, C);
    double e_ds = rel_err(kds, ds, C);
    printf("layernorm N=%d C=%d: out %.2e mean %.2e rstd %.2e | dinp %.2e dw %.2e db %.2e dsum %.2e\n", N, C,
           e_out, e_m, e_r, e_dx, e_dw, e_db, e_ds);
    CHECK(e_out <= TOL_FWD && e_m <= TOL_FWD && e_r <= TOL_FWD, "layernorm_forward error %.3e %.3e %.3e", e_out,
          e_m, e_r);
    CHECK(e_dx <= TOL_BWD && e_dw <= TOL_BWD && e_db <= TOL_BWD && e_ds <= TOL_BWD,
          "layernorm_backward (accumulating) error %.3e %.3e %.3e %.3e", e_dx, e_dw, e_db, e_ds);
    check_determinism(be, "layernorm", ln_run, &s, nout);

    if (fd) {
        float* gx = falloc(nc);
        float* gw = falloc(C);
        float* gb = falloc(C);
        memset(gx, 0, sizeof(float) * nc);
        memset(gw, 0, sizeof(float) * C);
        memset(gb, 0, sizeof(float) * C);
        be->layernorm_backward(be, gx, gw, gb, NULL, s.dout, s.inp, s.w, km, kr, N, C);
        LnLoss L = {N, C, x, w, b, G, out};
        double* fx = dalloc(nc);
        double* fw = dalloc(C);
        double* fb = dalloc(C);
        fd_grad(ln_loss, &L, x, nc, fx);
        fd_grad(ln_loss, &L, w, C, fw);
        fd_grad(ln_loss, &L, b, C, fb);
        double f1 = rel_err(gx, fx, nc), f2 = rel_err(gw, fw, C), f3 = rel_err(gb, fb, C);
        printf("layernorm finite differences N=%d C=%d: dinp %.2e dw %.2e db %.2e\n", N, C, f1, f2, f3);
        CHECK(f1 <= TOL_FD && f2 <= TOL_FD && f3 <= TOL_FD, "layernorm finite differences %.3e %.3e %.3e", f1,
              f2, f3);
        free(gx);
        free(gw);
        free(gb);
        free(fx);
        free(fw);
        free(fb);
    }
    free(s.inp);
    free(s.w);
    free(s.b);
    free(s.dout);
    free(s.dinp0);
    free(s.dw0);
    free(s.db0);
    free(s.ds0);
    free(ds);
    free(o);
    free(x);
    free(w);
    free(b);
    free(G);
    free(out);
    free(mean);
    free(rstd);
    free(dx);
    free(dw);
    free(db);
}

/* residual_layernorm_forward and residual_forward */
typedef struct {
    int N, C;
    float *a, *b, *w, *bias;
} ResSt;

/* out: [residual N*C | out N*C | mean N | rstd N | residual_forward N*C] */
static void res_run(Backend* be, void* p, float* o) {
    ResSt* s = p;
    const size_t nc = (size_t)s->N * s->C;
    fill_nan(o, 3 * nc + 2 * (size_t)s->N);
    be->residual_layernorm_forward(be, o, o + nc, o + 2 * nc, o + 2 * nc + s->N, s->a, s->b, s->w, s->bias,
                                   s->N, s->C);
    be->residual_forward(be, o + 2 * nc + 2 * (size_t)s->N, s->a, s->b, nc);
}

static void test_residual_case(Ctx* cx, int N, int C) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t nc = (size_t)N * C;
    ResSt s = {N, C, falloc(nc), falloc(nc), falloc(C), falloc(C)};
    fill_normal(&r, s.a, nc, 1.0f);
    fill_normal(&r, s.b, nc, 1.0f);
    fill_normal(&r, s.w, C, 1.0f);
    fill_normal(&r, s.bias, C, 1.0f);
    const size_t nout = 3 * nc + 2 * (size_t)N;
    float* o = falloc(nout);
    res_run(be, &s, o);
    int exact = 1;
    for (size_t i = 0; i < nc; i++) {
        float want = (float)((double)s.a[i] + (double)s.b[i]);
        exact &= (o[i] == want) && (o[2 * nc + 2 * (size_t)N + i] == want);
    }
    double* x = to_double(o, nc);
    double* w = to_double(s.w, C);
    double* b = to_double(s.bias, C);
    double* out = dalloc(nc);
    double* mean = dalloc(N);
    double* rstd = dalloc(N);
    ref_layernorm(out, mean, rstd, x, w, b, N, C);
    double e1 = rel_err(o + nc, out, nc), e2 = rel_err(o + 2 * nc, mean, N),
           e3 = rel_err(o + 2 * nc + N, rstd, N);
    /* the fused kernel must agree bit for bit with layernorm_forward of the sum */
    float* lo = falloc(nc + 2 * (size_t)N);
    be->layernorm_forward(be, lo, lo + nc, lo + nc + N, o, s.w, s.bias, N, C);
    int same = memcmp(lo, o + nc, sizeof(float) * (nc + 2 * (size_t)N)) == 0;
    printf("residual+layernorm N=%d C=%d: out %.2e mean %.2e rstd %.2e, sums exact %d, = layernorm %d\n", N, C,
           e1, e2, e3, exact, same);
    CHECK(exact, "residual sums are not the exact fp32 sums");
    CHECK(e1 <= TOL_FWD && e2 <= TOL_FWD && e3 <= TOL_FWD, "residual_layernorm_forward error %.3e %.3e %.3e",
          e1, e2, e3);
    CHECK(same, "residual_layernorm_forward differs from layernorm_forward of the residual");
    check_determinism(be, "residual_layernorm", res_run, &s, nout);
    free(s.a);
    free(s.b);
    free(s.w);
    free(s.bias);
    free(o);
    free(x);
    free(w);
    free(b);
    free(out);
    free(mean);
    free(rstd);
    free(lo);
}

/* ------------------------------------------------------------------- GELU */

typedef struct {
    size_t n;
    float *x, *dout;
} GeluSt;

static void gelu_run(Backend* be, void* p, float* o) {
    GeluSt* s = p;
    fill_nan(o, 2 * s->n);
    be->gelu_forward(be, o, s->x, s->n);
    be->gelu_backward(be, o + s->n, s->x, s->dout, s->n);
}

static void test_gelu_case(Ctx* cx, size_t n) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    GeluSt s = {n, falloc(n), falloc(n)};
    fill_normal(&r, s.x, n, 3.0f);
    if (n > 8) {
        s.x[0] = 0.0f;
        s.x[1] = -12.0f;
        s.x[2] = 12.0f;
        s.x[3] = -40.0f;
        s.x[4] = 40.0f;
    }
    fill_normal(&r, s.dout, n, 1.0f);
    float* o = falloc(2 * n);
    gelu_run(be, &s, o);
    double* rf = dalloc(n);
    double* rb = dalloc(n);
    double* fd = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        double x = s.x[i];
        rf[i] = ref_gelu(x);
        rb[i] = s.dout[i] * ref_gelu_grad(x);
        fd[i] = s.dout[i] * (ref_gelu(x + FD_H) - ref_gelu(x - FD_H)) / (2 * FD_H);
    }
    double e1 = rel_err(o, rf, n), e2 = rel_err(o + n, rb, n), e3 = rel_err(o + n, fd, n);
    printf("gelu n=%zu: fwd %.2e bwd %.2e finite differences %.2e\n", n, e1, e2, e3);
    CHECK(e1 <= TOL_FWD, "gelu_forward error %.3e", e1);
    CHECK(e2 <= TOL_BWD, "gelu_backward error %.3e", e2);
    CHECK(e3 <= TOL_FD, "gelu finite differences %.3e", e3);
    check_determinism(be, "gelu", gelu_run, &s, 2 * n);
    free(s.x);
    free(s.dout);
    free(o);
    free(rf);
    free(rb);
    free(fd);
}

/* ----------------------------------------------------------------- matmul */

typedef struct {
    int N, C, OC;
    int has_bias, gelu_fwd, gelu_bwd;
    float *inp, *w, *bias, *pre_prev, *dout, *dw0, *db0;
} MmSt;

/* out: [out N*OC | pre N*OC | dinp N*C | dw OC*C | db OC] */
static void mm_run(Backend* be, void* p, float* o) {
    MmSt* s = p;
    const size_t no = (size_t)s->N * s->OC, ni = (size_t)s->N * s->C, nw = (size_t)s->OC * s->C;
    float* out = o;
    float* pre = out + no;
    float* dinp = pre + no;
    float* dw = dinp + ni;
    float* db = dw + nw;
    fill_nan(out, 2 * no + ni);
    be->matmul_forward(be, out, s->gelu_fwd ? pre : NULL, s->inp, s->w, s->has_bias ? s->bias : NULL, s->N,
                       s->C, s->OC);
    if (!s->gelu_fwd) memset(pre, 0, sizeof(float) * no);
    memcpy(dw, s->dw0, sizeof(float) * nw);
    memcpy(db, s->db0, sizeof(float) * s->OC);
    be->matmul_backward(be, dinp, dw, s->has_bias ? db : NULL, s->dout, s->inp, s->w,
                        s->gelu_bwd ? s->pre_prev : NULL, s->N, s->C, s->OC);
}

static void test_matmul_case(Ctx* cx, int N, int C, int OC, int has_bias, int gelu_fwd, int gelu_bwd) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t no = (size_t)N * OC, ni = (size_t)N * C, nw = (size_t)OC * C;
    MmSt s = {N,          C,          OC,         has_bias,   gelu_fwd,   gelu_bwd,  falloc(ni),
              falloc(nw), falloc(OC), falloc(ni), falloc(no), falloc(nw), falloc(OC)};
    fill_normal(&r, s.pre_prev, ni, 1.5f);
    if (gelu_bwd) { /* the fc -> gelu -> fcproj chain: inp = gelu(pre_prev) */
        for (size_t i = 0; i < ni; i++) s.inp[i] = (float)ref_gelu(s.pre_prev[i]);
    } else {
        fill_normal(&r, s.inp, ni, 1.0f);
    }
    fill_normal(&r, s.w, nw, 1.0f / sqrtf((float)C));
    fill_normal(&r, s.bias, OC, 1.0f);
    fill_normal(&r, s.dout, no, 1.0f);
    fill_normal(&r, s.dw0, nw, 1.0f);
    fill_normal(&r, s.db0, OC, 1.0f);
    const size_t nout = 2 * no + ni + nw + OC;
    float* o = falloc(nout);
    mm_run(be, &s, o);

    double* inp = to_double(s.inp, ni);
    double* w = to_double(s.w, nw);
    double* bias = to_double(s.bias, OC);
    double* pp = to_double(s.pre_prev, ni);
    double* G = to_double(s.dout, no);
    double* out = dalloc(no);
    double* pre = dalloc(no);
    ref_matmul(out, pre, inp, w, has_bias ? bias : NULL, N, C, OC, gelu_fwd);
    double* dinp = dalloc(ni);
    double* dw = dalloc(nw);
    double* db = dalloc(OC);
    ref_matmul_backward(dinp, dw, db, G, inp, w, gelu_bwd ? pp : NULL, N, C, OC);
    for (size_t i = 0; i < nw; i++) dw[i] += s.dw0[i];
    for (int i = 0; i < OC; i++) db[i] += s.db0[i];
    double e_out = rel_err(o, out, no);
    double e_pre = gelu_fwd ? rel_err(o + no, pre, no) : 0.0;
    double e_dx = rel_err(o + 2 * no, dinp, ni), e_dw = rel_err(o + 2 * no + ni, dw, nw);
    double e_db = has_bias ? rel_err(o + 2 * no + ni + nw, db, OC) : 0.0;
    printf(
        "matmul N=%d C=%d OC=%d bias=%d gelu_fwd=%d gelu_bwd=%d: out %.2e pre %.2e | dinp %.2e dw %.2e db %.2e\n",
        N, C, OC, has_bias, gelu_fwd, gelu_bwd, e_out, e_pre, e_dx, e_dw, e_db);
    CHECK(e_out <= TOL_FWD && e_pre <= TOL_FWD, "matmul_forward error %.3e %.3e", e_out, e_pre);
    CHECK(e_dx <= TOL_BWD && e_dw <= TOL_BWD && e_db <= TOL_BWD, "matmul_backward error %.3e %.3e %.3e", e_dx,
          e_dw, e_db);
    if (!has_bias)
        CHECK(memcmp(o + 2 * no + ni + nw, s.db0, sizeof(float) * OC) == 0, "dbias written with dbias NULL");
    check_determinism(be, "matmul", mm_run, &s, nout);
    { /* dinp may be inp (dW is computed first): the bits of separate buffers */
        float* x = falloc(ni);
        float* dw2 = falloc(nw);
        float* db2 = falloc(OC);
        memcpy(x, s.inp, sizeof(float) * ni);
        memcpy(dw2, s.dw0, sizeof(float) * nw);
        memcpy(db2, s.db0, sizeof(float) * OC);
        be->matmul_backward(be, x, dw2, has_bias ? db2 : NULL, s.dout, x, s.w, gelu_bwd ? s.pre_prev : NULL, N,
                            C, OC);
        CHECK(memcmp(x, o + 2 * no, sizeof(float) * ni) == 0 &&
                  memcmp(dw2, o + 2 * no + ni, sizeof(float) * nw) == 0 &&
                  memcmp(db2, o + 2 * no + ni + nw, sizeof(float) * OC) == 0,
              "matmul N=%d C=%d OC=%d: matmul_backward with dinp == inp differs from separate buffers", N, C,
              OC);
        free(x);
        free(dw2);
        free(db2);
    }
    /* every GEMM micro-kernel this CPU runs: the same bits (cpu_gemm.h) */
    static const char* const kernels[] = {"avx512", "avx2", "portable"};
    float* o2 = falloc(nout);
    for (int k = 0; k < 3; k++) {
        const GemmKernel* gk = gemm_kernel_named(kernels[k]);
        if (!gk) continue;
        Backend* bk = backend_cpu_create_gemm(gk);
        mm_run(bk, &s, o2);
        bk->destroy(bk);
        CHECK(memcmp(o, o2, sizeof(float) * nout) == 0,
              "matmul N=%d C=%d OC=%d: GEMM kernel %s differs from %s", N, C, OC, gk->name,
              gemm_kernel_best()->name);
    }
    free(o2);
    free(s.inp);
    free(s.w);
    free(s.bias);
    free(s.pre_prev);
    free(s.dout);
    free(s.dw0);
    free(s.db0);
    free(o);
    free(inp);
    free(w);
    free(bias);
    free(pp);
    free(G);
    free(out);
    free(pre);
    free(dinp);
    free(dw);
    free(db);
}

/* matmul_backward_weight (the lm head's dW per vocabulary chunk):
 * dw[OCs,C] += dout[:, col0:col0+OCs]^T @ inp, dout rows ldd apart. Against
 * the double reference (accumulating into random values); the columns of
 * dout outside the slice are NaN (read one and the result is NaN); guard rows
 * after dw must stay as they were; the result must be bit-identical to the
 * same rows of the full-width matmul_backward dW, and slices tiling the
 * columns must give the full-width bits (the per-element order of the GEMM
 * does not depend on the slice). Also matmul_backward with dinp == NULL (dW
 * only) and with dw == NULL (dX only): the same bits as the full call. */
typedef struct {
    int N, C, ldd, col0, OCs;
    float *dout, *inp, *dw0;
} MwSt;
static void mw_run(Backend* be, void* p, float* o) {
    MwSt* s = p;
    memcpy(o, s->dw0, sizeof(float) * (size_t)s->OCs * s->C);
    be->matmul_backward_weight(be, o, s->dout + s->col0, s->ldd, s->inp, s->N, s->C, s->OCs);
}

static void test_matmul_weight_case(Ctx* cx, int N, int C, int ldd, int col0, int OCs) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t nd = (size_t)N * ldd, ni = (size_t)N * C, nw = (size_t)OCs * C;
    const int guard = 3;
    MwSt s = {N, C, ldd, col0, OCs, falloc(nd), falloc(ni), falloc(nw)};
    float* full = falloc(nd); /* the same dout without the poison, for the full-width call */
    fill_normal(&r, full, nd, 1.0f);
    fill_normal(&r, s.inp, ni, 1.0f);
    fill_normal(&r, s.dw0, nw, 1.0f);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < ldd; j++)
            s.dout[(size_t)n * ldd + j] = (j >= col0 && j < col0 + OCs) ? full[(size_t)n * ldd + j] : NAN;
    float* o = falloc(nw + (size_t)guard * C);
    for (size_t i = nw; i < nw + (size_t)guard * C; i++) o[i] = 12345.0f;
    mw_run(be, &s, o);
    int guard_ok = 1;
    for (size_t i = nw; i < nw + (size_t)guard * C; i++) guard_ok &= o[i] == 12345.0f;
    /* double reference */
    double* ref = dalloc(nw);
    for (int q = 0; q < OCs; q++)
        for (int c = 0; c < C; c++) {
            double acc = s.dw0[(size_t)q * C + c];
            for (int n = 0; n < N; n++)
                acc += (double)full[(size_t)n * ldd + col0 + q] * (double)s.inp[(size_t)n * C + c];
            ref[(size_t)q * C + c] = acc;
        }
    double e = rel_err(o, ref, nw);
    /* full width: dW rows col0.. of matmul_backward over all ldd outputs */
    float* wfull = falloc((size_t)ldd * C);
    float* w = falloc((size_t)ldd * C);
    float* dinp = falloc(ni);
    fill_normal(&r, wfull, (size_t)ldd * C, 1.0f);
    memcpy(wfull + (size_t)col0 * C, s.dw0, sizeof(float) * nw);
    fill_normal(&r, w, (size_t)ldd * C, 1.0f);
    float* wkeep = falloc((size_t)ldd * C);
    memcpy(wkeep, wfull, sizeof(float) * (size_t)ldd * C);
    be->matmul_backward(be, dinp, wfull, NULL, full, s.inp, w, NULL, N, C, ldd);
    int same_full = memcmp(o, wfull + (size_t)col0 * C, sizeof(float) * nw) == 0;
    /* tiled by three slices: the full-width bits everywhere */
    float* tiled = falloc((size_t)ldd * C);
    memcpy(tiled, wkeep, sizeof(float) * (size_t)ldd * C);
    int cuts[4] = {0, ldd / 3, ldd - ldd / 4, ldd};
    for (int k = 0; k < 3; k++)
        if (cuts[k + 1] > cuts[k])
            be->matmul_backward_weight(be, tiled + (size_t)cuts[k] * C, full + cuts[k], ldd, s.inp, N, C,
                                       cuts[k + 1] - cuts[k]);
    int same_tiled = memcmp(tiled, wfull, sizeof(float) * (size_t)ldd * C) == 0;
    /* matmul_backward with dinp NULL (dW only) and with dw NULL (dX only) */
    float* w2 = falloc((size_t)ldd * C);
    memcpy(w2, wkeep, sizeof(float) * (size_t)ldd * C);
    be->matmul_backward(be, NULL, w2, NULL, full, s.inp, w, NULL, N, C, ldd);
    float* dinp2 = falloc(ni);
    fill_nan(dinp2, ni);
    be->matmul_backward(be, dinp2, NULL, NULL, full, s.inp, w, NULL, N, C, ldd);
    int same_dw_only = memcmp(w2, wfull, sizeof(float) * (size_t)ldd * C) == 0;
    int same_dx_only = memcmp(dinp2, dinp, sizeof(float) * ni) == 0;
    printf("matmul_backward_weight N=%d C=%d columns [%d,%d) of %d: dw %.2e | = full-width rows %s, 3 slices = "
           "full width %s, dW-only %s, dX-only %s\n",
           N, C, col0, col0 + OCs, ldd, e, same_full ? "yes" : "NO", same_tiled ? "yes" : "NO",
           same_dw_only ? "yes" : "NO", same_dx_only ? "yes" : "NO");
    CHECK(e <= TOL_BWD, "matmul_backward_weight error %.3e (a column outside the slice read?)", e);
    CHECK(guard_ok, "matmul_backward_weight wrote past its OC rows");
    CHECK(same_full, "matmul_backward_weight: not the bits of the same rows of matmul_backward's dW");
    CHECK(same_tiled, "matmul_backward_weight: slices tiling the columns differ from the full-width dW");
    CHECK(same_dw_only, "matmul_backward with dinp NULL: dW differs from the full call");
    CHECK(same_dx_only, "matmul_backward with dw NULL: dinp differs from the full call");
    check_determinism(be, "matmul_backward_weight", mw_run, &s, nw);
    free(s.dout);
    free(s.inp);
    free(s.dw0);
    free(full);
    free(o);
    free(ref);
    free(wfull);
    free(w);
    free(dinp);
    free(wkeep);
    free(tiled);
    free(w2);
    free(dinp2);
}

/* finite differences of L = sum(G * f) through the matmul. mode 0: f =
 * inp W^T + b; mode 1: f = gelu(inp W^T + b) (forward-fused GELU, backward
 * through gelu_backward); mode 2: f = gelu(x) W^T + b (backward-fused GELU,
 * gradient wrt x). */
typedef struct {
    int N, C, OC, mode;
    double *x, *w, *b, *G, *out, *tmp;
} MmLoss;
static double mm_loss(void* p) {
    MmLoss* s = p;
    const double* in = s->x;
    if (s->mode == 2) {
        for (size_t i = 0; i < (size_t)s->N * s->C; i++) s->tmp[i] = ref_gelu(s->x[i]);
        in = s->tmp;
    }
    ref_matmul(s->out, NULL, in, s->w, s->b, s->N, s->C, s->OC, s->mode == 1);
    double L = 0.0;
    for (size_t i = 0; i < (size_t)s->N * s->OC; i++) L += s->G[i] * s->out[i];
    return L;
}

static void test_matmul_fd(Ctx* cx, int N, int C, int OC, int mode) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t no = (size_t)N * OC, ni = (size_t)N * C, nw = (size_t)OC * C;
    float* x = falloc(ni);
    float* w = falloc(nw);
    float* b = falloc(OC);
    float* G = falloc(no);
    fill_normal(&r, x, ni, 1.0f);
    fill_normal(&r, w, nw, 0.7f);
    fill_normal(&r, b, OC, 1.0f);
    fill_normal(&r, G, no, 1.0f);
    float* gx = falloc(ni);
    float* gw = falloc(nw);
    float* gb = falloc(OC);
    memset(gw, 0, sizeof(float) * nw);
    memset(gb, 0, sizeof(float) * OC);
    fill_nan(gx, ni);
    if (mode == 0) {
        be->matmul_backward(be, gx, gw, gb, G, x, w, NULL, N, C, OC);
    } else if (mode == 1) {
        float* out = falloc(no);
        float* pre = falloc(no);
        float* dpre = falloc(no);
        be->matmul_forward(be, out, pre, x, w, b, N, C, OC);
        be->gelu_backward(be, dpre, pre, G, no);
        be->matmul_backward(be, gx, gw, gb, dpre, x, w, NULL, N, C, OC);
        free(out);
        free(pre);
        free(dpre);
    } else {
        float* gx_in = falloc(ni);
        be->gelu_forward(be, gx_in, x, ni);
        be->matmul_backward(be, gx, gw, gb, G, gx_in, w, x, N, C, OC);
        free(gx_in);
    }
    MmLoss L = {
        N,          C,         OC, mode, to_double(x, ni), to_double(w, nw), to_double(b, OC), to_double(G, no),
        dalloc(no), dalloc(ni)};
    double* fx = dalloc(ni);
    double* fw = dalloc(nw);
    double* fb = dalloc(OC);
    fd_grad(mm_loss, &L, L.x, ni, fx);
    fd_grad(mm_loss, &L, L.w, nw, fw);
    fd_grad(mm_loss, &L, L.b, OC, fb);
    double f1 = rel_err(gx, fx, ni), f2 = rel_err(gw, fw, nw), f3 = rel_err(gb, fb, OC);
    static const char* names[3] = {"plain", "gelu fused in forward", "gelu fused in backward"};
    printf("matmul finite differences (%s) N=%d C=%d OC=%d: dinp %.2e dw %.2e db %.2e\n", names[mode], N, C, OC,
           f1, f2, f3);
    CHECK(f1 <= TOL_FD && f2 <= TOL_FD && f3 <= TOL_FD, "matmul finite differences (%s) %.3e %.3e %.3e",
          names[mode], f1, f2, f3);
    free(x);
    free(w);
    free(b);
    free(G);
    free(gx);
    free(gw);
    free(gb);
    free(L.x);
    free(L.w);
    free(L.b);
    free(L.G);
    free(L.out);
    free(L.tmp);
    free(fx);
    free(fw);
    free(fb);
}

/* -------------------------------------------------------------- attention */

typedef struct {
    int B, T, C, NH;
    float *qkv, *dout, *dbias0;
} AttSt;

/* out: [out B*T*C | lse B*NH*T | dqkv B*T*3C | dbias 3C (from dbias0: it
 * accumulates)] */
static void att_run(Backend* be, void* p, float* o) {
    AttSt* s = p;
    const size_t no = (size_t)s->B * s->T * s->C, nl = (size_t)s->B * s->NH * s->T;
    float* db = o + no + nl + 3 * no;
    fill_nan(o, no + nl + 3 * no);
    memcpy(db, s->dbias0, sizeof(float) * 3 * (size_t)s->C);
    be->attention_forward(be, o, o + no, s->qkv, s->B, s->T, s->C, s->NH);
    be->attention_backward(be, o + no + nl, db, s->dout, s->qkv, o, o + no, s->B, s->T, s->C, s->NH);
}

typedef struct {
    int B, T, C, NH;
    double *qkv, *G, *out;
} AttLoss;
static double att_loss(void* p) {
    AttLoss* s = p;
    ref_attention(s->out, NULL, s->qkv, s->B, s->T, s->C, s->NH);
    double L = 0.0;
    for (size_t i = 0; i < (size_t)s->B * s->T * s->C; i++) L += s->G[i] * s->out[i];
    return L;
}

static void test_attention_case(Ctx* cx, int B, int T, int C, int NH, float scale, int fd) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t no = (size_t)B * T * C, nq = 3 * no, nl = (size_t)B * NH * T, nb = (size_t)3 * C;
    AttSt s = {B, T, C, NH, falloc(nq), falloc(no), falloc(nb)};
    fill_normal(&r, s.qkv, nq, scale);
    fill_normal(&r, s.dout, no, 1.0f);
    fill_normal(&r, s.dbias0, nb, 1.0f);
    const size_t nout = no + nl + nq + nb;
    float* o = falloc(nout);
    att_run(be, &s, o);
    double* qkv = to_double(s.qkv, nq);
    double* G = to_double(s.dout, no);
    double* out = dalloc(no);
    double* lse = dalloc(nl);
    double* dqkv = dalloc(nq);
    ref_attention(out, lse, qkv, B, T, C, NH);
    ref_attention_backward(dqkv, G, qkv, B, T, C, NH);
    /* the qkv bias gradient: the initial value + the column sums of dqkv */
    double* dbias = to_double(s.dbias0, nb);
    for (size_t n = 0; n < (size_t)B * T; n++)
        for (size_t j = 0; j < nb; j++) dbias[j] += dqkv[n * nb + j];
    double e1 = rel_err(o, out, no), e2 = rel_err(o + no, lse, nl), e3 = rel_err(o + no + nl, dqkv, nq);
    double e4 = rel_err(o + no + nl + nq, dbias, nb);
    printf("attention B=%d T=%d C=%d NH=%d qkv scale %g: out %.2e lse %.2e | dqkv %.2e dbias %.2e\n", B, T, C,
           NH, (double)scale, e1, e2, e3, e4);
    CHECK(e1 <= TOL_FWD && e2 <= TOL_FWD, "attention_forward error %.3e %.3e", e1, e2);
    CHECK(e3 <= TOL_BWD && e4 <= TOL_BWD, "attention_backward error dqkv %.3e dbias %.3e", e3, e4);
    {
        /* the same bits as the qkv matmul_backward's dbias over this dqkv
         * (where the model took it from before it moved here) */
        float* db = falloc(nb);
        memcpy(db, s.dbias0, sizeof(float) * nb);
        be->matmul_backward(be, NULL, NULL, db, o + no + nl, NULL, NULL, NULL, B * T, C, (int)nb);
        CHECK(memcmp(db, o + no + nl + nq, sizeof(float) * nb) == 0,
              "attention_backward dbias differs in bits from matmul_backward's");
        free(db);
    }
    check_determinism(be, "attention", att_run, &s, nout);
    if (fd) {
        AttLoss L = {B, T, C, NH, qkv, G, dalloc(no)};
        double* fq = dalloc(nq);
        fd_grad(att_loss, &L, qkv, nq, fq);
        double f = rel_err(o + no + nl, fq, nq);
        printf("attention finite differences B=%d T=%d C=%d NH=%d: dqkv %.2e\n", B, T, C, NH, f);
        CHECK(f <= TOL_FD, "attention finite differences %.3e", f);
        free(L.out);
        free(fq);
    }
    free(s.qkv);
    free(s.dout);
    free(s.dbias0);
    free(o);
    free(qkv);
    free(G);
    free(out);
    free(lse);
    free(dqkv);
    free(dbias);
}

/* ------------------------------------------------------------- classifier */

typedef struct {
    int N, V, Vp;
    float dloss;
    float* logits;
    int* targets;
} ClsSt;

/* out: [logits N*Vp | losses N] */
static void cls_run(Backend* be, void* p, float* o) {
    ClsSt* s = p;
    const size_t nl = (size_t)s->N * s->Vp;
    memcpy(o, s->logits, sizeof(float) * nl);
    fill_nan(o + nl, s->N);
    be->fused_classifier(be, o, o + nl, s->targets, s->dloss, s->N, s->V, s->Vp);
}

typedef struct {
    int N, V, Vp;
    double dloss;
    double *logits, *losses;
    const int* targets;
} ClsLoss;
static double cls_loss(void* p) {
    ClsLoss* s = p;
    ref_classifier(s->losses, NULL, s->logits, s->targets, s->dloss, s->N, s->V, s->Vp);
    double L = 0.0;
    for (int n = 0; n < s->N; n++) L += s->dloss * s->losses[n];
    return L;
}

static void test_classifier_case(Ctx* cx, int N, int V, int Vp, float dloss, float scale, float offset,
                                 int fd) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    const size_t nl = (size_t)N * Vp;
    ClsSt s = {N, V, Vp, dloss, falloc(nl), xmalloc(sizeof(int) * N)};
    fill_normal(&r, s.logits, nl, scale);
    for (size_t i = 0; i < nl; i++) s.logits[i] += offset;
    for (int n = 0; n < N; n++) {
        s.targets[n] = (int)(rng_u64(&r) % (uint64_t)V);
        for (int i = V; i < Vp; i++) s.logits[(size_t)n * Vp + i] = 1e4f; /* pads must not count */
    }
    float* o = falloc(nl + N);
    cls_run(be, &s, o);
    double* x = to_double(s.logits, nl);
    double* losses = dalloc(N);
    double* dl = dalloc(nl);
    ref_classifier(losses, dl, x, s.targets, dloss, N, V, Vp);
    double e_loss = rel_err(o + nl, losses, N);
    double e_grad = 0.0;
    int ok_grad;
    if (dloss != 0.0f) {
        e_grad = rel_err(o, dl, nl);
        int pads = 1;
        for (int n = 0; n < N; n++)
            for (int i = V; i < Vp; i++) pads &= (o[(size_t)n * Vp + i] == 0.0f);
        CHECK(pads, "fused_classifier: padded columns are not 0");
        ok_grad = e_grad <= TOL_BWD;
    } else {
        ok_grad = memcmp(o, s.logits, sizeof(float) * nl) == 0;
        CHECK(ok_grad, "fused_classifier with dloss 0 changed the logits");
    }
    printf("classifier N=%d V=%d Vp=%d dloss=%g scale=%g offset=%g: losses %.2e grad %.2e\n", N, V, Vp,
           (double)dloss, (double)scale, (double)offset, e_loss, e_grad);
    CHECK(e_loss <= TOL_FWD, "fused_classifier losses error %.3e", e_loss);
    CHECK(ok_grad, "fused_classifier gradient error %.3e", e_grad);
    check_determinism(be, "classifier", cls_run, &s, nl + N);
    if (fd && dloss != 0.0f) {
        ClsLoss L = {N, V, Vp, dloss, x, dalloc(N), s.targets};
        double* f = dalloc(nl);
        fd_grad(cls_loss, &L, x, nl, f); /* pads come out 0: they are not read */
        double e = rel_err(o, f, nl);
        printf("classifier finite differences N=%d V=%d Vp=%d: dlogits %.2e\n", N, V, Vp, e);
        CHECK(e <= TOL_FD, "classifier finite differences %.3e", e);
        free(L.losses);
        free(f);
    }
    free(s.logits);
    free(s.targets);
    free(o);
    free(x);
    free(losses);
    free(dl);
}

/* -------------------------------------------------------------- optimizer */

/* Pieces with gaps between them; zero-length and chunk-boundary lengths. */
static int make_pieces(Rng* r, OptPiece* pc, size_t* buf_len, size_t* state_len) {
    static const size_t lens[] = {37, 0, 1, 8191, 8192, 8193, 100000, 7, 64, 20000, 3};
    const int np = (int)(sizeof lens / sizeof lens[0]);
    size_t off = 5, st = 0;
    for (int i = 0; i < np; i++) {
        pc[i].buf_off = off;
        pc[i].grad_off = off;
        pc[i].rng_off = off;
        pc[i].state_off = st;
        pc[i].len = lens[i];
        pc[i].decay = (int)(rng_u64(r) & 1);
        off += lens[i] + 1 + rng_u64(r) % 50;
        st += lens[i];
    }
    *buf_len = off + 11;
    *state_len = st;
    return np;
}

typedef struct {
    const float* grads;
    const OptPiece* pc;
    int np;
} SqSt;
static void sumsq_run(Backend* be, void* p, float* o) {
    SqSt* s = p;
    double v = be->grad_sumsq(be, s->grads, s->pc, s->np);
    memcpy(o, &v, sizeof v);
}

static void test_grad_sumsq(Ctx* cx) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    OptPiece pc[16];
    size_t nb, ns;
    int np = make_pieces(&r, pc, &nb, &ns);
    float* g = falloc(nb);
    for (size_t i = 0; i < nb; i++) g[i] = 1e10f; /* gaps: must not be read */
    double ref = 0.0;
    for (int p = 0; p < np; p++)
        for (size_t i = 0; i < pc[p].len; i++) {
            float v = rng_normal(&r) * (p % 3 == 0 ? 1e-3f : 1.0f);
            g[pc[p].buf_off + i] = v;
            ref += (double)v * v;
        }
    double got = be->grad_sumsq(be, g, pc, np);
    double e = fabs(got - ref) / ref;
    printf("grad_sumsq %zu elements in %d pieces: %.17g vs %.17g, rel %.2e\n", ns, np, got, ref, e);
    CHECK(e <= 1e-12, "grad_sumsq relative error %.3e", e);
    CHECK(be->grad_sumsq(be, g, pc, 0) == 0.0, "grad_sumsq of no pieces is not 0");
    SqSt s = {g, pc, np};
    check_determinism(be, "grad_sumsq", sumsq_run, &s, 2);
    free(g);
}

typedef struct {
    size_t nb, ns;
    const float *params0, *grads, *master0, *m0, *v0;
    const OptPiece* pc;
    int np;
    AdamWArgs a;
} AdSt;

/* out: [params nb | master ns | m ns | v ns] */
static void adamw_run(Backend* be, void* p, float* o) {
    AdSt* s = p;
    memcpy(o, s->params0, sizeof(float) * s->nb);
    memcpy(o + s->nb, s->master0, sizeof(float) * s->ns);
    memcpy(o + s->nb + s->ns, s->m0, sizeof(float) * s->ns);
    memcpy(o + s->nb + 2 * s->ns, s->v0, sizeof(float) * s->ns);
    be->adamw(be, o, s->grads, o + s->nb, o + s->nb + s->ns, o + s->nb + 2 * s->ns, s->pc, s->np, &s->a);
}

static void test_adamw(Ctx* cx, int t, float grad_scale) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    OptPiece pc[16];
    size_t nb, ns;
    int np = make_pieces(&r, pc, &nb, &ns);
    float* params = falloc(nb);
    float* grads = falloc(nb);
    float* master = falloc(ns);
    float* m = falloc(ns);
    float* v = falloc(ns);
    fill_normal(&r, params, nb, 1.0f); /* gaps keep these bits */
    fill_nan(grads, nb);               /* gaps: must not be read */
    fill_normal(&r, master, ns, 1.0f);
    fill_normal(&r, m, ns, 0.01f);
    for (size_t i = 0; i < ns; i++) v[i] = 1e-4f * rng_uniform(&r);
    for (int p = 0; p < np; p++)
        for (size_t i = 0; i < pc[p].len; i++) grads[pc[p].buf_off + i] = 0.05f * rng_normal(&r);
    AdSt s = {
        nb,
        ns,
        params,
        grads,
        master,
        m,
        v,
        pc,
        np,
        {.lr = 3e-3f,
         .beta1 = 0.9f,
         .beta2 = 0.95f,
         .eps = 1e-8f,
         .weight_decay = 0.1f,
         .grad_scale = grad_scale,
         .t = t,
         .seed = 1}};
    float* o = falloc(nb + 3 * ns);
    adamw_run(be, &s, o);
    /* the double reference */
    double* rm = dalloc(ns);
    double* rv = dalloc(ns);
    double* rw = dalloc(ns);
    double* dupd = dalloc(ns);
    double* kupd = dalloc(ns);
    const AdamWArgs* a = &s.a;
    const double bc1 = 1.0 - pow(a->beta1, t), bc2 = 1.0 - pow(a->beta2, t);
    int gaps_ok = 1, params_ok = 1, elem_ok = 1;
    for (int p = 0; p < np; p++)
        for (size_t i = 0; i < pc[p].len; i++) {
            size_t j = pc[p].state_off + i;
            double g = (double)grads[pc[p].buf_off + i] * a->grad_scale;
            rm[j] = a->beta1 * (double)m[j] + (1.0 - a->beta1) * g;
            rv[j] = a->beta2 * (double)v[j] + (1.0 - a->beta2) * g * g;
            double mh = rm[j] / bc1, vh = rv[j] / bc2;
            double w = master[j];
            dupd[j] = -a->lr * (mh / (sqrt(vh) + a->eps) + (pc[p].decay ? a->weight_decay * w : 0.0));
            rw[j] = w + dupd[j];
            kupd[j] = (double)o[nb + j] - w;
            /* elementwise: within fp32 rounding of the new master (2^-23
             * relative) plus 1e-5 of the update itself */
            double tol = ldexp(fabs(rw[j]), -23) + 1e-5 * fabs(dupd[j]) + 1e-30;
            elem_ok &= fabs((double)o[nb + j] - rw[j]) <= tol;
            params_ok &= memcmp(&o[pc[p].buf_off + i], &o[nb + j], sizeof(float)) == 0;
        }
    /* everything outside the pieces keeps its bits */
    size_t prev = 0;
    for (int p = 0; p <= np; p++) {
        size_t end = p < np ? pc[p].buf_off : nb;
        if (end > prev) gaps_ok &= memcmp(o + prev, params + prev, sizeof(float) * (end - prev)) == 0;
        if (p < np) prev = pc[p].buf_off + pc[p].len;
    }
    double e_w = rel_err(o + nb, rw, ns), e_u = rel_err_dd(kupd, dupd, ns);
    double e_m = rel_err(o + nb + ns, rm, ns), e_v = rel_err(o + nb + 2 * ns, rv, ns);
    printf("adamw t=%d grad_scale=%g %zu elements: master %.2e update %.2e m %.2e v %.2e\n", t,
           (double)grad_scale, ns, e_w, e_u, e_m, e_v);
    CHECK(e_w <= 1e-6 && e_u <= 1e-5 && e_m <= 1e-6 && e_v <= 1e-6, "adamw error %.3e %.3e %.3e %.3e", e_w, e_u,
          e_m, e_v);
    CHECK(elem_ok, "adamw: an element of master is off by more than fp32 rounding");
    CHECK(params_ok, "adamw: params differ from master");
    CHECK(gaps_ok, "adamw wrote params outside its pieces");
    check_determinism(be, "adamw", adamw_run, &s, nb + 3 * ns);
    free(params);
    free(grads);
    free(master);
    free(m);
    free(v);
    free(o);
    free(rm);
    free(rv);
    free(rw);
    free(dupd);
    free(kupd);
}

/* ------------------------------------------------------------------ speed */

static void bench_matmul(Ctx* cx, int N, int C, int OC) {
    Backend* be = cx->be;
    Rng r;
    case_rng(cx, &r);
    float* inp = falloc((size_t)N * C);
    float* w = falloc((size_t)OC * C);
    float* b = falloc(OC);
    float* out = falloc((size_t)N * OC);
    float* dinp = falloc((size_t)N * C);
    float* dw = falloc((size_t)OC * C);
    float* db = falloc(OC);
    fill_normal(&r, inp, (size_t)N * C, 1.0f);
    fill_normal(&r, w, (size_t)OC * C, 0.03f);
    fill_normal(&r, b, OC, 1.0f);
    memset(dw, 0, sizeof(float) * OC * C);
    memset(db, 0, sizeof(float) * OC);
    const double flop = 2.0 * N * C * OC;
    double best_f = 1e30, best_b = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = wall_time_s();
        be->matmul_forward(be, out, NULL, inp, w, b, N, C, OC);
        double t1 = wall_time_s();
        be->matmul_backward(be, dinp, dw, db, out, inp, w, NULL, N, C, OC);
        double t2 = wall_time_s();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("matmul speed N=%d C=%d OC=%d, %d threads: forward %.1f GFLOP/s, backward %.1f GFLOP/s, "
           "forward+backward %.1f GFLOP/s\n",
           N, C, OC, omp_get_max_threads(), flop / best_f / 1e9, 2 * flop / best_b / 1e9,
           3 * flop / (best_f + best_b) / 1e9);
    free(inp);
    free(w);
    free(b);
    free(out);
    free(dinp);
    free(dw);
    free(db);
}

/* ------------------------------------------------------------------- main */

int main(void) {
    Ctx cx = {backend_cpu_create(), 1};
    printf("test_kernels: OpenMP max threads %d; GEMM kernel %s (also run: every other this CPU supports of "
           "avx512, avx2, portable)\n",
           omp_get_max_threads(), gemm_kernel_best()->name);

    test_memory(&cx);

    test_encoder_case(&cx, 2, 7, 36, 5, 1);
    test_encoder_case(&cx, 1, 1, 3, 2, 1);
    test_encoder_case(&cx, 3, 13, 130, 100, 0);
    test_encoder_case(&cx, 4, 64, 768, 1000, 0);
    test_encoder_range_case(&cx, 2, 7, 36, 5);
    test_encoder_range_case(&cx, 3, 13, 130, 100);
    test_encoder_range_case(&cx, 4, 64, 768, 1000);

    test_layernorm_case(&cx, 13, 36, 1);
    test_layernorm_case(&cx, 3, 5, 1);
    test_layernorm_case(&cx, 1, 1, 0);
    test_layernorm_case(&cx, 7, 130, 0);
    test_layernorm_case(&cx, 256, 768, 0);

    test_residual_case(&cx, 13, 36);
    test_residual_case(&cx, 64, 768);

    test_gelu_case(&cx, 13);
    test_gelu_case(&cx, 100003);

    /* sizes: odd; single; several row blocks (MC 96), k-blocks (KC 256),
     * task columns (512), micro-tiles (mr x nr up to 12 x 32) with ragged edges */
    test_matmul_case(&cx, 13, 36, 7, 1, 0, 0);
    test_matmul_case(&cx, 1, 1, 1, 1, 1, 1);
    test_matmul_case(&cx, 7, 36, 108, 0, 1, 0);
    test_matmul_case(&cx, 13, 36, 144, 1, 1, 1);
    test_matmul_case(&cx, 200, 300, 290, 1, 0, 0);
    test_matmul_case(&cx, 97, 257, 33, 1, 1, 1);
    test_matmul_case(&cx, 64, 768, 2304, 1, 0, 0);
    test_matmul_case(&cx, 10, 4100, 600, 1, 0, 0);
    test_matmul_case(&cx, 2100, 1100, 8, 0, 0, 1);
    test_matmul_case(&cx, 6, 40, 4200, 1, 1, 0); /* several packed column blocks (4096) */
    test_matmul_case(&cx, 3, 4500, 5, 1, 0, 1);
    test_matmul_case(&cx, 2, 600, 4200, 1, 0, 0);   /* column blocks x k-ranges */
    test_matmul_case(&cx, 500, 4400, 136, 1, 0, 0); /* packed A in two row blocks; shared when columns split */
    /* the lm head's dW per vocabulary chunk: odd slices, several row blocks
     * (MC 96) and k-blocks (KC 256), GPT-2-like chunk of a wide dout */
    test_matmul_weight_case(&cx, 13, 36, 50, 7, 20);
    test_matmul_weight_case(&cx, 1, 1, 3, 2, 1);
    test_matmul_weight_case(&cx, 300, 40, 257, 0, 257);
    test_matmul_weight_case(&cx, 300, 130, 1000, 192, 500);
    test_matmul_weight_case(&cx, 64, 768, 3000, 1024, 1536);
    test_matmul_fd(&cx, 3, 5, 4, 0);
    test_matmul_fd(&cx, 7, 36, 13, 0);
    test_matmul_fd(&cx, 5, 9, 6, 1);
    test_matmul_fd(&cx, 7, 36, 13, 1);
    test_matmul_fd(&cx, 5, 9, 6, 2);
    test_matmul_fd(&cx, 7, 36, 13, 2);

    test_attention_case(&cx, 2, 7, 36, 3, 1.0f, 1);
    test_attention_case(&cx, 1, 5, 6, 2, 1.0f, 1);
    test_attention_case(&cx, 1, 1, 8, 2, 1.0f, 1);
    test_attention_case(&cx, 1, 6, 12, 2, 2.5f, 1); /* peaked softmax */
    test_attention_case(&cx, 3, 16, 24, 1, 1.0f, 0);
    test_attention_case(&cx, 2, 64, 96, 3, 1.0f, 0);
    test_attention_case(&cx, 2, 40, 48, 4, 3.0f, 0);
    test_attention_case(&cx, 1, 129, 128, 2, 1.0f, 0);

    test_classifier_case(&cx, 13, 7, 8, 1.0f / 13, 3.0f, 0.0f, 1);
    test_classifier_case(&cx, 5, 50, 64, -0.37f, 3.0f, 0.0f, 1);
    test_classifier_case(&cx, 3, 1, 4, 0.5f, 3.0f, 0.0f, 1);
    test_classifier_case(&cx, 6, 500, 512, 1.0f / 6, 3.0f, 1000.0f, 0);
    test_classifier_case(&cx, 6, 500, 512, 0.0f, 3.0f, 0.0f, 0);
    test_classifier_case(&cx, 7, 300, 320, 1.0f / 7, 40.0f, -500.0f, 0); /* peaked: huge losses */
    test_classifier_case(&cx, 4, 50257, 50304, 0.25f, 3.0f, 0.0f, 0);

    test_grad_sumsq(&cx);
    test_adamw(&cx, 1, 1.0f);
    test_adamw(&cx, 7, 0.37f);

    bench_matmul(&cx, 4096, 768, 768);

    cx.be->destroy(cx.be);
    return test_done("test_kernels");
}
