/* tools/fuzz/fuzz_model.c — fuzz harness of the llm.c model-file reader
 * (model/gpt2.c). The input is one model file.
 *  - The header codec alone (no I/O, outside fuzz_run: it must not call
 *    fatal()): the input's first 1024 bytes (zero-padded) decode, or are
 *    refused with a non-empty reason; a decoded header encodes back to the
 *    same 8 slots, zeros elsewhere, and decodes again to the same shape.
 *  - The file: its header is read (accepted only with the shape the codec
 *    decoded), the model described, laid out, bound to a CPU backend and
 *    loaded, and, when it loads, one forward pass with a loss runs over a
 *    few tokens (a file that loads must not crash the model). */
#include <stdlib.h>
#include <string.h>

#include "../../ddp/layout.h"
#include "../../kernels/kernels.h"
#include "../../model/gpt2.h"
#include "fuzz_common.h"

typedef struct {
    const char* path;
    int decoded;    /* gpt2_header_decode accepted the input's header */
    GPT2Config cfg; /* ... with this shape and version */
    int version;
} ModelInput;

/* The codec on the input's header; fills in->decoded, cfg, version. Aborts on a broken contract. */
static void check_codec(const uint8_t* data, size_t size, ModelInput* in) {
    int32_t h[GPT2_HEADER_INTS];
    memset(h, 0, sizeof h);
    memcpy(h, data, size < sizeof h ? size : sizeof h);
    char err[64]; /* shorter than some reasons: they are cut, still terminated */
    err[0] = '\0';
    in->decoded = gpt2_header_decode(h, &in->cfg, &in->version, err, sizeof err) == 0;
    if (!in->decoded) {
        if (err[0] == '\0' || memchr(err, '\0', sizeof err) == NULL) abort();
        return;
    }
    int32_t e[GPT2_HEADER_INTS];
    gpt2_header_encode(&in->cfg, in->version, e);
    if (memcmp(e, h, 8 * sizeof(int32_t)) != 0) abort();
    for (int i = 8; i < GPT2_HEADER_INTS; i++)
        if (e[i] != 0) abort();
    GPT2Config c2;
    int v2;
    if (gpt2_header_decode(e, &c2, &v2, err, sizeof err) != 0 || memcmp(&c2, &in->cfg, sizeof c2) != 0 ||
        v2 != in->version)
        abort();
}

static void model_body(void* ctx) {
    const ModelInput* in = ctx;
    const char* path = in->path;
    GPT2Config cfg;
    int version;
    gpt2_read_header(path, &cfg, &version);
    if (!in->decoded || memcmp(&cfg, &in->cfg, sizeof cfg) != 0 || version != in->version) abort();
    Backend* be = backend_cpu_create();
    GPT2 m;
    memset(&m, 0, sizeof m);
    int ns;
    LayoutParamSpec* specs = gpt2_describe(&m, &cfg, &ns);
    if (m.num_parameters != gpt2_num_parameters(&cfg)) abort();
    Layout L;
    char err[256];
    if (layout_build(&L, specs, ns, 1u << 20, 1, 1, 64, err, sizeof err) != 0) abort(); /* valid specs */
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
    ModelInput in;
    memset(&in, 0, sizeof in);
    check_codec(data, size, &in);
    char path[256];
    fuzz_write_file("model.bin", data, size, path, sizeof path);
    in.path = path;
    fuzz_run(model_body, &in);
    return 0;
}
