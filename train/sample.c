/* train/sample.c — see sample.h. */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/util.h"

void sample_text(GPT2* m, const Tokenizer* tok, int ntokens, int T, uint64_t seed) {
    int V = m->cfg.vocab_size;
    int* ids = xmalloc(sizeof(int) * (size_t)(T));
    float* row = xmalloc(sizeof(float) * (size_t)V);
    Rng r;
    rng_seed(&r, seed);
    ids[0] = (int)tok->eot;
    int n = 1;
    printf("---- sample ----\n");
    for (; n < ntokens + 1 && n < T; n++) {
        gpt2_forward(m, ids, NULL, 1, n, 0.0f);
        gpt2_logits_row(m, 0, n - 1, row);
        double mx = row[0];
        for (int i = 1; i < V; i++) if (row[i] > mx) mx = row[i];
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
        double u = (double)rng_uniform(&r) * sum, acc = 0;
        int next = V - 1;
        for (int i = 0; i < V; i++) {
            acc += exp((double)row[i] - mx);
            if (acc > u) { next = i; break; }
        }
        ids[n] = next;
    }
    tokenizer_print(tok, ids + 1, n - 1, stdout);
    printf("\n----------------\n");
    fflush(stdout);
    free(ids);
    free(row);
}
