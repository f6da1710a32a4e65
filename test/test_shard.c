/* test/test_shard.c — the ZeRO-2 gradient shard arithmetic and AdamW reading
 * the shard:
 *  - layout_shard_offsets / layout_shard_pieces for many random parameter
 *    lists, bucket sizes, aligns and world sizes 1..16, against an
 *    independent recomputation (find each piece's bucket by scanning the
 *    bucket ranges, add up the slice lengths before it): param offsets,
 *    lengths, state offsets and decay as layout_opt_pieces, gradient offsets
 *    (grad_off) inside the rank's
 *    slice of the shard, no element covered twice, as many covered as the
 *    rank owns, shard length = total / world;
 *  - optimizer_step over the shard pieces with the gradients in a shard (CPU
 *    backend) against the same step over layout_opt_pieces reading a
 *    full-size gradient buffer: bit-identical params and master weights,
 *    over several steps, ranks and world sizes;
 *  - a hand-computed case. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../ddp/layout.h"
#include "../kernels/kernels.h"
#include "../zero/optimizer.h"
#include "test.h"

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static size_t rnd_in(size_t lo, size_t hi) { return lo + (size_t)(rnd() % (hi - lo + 1)); }

static int build_random(Layout* L, LayoutParamSpec* specs, int* np, int world) {
    *np = (int)rnd_in(1, 30);
    for (int i = 0; i < *np; i++) {
        memset(&specs[i], 0, sizeof specs[i]);
        specs[i].name = "p";
        specs[i].numel = rnd() % 4 == 0 ? rnd_in(1, 20) : rnd_in(1, 3000);
        specs[i].decay = (int)(rnd() & 1);
        if (rnd() % 8 == 0) { /* a matrix the layout may cut into row chunks (ZeRO-2's wte) */
            specs[i].row_len = rnd_in(1, 64);
            specs[i].numel = specs[i].row_len * rnd_in(1, 400);
            specs[i].row_align = rnd() % 2 ? 0 : 8;
        }
    }
    size_t bucket = rnd() % 3 == 0 ? 1000000 : rnd_in(1, 6000);
    size_t align = rnd() % 2 ? 64 : rnd_in(1, 16);
    char err[256];
    return layout_build(L, specs, *np, bucket, (int)rnd_in(1, 3), world, align, err, sizeof err);
}

static void test_random_layouts(void) {
    int configs = 0;
    for (int it = 0; it < 400; it++) {
        LayoutParamSpec specs[32];
        int np;
        Layout L;
        int world = (int)rnd_in(1, 16);
        if (build_random(&L, specs, &np, world) != 0) {
            CHECK(0, "random layout %d rejected", it);
            continue;
        }
        configs++;
        size_t* off = layout_shard_offsets(&L);
        /* independent: slice lengths added up */
        size_t acc = 0;
        for (int b = 0; b < L.nbuckets; b++) {
            CHECK(off[b] == acc, "it %d: shard_off[%d] = %zu, expected %zu", it, b, off[b], acc);
            acc += L.buckets[b].len / (size_t)world;
        }
        CHECK(off[L.nbuckets] == acc && acc * (size_t)world == L.total,
              "it %d: shard length %zu, total %zu, world %d", it, off[L.nbuckets], L.total, world);
        unsigned char* seen = calloc(acc ? acc : 1, 1);
        for (int r = 0; r < world; r++) {
            int n1, n2;
            OptPiece* op = layout_opt_pieces(&L, r, &n1);
            OptPiece* sp = layout_shard_pieces(&L, r, &n2);
            CHECK(n1 == n2, "it %d rank %d: %d shard pieces for %d pieces", it, r, n2, n1);
            size_t covered = 0;
            for (int k = 0; k < n1 && k < n2; k++) {
                CHECK(sp[k].buf_off == op[k].buf_off && sp[k].len == op[k].len &&
                          sp[k].state_off == op[k].state_off && sp[k].decay == op[k].decay,
                      "it %d rank %d piece %d: fields differ from layout_opt_pieces", it, r, k);
                int b = -1;
                for (int bb = 0; bb < L.nbuckets; bb++)
                    if (op[k].buf_off >= L.buckets[bb].start &&
                        op[k].buf_off < L.buckets[bb].start + L.buckets[bb].len)
                        b = bb;
                if (b < 0) {
                    CHECK(0, "it %d: piece outside every bucket", it);
                    continue;
                }
                size_t slice = L.buckets[b].len / (size_t)world;
                size_t sstart = L.buckets[b].start + (size_t)r * slice;
                size_t base = 0;
                for (int bb = 0; bb < b; bb++) base += L.buckets[bb].len / (size_t)world;
                size_t want = base + (op[k].buf_off - sstart);
                CHECK(op[k].buf_off >= sstart && op[k].buf_off + op[k].len <= sstart + slice,
                      "it %d rank %d piece %d: outside the rank's slice", it, r, k);
                CHECK(sp[k].grad_off == want, "it %d rank %d piece %d: shard offset %zu, expected %zu", it, r,
                      k, sp[k].grad_off, want);
                CHECK(sp[k].grad_off >= base && sp[k].grad_off + sp[k].len <= base + slice,
                      "it %d rank %d piece %d: outside the bucket's part of the shard", it, r, k);
                int twice = 0;
                for (size_t e = 0; e < sp[k].len && sp[k].grad_off + e < acc; e++) {
                    if (seen[sp[k].grad_off + e] == (unsigned char)(r + 1)) twice = 1;
                    seen[sp[k].grad_off + e] = (unsigned char)(r + 1);
                }
                CHECK(!twice, "it %d rank %d piece %d: shard element covered twice", it, r, k);
                covered += sp[k].len;
            }
            CHECK(covered == layout_owned(&L, r), "it %d rank %d: %zu shard elements for %zu owned", it, r,
                  covered, layout_owned(&L, r));
            free(op);
            free(sp);
        }
        free(seen);
        free(off);
        layout_free(&L);
    }
    printf("shard arithmetic: %d random layouts, world 1..16\n", configs);
}

/* hand-computed: 3 params of 100, 300, 50 elements, align 1, bucket_size
 * 250, world 2: bucket 0 = p0 + p1 (400 -> padded to 512, slices of 256),
 * bucket 1 = p2 (50 -> 128, slices of 64). Shard: bucket 0 at 0, bucket 1
 * at 256; 320 elements. Rank 1 owns [256, 512) of bucket 0 (p1 elements
 * 156..299, at buffer 256..399) and [448, 512) of bucket 1 (padding only). */
static void test_hand(void) {
    LayoutParamSpec specs[3] = {{.name = "a", .numel = 100, .decay = 1},
                                {.name = "b", .numel = 300, .decay = 0},
                                {.name = "c", .numel = 50, .decay = 1}};
    Layout L;
    char err[256];
    if (layout_build(&L, specs, 3, 250, 1, 2, 1, err, sizeof err) != 0) {
        CHECK(0, "hand layout: %s", err);
        return;
    }
    size_t* off = layout_shard_offsets(&L);
    CHECK(L.nbuckets == 2 && off[0] == 0 && off[1] == 256 && off[2] == 320,
          "hand: %d buckets, shard offsets %zu %zu %zu (expected 0 256 320)", L.nbuckets, off[0], off[1],
          off[2]);
    int n;
    OptPiece* sp = layout_shard_pieces(&L, 1, &n);
    CHECK(n == 1 && sp[0].grad_off == 0 && sp[0].len == 144 && sp[0].state_off == 0,
          "hand rank 1: %d pieces, first (shard %zu, len %zu, state %zu), expected 1 (0, 144, 0)", n,
          n ? sp[0].grad_off : 0, n ? sp[0].len : 0, n ? sp[0].state_off : 0);
    free(sp);
    sp = layout_shard_pieces(&L, 0, &n);
    /* rank 0: p0 [0,100) -> shard 0, p1 [100,256) -> shard 100, p2 [384,434) -> shard 256 + 0 */
    CHECK(n == 3 && sp[0].grad_off == 0 && sp[0].len == 100 && sp[1].grad_off == 100 && sp[1].len == 156 &&
              sp[2].grad_off == 256 && sp[2].len == 50,
          "hand rank 0: %d pieces, wrong shard offsets or lengths", n);
    free(sp);
    free(off);
    layout_free(&L);
}

/* AdamW reading the shard == AdamW reading the full buffer, bit for bit. */
static void test_optimizer(void) {
    Backend* be = backend_cpu_create();
    int cases = 0, bad = 0;
    for (int it = 0; it < 40; it++) {
        LayoutParamSpec specs[32];
        int np;
        Layout L;
        int world = (int)rnd_in(1, 6);
        if (build_random(&L, specs, &np, world) != 0) continue;
        int r = (int)rnd_in(0, (size_t)world - 1);
        size_t total = L.total;
        float* p_init = xmalloc(total * sizeof(float));
        for (size_t i = 0; i < total; i++) p_init[i] = (float)((double)(rnd() % 20001) / 10000.0 - 1.0);
        float* pA = xmalloc(total * sizeof(float));
        float* pB = xmalloc(total * sizeof(float));
        memcpy(pA, p_init, total * sizeof(float));
        memcpy(pB, p_init, total * sizeof(float));
        float* gfull = xcalloc(total, sizeof(float));
        size_t* off = layout_shard_offsets(&L);
        size_t shard_n = off[L.nbuckets];
        float* gshard = xcalloc(shard_n ? shard_n : 1, sizeof(float));
        int n1, n2;
        OptPiece* opA = layout_opt_pieces(&L, r, &n1);
        OptPiece* sp = layout_shard_pieces(&L, r, &n2);
        Optimizer A, B;
        optimizer_init(&A, be, &(OptBuffer){.params = pA, .grads = gfull, .pieces = opA, .npieces = n1}, 1);
        optimizer_init(&B, be, &(OptBuffer){.params = pB, .grads = gshard, .pieces = sp, .npieces = n2}, 1);
        for (int step = 0; step < 3; step++) {
            for (size_t i = 0; i < total; i++) gfull[i] = (float)((double)(rnd() % 20001) / 1e5 - 0.1);
            for (int k = 0; k < n1; k++) /* the rank's gradients, copied into its shard */
                memcpy(gshard + B.bufs[0].pieces[k].grad_off, gfull + A.bufs[0].pieces[k].grad_off,
                       B.bufs[0].pieces[k].len * sizeof(float));
            optimizer_step(&A, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 11u + (uint32_t)step);
            optimizer_step(&B, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 11u + (uint32_t)step);
        }
        int same = memcmp(pA, pB, total * sizeof(float)) == 0 &&
                   (A.nstate == 0 || memcmp(A.master, B.master, A.nstate * sizeof(float)) == 0);
        /* and the update really happened on the owned elements */
        int moved = 0;
        for (int k = 0; k < n1; k++)
            for (size_t e = 0; e < A.bufs[0].pieces[k].len; e++)
                if (pA[A.bufs[0].pieces[k].buf_off + e] != p_init[A.bufs[0].pieces[k].buf_off + e]) moved = 1;
        CHECK(same, "optimizer case %d (world %d, rank %d): shard step differs from full-buffer step", it,
              world, r);
        CHECK(n1 == 0 || moved, "optimizer case %d: nothing was updated", it);
        if (!same) bad++;
        cases++;
        optimizer_free(&A);
        optimizer_free(&B);
        free(off);
        free(p_init);
        free(pA);
        free(pB);
        free(gfull);
        free(gshard);
        layout_free(&L);
    }
    printf("AdamW from the shard vs the full buffer: %d cases, %d differ\n", cases, bad);
    be->destroy(be);
}

int main(void) {
    test_hand();
    test_random_layouts();
    test_optimizer();
    return test_done("test_shard");
}
