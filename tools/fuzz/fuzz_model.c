/* tools/fuzz/fuzz_model.c — fuzz harness of the llm.c model-file reader
 * (model/gpt2.c): the input is one model file; its header is read, the
 * model described, laid out, bound to a CPU backend and loaded, and, when
 * it loads, one forward pass with a loss runs over a few tokens (a file
 * that loads must not crash the model). */
#include <stdlib.h>
#include <string.h>

#include "../../ddp/layout.h"
#include "../../kernels/kernels.h"
#include "../../model/gpt2.h"
#include "fuzz_common.h"

static void model_body(void* ctx) {
    const char* path = ctx;
    GPT2Config cfg;
    int version;
    gpt2_read_header(path, &cfg, &version);
    Backend* be = backend_cpu_create();
    GPT2 m;
    memset(&m, 0, sizeof m);
    int ns;
    LayoutParamSpec* specs = gpt2_describe(&m, &cfg, &ns);
    Layout L;
    char err[256];
    if (layout_build(&L, specs, ns, 1u << 20, 1, 1, 64, err, sizeof err) != 0) abort();   /* valid specs */
    gpt2_bind(&m, be, &L);
    gpt2_load(&m, path);
    int T = cfg.max_seq_len < 4 ? cfg.max_seq_len : 4;
    gpt2_alloc_activations(&m, 1, T);
    int ids[4];
    for (int t = 0; t < T; t++) ids[t] = t % cfg.vocab_size;
    gpt2_forward(&m, ids, ids, 1, T, 0.0f);
    gpt2_free(&m);
    layout_free(&L);
    free(specs);
    be->destroy(be);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[256];
    fuzz_write_file("model.bin", data, size, path, sizeof path);
    fuzz_run(model_body, path);
    return 0;
}
