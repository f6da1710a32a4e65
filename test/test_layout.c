/* test/test_layout.c — tests ddp/layout.c: hand-computed layouts compared
 * field by field, then the layout invariants checked against independent
 * recomputation for many random parameter lists, bucket sizes, aligns and
 * every world size from 1 to 64, then argument rejection. */
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
        CHECK(P->param == e[k].param && P->param_off == e[k].param_off &&
                  P->buf_off == e[k].buf_off && P->len == e[k].len &&
                  P->state_off == e[k].state_off && P->owner == e[k].owner,
              "%s: piece %d = (p%d po%zu b%zu l%zu s%zu r%d), expected (p%d po%zu b%zu l%zu s%zu r%d)",
              tag, k, P->param, P->param_off, P->buf_off, P->len, P->state_off, P->owner,
              e[k].param, e[k].param_off, e[k].buf_off, e[k].len, e[k].state_off, e[k].owner);
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
    LayoutParamSpec a[3] = {{"a0", 100, 1}, {"a1", 300, 0}, {"a2", 5, 1}};
    int rc = layout_build(&L, a, 3, 200, 1, 3, 64, err, sizeof err);
    CHECK(rc == 0, "A: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.total == 1152 && L.total_params == 405, "A: total %zu params %zu", L.total,
              L.total_params);
        CHECK(L.params[0].offset == 0 && L.params[1].offset == 128 && L.params[2].offset == 768,
              "A: offsets %zu %zu %zu", L.params[0].offset, L.params[1].offset, L.params[2].offset);
        CHECK(L.params[0].bucket == 0 && L.params[1].bucket == 0 && L.params[2].bucket == 1,
              "A: param buckets");
        CHECK(L.nbuckets == 2, "A: nbuckets %d", L.nbuckets);
        if (L.nbuckets == 2) {
            CHECK(L.buckets[0].start == 0 && L.buckets[0].len == 768 &&
                      L.buckets[0].slice_len == 256 && L.buckets[0].first_param == 0 &&
                      L.buckets[0].nparams == 2 && L.buckets[0].group == 0,
                  "A: bucket 0 (%zu, %zu, %zu)", L.buckets[0].start, L.buckets[0].len,
                  L.buckets[0].slice_len);
            CHECK(L.buckets[1].start == 768 && L.buckets[1].len == 384 &&
                      L.buckets[1].slice_len == 128 && L.buckets[1].first_param == 2 &&
                      L.buckets[1].nparams == 1 && L.buckets[1].group == 1,
                  "A: bucket 1 (%zu, %zu, %zu)", L.buckets[1].start, L.buckets[1].len,
                  L.buckets[1].slice_len);
        }
        CHECK(L.ngroups == 2 && L.group_first_bucket[0] == 0 && L.group_first_bucket[1] == 1 &&
                  L.group_first_bucket[2] == 2,
              "A: groups");
        ExpPiece e[4] = {{0, 0, 0, 100, 0, 0},
                         {1, 0, 128, 128, 100, 0},
                         {2, 0, 768, 5, 228, 0},
                         {1, 128, 256, 172, 0, 1}};
        check_pieces(&L, e, 4, "A");
        CHECK(L.rank_first_piece[0] == 0 && L.rank_first_piece[1] == 3 &&
                  L.rank_first_piece[2] == 4 && L.rank_first_piece[3] == 4,
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
        CHECK(n == 3 && o[0].buf_off == 0 && o[0].state_off == 0 && o[0].len == 100 &&
                  o[0].decay == 1 && o[1].buf_off == 128 && o[1].state_off == 100 &&
                  o[1].len == 128 && o[1].decay == 0 && o[2].buf_off == 768 &&
                  o[2].state_off == 228 && o[2].len == 5,
              "A: opt pieces rank 0");
        free(o);
        o = layout_opt_pieces(&L, 1, &n);
        CHECK(n == 1 && o[0].buf_off == 256 && o[0].state_off == 0 && o[0].len == 172,
              "A: opt pieces rank 1");
        free(o);
        o = layout_opt_pieces(&L, 2, &n);
        CHECK(n == 0 && o != NULL, "A: opt pieces rank 2 (empty) n=%d", n);
        free(o);
        o = layout_opt_pieces(&L, -1, &n);
        CHECK(n == 3 && o[0].buf_off == 0 && o[0].state_off == 0 && o[0].len == 100 &&
                  o[1].buf_off == 128 && o[1].state_off == 100 && o[1].len == 300 &&
                  o[2].buf_off == 768 && o[2].state_off == 400 && o[2].len == 5 &&
                  o[0].decay == 1 && o[1].decay == 0 && o[2].decay == 1,
              "A: opt pieces rank -1");
        free(o);
        printf("layout A (numel 100,300,5 align 64 bucket 200 world 3):\n");
        layout_print(&L, stdout);
        layout_free(&L);
    }

    /* Same parameters, buckets_per_group 3: one group holding both buckets. */
    rc = layout_build(&L, a, 3, 200, 3, 3, 64, err, sizeof err);
    CHECK(rc == 0 && L.ngroups == 1 && L.group_first_bucket[0] == 0 &&
              L.group_first_bucket[1] == 2 && L.buckets[1].group == 0,
          "A3: groups");
    if (rc == 0) layout_free(&L);

    /* B: numel {1, 130}, align 1, bucket_size 1, world 1: a bucket per param.
     * m = 128. b0 [0,128) p0 at 0; b1 at 128, p1 [128,258), len 256. total 384. */
    LayoutParamSpec b[2] = {{"b0", 1, 0}, {"b1", 130, 1}};
    rc = layout_build(&L, b, 2, 1, 1, 1, 1, err, sizeof err);
    CHECK(rc == 0, "B: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.nbuckets == 2 && L.total == 384 && L.params[1].offset == 128 &&
                  L.buckets[0].len == 128 && L.buckets[1].start == 128 &&
                  L.buckets[1].len == 256 && L.buckets[1].slice_len == 256,
              "B: buckets/offsets");
        ExpPiece e[2] = {{0, 0, 0, 1, 0, 0}, {1, 0, 128, 130, 1, 0}};
        check_pieces(&L, e, 2, "B");
        layout_free(&L);
    }

    /* C: numel {3, 1000}, align 8, bucket_size 10000 (> total), world 5.
     * m = lcm(5, 128, 8) = 640. p0 [0,3), p1 at 8 -> [8,1008); len 1280, slice 256.
     * r0: p0 [0,3) s0, p1 [8,256) po0 s3. r1: p1 [256,512) po248. r2: [512,768) po504.
     * r3: [768,1008) po760 len 240. r4: none. */
    LayoutParamSpec c[2] = {{"c0", 3, 0}, {"c1", 1000, 1}};
    rc = layout_build(&L, c, 2, 10000, 1, 5, 8, err, sizeof err);
    CHECK(rc == 0, "C: build failed: %s", err);
    if (rc == 0) {
        CHECK(L.nbuckets == 1 && L.total == 1280 && L.params[1].offset == 8 &&
                  L.buckets[0].slice_len == 256,
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
    LayoutParamSpec d[3] = {{"d0", 5, 0}, {"d1", 7, 0}, {"d2", 2, 0}};
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
} Stats;

/* Checks every invariant of L against the specs it was built from. When
 * mark_ok, also marks each element (buffer and per parameter) one by one. */
static void check_layout(const Layout* L, const LayoutParamSpec* s, int n, size_t bsz, int bpg,
                         int world, size_t align, int mark_ok, Stats* st, const char* tag) {
    int fails0 = test_failed;
#define REQ(cond, ...)                                                                          \
    do {                                                                                        \
        if (cond) {                                                                             \
            test_passed++;                                                                      \
        } else {                                                                                \
            CHECK(0, __VA_ARGS__);                                                              \
            if (test_failed - fails0 > 5) return;                                               \
        }                                                                                       \
    } while (0)
    size_t m = ref_lcm((size_t)world, 128);
    REQ(L->world == world && L->nparams == n && L->align == align && L->bucket_size == bsz,
        "%s: header fields", tag);
    size_t tp = 0;
    for (int p = 0; p < n; p++) tp += s[p].numel;
    REQ(L->total_params == tp, "%s: total_params %zu != %zu", tag, L->total_params, tp);

    /* buckets: contiguous from 0, lengths multiple of lcm(world,128) and of align,
     * parameter ranges consecutive and covering all parameters */
    REQ(L->nbuckets >= 1 && L->nbuckets <= n, "%s: nbuckets %d", tag, L->nbuckets);
    size_t pos = 0;
    int nextp = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        const LayoutBucket* B = &L->buckets[b];
        REQ(B->start == pos, "%s: bucket %d start %zu, expected %zu", tag, b, B->start, pos);
        REQ(B->len > 0 && B->len % m == 0, "%s: bucket %d len %zu not a multiple of %zu", tag, b,
            B->len, m);
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
        REQ(B->len == (fill + mm - 1) / mm * mm, "%s: bucket %d len %zu, fill %zu", tag, b, B->len,
            fill);
        if (b < L->nbuckets - 1) REQ(fill >= bsz, "%s: bucket %d holds %zu < %zu", tag, b, fill, bsz);
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
        REQ(P->numel == s[p].numel && P->decay == s[p].decay, "%s: param %d fields", tag, p);
        REQ(P->offset % align == 0, "%s: param %d offset %zu not aligned", tag, p, P->offset);
        REQ(P->bucket >= 0 && P->bucket < L->nbuckets, "%s: param %d bucket", tag, p);
        const LayoutBucket* B = &L->buckets[P->bucket];
        REQ(p >= B->first_param && p < B->first_param + B->nparams, "%s: param %d bucket %d", tag,
            p, P->bucket);
        REQ(P->offset >= B->start && P->offset + P->numel <= B->start + B->len,
            "%s: param %d outside its bucket", tag, p);
        if (p > 0 && p != B->first_param) {
            size_t pe = L->params[p - 1].offset + L->params[p - 1].numel;
            REQ(P->offset == (pe + align - 1) / align * align,
                "%s: param %d at %zu, previous ends at %zu", tag, p, P->offset, pe);
        }
        if (p > 0)
            REQ(P->offset >= L->params[p - 1].offset + L->params[p - 1].numel,
                "%s: params %d and %d overlap", tag, p - 1, p);
    }

    /* groups */
    int ng = (L->nbuckets + bpg - 1) / bpg;
    REQ(L->ngroups == ng, "%s: ngroups %d != %d", tag, L->ngroups, ng);
    for (int g = 0; g <= ng; g++) {
        int want = g < ng ? g * bpg : L->nbuckets;
        REQ(L->group_first_bucket[g] == want, "%s: group %d first %d", tag, g,
            L->group_first_bucket[g]);
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
    REQ(L->npieces == exp_np, "%s: npieces %d, expected %ld (not maximal runs?)", tag, L->npieces,
        exp_np);
    REQ(L->rank_first_piece[0] == 0 && L->rank_first_piece[world] == L->npieces,
        "%s: rank_first_piece ends", tag);

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
            REQ(Q->len > 0 && Q->param_off + Q->len <= P->numel, "%s: piece %d past its param", tag,
                k);
            REQ(Q->buf_off == P->offset + Q->param_off, "%s: piece %d buf_off", tag, k);
            size_t s0 = B->start + (size_t)r * B->slice_len;
            REQ(Q->buf_off >= s0 && Q->buf_off + Q->len <= s0 + B->slice_len,
                "%s: piece %d outside rank %d's slice of bucket %d", tag, k, r, P->bucket);
            REQ(Q->decay == P->decay, "%s: piece %d decay", tag, k);
            REQ(Q->state_off == state, "%s: rank %d piece %d state_off %zu, expected %zu", tag, r,
                k, Q->state_off, state);
            if (k > a)
                REQ(L->pieces[k - 1].buf_off + L->pieces[k - 1].len <= Q->buf_off,
                    "%s: rank %d pieces %d,%d not sorted/disjoint", tag, r, k - 1, k);
            state += Q->len;
        }
        REQ(L->rank_owned[r] == state, "%s: rank_owned[%d] %zu != %zu", tag, r, L->rank_owned[r],
            state);
        REQ(layout_owned(L, r) == state, "%s: layout_owned(%d)", tag, r);
        owned_sum += state;

        int no = -1;
        OptPiece* o = layout_opt_pieces(L, r, &no);
        REQ(o != NULL && no == e - a, "%s: layout_opt_pieces(%d) count %d", tag, r, no);
        for (int k = 0; k < no; k++) {
            const LayoutPiece* Q = &L->pieces[a + k];
            if (o[k].buf_off != Q->buf_off || o[k].state_off != Q->state_off ||
                o[k].len != Q->len || o[k].decay != Q->decay) {
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
        if (o[p].buf_off != L->params[p].offset || o[p].len != s[p].numel ||
            o[p].state_off != state || o[p].decay != s[p].decay) {
            CHECK(0, "%s: opt pieces(-1) param %d", tag, p);
            break;
        }
        state += s[p].numel;
    }
    free(o);

    if (mark_ok) {
        /* buffer map: which param each element belongs to (-1: padding), from params alone */
        int* bufp = malloc(L->total * sizeof *bufp);
        for (size_t x = 0; x < L->total; x++) bufp[x] = -1;
        size_t* base = malloc(((size_t)n + 1) * sizeof *base);
        base[0] = 0;
        for (int p = 0; p < n; p++) {
            base[p + 1] = base[p] + s[p].numel;
            for (size_t x = L->params[p].offset; x < L->params[p].offset + s[p].numel; x++) {
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
        REQ(bad_pad == 0, "%s: %d piece elements are padding or another param", tag, bad_pad);
        REQ(bad_owner == 0, "%s: %d piece elements outside the owner's slice", tag, bad_owner);
        size_t not_once = 0;
        for (size_t i = 0; i < tp; i++) not_once += seen[i] != 1;
        REQ(not_once == 0, "%s: %zu parameter elements not owned exactly once", tag, not_once);
        st->elements += (long)tp;
        free(seen);
        free(base);
        free(bufp);
    }
    st->layouts++;
    st->pieces += L->npieces;
    double pct = 100.0 * (double)(L->total - tp) / (double)L->total;
    if (pct > st->max_pad_pct) st->max_pad_pct = pct;
#undef REQ
}

static void test_random(void) {
    Rng rng;
    rng_seed(&rng, 12345);
    Stats st = {0, 0, 0, 0.0};
    const size_t aligns[3] = {1, 8, 64};
    char err[256], tag[128];
    int nlists = 40;
    for (int li = 0; li < nlists; li++) {
        int n = 1 + (int)(rng_u64(&rng) % 40);
        LayoutParamSpec s[40];
        size_t tp = 0;
        for (int p = 0; p < n; p++) {
            size_t numel = 1 + rng_u64(&rng) % 5000;
            if (li % 8 == 7 && rng_u64(&rng) % 10 == 0) numel = 100000 + rng_u64(&rng) % 2000000;
            s[p].name = "rand";
            s[p].numel = numel;
            s[p].decay = (int)(rng_u64(&rng) & 1);
            tp += numel;
        }
        size_t align = aligns[li % 3];
        int bpg = 1 + (int)(rng_u64(&rng) % 3);
        size_t bsz;
        switch (li % 4) {
            case 0: bsz = 1 + rng_u64(&rng) % 64; break;          /* tiny: ~a bucket per param */
            case 1: bsz = 1 + rng_u64(&rng) % 20000; break;
            case 2: bsz = tp + 1 + rng_u64(&rng) % 1000; break;    /* larger than the total */
            default: bsz = 1 + rng_u64(&rng) % (tp + 1); break;
        }
        for (int world = 1; world <= 64; world++) {
            Layout L;
            snprintf(tag, sizeof tag, "list %d (n %d, bsz %zu, align %zu, bpg %d) world %d", li, n,
                     bsz, align, bpg, world);
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
        for (int p = 0; p < n; p++) s[p] = (LayoutParamSpec){"odd", 1 + rng_u64(&rng) % 3000, 1};
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
    LayoutParamSpec big[4] = {{"wte", 50304ull * 12288, 1},
                              {"huge", 3000000000ull * 7, 1},
                              {"bias", 7, 0},
                              {"w", 12288ull * 49152, 1}};
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
    printf("random: %ld layouts, %ld pieces, %ld parameter elements marked, max padding %.1f%%\n",
           st.layouts, st.pieces, st.elements, st.max_pad_pct);
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
    LayoutParamSpec ok[2] = {{"x", 10, 0}, {"y", 20, 1}};
    LayoutParamSpec zero[2] = {{"x", 10, 0}, {"zero_param", 0, 1}};
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
        int rc = layout_build(&L, cases[i].s, cases[i].n, cases[i].bsz, cases[i].bpg,
                              cases[i].world, cases[i].align, err, sizeof err);
        CHECK(rc == -1, "bad %s: accepted", cases[i].what);
        CHECK(strstr(err, cases[i].needle) != NULL && strchr(err, '\n') == NULL,
              "bad %s: message '%s' should name '%s' on one line", cases[i].what, err,
              cases[i].needle);
        CHECK(L.params == NULL && L.pieces == NULL, "bad %s: layout not left empty", cases[i].what);
        layout_free(&L); /* must be safe on a failed build */
        if (i == 0) printf("rejected (%s): %s\n", cases[i].what, err);
    }
    /* NULL err buffer must not crash */
    CHECK(layout_build(&L, ok, 2, 100, 1, 0, 64, NULL, 0) == -1, "bad world with NULL err");
    /* size_t overflow: two params of SIZE_MAX/2 elements */
    LayoutParamSpec huge[2] = {{"h0", SIZE_MAX / 2, 0}, {"h1", SIZE_MAX / 2, 0}};
    int rc = layout_build(&L, huge, 2, 1, 1, 3, 64, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "too large"), "overflow not rejected: rc %d '%s'", rc, err);
    printf("rejected (overflow): %s\n", err);
    LayoutParamSpec one[1] = {{"h", SIZE_MAX - 10, 0}};
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
    printf("time %.2f s\n", wall_time_s() - t0);
    return test_done("test_layout");
}
