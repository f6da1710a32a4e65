/* test/test_fixture.c — the CPU backend against the PyTorch oracle.
 *   build/test_fixture [MODEL.bin FIXTURE.bin] [--device cuda --dtype fp32|bf16]
 * The fixture (tools/oracle.py, float64 PyTorch) holds a fixed batch, logits
 * at some positions, the loss, every gradient, and 10 AdamW steps with
 * clipping and weight decay (losses, learning rates, grad norms). We run the
 * same through the model, optimizer and schedule code the trainer uses.
 * Tolerances (fp32): logits and loss 1e-5 relative, each gradient tensor 1e-4
 * relative by norm, each of the step losses 1e-5 relative. bf16 on cuda: loss
 * within 1e-2 relative (gradients and logits reported, not asserted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "../common/util.h"
#include "../kernels/kernels.h"
#include "../model/gpt2.h"
#include "../ddp/layout.h"
#include "../zero/optimizer.h"

static float as_float(int32_t v) {
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static double rel_err(const float* a, const float* ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = ref[i];
        d += (x - y) * (x - y);
        r += y * y;
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

int main(int argc, char** argv) {
    const char* model_path = "test/fixtures/oracle_model.bin";
    const char* fix_path = "test/fixtures/oracle_fixture.bin";
    const char* device = "cpu";
    const char* dtype = "fp32";
    int pos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) dtype = argv[++i];
        else if (pos == 0) {
            model_path = argv[i];
            pos++;
        } else if (pos == 1) {
            fix_path = argv[i];
            pos++;
        }
    }
    int bf16 = strcmp(dtype, "bf16") == 0;
    Backend* be = strcmp(device, "cuda") == 0 ? backend_cuda_create(bf16 ? DTYPE_BF16 : DTYPE_FP32, 0, 0)
                                              : backend_cpu_create();

    FILE* f = xfopen(fix_path, "rb");
    int32_t h[256];
    xfread(h, 4, 256, f, fix_path);
    CHECK(h[0] == 20261202 && h[1] == 1, "fixture magic/version %d %d", h[0], h[1]);
    int B = h[2], T = h[3], steps = h[4], P = h[5], V = h[6];
    size_t nparams = (size_t)h[12];
    int warmup = h[13], total = h[14];
    float lr = as_float(h[32]), b1 = as_float(h[33]), b2 = as_float(h[34]), eps = as_float(h[35]);
    float wd = as_float(h[36]), clip = as_float(h[37]), frac = as_float(h[38]);
    int* inputs = xmalloc(sizeof(int) * (size_t)B * T);
    int* targets = xmalloc(sizeof(int) * (size_t)B * T);
    int* positions = xmalloc(sizeof(int) * (size_t)P);
    float* logits = xmalloc(sizeof(float) * (size_t)P * V);
    float loss_ref;
    float* grads_ref = xmalloc(sizeof(float) * nparams);
    float* losses_ref = xmalloc(sizeof(float) * (size_t)steps);
    float* lrs_ref = xmalloc(sizeof(float) * (size_t)steps);
    float* norms_ref = xmalloc(sizeof(float) * (size_t)steps);
    xfread(inputs, 4, (size_t)B * T, f, fix_path);
    xfread(targets, 4, (size_t)B * T, f, fix_path);
    xfread(positions, 4, (size_t)P, f, fix_path);
    xfread(logits, 4, (size_t)P * V, f, fix_path);
    xfread(&loss_ref, 4, 1, f, fix_path);
    xfread(grads_ref, 4, nparams, f, fix_path);
    xfread(losses_ref, 4, (size_t)steps, f, fix_path);
    xfread(lrs_ref, 4, (size_t)steps, f, fix_path);
    xfread(norms_ref, 4, (size_t)steps, f, fix_path);
    fclose(f);
    printf("fixture: B %d T %d steps %d positions %d, lr %g clip %g wd %g warmup %d total %d\n", B, T, steps, P,
           lr, clip, wd, warmup, total);

    GPT2Config cfg;
    int version;
    gpt2_read_header(model_path, &cfg, &version);
    GPT2 m;
    memset(&m, 0, sizeof m);
    int ns;
    LayoutParamSpec* specs = gpt2_describe(&m, &cfg, &ns);
    CHECK(m.num_parameters == nparams, "parameter count %zu vs fixture %zu", m.num_parameters, nparams);
    Layout L;
    char err[256];
    if (layout_build(&L, specs, ns, 1u << 20, 1, 1, 64, err, sizeof err) != 0) fatal("%s", err);
    gpt2_bind(&m, be, &L);
    gpt2_load(&m, model_path);
    gpt2_alloc_activations(&m, B, T);

    /* forward: logits and loss */
    float loss = gpt2_forward(&m, inputs, NULL, B, T, 0.0f);
    float* row = xmalloc(sizeof(float) * (size_t)V);
    double worst_logit = 0;
    for (int p = 0; p < P; p++) {
        gpt2_logits_row(&m, positions[p] / T, positions[p] % T, row);
        double e = rel_err(row, logits + (size_t)p * V, (size_t)V);
        if (e > worst_logit) worst_logit = e;
    }
    double tol_fwd = bf16 ? 2e-2 : 1e-5;
    printf("logits: worst relative error %.3e over %d positions\n", worst_logit, P);
    CHECK(bf16 || worst_logit <= tol_fwd, "logits relative error %.3e > %.1e", worst_logit, tol_fwd);
    loss = gpt2_forward(&m, inputs, targets, B, T, 1.0f / (float)(B * T));
    double le = fabs((double)loss - loss_ref) / fabs((double)loss_ref);
    printf("loss: %.7f vs oracle %.7f, relative error %.3e\n", loss, loss_ref, le);
    CHECK(le <= (bf16 ? 1e-2 : 1e-5), "loss relative error %.3e", le);

    /* backward: every gradient tensor */
    gpt2_backward(&m, NULL, NULL);
    float* g = xmalloc(sizeof(float) * nparams);
    gpt2_grads_to_host(&m, g);
    double worst_grad = 0;
    const char* worst_name = "";
    for (int t = 0; t < m.ntensors; t++) {
        const GPT2Tensor* tt = &m.tensors[t];
        double e = rel_err(g + tt->file_off, grads_ref + tt->file_off, tt->numel);
        if (e > worst_grad) {
            worst_grad = e;
            worst_name = tt->name;
        }
        if (!bf16) CHECK(e <= 1e-4, "gradient %s relative error %.3e > 1e-4", tt->name, e);
    }
    printf("gradients: worst tensor %s relative error %.3e (%d tensors)\n", worst_name, worst_grad, m.ntensors);
    be->zero(be, m.grads, L.total * dtype_size(be->dtype));

    /* 10 AdamW steps on the same batch, the trainer's optimizer and schedule */
    int npieces;
    OptPiece* pieces = layout_opt_pieces(&L, -1, &npieces);
    int nnorm;
    OptPiece* norm_pieces = layout_opt_pieces(&L, 0, &nnorm);
    Optimizer opt;
    optimizer_init(&opt, be,
                   &(OptBuffer){.params = m.params, .grads = m.grads, .pieces = pieces, .npieces = npieces}, 1);
    double worst_step = 0;
    for (int s = 0; s < steps; s++) {
        float l = gpt2_forward(&m, inputs, targets, B, T, 1.0f / (float)(B * T));
        gpt2_backward(&m, NULL, NULL);
        double norm = sqrt(be->grad_sumsq(be, m.grads, norm_pieces, nnorm));
        float slr = lr_at_step(LR_COSINE, s, warmup, total, lr, frac);
        float scale = (clip > 0 && norm > clip) ? (float)(clip / norm) : 1.0f;
        optimizer_step(&opt, slr, b1, b2, eps, wd, scale, 1234u + (uint32_t)s);
        be->zero(be, m.grads, L.total * dtype_size(be->dtype));
        double e = fabs((double)l - losses_ref[s]) / fabs((double)losses_ref[s]);
        double ne = fabs(norm - norms_ref[s]) / fabs((double)norms_ref[s]);
        double lre = fabs((double)slr - lrs_ref[s]) / fabs((double)lrs_ref[s]);
        if (e > worst_step) worst_step = e;
        printf("step %2d: loss %.7f oracle %.7f (rel %.2e) | norm %.5f oracle %.5f (rel %.2e) | lr %.4e%s\n", s,
               l, losses_ref[s], e, norm, norms_ref[s], ne, slr, scale < 1 ? " (clipped)" : "");
        CHECK(e <= (bf16 ? 1e-2 : 1e-5), "step %d loss relative error %.3e", s, e);
        CHECK(lre <= 1e-6, "step %d learning rate %.8g vs oracle %.8g", s, slr, lrs_ref[s]);
        if (!bf16) CHECK(ne <= 1e-4, "step %d grad norm relative error %.3e", s, ne);
    }
    printf("steps: worst loss relative error %.3e\n", worst_step);
    free(norm_pieces);
    optimizer_free(&opt);
    gpt2_free(&m);
    layout_free(&L);
    free(specs);
    be->destroy(be);
    free(inputs);
    free(targets);
    free(positions);
    free(logits);
    free(grads_ref);
    free(losses_ref);
    free(lrs_ref);
    free(norms_ref);
    free(row);
    free(g);
    return test_done(bf16 ? "test_fixture(bf16)" : "test_fixture");
}
