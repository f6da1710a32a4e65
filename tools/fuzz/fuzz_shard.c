/* tools/fuzz/fuzz_shard.c — fuzz harness of the token-shard parser
 * (data/dataloader.c): the input is one shard file, loaded with two
 * settings; rows are read across epochs, and every token handed out must
 * be inside the vocabulary the loader validated against. */
#include <stdlib.h>
#include <string.h>

#include "../../data/dataloader.h"
#include "fuzz_common.h"

typedef struct {
    const char* path;
    int T, shuffle;
} ShardCase;

static void shard_body(void* ctx) {
    const ShardCase* c = ctx;
    const int V = 50257, n = 2;
    DataLoader dl;
    dataloader_init(&dl, c->path, c->T, (size_t)n * c->T + 1, V, c->shuffle, 7);
    int* in = malloc(sizeof(int) * (size_t)n * c->T);
    int* tg = malloc(sizeof(int) * (size_t)n * c->T);
    uint64_t rows[4] = {0, dl.nrows - 1, dl.nrows, 3 * (uint64_t)dl.nrows + 5};
    for (int k = 0; k < 4; k++) {
        dataloader_rows(&dl, rows[k], n, in, tg);
        for (int i = 0; i < n * c->T; i++)
            if (in[i] < 0 || in[i] >= V || tg[i] < 0 || tg[i] >= V) abort(); /* validated, so never */
    }
    free(in);
    free(tg);
    dataloader_free(&dl);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[256];
    fuzz_write_file("shard.bin", data, size, path, sizeof path);
    ShardCase a = {path, 8, 1}, b = {path, 1, 0};
    fuzz_run(shard_body, &a);
    fuzz_run(shard_body, &b);
    return 0;
}
