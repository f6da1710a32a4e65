/* data/dataloader.c — owns the token-shard loader declared in dataloader.h:
 * globbing the shard files, reading and validating them whole into memory,
 * the global-row numbering, and the per-epoch shuffle permutation.
 *
 * Shuffle rule (part of the data order that a resumed run must reproduce):
 * the permutation of epoch e is a Fisher-Yates shuffle of [0, nrows) driven
 * by the util.h Rng seeded with rng_seed(seed * 0x9E3779B97F4A7C15 ^ e);
 * for i = nrows-1 down to 1, j = rng_below(i+1) (an unbiased draw by
 * rejection, see dataloader_rng_below) and perm[i] <-> perm[j]. Row g of the
 * run is then row perm[g % nrows] of the concatenated shards, for epoch
 * e = g / nrows. Only the permutation of one epoch is cached at a time. */
#define _GNU_SOURCE
#include "dataloader.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#define DATALOADER_MAGIC 20240520
#define DATALOADER_VERSION 1
#define DATALOADER_HEADER_INTS 256
#define DATALOADER_HEADER_BYTES (DATALOADER_HEADER_INTS * 4)

static int32_t dataloader_le32(const unsigned char* p) {
    uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    return (int32_t)u;
}

static int dataloader_has_wildcard(const char* s) { return strpbrk(s, "*?[") != NULL; }

/* Read and validate one shard; fills *tokens_out (xmalloc'ed) and *ntok_out. */
static void dataloader_load_shard(const char* path, size_t min_tokens, int vocab_size, uint16_t** tokens_out,
                                  size_t* ntok_out) {
    FILE* f = xfopen(path, "rb");
    long long size = file_size(f);
    if (size < 0) fatal("%s: cannot determine the file size", path);
    if (size < DATALOADER_HEADER_BYTES)
        fatal("%s: file is %lld bytes, shorter than the %d-byte header: not an llm.c token shard", path, size,
              DATALOADER_HEADER_BYTES);
    unsigned char hdr[DATALOADER_HEADER_BYTES];
    xfread(hdr, 1, sizeof hdr, f, path);
    int32_t magic = dataloader_le32(hdr + 0);
    int32_t version = dataloader_le32(hdr + 4);
    int32_t hdr_ntok = dataloader_le32(hdr + 8);
    if (magic != DATALOADER_MAGIC)
        fatal("%s: wrong magic number %d (expected %d): not an llm.c token shard", path, (int)magic,
              DATALOADER_MAGIC);
    if (version != DATALOADER_VERSION)
        fatal("%s: unsupported token shard version %d (expected %d)", path, (int)version, DATALOADER_VERSION);
    if (hdr_ntok < 0) fatal("%s: header says %d tokens (negative): corrupt token shard", path, (int)hdr_ntok);
    long long payload = size - DATALOADER_HEADER_BYTES;
    long long want = 2LL * (long long)hdr_ntok;
    if (payload < want)
        fatal("%s: truncated: header says %d tokens but the file holds only %lld", path, (int)hdr_ntok,
              payload / 2);
    if (payload > want)
        fatal("%s: header says %d tokens (%lld bytes) but %lld bytes follow the header: corrupt token shard",
              path, (int)hdr_ntok, want, payload);
    size_t ntok = (size_t)hdr_ntok;
    if (ntok < min_tokens) fatal("%s holds %zu tokens, fewer than B*T+1 = %zu needed", path, ntok, min_tokens);

    uint16_t* tok = (uint16_t*)xmalloc(ntok * sizeof(uint16_t));
    xfread(tok, sizeof(uint16_t), ntok, f, path);
    fclose(f);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t i = 0; i < ntok; i++) tok[i] = (uint16_t)((tok[i] >> 8) | (tok[i] << 8));
#endif
    for (size_t i = 0; i < ntok; i++) {
        if ((int)tok[i] >= vocab_size)
            fatal("%s: token id %d at position %zu is out of range (vocab size %d)", path, (int)tok[i], i,
                  vocab_size);
    }
    *tokens_out = tok;
    *ntok_out = ntok;
}

/* Uniform integer in [0, n), n >= 1, without modulo bias: draws below
 * 2^64 mod n are rejected so the accepted range is a multiple of n. */
static uint64_t dataloader_rng_below(Rng* r, uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = rng_u64(r);
        if (x >= threshold) return x % n;
    }
}

static void dataloader_make_perm(DataLoader* dl, uint64_t epoch) {
    Rng r;
    rng_seed(&r, (dl->seed * 0x9E3779B97F4A7C15ull) ^ epoch);
    for (size_t i = 0; i < dl->nrows; i++) dl->perm[i] = i;
    for (size_t i = dl->nrows; i-- > 1;) {
        size_t j = (size_t)dataloader_rng_below(&r, (uint64_t)i + 1);
        size_t tmp = dl->perm[i];
        dl->perm[i] = dl->perm[j];
        dl->perm[j] = tmp;
    }
    dl->perm_epoch = epoch;
}

void dataloader_init(DataLoader* dl, const char* glob_pattern, int T, size_t min_tokens, int vocab_size,
                     int shuffle, uint64_t seed) {
    memset(dl, 0, sizeof *dl);
    if (!glob_pattern || !*glob_pattern) fatal("data loader: empty input file pattern");
    if (T <= 0) fatal("data loader: sequence length T = %d must be positive", T);
    if (vocab_size <= 0) fatal("data loader: vocab size %d must be positive", vocab_size);

    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(glob_pattern, 0, NULL, &g); /* sorted order (no GLOB_NOSORT) */
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        /* A plain path that is missing: let fopen's reason (ENOENT, EACCES...) name it. */
        if (!dataloader_has_wildcard(glob_pattern)) fclose(xfopen(glob_pattern, "rb"));
        fatal("no file matches '%s' (check --input_bin / --input_val_bin)", glob_pattern);
    }
    if (rc != 0) {
        globfree(&g);
        fatal("'%s': glob failed (%s)", glob_pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }

    dl->T = T;
    dl->nshards = (int)g.gl_pathc;
    dl->paths = (char**)xcalloc((size_t)dl->nshards, sizeof(char*));
    dl->tokens = (uint16_t**)xcalloc((size_t)dl->nshards, sizeof(uint16_t*));
    dl->ntok = (size_t*)xcalloc((size_t)dl->nshards, sizeof(size_t));
    dl->shard_first_row = (size_t*)xcalloc((size_t)dl->nshards + 1, sizeof(size_t));
    for (int s = 0; s < dl->nshards; s++) {
        size_t len = strlen(g.gl_pathv[s]);
        dl->paths[s] = (char*)xmalloc(len + 1);
        memcpy(dl->paths[s], g.gl_pathv[s], len + 1);
    }
    globfree(&g);

    for (int s = 0; s < dl->nshards; s++) {
        dataloader_load_shard(dl->paths[s], min_tokens, vocab_size, &dl->tokens[s], &dl->ntok[s]);
        size_t rows = dl->ntok[s] > 0 ? (dl->ntok[s] - 1) / (size_t)T : 0;
        dl->shard_first_row[s + 1] = dl->shard_first_row[s] + rows;
    }
    dl->nrows = dl->shard_first_row[dl->nshards];
    if (dl->nrows == 0) fatal("'%s': the shards hold no complete row of T+1 = %d tokens", glob_pattern, T + 1);

    dl->shuffle = shuffle ? 1 : 0;
    dl->seed = seed;
    dl->perm = NULL;
    dl->perm_epoch = 0;
    if (dl->shuffle) {
        dl->perm = (size_t*)xmalloc(dl->nrows * sizeof(size_t));
        dataloader_make_perm(dl, 0);
    }
}

/* Shard holding epoch-relative row pos: the s with first_row[s] <= pos < first_row[s+1]. */
static int dataloader_shard_of(const DataLoader* dl, size_t pos) {
    int lo = 0, hi = dl->nshards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (dl->shard_first_row[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    /* Shards with zero rows share their first_row with the next: step past them. */
    while (dl->shard_first_row[lo + 1] <= pos) lo++;
    return lo;
}

void dataloader_rows(DataLoader* dl, uint64_t first_row, int n, int* inputs, int* targets) {
    const int T = dl->T;
    for (int k = 0; k < n; k++) {
        uint64_t g = first_row + (uint64_t)k;
        uint64_t epoch = g / dl->nrows;
        size_t pos = (size_t)(g % dl->nrows);
        if (dl->shuffle) {
            if (dl->perm_epoch != epoch) dataloader_make_perm(dl, epoch);
            pos = dl->perm[pos];
        }
        int s = dataloader_shard_of(dl, pos);
        const uint16_t* src = dl->tokens[s] + (pos - dl->shard_first_row[s]) * (size_t)T;
        int* in = inputs + (size_t)k * T;
        int* tg = targets + (size_t)k * T;
        for (int t = 0; t < T; t++) {
            in[t] = src[t];
            tg[t] = src[t + 1];
        }
    }
}

void dataloader_free(DataLoader* dl) {
    for (int s = 0; s < dl->nshards; s++) {
        free(dl->paths[s]);
        free(dl->tokens[s]);
    }
    free(dl->paths);
    free(dl->tokens);
    free(dl->ntok);
    free(dl->shard_first_row);
    free(dl->perm);
    memset(dl, 0, sizeof *dl);
}
