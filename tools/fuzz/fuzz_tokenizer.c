/* tools/fuzz/fuzz_tokenizer.c — fuzz harness of the tokenizer-file parser
 * (data/tokenizer.c): the input is one tokenizer file; every id decodes,
 * and printing (valid and invalid ids) stays in bounds. */
#include <stdio.h>
#include <stdlib.h>

#include "../../data/tokenizer.h"
#include "fuzz_common.h"

typedef struct {
    const char* path;
    FILE* sink;
} TokCase;

static void tok_body(void* ctx) {
    const TokCase* c = ctx;
    Tokenizer t;
    tokenizer_init(&t, c->path);
    for (uint32_t i = 0; i < t.vocab_size; i++)
        if (!tokenizer_decode(&t, i)) abort(); /* every id below the vocab size decodes */
    if (tokenizer_decode(&t, t.vocab_size)) abort();
    int ids[72], n = 0;
    for (uint32_t i = 0; i < t.vocab_size && n < 64; i++) ids[n++] = (int)i;
    ids[n++] = -1;
    ids[n++] = (int)t.vocab_size;
    ids[n++] = (int)t.eot;
    tokenizer_print(&t, ids, n, c->sink);
    tokenizer_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FILE* sink;
    if (!sink) sink = fopen("/dev/null", "w"); /* opened outside fuzz_run: not tracked */
    char path[256];
    fuzz_write_file("tokenizer.bin", data, size, path, sizeof path);
    TokCase c = {path, sink};
    fuzz_run(tok_body, &c);
    return 0;
}
