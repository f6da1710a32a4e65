/* tools/make_shard.c — writes a synthetic llm.c token shard for tests:
 *   build/make_shard OUT.bin NTOKENS [SEED] [VOCAB_USED]
 * Tokens follow a random first-order Markov chain over VOCAB_USED ids
 * (default 512) spread over GPT-2's vocabulary, so a model can learn them and
 * the loss falls; an EOT (50256) starts every 97-token "document". */
#include <stdlib.h>
#include <string.h>
#include "../common/util.h"

int main(int argc, char** argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s OUT.bin NTOKENS [SEED] [VOCAB_USED]\n", argv[0]);
        return 2;
    }
    long long n = parse_int_flag("NTOKENS", argv[2]);
    long long seed = argc > 3 ? parse_int_flag("SEED", argv[3]) : 1;
    long long used = argc > 4 ? parse_int_flag("VOCAB_USED", argv[4]) : 512;
    if (n < 1 || n > 2000000000LL) fatal("NTOKENS must be in [1, 2e9] (got %lld)", n);
    if (used < 2 || used > 50000) fatal("VOCAB_USED must be in [2, 50000] (got %lld)", used);
    Rng r;
    rng_seed(&r, (uint64_t)seed);
    /* each state has 4 likely successors */
    int* succ = xmalloc(sizeof(int) * (size_t)used * 4);
    for (long long i = 0; i < used * 4; i++) succ[i] = (int)(rng_u64(&r) % (uint64_t)used);
    uint16_t* tok = xmalloc(sizeof(uint16_t) * (size_t)n);
    int state = 0;
    for (long long i = 0; i < n; i++) {
        if (i % 97 == 0) {
            tok[i] = 50256;
            continue;
        }
        uint64_t u = rng_u64(&r) % 16;
        state = u < 12 ? succ[state * 4 + (int)(u % 4)] : (int)(rng_u64(&r) % (uint64_t)used);
        tok[i] = (uint16_t)((state * 97) % 50000);
    }
    int32_t h[256];
    memset(h, 0, sizeof h);
    h[0] = 20240520;
    h[1] = 1;
    h[2] = (int32_t)n;
    FILE* f = xfopen(argv[1], "wb");
    xfwrite(h, sizeof(int32_t), 256, f, argv[1]);
    xfwrite(tok, sizeof(uint16_t), (size_t)n, f, argv[1]);
    if (fclose(f) != 0) fatal("%s: write failed", argv[1]);
    free(tok);
    free(succ);
    return 0;
}
