/* tools/compare_models.c — compares two llm.c model files tensor by tensor.
 *   build/compare_models A.bin B.bin [--exact | --rtol X]
 * Prints the relative difference by norm over the whole model, and the worst
 * tensor's. Exits 1 if the files differ in shape, or if the whole-model
 * relative difference exceeds X (default 1e-6), or, with --exact, in any bit.
 * (The whole model, not each tensor: some tensors have gradients that are
 * zero in exact arithmetic, e.g. the key bias, since softmax ignores a shift
 * shared by all keys; AdamW turns their rounding noise into full-size
 * updates, so their values depend on the summation order of any run.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../common/util.h"
#include "../model/gpt2.h"

static float* read_all(const char* path, GPT2Config* c, size_t* n) {
    int version;
    gpt2_read_header(path, c, &version);
    *n = gpt2_num_parameters(c);
    float* w = xmalloc(*n * sizeof(float));
    FILE* f = xfopen(path, "rb");
    fseek(f, GPT2_HEADER_INTS * sizeof(int32_t), SEEK_SET);
    if (version == 3) {
        xfread(w, 4, *n, f, path);
    } else {
        uint16_t* h = xmalloc(*n * 2);
        xfread(h, 2, *n, f, path);
        for (size_t i = 0; i < *n; i++) w[i] = bf16_to_f32(h[i]);
        free(h);
    }
    fclose(f);
    return w;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s A.bin B.bin [--exact | --rtol X]\n", argv[0]);
        return 2;
    }
    int exact = 0;
    double rtol = 1e-6;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--exact") == 0) exact = 1;
        else if (strcmp(argv[i], "--rtol") == 0 && i + 1 < argc) rtol = parse_float_flag("--rtol", argv[++i]);
        else fatal("compare_models: unknown argument '%s'", argv[i]);
    }
    GPT2Config ca, cb;
    size_t na, nb;
    float* a = read_all(argv[1], &ca, &na);
    float* b = read_all(argv[2], &cb, &nb);
    if (memcmp(&ca, &cb, sizeof ca) != 0 || na != nb) {
        printf("compare_models: shapes differ\n");
        return 1;
    }
    GPT2 m;
    memset(&m, 0, sizeof m);
    int ns;
    free(gpt2_describe(&m, &ca, &ns));
    double worst = 0.0, all_d2 = 0.0, all_r2 = 0.0;
    const char* worst_name = "";
    size_t differing = 0;
    for (int t = 0; t < m.ntensors; t++) {
        const GPT2Tensor* tt = &m.tensors[t];
        double d2 = 0, r2 = 0;
        for (size_t i = 0; i < tt->numel; i++) {
            double x = a[tt->file_off + i], y = b[tt->file_off + i];
            if (memcmp(&a[tt->file_off + i], &b[tt->file_off + i], 4) != 0) differing++;
            d2 += (x - y) * (x - y);
            r2 += y * y;
        }
        all_d2 += d2;
        all_r2 += r2;
        double rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        if (rel > worst) {
            worst = rel;
            worst_name = tt->name;
        }
    }
    double whole = all_r2 > 0 ? sqrt(all_d2 / all_r2) : sqrt(all_d2);
    printf("compare_models: %zu of %zu values differ; model rel diff %.3e; worst tensor %s rel diff %.3e\n",
           differing, na, whole, worst_name[0] ? worst_name : "-", worst);
    free(a);
    free(b);
    free(m.tensors);
    free(m.layout_to_tensor);
    if (exact) return differing ? 1 : 0;
    return whole <= rtol ? 0 : 1;
}
