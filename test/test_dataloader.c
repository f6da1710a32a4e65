/* test/test_dataloader.c — tests data/dataloader.c and data/tokenizer.c on
 * shard and tokenizer files written into a temp dir: row contents against a
 * hand-indexed reference, epoch wrap-around, the shuffle (a permutation per
 * epoch, reproducible, seed- and epoch-dependent, equal to an independent
 * re-implementation of the documented rule, roughly uniform), independence
 * from how rows are requested, tokenizer decode/print, and every fatal input
 * error (run in a forked child: non-zero exit, one "error:" line naming the file). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/util.h"
#include "../data/dataloader.h"
#include "../data/tokenizer.h"
#include "test.h"

#define T_SEQ 8
#define VOCAB 1000
#define NSHARD 3

static char g_dir[64];

/* ---- file writers ---- */
static void put_le32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Header (magic, version, header token count), then nwrite tokens. */
static void write_shard(const char* path, uint32_t magic, uint32_t version, uint32_t hdr_ntok,
                        const uint16_t* tok, size_t nwrite) {
    unsigned char hdr[1024];
    memset(hdr, 0, sizeof hdr);
    put_le32(hdr, magic);
    put_le32(hdr + 4, version);
    put_le32(hdr + 8, hdr_ntok);
    FILE* f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fwrite(hdr, 1, sizeof hdr, f);
    for (size_t i = 0; i < nwrite; i++) {
        unsigned char b[2] = {(unsigned char)tok[i], (unsigned char)(tok[i] >> 8)};
        fwrite(b, 1, 2, f);
    }
    fclose(f);
}

static void write_bytes(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fwrite(p, 1, n, f);
    fclose(f);
}

/* Tokenizer vocab used here: ids 0..255 are the single bytes, then words. */
static const char* k_words[] = {"hello", " world", "\xC3\xA9t\xC3\xA9", " the", "<|endoftext|>"};
#define TOK_NWORDS 5
#define TOK_VOCAB (256 + TOK_NWORDS)

/* Build a tokenizer file in memory; returns its length. */
static size_t build_tokenizer(unsigned char* buf, uint32_t magic, uint32_t version, uint32_t vocab,
                              uint32_t eot_field) {
    memset(buf, 0, 1024);
    put_le32(buf, magic);
    put_le32(buf + 4, version);
    put_le32(buf + 8, vocab);
    put_le32(buf + 12, eot_field);
    size_t off = 1024;
    for (uint32_t i = 0; i < vocab; i++) {
        if (i < 256) {
            buf[off++] = 1;
            buf[off++] = (unsigned char)i;
        } else {
            const char* w = k_words[i - 256];
            size_t l = strlen(w);
            buf[off++] = (unsigned char)l;
            memcpy(buf + off, w, l);
            off += l;
        }
    }
    return off;
}

/* ---- fatal-case harness ---- */
typedef void (*fatal_fn)(const void* ctx);

/* Run fn(ctx) in a child with stderr sent to a file; the child must exit
 * non-zero with exactly one line "error: ..." containing need1 and need2. */
static void expect_fatal(const char* what, fatal_fn fn, const void* ctx, const char* need1, const char* need2) {
    char errpath[128];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", g_dir);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        FILE* e = freopen(errpath, "w", stderr);
        if (!e) _exit(3);
        fn(ctx);
        _exit(0); /* returning means the bad input was accepted */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char msg[2048] = {0};
    FILE* f = fopen(errpath, "r");
    size_t got = f ? fread(msg, 1, sizeof msg - 1, f) : 0;
    if (f) fclose(f);
    msg[got] = '\0';
    char* nl = strchr(msg, '\n');
    int one_line = nl != NULL && nl[1] == '\0';
    printf("  %-34s exit %d: %s", what, code, got ? msg : "(no message)\n");
    CHECK(WIFEXITED(st) && code != 0, "%s: child exit status %d, expected a non-zero exit", what, code);
    CHECK(strncmp(msg, "error:", 6) == 0, "%s: message does not start with 'error:': %s", what, msg);
    CHECK(one_line, "%s: message is not exactly one line: %s", what, msg);
    CHECK(need1 == NULL || strstr(msg, need1) != NULL, "%s: message lacks '%s'", what, need1);
    CHECK(need2 == NULL || strstr(msg, need2) != NULL, "%s: message lacks '%s'", what, need2);
}

typedef struct {
    const char* pattern;
    size_t min_tokens;
    int vocab;
} LoadCase;
static void run_load(const void* ctx) {
    const LoadCase* c = (const LoadCase*)ctx;
    DataLoader dl;
    dataloader_init(&dl, c->pattern, T_SEQ, c->min_tokens, c->vocab, 0, 1);
    dataloader_free(&dl);
}
static void run_tok(const void* ctx) {
    Tokenizer t;
    tokenizer_init(&t, (const char*)ctx);
    tokenizer_free(&t);
}

/* ---- the reference: rows hand-indexed from the token arrays ---- */
static uint16_t* g_tok[NSHARD];
static const size_t k_ntok[NSHARD] = {50, 40, 77}; /* rows: 49/8=6, 39/8=4 (not 40/8=5), 76/8=9 */
static size_t g_ref_nrows;
static const uint16_t* g_ref_row[64]; /* first token of each reference row */

static int row_equals(const int* in, const int* tg, const uint16_t* ref) {
    for (int t = 0; t < T_SEQ; t++)
        if (in[t] != ref[t] || tg[t] != ref[t + 1]) return 0;
    return 1;
}

/* Which reference row is (in, tg)? -1 if none. */
static int ref_index(const int* in, const int* tg) {
    for (size_t r = 0; r < g_ref_nrows; r++)
        if (row_equals(in, tg, g_ref_row[r])) return (int)r;
    return -1;
}

/* Independent re-implementation of the shuffle rule documented in dataloader.c. */
static void ref_perm(uint64_t seed, uint64_t epoch, size_t n, size_t* perm) {
    Rng r;
    rng_seed(&r, (seed * 0x9E3779B97F4A7C15ull) ^ epoch);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n - 1; i >= 1; i--) {
        uint64_t m = (uint64_t)i + 1, x;
        uint64_t reject_below = (UINT64_MAX % m + 1) % m; /* 2^64 mod m */
        do { x = rng_u64(&r); } while (x < reject_below);
        size_t j = (size_t)(x % m);
        size_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}

/* The epoch order seen through the loader, as reference-row indices. */
static void loader_order(DataLoader* dl, uint64_t epoch, int* order) {
    int in[64 * T_SEQ], tg[64 * T_SEQ];
    dataloader_rows(dl, epoch * dl->nrows, (int)dl->nrows, in, tg);
    for (size_t r = 0; r < dl->nrows; r++) order[r] = ref_index(in + r * T_SEQ, tg + r * T_SEQ);
}

static void test_dataloader(void) {
    char pattern[128], path[128];
    Rng rng;
    rng_seed(&rng, 12345);
    /* Written in the order 2, 0, 1 so that a loader relying on directory order would fail. */
    const int write_order[NSHARD] = {2, 0, 1};
    for (int s = 0; s < NSHARD; s++) {
        g_tok[s] = (uint16_t*)malloc(k_ntok[s] * sizeof(uint16_t));
        for (size_t i = 0; i < k_ntok[s]; i++) g_tok[s][i] = (uint16_t)(rng_u64(&rng) % VOCAB);
    }
    g_tok[1][5] = VOCAB - 1; /* the largest legal id */
    for (int k = 0; k < NSHARD; k++) {
        int s = write_order[k];
        snprintf(path, sizeof path, "%s/train_%03d.bin", g_dir, s);
        write_shard(path, 20240520, 1, (uint32_t)k_ntok[s], g_tok[s], k_ntok[s]);
    }
    /* Hand indexing: shard 0 rows 0..5, shard 1 rows 6..9, shard 2 rows 10..18. */
    g_ref_nrows = 0;
    for (int s = 0; s < NSHARD; s++)
        for (size_t i = 0; i < (k_ntok[s] - 1) / T_SEQ; i++) g_ref_row[g_ref_nrows++] = g_tok[s] + i * T_SEQ;
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", g_dir);

    DataLoader dl;
    dataloader_init(&dl, pattern, T_SEQ, 2 * T_SEQ + 1, VOCAB, 0, 7);
    printf("sequential: %d shards, %zu rows (expected 3, 19)\n", dl.nshards, dl.nrows);
    CHECK(dl.nshards == NSHARD, "nshards %d", dl.nshards);
    CHECK(dl.nrows == 19 && g_ref_nrows == 19, "nrows %zu, reference %zu", dl.nrows, g_ref_nrows);
    for (int s = 0; s < dl.nshards && s < NSHARD; s++) {
        snprintf(path, sizeof path, "%s/train_%03d.bin", g_dir, s);
        CHECK(strcmp(dl.paths[s], path) == 0, "shard %d is %s, expected %s (sorted order)", s, dl.paths[s],
              path);
        CHECK(dl.ntok[s] == k_ntok[s], "shard %d ntok %zu", s, dl.ntok[s]);
    }

    int in[64 * T_SEQ], tg[64 * T_SEQ];
    /* All rows of one epoch in one call. */
    dataloader_rows(&dl, 0, 19, in, tg);
    int bad = 0;
    for (int r = 0; r < 19; r++) bad += !row_equals(in + r * T_SEQ, tg + r * T_SEQ, g_ref_row[r]);
    CHECK(bad == 0, "%d of 19 sequential rows differ from the reference", bad);
    /* Spot values by hand: row 6 is shard 1 tokens 0..8; row 18 is shard 2 tokens 64..72. */
    CHECK(in[6 * T_SEQ + 0] == g_tok[1][0] && tg[6 * T_SEQ + 7] == g_tok[1][8], "row 6 not shard 1 start");
    CHECK(in[18 * T_SEQ + 0] == g_tok[2][64] && tg[18 * T_SEQ + 7] == g_tok[2][72], "row 18 not shard 2 row 8");
    CHECK(in[5 * T_SEQ + 7] == g_tok[0][47] && tg[5 * T_SEQ + 7] == g_tok[0][48], "row 5 last token");
    CHECK(in[6 * T_SEQ + 5] == VOCAB - 1, "largest id not read back: %d", in[6 * T_SEQ + 5]);
    /* Across a shard boundary, starting mid-epoch. */
    dataloader_rows(&dl, 4, 4, in, tg);
    bad = 0;
    for (int r = 0; r < 4; r++) bad += !row_equals(in + r * T_SEQ, tg + r * T_SEQ, g_ref_row[4 + r]);
    CHECK(bad == 0, "rows 4..7 across the shard 0/1 boundary: %d differ", bad);
    /* Wrap-around: rows 17..22 are 17, 18, 0, 1, 2, 3; row 19*1000+11 is row 11. */
    dataloader_rows(&dl, 17, 6, in, tg);
    const int wrap_ref[6] = {17, 18, 0, 1, 2, 3};
    bad = 0;
    for (int r = 0; r < 6; r++) bad += !row_equals(in + r * T_SEQ, tg + r * T_SEQ, g_ref_row[wrap_ref[r]]);
    CHECK(bad == 0, "wrap-around at the epoch end: %d of 6 rows differ", bad);
    dataloader_rows(&dl, 19ull * 1000000007ull + 11, 1, in, tg);
    CHECK(row_equals(in, tg, g_ref_row[11]), "row 19*1000000007+11 is not row 11");
    dataloader_free(&dl);
    CHECK(dl.tokens == NULL && dl.perm == NULL && dl.nshards == 0, "dataloader_free left state behind");

    /* ---- shuffle ---- */
    DataLoader a, a2, b;
    dataloader_init(&a, pattern, T_SEQ, 2 * T_SEQ + 1, VOCAB, 1, 42);
    dataloader_init(&a2, pattern, T_SEQ, 2 * T_SEQ + 1, VOCAB, 1, 42);
    dataloader_init(&b, pattern, T_SEQ, 2 * T_SEQ + 1, VOCAB, 1, 43);
    int ord[4][19], ord2[4][19], ordb[19];
    size_t rp[19];
    int perm_ok = 1, rule_ok = 1;
    for (int e = 0; e < 4; e++) {
        loader_order(&a, (uint64_t)e, ord[e]);
        int seen[19] = {0};
        for (int r = 0; r < 19; r++) {
            if (ord[e][r] < 0) perm_ok = 0;
            else seen[ord[e][r]]++;
        }
        for (int r = 0; r < 19; r++) perm_ok &= seen[r] == 1;
        ref_perm(42, (uint64_t)e, 19, rp);
        for (int r = 0; r < 19; r++) rule_ok &= ord[e][r] == (int)rp[r];
    }
    printf("shuffle seed 42 epoch 0:");
    for (int r = 0; r < 19; r++) printf(" %d", ord[0][r]);
    printf("\nshuffle seed 42 epoch 1:");
    for (int r = 0; r < 19; r++) printf(" %d", ord[1][r]);
    printf("\n");
    CHECK(perm_ok, "a shuffled epoch is not a permutation of the rows");
    CHECK(rule_ok, "shuffled order differs from the documented rule (Fisher-Yates, seed*0x9E37..^epoch)");
    /* Same seed: same order, even when epochs are visited in another order (cache rebuilt). */
    int same = 1;
    for (int e = 3; e >= 0; e--) {
        loader_order(&a2, (uint64_t)e, ord2[e]);
        same &= memcmp(ord2[e], ord[e], sizeof ord[e]) == 0;
    }
    CHECK(same, "same seed gave a different order");
    loader_order(&b, 0, ordb);
    CHECK(memcmp(ordb, ord[0], sizeof ordb) != 0, "seed 43 gave the same order as seed 42");
    int epochs_differ = 1;
    for (int e = 1; e < 4; e++) epochs_differ &= memcmp(ord[e], ord[0], sizeof ord[0]) != 0;
    CHECK(epochs_differ, "different epochs gave the same order");
    int fixed0 = 0;
    for (int r = 0; r < 19; r++) fixed0 += ord[0][r] == r;
    CHECK(fixed0 < 19, "shuffle left every row in place");

    /* Independence from how rows are requested: rows 0..56 (3 epochs) in one
     * call, one at a time, and in chunks of 3 as two "ranks" with B=3 would
     * take them (rank r of N=2 reads rows (2*step + r)*3 .. +2). */
    enum { K = 57 };
    int in1[K * T_SEQ], tg1[K * T_SEQ], in2[K * T_SEQ], tg2[K * T_SEQ], in3[K * T_SEQ], tg3[K * T_SEQ];
    dataloader_rows(&a, 0, K, in1, tg1);
    for (int g = K - 1; g >= 0; g--) dataloader_rows(&a2, (uint64_t)g, 1, in2 + g * T_SEQ, tg2 + g * T_SEQ);
    for (int step = 0; step * 6 < K; step++)
        for (int rank = 1; rank >= 0; rank--) {
            int first = (2 * step + rank) * 3;
            int n = first + 3 <= K ? 3 : K - first;
            if (n > 0) dataloader_rows(&b, (uint64_t)first, n, in3 + first * T_SEQ, tg3 + first * T_SEQ);
        }
    CHECK(memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0,
          "rows 0..56 in one call differ from one row at a time (backwards)");
    /* b has another seed: compare it against a one-call read of b's own order. */
    DataLoader b2;
    dataloader_init(&b2, pattern, T_SEQ, 2 * T_SEQ + 1, VOCAB, 1, 43);
    dataloader_rows(&b2, 0, K, in2, tg2);
    CHECK(memcmp(in3, in2, sizeof in3) == 0 && memcmp(tg3, tg2, sizeof tg3) == 0,
          "rows read in per-rank chunks of 3 differ from one call");
    /* Spread: over 3000 epochs the row at position 0 should be near uniform. */
    int hist[19] = {0};
    for (int e = 0; e < 3000; e++) {
        dataloader_rows(&b2, (uint64_t)e * 19, 1, in, tg);
        int r = ref_index(in, tg);
        if (r >= 0) hist[r]++;
    }
    double chi2 = 0, expct = 3000.0 / 19;
    for (int r = 0; r < 19; r++) chi2 += (hist[r] - expct) * (hist[r] - expct) / expct;
    printf("position-0 row over 3000 epochs: chi2 = %.1f (18 dof; 42.3 is p=0.001)\n", chi2);
    CHECK(chi2 < 42.3, "shuffle looks biased: chi2 %.1f", chi2);
    dataloader_free(&a);
    dataloader_free(&a2);
    dataloader_free(&b);
    dataloader_free(&b2);

    /* Single plain path (no wildcard) works too. */
    snprintf(path, sizeof path, "%s/train_001.bin", g_dir);
    dataloader_init(&dl, path, T_SEQ, 0, VOCAB, 0, 0);
    CHECK(dl.nshards == 1 && dl.nrows == 4, "plain path: %d shards %zu rows", dl.nshards, dl.nrows);
    dataloader_rows(&dl, 5, 1, in, tg);
    CHECK(row_equals(in, tg, g_ref_row[6 + 1]), "plain path: row 5 is not shard 1 row 1");
    dataloader_free(&dl);
}

static void test_dataloader_errors(void) {
    char p[16][160];
    uint16_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = (uint16_t)(i * 7 % VOCAB);
    printf("data loader fatal cases:\n");
    LoadCase c;

    snprintf(p[0], sizeof p[0], "%s/missing.bin", g_dir);
    c = (LoadCase){p[0], 17, VOCAB};
    expect_fatal("missing file", run_load, &c, p[0], NULL);

    snprintf(p[1], sizeof p[1], "%s/nothing_*.bin", g_dir);
    c = (LoadCase){p[1], 17, VOCAB};
    expect_fatal("no glob match", run_load, &c, p[1], "no file matches");

    snprintf(p[2], sizeof p[2], "%s/bad_magic.bin", g_dir);
    write_shard(p[2], 20240326, 1, 100, tok, 100);
    c = (LoadCase){p[2], 17, VOCAB};
    expect_fatal("wrong magic", run_load, &c, p[2], "magic");

    snprintf(p[3], sizeof p[3], "%s/bad_version.bin", g_dir);
    write_shard(p[3], 20240520, 2, 100, tok, 100);
    c = (LoadCase){p[3], 17, VOCAB};
    expect_fatal("wrong version", run_load, &c, p[3], "version");

    snprintf(p[4], sizeof p[4], "%s/truncated.bin", g_dir);
    write_shard(p[4], 20240520, 1, 100, tok, 60);
    c = (LoadCase){p[4], 17, VOCAB};
    expect_fatal("truncated shard", run_load, &c, p[4], "truncated");

    snprintf(p[5], sizeof p[5], "%s/short.bin", g_dir);
    write_shard(p[5], 20240520, 1, 30, tok, 30);
    c = (LoadCase){p[5], 41, VOCAB};
    expect_fatal("fewer than min_tokens", run_load, &c, p[5], "30 tokens, fewer than B*T+1 = 41");

    snprintf(p[6], sizeof p[6], "%s/bad_token.bin", g_dir);
    tok[17] = VOCAB;
    write_shard(p[6], 20240520, 1, 100, tok, 100);
    tok[17] = 1;
    c = (LoadCase){p[6], 17, VOCAB};
    expect_fatal("token id >= vocab", run_load, &c, p[6], "position 17");

    snprintf(p[7], sizeof p[7], "%s/tiny_header.bin", g_dir);
    write_bytes(p[7], "\x38\x2a\x35\x01\x01\x00", 6);
    c = (LoadCase){p[7], 17, VOCAB};
    expect_fatal("incomplete header", run_load, &c, p[7], "header");

    snprintf(p[8], sizeof p[8], "%s/extra.bin", g_dir);
    write_shard(p[8], 20240520, 1, 50, tok, 80);
    c = (LoadCase){p[8], 17, VOCAB};
    expect_fatal("more tokens than the header says", run_load, &c, p[8], NULL);

    /* One bad file among good ones: the message names the bad one. */
    snprintf(p[9], sizeof p[9], "%s/mix_a.bin", g_dir);
    write_shard(p[9], 20240520, 1, 100, tok, 100);
    snprintf(p[10], sizeof p[10], "%s/mix_b.bin", g_dir);
    write_shard(p[10], 20240520, 1, 100, tok, 99);
    snprintf(p[11], sizeof p[11], "%s/mix_*.bin", g_dir);
    c = (LoadCase){p[11], 17, VOCAB};
    expect_fatal("second of two shards truncated", run_load, &c, p[10], "truncated");
}

static void test_tokenizer(void) {
    static unsigned char buf[1024 + 2 * 256 + 64];
    char path[160];
    size_t n = build_tokenizer(buf, 20240328, 2, TOK_VOCAB, TOK_VOCAB - 1);
    snprintf(path, sizeof path, "%s/tok_v2.bin", g_dir);
    write_bytes(path, buf, n);
    Tokenizer t;
    tokenizer_init(&t, path);
    printf("tokenizer v2: vocab %u eot %u (expected %d, %d)\n", t.vocab_size, t.eot, TOK_VOCAB, TOK_VOCAB - 1);
    CHECK(t.vocab_size == TOK_VOCAB, "vocab %u", t.vocab_size);
    CHECK(t.eot == TOK_VOCAB - 1, "v2 eot %u", t.eot);
    const char* s = tokenizer_decode(&t, 256);
    CHECK(s && strcmp(s, "hello") == 0 && t.lens[256] == 5, "decode 256 = '%s'", s ? s : "(null)");
    s = tokenizer_decode(&t, 257);
    CHECK(s && strcmp(s, " world") == 0, "decode 257 = '%s'", s ? s : "(null)");
    s = tokenizer_decode(&t, t.eot);
    CHECK(s && strcmp(s, "<|endoftext|>") == 0, "decode eot = '%s'", s ? s : "(null)");
    s = tokenizer_decode(&t, 'A');
    CHECK(s && s[0] == 'A' && s[1] == '\0' && t.lens['A'] == 1, "decode 65");
    s = tokenizer_decode(&t, 0);
    CHECK(s && t.lens[0] == 1 && s[0] == '\0', "decode 0 is the zero byte, length 1");
    CHECK(tokenizer_decode(&t, TOK_VOCAB) == NULL, "decode(vocab) is not NULL");
    CHECK(tokenizer_decode(&t, UINT32_MAX) == NULL, "decode(UINT32_MAX) is not NULL");

    /* print: "hello world" + é split over two byte-tokens + "été" + controls + junk. */
    const int ids[] = {256,  257,  ' ',  0xC3, 0xA9, 258,  '\n', 0x01, '\t', 0xFF, '\r', 0xC3,
                       'A',  0xE2, 0x82, 0xAC, 0xED, 0xA0, 0x80, 0xE0, 0x80, 0xAF, 0xC0, 0xAF,
                       0xF0, 0x9F, 0x98, 0x80, 0xF4, 0x90, 0x80, 0x80, 0x7F, 9999, 260,  0xC3};
    const char* want = "hello world \xC3\xA9\xC3\xA9t\xC3\xA9\n\\x01\t\\xff\\x0d\\xc3A\xE2\x82\xAC"
                       "\\xed\\xa0\\x80\\xe0\\x80\\xaf\\xc0\\xaf"
                       "\xF0\x9F\x98\x80\\xf4\\x90\\x80\\x80\\x7f<|bad id 9999|><|endoftext|>\\xc3";
    FILE* f = tmpfile();
    tokenizer_print(&t, ids, (int)(sizeof ids / sizeof ids[0]), f);
    char out[512] = {0};
    rewind(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    fclose(f);
    out[got] = '\0';
    printf("tokenizer_print: ");
    fwrite(out, 1, got, stdout);
    printf("\n");
    CHECK(strcmp(out, want) == 0, "tokenizer_print wrote '%s', expected '%s'", out, want);
    tokenizer_free(&t);
    CHECK(t.tokens == NULL && t.vocab_size == 0, "tokenizer_free left state behind");

    /* Version 1: no EOT field (the header's [3] is ignored), EOT is 50256. */
    n = build_tokenizer(buf, 20240328, 1, TOK_VOCAB, 77);
    snprintf(path, sizeof path, "%s/tok_v1.bin", g_dir);
    write_bytes(path, buf, n);
    tokenizer_init(&t, path);
    printf("tokenizer v1: vocab %u eot %u (expected %d, 50256)\n", t.vocab_size, t.eot, TOK_VOCAB);
    CHECK(t.eot == 50256, "v1 eot %u", t.eot);
    s = tokenizer_decode(&t, 258);
    CHECK(s && strcmp(s, "\xC3\xA9t\xC3\xA9") == 0 && t.lens[258] == 5, "v1 decode 258");
    tokenizer_free(&t);

    printf("tokenizer fatal cases:\n");
    static char p[8][160];
    snprintf(p[0], sizeof p[0], "%s/tok_missing.bin", g_dir);
    expect_fatal("tokenizer missing", run_tok, p[0], p[0], NULL);

    n = build_tokenizer(buf, 20240520, 2, TOK_VOCAB, 0);
    snprintf(p[1], sizeof p[1], "%s/tok_magic.bin", g_dir);
    write_bytes(p[1], buf, n);
    expect_fatal("tokenizer wrong magic", run_tok, p[1], p[1], "magic");

    n = build_tokenizer(buf, 20240328, 3, TOK_VOCAB, 0);
    snprintf(p[2], sizeof p[2], "%s/tok_version.bin", g_dir);
    write_bytes(p[2], buf, n);
    expect_fatal("tokenizer bad version", run_tok, p[2], p[2], "version");

    n = build_tokenizer(buf, 20240328, 2, TOK_VOCAB, TOK_VOCAB - 1);
    snprintf(p[3], sizeof p[3], "%s/tok_trunc.bin", g_dir);
    write_bytes(p[3], buf, n - 4); /* cut inside the last token */
    expect_fatal("tokenizer truncated (mid token)", run_tok, p[3], p[3], "truncated");

    snprintf(p[4], sizeof p[4], "%s/tok_trunc2.bin", g_dir);
    write_bytes(p[4], buf, 1024 + 2 * 100); /* ends after 100 of 261 tokens */
    expect_fatal("tokenizer truncated (token count)", run_tok, p[4], p[4], "truncated");

    snprintf(p[5], sizeof p[5], "%s/tok_header.bin", g_dir);
    write_bytes(p[5], buf, 500);
    expect_fatal("tokenizer truncated (header)", run_tok, p[5], p[5], "truncated");

    n = build_tokenizer(buf, 20240328, 2, TOK_VOCAB, TOK_VOCAB - 1);
    buf[1024 + 2 * 42] = 0; /* token 42 gets length 0 */
    snprintf(p[6], sizeof p[6], "%s/tok_zero.bin", g_dir);
    write_bytes(p[6], buf, n);
    expect_fatal("tokenizer zero-length token", run_tok, p[6], p[6], "token 42");

    n = build_tokenizer(buf, 20240328, 2, TOK_VOCAB, TOK_VOCAB);
    snprintf(p[7], sizeof p[7], "%s/tok_eot.bin", g_dir);
    write_bytes(p[7], buf, n);
    expect_fatal("tokenizer v2 EOT out of range", run_tok, p[7], p[7], "end-of-text");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_dataloader_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_dataloader();
    test_dataloader_errors();
    test_tokenizer();
    for (int s = 0; s < NSHARD; s++) free(g_tok[s]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    return test_done("test_dataloader");
}
