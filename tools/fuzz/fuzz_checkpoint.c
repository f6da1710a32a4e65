/* tools/fuzz/fuzz_checkpoint.c — fuzz harness of the checkpoint readers
 * (checkpoint/ckpt_format.c, ckpt_file.c). The input is the state.bin of a
 * tiny model's checkpoint; it is placed next to a fixed valid model.bin and a
 * DONE that records the input's true size and CRC-32 (and the step its
 * header slot holds), so the fuzzer gets past the checksum into the header
 * checks and the array reader (ckpt_verify, then ckpt_read_state into a CPU
 * optimizer). The same bytes also go to the pure parsers: the DONE parser
 * (a parsed marker must format back to text that parses to the same
 * values), the header decoder (a decoded header must encode back to bytes
 * that decode to the same header and hold the same value in every field's
 * slot, and goes through the resume check), the model.bin header check,
 * the checkpoint directory name parser, and the log.jsonl trimmer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../checkpoint/checkpoint.h"
#include "../../train/runlog.h"
#include "fuzz_common.h"

static GPT2Config tiny_cfg(void) {
    GPT2Config c = {.max_seq_len = 8,
                    .vocab_size = 16,
                    .padded_vocab_size = 16,
                    .num_layers = 1,
                    .num_heads = 1,
                    .channels = 4};
    return c;
}

static void read_body(void* ctx) {
    const char* dir = ctx;
    GPT2Config cfg = tiny_cfg();
    Backend* be = backend_cpu_create();
    GPT2 m;
    memset(&m, 0, sizeof m);
    int ns;
    LayoutParamSpec* specs = gpt2_describe(&m, &cfg, &ns);
    Layout L;
    char err[1024];
    if (layout_build(&L, specs, ns, 100, 1, 1, 64, err, sizeof err) != 0) abort();
    gpt2_bind(&m, be, &L);
    CkptHeader h;
    int verified = ckpt_verify(dir, &cfg, m.num_parameters, &h, err, sizeof err) == 0;
    if (getenv("FUZZ_VERBOSE")) fprintf(stdout, "fuzz_checkpoint: %s\n", verified ? "verified" : err);
    if (verified) {
        int n;
        OptPiece* pieces = layout_opt_pieces(&L, -1, &n);
        Optimizer o;
        optimizer_init(&o, be, &(OptBuffer){.params = m.params, .pieces = pieces, .npieces = n}, 1);
        int ns2;
        CkptSpan* spans =
            ckpt_spans(&L, &m, o.bufs[0].pieces, o.bufs[0].npieces, o.bufs[0].pieces, o.bufs[0].npieces, &ns2);
        char path[512];
        snprintf(path, sizeof path, "%s/state.bin", dir);
        int rd = ckpt_read_state(path, be, m.num_parameters, spans, ns2, o.master, o.m, o.v, err, sizeof err);
        if (getenv("FUZZ_VERBOSE")) fprintf(stdout, "fuzz_checkpoint: read %s\n", rd == 0 ? "ok" : err);
        if (rd == 0)
            for (size_t i = 0; i < o.nstate; i++)
                if (o.v[i] < 0) abort(); /* the reader refuses negative second moments */
        free(spans);
        optimizer_free(&o);
    }
    gpt2_free(&m);
    layout_free(&L);
    free(specs);
    be->destroy(be);
}

typedef struct {
    const uint8_t* data;
    size_t size;
    const char* log;
} ParseCase;

static void parse_body(void* ctx) {
    const ParseCase* c = ctx;
    char err[1024];
    CkptDone d, d2;
    CkptHeader h;
    if (ckpt_done_parse((const char*)c->data, c->size, &d, err, sizeof err) == 0) {
        char text[CKPT_DONE_MAX];
        int len = ckpt_done_format(&d, text, sizeof text);
        if (len <= 0 || len >= (int)sizeof text ||
            ckpt_done_parse(text, (size_t)len, &d2, err, sizeof err) != 0 || memcmp(&d, &d2, sizeof d) != 0)
            abort(); /* the formatter writes what the parser reads */
    }
    if (ckpt_header_decode(c->data, c->size, &h, err, sizeof err) == 0) {
        unsigned char again[CKPT_HEADER_BYTES];
        CkptHeader h2;
        ckpt_header_encode(&h, again);
        if (ckpt_header_decode(again, sizeof again, &h2, err, sizeof err) != 0 ||
            memcmp(&h, &h2, sizeof h) != 0)
            abort(); /* the encoder writes what the decoder read */
        /* and the same slot values, but the upper half of a float's slot, which the decoder ignores */
        for (int i = 0; i < ckpt_nfields; i++) {
            int s = ckpt_fields[i].slot, n = ckpt_fields[i].type == CKPT_F32 ? 4 : 8;
            if (memcmp(again + 8 * s, c->data + 8 * s, (size_t)n) != 0) abort();
        }
        CkptHparams now = h.hp;
        now.seed ^= (int)(c->size & 1);
        now.world += 1;
        char notes[4096];
        ckpt_header_check_resume(&h, &now, notes, sizeof notes, err, sizeof err);
    }
    if (c->size >= GPT2_HEADER_INTS * 4) {
        GPT2Config cfg = tiny_cfg();
        ckpt_model_header_check(c->data, &cfg, err, sizeof err);
    }
    char name[64];
    size_t n = c->size < sizeof name - 1 ? c->size : sizeof name - 1;
    memcpy(name, c->data, n);
    name[n] = '\0';
    int tmp;
    ckpt_parse_name(name, &tmp);
    runlog_trim(c->log, 5, err, sizeof err);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static char dir[256];
    static size_t P;
    char path[512];
    if (!dir[0]) { /* once: the checkpoint directory and its valid model.bin */
        GPT2Config cfg = tiny_cfg();
        P = gpt2_num_parameters(&cfg);
        snprintf(dir, sizeof dir, "%s/ckpt", fuzz_temp_dir());
        mkdir(dir, 0755);
        size_t bytes = (size_t)ckpt_model_bytes(P);
        uint8_t* model = calloc(bytes, 1);
        int32_t hdr[GPT2_HEADER_INTS];
        gpt2_header_encode(&cfg, 3, hdr);
        memcpy(model, hdr, sizeof hdr);
        for (size_t i = 0; i < P; i++) {
            float w = 0.01f * (float)(i % 17);
            memcpy(model + sizeof hdr + 4 * i, &w, 4);
        }
        fuzz_write_file("ckpt/model.bin", model, bytes, path, sizeof path);
        free(model);
    }
    fuzz_write_file("ckpt/state.bin", data, size, path, sizeof path);
    int64_t step = 0;
    if (size >= 40) memcpy(&step, data + 32, 8); /* the header's step slot */
    if (step < 0 || step > 2147483647) step = 0;
    char text[256];
    /* model.bin's crc: once per process, from the file */
    static uint32_t model_crc;
    static int have_crc;
    if (!have_crc) {
        long long b;
        char err[256];
        snprintf(path, sizeof path, "%s/model.bin", dir);
        if (ckpt_crc32_file(path, &model_crc, &b, err, sizeof err) != 0) abort();
        have_crc = 1;
    }
    int len = snprintf(text, sizeof text,
                       "gpt2-checkpoint v1\nstep %d\nmodel.bin %zu crc32 %08x\nstate.bin %zu crc32 %08x\n",
                       (int)step, (size_t)ckpt_model_bytes(P), model_crc, size, ckpt_crc32(0, data, size));
    fuzz_write_file("ckpt/DONE", (const uint8_t*)text, (size_t)len, path, sizeof path);
    fuzz_run(read_body, dir);
    char logp[512];
    fuzz_write_file("log.jsonl", data, size, logp, sizeof logp);
    ParseCase pc = {data, size, logp};
    fuzz_run(parse_body, &pc);
    return 0;
}
