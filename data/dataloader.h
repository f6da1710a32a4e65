/* data/dataloader.h — llm.c token shards, read as rows of T+1 tokens.
 *
 * A shard: header of 256 little-endian int32 ([0]=20240520, [1]=1,
 * [2]=number of tokens), then that many uint16 tokens. The loader takes a
 * glob pattern (one or several files, matched in sorted order).
 *
 * The data order is defined by the GLOBAL ROW index, independent of the
 * number of ranks and of the micro-batch size: shard s holds
 * (ntok_s - 1) / T rows; row i of a shard is tokens [i*T, i*T + T] (T+1
 * tokens: inputs are the first T, targets the last T). Rows of all shards
 * are numbered in shard order. Row index g of the run maps to epoch
 * g / nrows and position g % nrows within the epoch; with shuffling on,
 * the position goes through a permutation of all rows seeded by
 * (seed, epoch) (Fisher-Yates on the util.h Rng), otherwise it is used as is.
 * So a run that resumes at any number of ranks sees the same rows.
 *
 * Errors are fatal() with one line naming the file: no file matches, cannot
 * open, wrong magic or version, truncated (fewer tokens than the header
 * says), a shard with fewer than min_tokens tokens, a token id >= vocab_size.
 * Tokens are validated while loading. */
#ifndef DATA_DATALOADER_H
#define DATA_DATALOADER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int T;
    int nshards;
    char** paths;
    uint16_t** tokens; /* whole shards in memory (the data sets are small); tokens[s][0..ntok[s]) */
    size_t* ntok;
    size_t* shard_first_row; /* [nshards + 1], cumulative row counts */
    size_t nrows;            /* rows in one epoch */
    int shuffle;
    uint64_t seed;
    uint64_t perm_epoch; /* epoch the cached permutation is for */
    size_t* perm;        /* [nrows] when shuffle, else NULL */
} DataLoader;

/* min_tokens: each shard must hold at least this many tokens (B*T+1). */
void dataloader_init(DataLoader* dl, const char* glob_pattern, int T, size_t min_tokens, int vocab_size,
                     int shuffle, uint64_t seed);
/* Fill inputs[n*T] and targets[n*T] with global rows first_row .. first_row+n-1. */
void dataloader_rows(DataLoader* dl, uint64_t first_row, int n, int* inputs, int* targets);
void dataloader_free(DataLoader* dl);

#endif
