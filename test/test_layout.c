/* test/test_layout.c — tests ddp/layout.c: hand-computed layouts compared
 * field by field, then the layout invariants checked against independent
 * recomputation for many random parameter lists (some of them matrices the
 * layout may cut into row chunks, some starting a new bucket), bucket sizes,
 * aligns and every world size from 1 to 64, then argument rejection. Row
 * chunks (ZeRO-2's embedding): a hand-computed layout, and GPT-2's
 * shapes (wpe then wte of 50304 rows, C = 32 and 768, world 1..8, five bucket
 * sizes): the chunk row count against a brute-force search for the smallest
 * row unit, every chunk but the last a whole unpadded bucket divisible by
 * lcm(world, 128) and 64, and no gap: chunk k at wte's offset + k * rows * C. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/util.h"
#include "../ddp/layout.h"
#include "test.h"

typedef struct {
    int param;
    size_t param_off, buf_off, len, state_off;
    int owner;
} ExpPiece;

static size_t ref_gcd(size_t a, size_t b) { return b ? ref_gcd(b, a % b) : a; }
static size_t ref_lcm(size_t a, size_t b) { return a / ref_gcd(a, b) * b; }

static void check_pieces(const Layout* L, const ExpPiece* e, int ne, const char* tag) {
    CHECK(L->npieces == ne, "%s: npieces %d, expected %d", tag, L->npieces, ne);
    for (int k = 0; k < ne && k < L->npieces; k++) {
        const LayoutPiece* P = &L->pieces[k];
        CHECK(P->param == e[k].param && P->param_off == e[k].param_off && P->buf_off == e[k].buf_off &&
                  P->len == e[k].len && P->state_off == e[k].state_off && P->owner == e[k].owner,
              "%s: piece %d = (p%d po%zu b%zu l%zu s%zu r%d), expected (p%d po%zu b%zu l%zu s%zu r%d)", tag, k,
              P->param, P->param_off, P->buf_off, P->len, P->state_off, P->owner, e[k].param, e[k].param_off,
              e[k].buf_off, e[k].len, e[k].state_off, e[k].owner);
    }
}

/* ---- hand-computed layouts ---- */
static void test_hand(void) {
    char err[256];
    Layout L;

    /* A: numel {100, 300, 5}, align 64, bucket_size 200, world 3.
     * m = lcm(3, 128, 64) = 384.
     * bucket 0 at 0: p0 [0,100) (fill 100 < 200), p1 at roundup(100,64)=128 -> [128,428),
     *   fill 428 >= 200: closes; len = roundup(428, 384) = 768, slice 256.
     * bucket 1 at 768: p2 [768,773), last; len 384, slice 128. total 1152.
     * slices b0: r0 [0,256) r1 [256,512) r2 [512,768); b1: r0 [768,896) ...
     * pieces: r0: p0 [0,100) s0; p1 [128,256) po0 s100; p2 [768,773) s228.
     *         r1: p1 [256,428) po128 s0.  r2: none. */
    LayoutParamSpec a[3] = {{.name = "a0", .numel = 100, .decay = 1},
                            {.name = "a1", .numel = 300, .decay = 0},
                            {.name = "a2", .numel = 5, .decay = 1}};
    int rc = layout_build(&L, a, 3, 200, 1, 3, 64, err, sizeof err);
    CHECK(rc == 0, "A: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.total == 1152 && L.total_params == 405, "A: total %zu params %zu", L.total, L.total_params);
        CHECK(L.params[0].offset == 0 && L.params[1].offset == 128 && L.params[2].offset == 768,
              "A: offsets %zu %zu %zu", L.params[0].offset, L.params[1].offset, L.params[2].offset);
        CHECK(L.params[0].bucket == 0 && L.params[1].bucket == 0 && L.params[2].bucket == 1,
              "A: param buckets");
        CHECK(L.nbuckets == 2, "A: nbuckets %d", L.nbuckets);
        if (L.nbuckets == 2) {
            CHECK(L.buckets[0].start == 0 && L.buckets[0].len == 768 && L.buckets[0].slice_len == 256 &&
                      L.buckets[0].first_param == 0 && L.buckets[0].nparams == 2 && L.buckets[0].group == 0,
                  "A: bucket 0 (%zu, %zu, %zu)", L.buckets[0].start, L.buckets[0].len, L.buckets[0].slice_len);
            CHECK(L.buckets[1].start == 768 && L.buckets[1].len == 384 && L.buckets[1].slice_len == 128 &&
                      L.buckets[1].first_param == 2 && L.buckets[1].nparams == 1 && L.buckets[1].group == 1,
                  "A: bucket 1 (%zu, %zu, %zu)", L.buckets[1].start, L.buckets[1].len, L.buckets[1].slice_len);
        }
        CHECK(L.ngroups == 2 && L.group_first_bucket[0] == 0 && L.group_first_bucket[1] == 1 &&
                  L.group_first_bucket[2] == 2,
              "A: groups");
        ExpPiece e[4] = {{0, 0, 0, 100, 0, 0},
                         {1, 0, 128, 128, 100, 0},
                         {2, 0, 768, 5, 228, 0},
                         {1, 128, 256, 172, 0, 1}};
        check_pieces(&L, e, 4, "A");
        CHECK(L.rank_first_piece[0] == 0 && L.rank_first_piece[1] == 3 && L.rank_first_piece[2] == 4 &&
                  L.rank_first_piece[3] == 4,
              "A: rank_first_piece %d %d %d %d", L.rank_first_piece[0], L.rank_first_piece[1],
              L.rank_first_piece[2], L.rank_first_piece[3]);
        CHECK(L.rank_owned[0] == 233 && L.rank_owned[1] == 172 && L.rank_owned[2] == 0,
              "A: rank_owned %zu %zu %zu", L.rank_owned[0], L.rank_owned[1], L.rank_owned[2]);
        CHECK(layout_owned(&L, 0) == 233 && layout_owned(&L, 1) == 172 && layout_owned(&L, 2) == 0,
              "A: layout_owned");
        CHECK(L.pieces[0].decay == 1 && L.pieces[1].decay == 0 && L.pieces[2].decay == 1 &&
                  L.pieces[3].decay == 0,
              "A: piece decay flags");
        int n = -1;
        OptPiece* o = layout_opt_pieces(&L, 0, &n);
        CHECK(n == 3 && o[0].buf_off == 0 && o[0].state_off == 0 && o[0].len == 100 && o[0].decay == 1 &&
                  o[1].buf_off == 128 && o[1].state_off == 100 && o[1].len == 128 && o[1].decay == 0 &&
                  o[2].buf_off == 768 && o[2].state_off == 228 && o[2].len == 5,
              "A: opt pieces rank 0");
        free(o);
        o = layout_opt_pieces(&L, 1, &n);
        CHECK(n == 1 && o[0].buf_off == 256 && o[0].state_off == 0 && o[0].len == 172, "A: opt pieces rank 1");
        free(o);
        o = layout_opt_pieces(&L, 2, &n);
        CHECK(n == 0 && o != NULL, "A: opt pieces rank 2 (empty) n=%d", n);
        free(o);
        o = layout_opt_pieces(&L, -1, &n);
        CHECK(n == 3 && o[0].buf_off == 0 && o[0].state_off == 0 && o[0].len == 100 && o[1].buf_off == 128 &&
                  o[1].state_off == 100 && o[1].len == 300 && o[2].buf_off == 768 && o[2].state_off == 400 &&
                  o[2].len == 5 && o[0].decay == 1 && o[1].decay == 0 && o[2].decay == 1,
              "A: opt pieces rank -1");
        free(o);
        printf("layout A (numel 100,300,5 align 64 bucket 200 world 3):\n");
        layout_print(&L, stdout);
        layout_free(&L);
    }

    /* Same parameters, buckets_per_group 3: one group holding both buckets. */
    rc = layout_build(&L, a, 3, 200, 3, 3, 64, err, sizeof err);
    CHECK(rc == 0 && L.ngroups == 1 && L.group_first_bucket[0] == 0 && L.group_first_bucket[1] == 2 &&
              L.buckets[1].group == 0,
          "A3: groups");
    if (rc == 0) layout_free(&L);

    /* B: numel {1, 130}, align 1, bucket_size 1, world 1: a bucket per param.
     * m = 128. b0 [0,128) p0 at 0; b1 at 128, p1 [128,258), len 256. total 384. */
    LayoutParamSpec b[2] = {{.name = "b0", .numel = 1, .decay = 0}, {.name = "b1", .numel = 130, .decay = 1}};
    rc = layout_build(&L, b, 2, 1, 1, 1, 1, err, sizeof err);
    CHECK(rc == 0, "B: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.nbuckets == 2 && L.total == 384 && L.params[1].offset == 128 && L.buckets[0].len == 128 &&
                  L.buckets[1].start == 128 && L.buckets[1].len == 256 && L.buckets[1].slice_len == 256,
              "B: buckets/offsets");
        ExpPiece e[2] = {{0, 0, 0, 1, 0, 0}, {1, 0, 128, 130, 1, 0}};
        check_pieces(&L, e, 2, "B");
        layout_free(&L);
    }

    /* C: numel {3, 1000}, align 8, bucket_size 10000 (> total), world 5.
     * m = lcm(5, 128, 8) = 640. p0 [0,3), p1 at 8 -> [8,1008); len 1280, slice 256.
     * r0: p0 [0,3) s0, p1 [8,256) po0 s3. r1: p1 [256,512) po248. r2: [512,768) po504.
     * r3: [768,1008) po760 len 240. r4: none. */
    LayoutParamSpec c[2] = {{.name = "c0", .numel = 3, .decay = 0}, {.name = "c1", .numel = 1000, .decay = 1}};
    rc = layout_build(&L, c, 2, 10000, 1, 5, 8, err, sizeof err);
    CHECK(rc == 0, "C: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.nbuckets == 1 && L.total == 1280 && L.params[1].offset == 8 && L.buckets[0].slice_len == 256,
              "C: bucket %zu offset %zu", L.total, L.params[1].offset);
        ExpPiece e[5] = {{0, 0, 0, 3, 0, 0},
                         {1, 0, 8, 248, 3, 0},
                         {1, 248, 256, 256, 0, 1},
                         {1, 504, 512, 256, 0, 2},
                         {1, 760, 768, 240, 0, 3}};
        check_pieces(&L, e, 5, "C");
        CHECK(L.rank_first_piece[4] == 5 && L.rank_first_piece[5] == 5 && L.rank_owned[4] == 0,
              "C: rank 4 owns nothing");
        layout_free(&L);
    }

    /* D: align 3 (does not divide 128), world 2, numel {5, 7, 2}, bucket_size 6.
     * m = lcm(2, 128, 3) = 384. b0 at 0: p0 [0,5) fill 5 < 6; p1 at 6 -> [6,13), closes;
     * len 384. b1 at 384 (multiple of 3): p2 [384,386); len 384. total 768. */
    LayoutParamSpec d[3] = {{.name = "d0", .numel = 5, .decay = 0},
                            {.name = "d1", .numel = 7, .decay = 0},
                            {.name = "d2", .numel = 2, .decay = 0}};
    rc = layout_build(&L, d, 3, 6, 1, 2, 3, err, sizeof err);
    CHECK(rc == 0, "D: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.nbuckets == 2 && L.params[1].offset == 6 && L.params[2].offset == 384 &&
                  L.buckets[1].start == 384 && L.total == 768,
              "D: offsets %zu %zu total %zu", L.params[1].offset, L.params[2].offset, L.total);
        layout_free(&L);
    }
}

/* ---- invariants for random layouts ---- */
typedef struct {
    long layouts, pieces, elements;
    double max_pad_pct;
    long chunked, chunks; /* specs with a row length; layout parameters added by cutting */
} Stats;

/* ---- the expected expansion of specs into layout parameters, recomputed
 * independently (brute force) from the rules in layout.h ---- */
typedef struct {
    size_t numel, spec_off;
    int spec, decay;
    int brk; /* a bucket must start at this parameter */
} ExpParam;

/* Rows per chunk, by brute force: the smallest unit u (u * row_len divisible
 * by lcm(world, 128, align), u a multiple of row_align), the most units whose
 * length stays within bsz (at least one), then more units until at most
 * LAYOUT_MAX_ROW_CHUNKS chunks are needed; rows when it fits one bucket. */
static size_t ref_chunk_rows(size_t rows, size_t rl, size_t ra, size_t bsz, int world, size_t align) {
    if (rows * rl <= bsz) return rows;
    size_t M = ref_lcm(ref_lcm((size_t)world, 128), align);
    size_t u = 1;
    while ((u * rl) % M != 0 || (ra > 1 && u % ra != 0)) u++;
    size_t cr = u;
    while (cr + u < rows && (cr + u) * rl <= bsz) cr += u;
    while (cr * LAYOUT_MAX_ROW_CHUNKS < rows) cr += u;
    return cr < rows ? cr : rows;
}

/* Fills e (capacity cap) from the specs; returns the count. */
static int expand_specs(const LayoutParamSpec* s, int n, size_t bsz, int world, size_t align, ExpParam* e,
                        int cap) {
    int k = 0, after_cut = 0;
    for (int p = 0; p < n; p++) {
        size_t rl = s[p].row_len;
        size_t rows = rl ? s[p].numel / rl : 1;
        size_t cr = rl ? ref_chunk_rows(rows, rl, s[p].row_align, bsz, world, align) : rows;
        if (cr >= rows) { /* whole: a bucket break if asked, or after a cut spec */
            if (k < cap) e[k] = (ExpParam){s[p].numel, 0, p, s[p].decay, s[p].new_bucket || after_cut};
            k++;
            after_cut = 0;
            continue;
        }
        for (size_t r0 = 0; r0 < rows; r0 += cr) { /* every chunk starts a bucket */
            size_t nr = rows - r0 < cr ? rows - r0 : cr;
            if (k < cap) e[k] = (ExpParam){nr * rl, r0 * rl, p, s[p].decay, 1};
            k++;
        }
        after_cut = 1;
    }
    return k;
}

/* Checks every invariant of L against the specs it was built from. When
 * mark_ok, also marks each element (buffer and per parameter) one by one. */
static void check_layout(const Layout* L, const LayoutParamSpec* s, int ns, size_t bsz, int bpg, int world,
                         size_t align, int mark_ok, Stats* st, const char* tag) {
    int fails0 = test_failed;
#define REQ(cond, ...)                              \
    do {                                            \
        if (cond) {                                 \
            test_passed++;                          \
        } else {                                    \
            CHECK(0, __VA_ARGS__);                  \
            if (test_failed - fails0 > 5) goto out; \
        }                                           \
    } while (0)
    int cap = ns * (LAYOUT_MAX_ROW_CHUNKS + 1);
    ExpParam* E = malloc(sizeof *E * (size_t)cap);
    int n = expand_specs(s, ns, bsz, world, align, E, cap);
    size_t m = ref_lcm((size_t)world, 128);
    REQ(L->world == world && L->nparams == n && L->nspecs == ns && L->align == align && L->bucket_size == bsz,
        "%s: header fields (nparams %d, expected %d)", tag, L->nparams, n);
    size_t tp = 0;
    for (int p = 0; p < ns; p++) tp += s[p].numel;
    REQ(L->total_params == tp, "%s: total_params %zu != %zu", tag, L->total_params, tp);

    /* buckets: contiguous from 0, lengths multiple of lcm(world,128) and of align,
     * parameter ranges consecutive and covering all parameters */
    REQ(L->nbuckets >= 1 && L->nbuckets <= n, "%s: nbuckets %d", tag, L->nbuckets);
    size_t pos = 0;
    int nextp = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        const LayoutBucket* B = &L->buckets[b];
        REQ(B->start == pos, "%s: bucket %d start %zu, expected %zu", tag, b, B->start, pos);
        REQ(B->len > 0 && B->len % m == 0, "%s: bucket %d len %zu not a multiple of %zu", tag, b, B->len, m);
        REQ(B->start % align == 0, "%s: bucket %d start %zu not aligned", tag, b, B->start);
        REQ(B->slice_len * (size_t)world == B->len, "%s: bucket %d slices unequal", tag, b);
        REQ(B->first_param == nextp && B->nparams >= 1, "%s: bucket %d param range", tag, b);
        REQ(B->group == b / bpg, "%s: bucket %d group %d", tag, b, B->group);
        int lp = B->first_param + B->nparams - 1;
        REQ(lp < n, "%s: bucket %d param range past the end", tag, b);
        const LayoutParam* P0 = &L->params[B->first_param];
        const LayoutParam* PL = &L->params[lp];
        REQ(P0->offset == B->start, "%s: bucket %d first param not at its start", tag, b);
        size_t fill = PL->offset + PL->numel - B->start;
        REQ(fill <= B->len, "%s: bucket %d params run past its end", tag, b);
        /* minimal padding: len is the smallest multiple of lcm(m, align) >= fill */
        size_t mm = ref_lcm(m, align);
        REQ(B->len == (fill + mm - 1) / mm * mm, "%s: bucket %d len %zu, fill %zu", tag, b, B->len, fill);
        /* it closed when full, or because the next parameter starts a bucket */
        if (b < L->nbuckets - 1)
            REQ(fill >= bsz || E[lp + 1].brk, "%s: bucket %d holds %zu < %zu", tag, b, fill, bsz);
        for (int q = B->first_param + 1; q <= lp; q++)
            REQ(!E[q].brk, "%s: param %d should start a bucket", tag, q);
        if (B->nparams >= 2) {
            const LayoutParam* PP = &L->params[lp - 1];
            REQ(PP->offset + PP->numel - B->start < bsz,
                "%s: bucket %d should have closed one parameter earlier", tag, b);
        }
        pos = B->start + B->len;
        nextp = lp + 1;
    }
    REQ(nextp == n, "%s: buckets hold %d of %d params", tag, nextp, n);
    REQ(L->total == pos, "%s: total %zu != sum of bucket lengths %zu", tag, L->total, pos);

    /* params: in order, aligned, tightly packed, non-overlapping, inside their bucket */
    for (int p = 0; p < n; p++) {
        const LayoutParam* P = &L->params[p];
        REQ(P->numel == E[p].numel && P->decay == E[p].decay && P->spec == E[p].spec &&
                P->spec_off == E[p].spec_off,
            "%s: param %d fields (numel %zu spec %d spec_off %zu, expected %zu %d %zu)", tag, p, P->numel,
            P->spec, P->spec_off, E[p].numel, E[p].spec, E[p].spec_off);
        REQ(P->name == s[E[p].spec].name, "%s: param %d name", tag, p);
        REQ(P->offset % align == 0, "%s: param %d offset %zu not aligned", tag, p, P->offset);
        REQ(P->bucket >= 0 && P->bucket < L->nbuckets, "%s: param %d bucket", tag, p);
        const LayoutBucket* B = &L->buckets[P->bucket];
        REQ(p >= B->first_param && p < B->first_param + B->nparams, "%s: param %d bucket %d", tag, p,
            P->bucket);
        REQ(P->offset >= B->start && P->offset + P->numel <= B->start + B->len,
            "%s: param %d outside its bucket", tag, p);
        if (p > 0 && p != B->first_param) {
            size_t pe = L->params[p - 1].offset + L->params[p - 1].numel;
            REQ(P->offset == (pe + align - 1) / align * align, "%s: param %d at %zu, previous ends at %zu", tag,
                p, P->offset, pe);
        }
        if (p > 0)
            REQ(P->offset >= L->params[p - 1].offset + L->params[p - 1].numel, "%s: params %d and %d overlap",
                tag, p - 1, p);
        /* row chunks: no gap, the chunks of a spec are one contiguous range,
         * and every chunk but the last fills its bucket exactly */
        if (P->spec_off > 0) {
            const LayoutParam* Q = &L->params[p - 1];
            REQ(Q->spec == P->spec && Q->offset + Q->numel == P->offset,
                "%s: chunk %d at %zu, the previous chunk ends at %zu (a gap)", tag, p, P->offset,
                Q->offset + Q->numel);
            REQ(Q->numel % m == 0 && Q->numel % align == 0 && L->buckets[Q->bucket].len == Q->numel &&
                    L->buckets[Q->bucket].nparams == 1,
                "%s: chunk %d (%zu elements) is not a whole, unpadded bucket", tag, p - 1, Q->numel);
        }
    }

    /* groups */
    int ng = (L->nbuckets + bpg - 1) / bpg;
    REQ(L->ngroups == ng, "%s: ngroups %d != %d", tag, L->ngroups, ng);
    for (int g = 0; g <= ng; g++) {
        int want = g < ng ? g * bpg : L->nbuckets;
        REQ(L->group_first_bucket[g] == want, "%s: group %d first %d", tag, g, L->group_first_bucket[g]);
    }

    /* expected number of pieces: per param, the count of distinct owners of its elements */
    long exp_np = 0;
    for (int p = 0; p < n; p++) {
        const LayoutParam* P = &L->params[p];
        const LayoutBucket* B = &L->buckets[P->bucket];
        size_t r0 = (P->offset - B->start) / B->slice_len;
        size_t r1 = (P->offset + P->numel - 1 - B->start) / B->slice_len;
        exp_np += (long)(r1 - r0 + 1);
    }
    REQ(L->npieces == exp_np, "%s: npieces %d, expected %ld (not maximal runs?)", tag, L->npieces, exp_np);
    REQ(L->rank_first_piece[0] == 0 && L->rank_first_piece[world] == L->npieces, "%s: rank_first_piece ends",
        tag);

    /* pieces: sorted by (owner, buf_off), inside owner's slice and their param,
     * state_off contiguous from 0 per rank, sums match rank_owned */
    size_t owned_sum = 0;
    for (int r = 0; r < world; r++) {
        int a = L->rank_first_piece[r], e = L->rank_first_piece[r + 1];
        REQ(a <= e, "%s: rank %d piece range", tag, r);
        size_t state = 0;
        for (int k = a; k < e; k++) {
            const LayoutPiece* Q = &L->pieces[k];
            REQ(Q->owner == r, "%s: piece %d owner %d in rank %d's range", tag, k, Q->owner, r);
            REQ(Q->param >= 0 && Q->param < n, "%s: piece %d param %d", tag, k, Q->param);
            const LayoutParam* P = &L->params[Q->param];
            const LayoutBucket* B = &L->buckets[P->bucket];
            REQ(Q->len > 0 && Q->param_off + Q->len <= P->numel, "%s: piece %d past its param", tag, k);
            REQ(Q->buf_off == P->offset + Q->param_off, "%s: piece %d buf_off", tag, k);
            size_t s0 = B->start + (size_t)r * B->slice_len;
            REQ(Q->buf_off >= s0 && Q->buf_off + Q->len <= s0 + B->slice_len,
                "%s: piece %d outside rank %d's slice of bucket %d", tag, k, r, P->bucket);
            REQ(Q->decay == P->decay, "%s: piece %d decay", tag, k);
            REQ(Q->state_off == state, "%s: rank %d piece %d state_off %zu, expected %zu", tag, r, k,
                Q->state_off, state);
            if (k > a)
                REQ(L->pieces[k - 1].buf_off + L->pieces[k - 1].len <= Q->buf_off,
                    "%s: rank %d pieces %d,%d not sorted/disjoint", tag, r, k - 1, k);
            state += Q->len;
        }
        REQ(L->rank_owned[r] == state, "%s: rank_owned[%d] %zu != %zu", tag, r, L->rank_owned[r], state);
        REQ(layout_owned(L, r) == state, "%s: layout_owned(%d)", tag, r);
        owned_sum += state;

        int no = -1;
        OptPiece* o = layout_opt_pieces(L, r, &no);
        REQ(o != NULL && no == e - a, "%s: layout_opt_pieces(%d) count %d", tag, r, no);
        for (int k = 0; k < no; k++) {
            const LayoutPiece* Q = &L->pieces[a + k];
            if (o[k].buf_off != Q->buf_off || o[k].state_off != Q->state_off || o[k].len != Q->len ||
                o[k].decay != Q->decay) {
                CHECK(0, "%s: opt piece %d of rank %d differs", tag, k, r);
                break;
            }
        }
        free(o);
    }
    REQ(owned_sum == tp, "%s: rank_owned sums to %zu, not %zu", tag, owned_sum, tp);

    /* rank -1: one piece per param, whole, state running over all params */
    int no = -1;
    OptPiece* o = layout_opt_pieces(L, -1, &no);
    REQ(no == n, "%s: opt pieces(-1) count %d", tag, no);
    size_t state = 0;
    for (int p = 0; p < n; p++) {
        if (o[p].buf_off != L->params[p].offset || o[p].len != E[p].numel || o[p].state_off != state ||
            o[p].decay != E[p].decay) {
            CHECK(0, "%s: opt pieces(-1) param %d", tag, p);
            break;
        }
        state += E[p].numel;
    }
    free(o);

    if (mark_ok) {
        /* buffer map: which param each element belongs to (-1: padding), from params alone */
        int* bufp = malloc(L->total * sizeof *bufp);
        for (size_t x = 0; x < L->total; x++) bufp[x] = -1;
        size_t* base = malloc(((size_t)n + 1) * sizeof *base);
        base[0] = 0;
        for (int p = 0; p < n; p++) {
            base[p + 1] = base[p] + E[p].numel;
            for (size_t x = L->params[p].offset; x < L->params[p].offset + E[p].numel; x++) {
                if (bufp[x] != -1) {
                    CHECK(0, "%s: element %zu in params %d and %d", tag, x, bufp[x], p);
                    break;
                }
                bufp[x] = p;
            }
        }
        unsigned char* seen = calloc(tp, 1);
        int bad_pad = 0, bad_owner = 0;
        for (int k = 0; k < L->npieces; k++) {
            const LayoutPiece* Q = &L->pieces[k];
            const LayoutBucket* B = &L->buckets[L->params[Q->param].bucket];
            for (size_t i = 0; i < Q->len; i++) {
                size_t x = Q->buf_off + i;
                if (bufp[x] != Q->param) bad_pad++;
                if ((int)((x - B->start) / B->slice_len) != Q->owner) bad_owner++;
                if (seen[base[Q->param] + Q->param_off + i] < 255) seen[base[Q->param] + Q->param_off + i]++;
            }
        }
        size_t not_once = 0;
        for (size_t i = 0; i < tp; i++) not_once += seen[i] != 1;
        st->elements += (long)tp;
        free(seen);
        free(base);
        free(bufp);
        REQ(bad_pad == 0, "%s: %d piece elements are padding or another param", tag, bad_pad);
        REQ(bad_owner == 0, "%s: %d piece elements outside the owner's slice", tag, bad_owner);
        REQ(not_once == 0, "%s: %zu parameter elements not owned exactly once", tag, not_once);
    }
    st->layouts++;
    st->pieces += L->npieces;
    for (int p = 0; p < ns; p++) st->chunked += s[p].row_len > 0;
    st->chunks += n - ns;
    double pct = 100.0 * (double)(L->total - tp) / (double)L->total;
    if (pct > st->max_pad_pct) st->max_pad_pct = pct;
out:
    free(E);
#undef REQ
}

static void test_random(void) {
    Rng rng;
    rng_seed(&rng, 12345);
    Stats st = {0, 0, 0, 0.0, 0, 0};
    const size_t aligns[3] = {1, 8, 64};
    char err[256], tag[128];
    int nlists = 40;
    for (int li = 0; li < nlists; li++) {
        int n = 1 + (int)(rng_u64(&rng) % 40);
        LayoutParamSpec s[40];
        memset(s, 0, sizeof s);
        size_t tp = 0;
        for (int p = 0; p < n; p++) {
            size_t numel = 1 + rng_u64(&rng) % 5000;
            if (li % 8 == 7 && rng_u64(&rng) % 10 == 0) numel = 100000 + rng_u64(&rng) % 2000000;
            s[p].name = "rand";
            s[p].decay = (int)(rng_u64(&rng) & 1);
            if (li % 2 == 1 && rng_u64(&rng) % 4 == 0) {
                /* a matrix the layout may cut into row chunks */
                static const size_t ras[4] = {0, 1, 8, 64};
                size_t rl = 1 + rng_u64(&rng) % 100, rows = 1 + rng_u64(&rng) % 400;
                if (li % 8 == 7) rows += rng_u64(&rng) % 3000;
                numel = rl * rows;
                s[p].row_len = rl;
                s[p].row_align = ras[rng_u64(&rng) % 4];
            }
            if (li % 3 == 2 && rng_u64(&rng) % 6 == 0) s[p].new_bucket = 1;
            s[p].numel = numel;
            tp += numel;
        }
        size_t align = aligns[li % 3];
        int bpg = 1 + (int)(rng_u64(&rng) % 3);
        size_t bsz;
        switch (li % 4) {
        case 0: bsz = 1 + rng_u64(&rng) % 64; break; /* tiny: ~a bucket per param */
        case 1: bsz = 1 + rng_u64(&rng) % 20000; break;
        case 2: bsz = tp + 1 + rng_u64(&rng) % 1000; break; /* larger than the total */
        default: bsz = 1 + rng_u64(&rng) % (tp + 1); break;
        }
        for (int world = 1; world <= 64; world++) {
            Layout L;
            snprintf(tag, sizeof tag, "list %d (n %d, bsz %zu, align %zu, bpg %d) world %d", li, n, bsz, align,
                     bpg, world);
            int rc = layout_build(&L, s, n, bsz, bpg, world, align, err, sizeof err);
            CHECK(rc == 0, "%s: build failed: %s", tag, err);
            if (rc) continue;
            check_layout(&L, s, n, bsz, bpg, world, align, 1, &st, tag);
            layout_free(&L);
        }
    }
    /* odd aligns (not dividing 128), a few worlds */
    for (int li = 0; li < 6; li++) {
        int n = 1 + (int)(rng_u64(&rng) % 20);
        LayoutParamSpec s[20];
        for (int p = 0; p < n; p++)
            s[p] = (LayoutParamSpec){.name = "odd", .numel = 1 + rng_u64(&rng) % 3000, .decay = 1};
        size_t align = li % 2 ? 3 : 200;
        for (int world = 1; world <= 64; world += 7) {
            Layout L;
            size_t bsz = 1 + rng_u64(&rng) % 5000;
            snprintf(tag, sizeof tag, "odd list %d align %zu world %d", li, align, world);
            int rc = layout_build(&L, s, n, bsz, 2, world, align, err, sizeof err);
            CHECK(rc == 0, "%s: build failed: %s", tag, err);
            if (rc) continue;
            check_layout(&L, s, n, bsz, 2, world, align, 1, &st, tag);
            layout_free(&L);
        }
    }
    /* GPT-2-scale and beyond, interval checks only (no element marks): size_t arithmetic */
    LayoutParamSpec big[4] = {{.name = "wte", .numel = 50304ull * 12288, .decay = 1},
                              {.name = "huge", .numel = 3000000000ull * 7, .decay = 1},
                              {.name = "bias", .numel = 7, .decay = 0},
                              {.name = "w", .numel = 12288ull * 49152, .decay = 1}};
    int worlds[5] = {1, 3, 7, 64, 1000};
    for (int wi = 0; wi < 5; wi++) {
        Layout L;
        snprintf(tag, sizeof tag, "big world %d", worlds[wi]);
        int rc = layout_build(&L, big, 4, 40000000, 1, worlds[wi], 64, err, sizeof err);
        CHECK(rc == 0, "%s: build failed: %s", tag, err);
        if (rc) continue;
        check_layout(&L, big, 4, 40000000, 1, worlds[wi], 64, 0, &st, tag);
        if (wi == 4) {
            printf("big layout, world 1000:\n");
            layout_print(&L, stdout);
        }
        layout_free(&L);
    }
    printf("random: %ld layouts, %ld pieces, %ld parameter elements marked, max padding %.1f%%, "
           "%ld row-chunkable specs laid out, %ld chunks added by cutting\n",
           st.layouts, st.pieces, st.elements, st.max_pad_pct, st.chunked, st.chunks);
}

/* ---- row chunks: a hand-computed layout ---- */
static void test_chunks_hand(void) {
    char err[256];
    Layout L;
    /* Specs a (100), wpe (500), wte (100 rows x 32, row_len 32), tail (10);
     * align 64, bucket_size 1000, world 3: M = lcm(3, 128, 64) = 384.
     * wte: unit u = 384 / gcd(384, 32) = 12 rows (384 elements); the most
     * units within 1000 elements: 2 (24 rows, 768 elements; 36 rows would be
     * 1152); at most 32 chunks needs 4 rows: so 24 rows, chunks of rows
     * [0,24) [24,48) [48,72) [72,96) [96,100).
     * bucket 0 at 0: a [0,100), wpe at 128 -> [128,628), fill 628 < 1000 but
     *   wte's first chunk starts a bucket: len roundup(628, 384) = 768.
     * buckets 1..4: the 768-element chunks at 768, 1536, 2304, 3072, each
     *   exactly its bucket (768 = 2 x 384: no padding), so chunk k sits at
     *   768 + k * 768 = wte's offset + 32 * (its first row): no gap.
     * bucket 5 at 3840: the last chunk, 128 elements, len 384.
     * bucket 6 at 4224: tail (a bucket closes after the last chunk), len 384.
     * total 4608. */
    LayoutParamSpec sp[4] = {{.name = "a", .numel = 100, .decay = 0},
                             {.name = "wpe", .numel = 500, .decay = 1},
                             {.name = "wte", .numel = 3200, .decay = 1, .row_len = 32},
                             {.name = "tail", .numel = 10, .decay = 0}};
    CHECK(layout_chunk_rows(100, 32, 0, 1000, 3, 64) == 24,
          "chunk rows (100 x 32, bsz 1000, world 3): %zu, expected 24",
          layout_chunk_rows(100, 32, 0, 1000, 3, 64));
    int rc = layout_build(&L, sp, 4, 1000, 1, 3, 64, err, sizeof err);
    CHECK(rc == 0, "chunks: build failed: %s", err);
    if (rc == 0) {
        const size_t off[8] = {0, 128, 768, 1536, 2304, 3072, 3840, 4224};
        const size_t numel[8] = {100, 500, 768, 768, 768, 768, 128, 10};
        const int spec[8] = {0, 1, 2, 2, 2, 2, 2, 3};
        const size_t soff[8] = {0, 0, 0, 768, 1536, 2304, 3072, 0};
        const int bucket[8] = {0, 0, 1, 2, 3, 4, 5, 6};
        const size_t bstart[7] = {0, 768, 1536, 2304, 3072, 3840, 4224};
        const size_t blen[7] = {768, 768, 768, 768, 768, 384, 384};
        CHECK(L.nparams == 8 && L.nspecs == 4 && L.nbuckets == 7 && L.total == 4608 && L.total_params == 3810,
              "chunks: %d params, %d specs, %d buckets, total %zu, params %zu", L.nparams, L.nspecs, L.nbuckets,
              L.total, L.total_params);
        for (int p = 0; p < 8 && p < L.nparams; p++)
            CHECK(
                L.params[p].offset == off[p] && L.params[p].numel == numel[p] && L.params[p].spec == spec[p] &&
                    L.params[p].spec_off == soff[p] && L.params[p].bucket == bucket[p] &&
                    L.params[p].decay == sp[spec[p]].decay && L.params[p].name == sp[spec[p]].name,
                "chunks: param %d = (off %zu numel %zu spec %d spec_off %zu bucket %d), expected (%zu %zu %d %zu %d)",
                p, L.params[p].offset, L.params[p].numel, L.params[p].spec, L.params[p].spec_off,
                L.params[p].bucket, off[p], numel[p], spec[p], soff[p], bucket[p]);
        for (int b = 0; b < 7 && b < L.nbuckets; b++)
            CHECK(L.buckets[b].start == bstart[b] && L.buckets[b].len == blen[b] &&
                      L.buckets[b].slice_len == blen[b] / 3,
                  "chunks: bucket %d = (%zu, %zu), expected (%zu, %zu)", b, L.buckets[b].start,
                  L.buckets[b].len, bstart[b], blen[b]);
        /* no gap, by hand: wte's chunks one after the other from wte's offset */
        for (int k = 0; k < 5 && 2 + k < L.nparams; k++)
            CHECK(L.params[2 + k].offset == 768 + (size_t)k * 24 * 32, "chunks: chunk %d at %zu, expected %zu",
                  k, L.params[2 + k].offset, 768 + (size_t)k * 24 * 32);
        /* the first chunk's pieces: one per rank, 256 each */
        int seen = 0;
        for (int k = 0; k < L.npieces; k++)
            if (L.pieces[k].param == 2) {
                CHECK(L.pieces[k].len == 256 && L.pieces[k].buf_off == 768 + 256 * (size_t)L.pieces[k].owner &&
                          L.pieces[k].param_off == 256 * (size_t)L.pieces[k].owner,
                      "chunks: piece of chunk 0 for rank %d", L.pieces[k].owner);
                seen++;
            }
        CHECK(seen == 3, "chunks: chunk 0 has %d pieces, expected 3", seen);
        printf("layout with row chunks (a 100, wpe 500, wte 100 x 32, tail 10; bucket 1000, world 3):\n");
        layout_print(&L, stdout);
        layout_free(&L);
    }
    /* world 1: u = 128 / gcd(128, 32) = 4 rows; within 1000: 28 rows (896) */
    CHECK(layout_chunk_rows(100, 32, 0, 1000, 1, 64) == 28, "chunk rows world 1: %zu, expected 28",
          layout_chunk_rows(100, 32, 0, 1000, 1, 64));
    /* row_align 64 makes the unit lcm(12, 64) = 192 rows > 100: not cut */
    CHECK(layout_chunk_rows(100, 32, 64, 1000, 3, 64) == 100, "chunk rows with row_align 64: %zu, expected 100",
          layout_chunk_rows(100, 32, 64, 1000, 3, 64));
    /* the cap: 1000 rows of 32 at bucket_size 1 would be 250 chunks of 4 rows;
     * at most 32 chunks: ceil(1000 / 32) = 32 rows (a multiple of 4) */
    CHECK(layout_chunk_rows(1000, 32, 0, 1, 1, 64) == 32, "chunk rows at the cap: %zu, expected 32",
          layout_chunk_rows(1000, 32, 0, 1, 1, 64));
    /* fits a bucket: not cut */
    CHECK(layout_chunk_rows(100, 32, 0, 3200, 3, 64) == 100, "chunk rows when it fits: %zu",
          layout_chunk_rows(100, 32, 0, 3200, 3, 64));
    /* new_bucket on a plain spec: b closes the bucket of a although 5 + 5 < 1000 */
    LayoutParamSpec nb[3] = {{.name = "a", .numel = 5},
                             {.name = "b", .numel = 5, .new_bucket = 1},
                             {.name = "c", .numel = 5}};
    rc = layout_build(&L, nb, 3, 1000, 1, 2, 64, err, sizeof err);
    CHECK(rc == 0 && L.nbuckets == 2 && L.params[1].offset == 128 && L.params[1].bucket == 1 &&
              L.params[2].offset == 192 && L.params[2].bucket == 1,
          "new_bucket: %d buckets, b at %zu", L.nbuckets, L.params[1].offset);
    if (rc == 0) layout_free(&L);
    /* a row length that does not divide numel is refused */
    LayoutParamSpec badrl[1] = {{.name = "odd_rows", .numel = 100, .row_len = 7}};
    rc = layout_build(&L, badrl, 1, 10, 1, 1, 64, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "odd_rows") && strstr(err, "row length"), "row_len 7 of 100 accepted: '%s'",
          err);
    printf("rejected (row length): %s\n", err);
}

/* ---- row chunks at GPT-2's shapes: C = 32 and 768, world 1..8 ---- */
static void test_chunks_gpt2(void) {
    char err[256], tag[160];
    Stats st = {0, 0, 0, 0.0, 0, 0};
    const size_t Vp = 50304, maxT = 1024;
    const size_t chans[2] = {32, 768};
    const size_t bszs[5] = {1000, 100000, 1000000, 4000000, 100000000};
    for (int ci = 0; ci < 2; ci++)
        for (int bi = 0; bi < 5; bi++)
            for (int world = 1; world <= 8; world++) {
                size_t C = chans[ci], bsz = bszs[bi];
                LayoutParamSpec sp[3] = {
                    {.name = "lnf", .numel = 2 * C, .decay = 0},
                    {.name = "wpe", .numel = maxT * C, .decay = 1},
                    {.name = "wte", .numel = Vp * C, .decay = 1, .row_len = C, .row_align = 64}};
                Layout L;
                snprintf(tag, sizeof tag, "gpt2 C %zu bucket %zu world %d", C, bsz, world);
                if (layout_build(&L, sp, 3, bsz, 1, world, 64, err, sizeof err) != 0) {
                    CHECK(0, "%s: build failed: %s", tag, err);
                    continue;
                }
                check_layout(&L, sp, 3, bsz, 1, world, 64, C == 32, &st, tag);
                /* by hand: the unit, the chunks, no gap */
                size_t M = ref_lcm((size_t)world, 128);
                size_t u = 1;
                while ((u * C) % M != 0 || (u * C) % 64 != 0 || u % 64 != 0) u++;
                size_t cr = layout_chunk_rows(Vp, C, 64, bsz, world, 64);
                int K = L.nparams - 2;
                int first = 2;
                CHECK(L.params[1].spec == 1 &&
                          L.params[1].offset + L.params[1].numel <= L.params[first].offset &&
                          (Vp * C <= bsz || L.params[1].bucket < L.params[first].bucket),
                      "%s: wpe is not before wte (in an earlier bucket when wte is cut)", tag);
                if (Vp * C <= bsz) {
                    CHECK(K == 1 && cr == Vp, "%s: wte fits a bucket but was cut (%d chunks)", tag, K);
                } else {
                    CHECK(cr % u == 0 && K == (int)((Vp + cr - 1) / cr) && K <= LAYOUT_MAX_ROW_CHUNKS && K >= 2,
                          "%s: %d chunks of %zu rows (unit %zu)", tag, K, cr, u);
                    CHECK(cr * C <= bsz || cr == u || (cr - u) * LAYOUT_MAX_ROW_CHUNKS < Vp,
                          "%s: chunks of %zu rows are larger than needed", tag, cr);
                    for (int k = 0; k < K; k++) {
                        const LayoutParam* P = &L.params[first + k];
                        CHECK(P->offset == L.params[first].offset + (size_t)k * cr * C && P->spec == 2 &&
                                  P->spec_off == (size_t)k * cr * C,
                              "%s: chunk %d at %zu, expected %zu (a gap?)", tag, k, P->offset,
                              L.params[first].offset + (size_t)k * cr * C);
                        if (k < K - 1)
                            CHECK(P->numel == cr * C && P->numel % M == 0 && P->numel % 64 == 0 &&
                                      L.buckets[P->bucket].len == P->numel &&
                                      L.buckets[P->bucket].start == P->offset,
                                  "%s: chunk %d (%zu elements) not a whole bucket divisible by %zu and 64", tag,
                                  k, P->numel, M);
                    }
                }
                if (C == 768 && (bsz == 4000000 || bsz == 1000000) && (world == 1 || world == 3 || world == 8))
                    printf("gpt2 C 768, bucket %zu, world %d: wte in %d chunk(s) of %zu rows (%zu elements)\n",
                           bsz, world, K, cr, cr * C);
                layout_free(&L);
            }
    printf("gpt2 shapes: %ld layouts, %ld chunks added by cutting\n", st.layouts, st.chunks);
}

/* ---- rejection of bad arguments ---- */
static int expect_fatal_opt(const Layout* L, int rank) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        int n;
        layout_opt_pieces(L, rank, &n);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) != 0;
}

static void test_bad(void) {
    char err[256];
    Layout L;
    LayoutParamSpec ok[2] = {{.name = "x", .numel = 10, .decay = 0}, {.name = "y", .numel = 20, .decay = 1}};
    LayoutParamSpec zero[2] = {{.name = "x", .numel = 10, .decay = 0},
                               {.name = "zero_param", .numel = 0, .decay = 1}};
    struct {
        const char* what;
        const LayoutParamSpec* s;
        int n;
        size_t bsz;
        int bpg, world;
        size_t align;
        const char* needle;
    } cases[] = {
        {"world 0", ok, 2, 100, 1, 0, 64, "world"},
        {"world -3", ok, 2, 100, 1, -3, 64, "world"},
        {"align 0", ok, 2, 100, 1, 2, 0, "align"},
        {"bucket_size 0", ok, 2, 0, 1, 2, 64, "bucket_size"},
        {"nparams 0", ok, 0, 100, 1, 2, 64, "parameter"},
        {"nparams -1", ok, -1, 100, 1, 2, 64, "parameter"},
        {"specs NULL", NULL, 2, 100, 1, 2, 64, "parameter"},
        {"zero numel", zero, 2, 100, 1, 2, 64, "zero_param"},
        {"bpg 0", ok, 2, 100, 0, 2, 64, "buckets_per_group"},
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < nc; i++) {
        memset(&L, 0x5a, sizeof L);
        err[0] = '\0';
        int rc = layout_build(&L, cases[i].s, cases[i].n, cases[i].bsz, cases[i].bpg, cases[i].world,
                              cases[i].align, err, sizeof err);
        CHECK(rc == -1, "bad %s: accepted", cases[i].what);
        CHECK(strstr(err, cases[i].needle) != NULL && strchr(err, '\n') == NULL,
              "bad %s: message '%s' should name '%s' on one line", cases[i].what, err, cases[i].needle);
        CHECK(L.params == NULL && L.pieces == NULL, "bad %s: layout not left empty", cases[i].what);
        layout_free(&L); /* must be safe on a failed build */
        if (i == 0) printf("rejected (%s): %s\n", cases[i].what, err);
    }
    /* NULL err buffer must not crash */
    CHECK(layout_build(&L, ok, 2, 100, 1, 0, 64, NULL, 0) == -1, "bad world with NULL err");
    /* size_t overflow: two params of SIZE_MAX/2 elements */
    LayoutParamSpec huge[2] = {{.name = "h0", .numel = SIZE_MAX / 2, .decay = 0},
                               {.name = "h1", .numel = SIZE_MAX / 2, .decay = 0}};
    int rc = layout_build(&L, huge, 2, 1, 1, 3, 64, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "too large"), "overflow not rejected: rc %d '%s'", rc, err);
    printf("rejected (overflow): %s\n", err);
    LayoutParamSpec one[1] = {{.name = "h", .numel = SIZE_MAX - 10, .decay = 0}};
    rc = layout_build(&L, one, 1, 1, 1, 1, 1, err, sizeof err);
    CHECK(rc == -1, "overflow in end padding not rejected");
    rc = layout_build(&L, ok, 2, 1, 1, 3, SIZE_MAX / 3 + 7, err, sizeof err);
    CHECK(rc == -1, "overflowing lcm(world, 128, align) not rejected");
    /* layout_opt_pieces with a rank outside [-1, world) ends the process */
    rc = layout_build(&L, ok, 2, 100, 1, 4, 64, err, sizeof err);
    CHECK(rc == 0, "ok build failed: %s", err);
    if (rc == 0) {
        CHECK(expect_fatal_opt(&L, 4), "rank 4 of world 4 accepted");
        CHECK(expect_fatal_opt(&L, -2), "rank -2 accepted");
        CHECK(!expect_fatal_opt(&L, 3), "rank 3 of world 4 rejected");
        layout_free(&L);
        CHECK(L.params == NULL, "layout_free leaves the struct empty");
    }
}

int main(void) {
    double t0 = wall_time_s();
    test_hand();
    test_bad();
    test_random();
    test_chunks_hand();
    test_chunks_gpt2();
    printf("time %.2f s\n", wall_time_s() - t0);
    return test_done("test_layout");
}
