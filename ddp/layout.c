/* ddp/layout.c — builds the flat parameter/gradient buffer layout declared in
 * ddp/layout.h: parameter offsets, buckets, bucket groups, each rank's slice
 * and the pieces (parameter x rank slice) that the optimizer works on.
 *
 * Placement, as implemented here:
 *  - The first parameter of a bucket sits at the bucket start; each further
 *    parameter at the smallest multiple of `align` at or after the end of the
 *    previous one.
 *  - A bucket closes as soon as (end of its last parameter - its start)
 *    >= bucket_size, or when the parameters run out.
 *  - Its length is then padded up to a multiple of M = lcm(world, 128, align).
 *    lcm(world, 128) is what the header requires (equal, 128-aligned rank
 *    slices); folding `align` into M makes every bucket start, and so the
 *    first parameter of every bucket, a multiple of `align` as well. With the
 *    usual power-of-two align <= 128, M is just lcm(world, 128).
 *  - A spec with row_len > 0 and more than bucket_size elements is first
 *    expanded into its row chunks (layout_chunk_rows): each chunk closes the
 *    bucket before it and its own; a chunk's length is a multiple of M, so
 *    its bucket is exactly the chunk and the next chunk starts at its end.
 *    A spec's new_bucket flag closes the bucket before it.
 * All arithmetic is on size_t with explicit overflow checks: a layout that
 * would not fit in size_t (or more pieces than an int counts) is rejected. */
#include "layout.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

static void layout_set_err(char* err, size_t errlen, const char* fmt, ...) PRINTF_LIKE(3, 4);
static void layout_set_err(char* err, size_t errlen, const char* fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static size_t layout_gcd(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* lcm(a, b) into *out; returns 0 on overflow. a, b >= 1. */
static int layout_lcm(size_t a, size_t b, size_t* out) {
    size_t q = a / layout_gcd(a, b);
    if (q > SIZE_MAX / b) return 0;
    *out = q * b;
    return 1;
}

/* Smallest multiple of m that is >= x, into *out; returns 0 on overflow. */
static int layout_round_up(size_t x, size_t m, size_t* out) {
    size_t r = x % m;
    if (r == 0) {
        *out = x;
        return 1;
    }
    size_t add = m - r;
    if (x > SIZE_MAX - add) return 0;
    *out = x + add;
    return 1;
}

static const char* layout_pname(const LayoutParamSpec* s, int i, char* buf, size_t n) {
    if (s->name) return s->name;
    snprintf(buf, n, "#%d", i);
    return buf;
}

/* The arguments layout_build takes, checked: 0, or -1 with the error. */
static int layout_check_args(const LayoutParamSpec* specs, int nspecs, size_t bucket_size,
                             int buckets_per_group, int world, size_t align, char* err, size_t errlen) {
    if (world < 1) {
        layout_set_err(err, errlen, "layout: world size %d must be >= 1", world);
        return -1;
    }
    if (align < 1) {
        layout_set_err(err, errlen, "layout: align must be >= 1 element");
        return -1;
    }
    if (bucket_size < 1) {
        layout_set_err(err, errlen, "layout: bucket_size must be >= 1 element");
        return -1;
    }
    if (buckets_per_group < 1) {
        layout_set_err(err, errlen, "layout: buckets_per_group %d must be >= 1", buckets_per_group);
        return -1;
    }
    if (nspecs < 1 || !specs) {
        layout_set_err(err, errlen, "layout: need at least one parameter (got %d)", nspecs);
        return -1;
    }
    char nbuf[32];
    for (int i = 0; i < nspecs; i++) {
        if (specs[i].numel == 0) {
            layout_set_err(err, errlen, "layout: parameter %s has zero elements",
                           layout_pname(&specs[i], i, nbuf, sizeof nbuf));
            return -1;
        }
        if (specs[i].row_len && specs[i].numel % specs[i].row_len != 0) {
            layout_set_err(err, errlen,
                           "layout: parameter %s has %zu elements, not a multiple of its row length %zu",
                           layout_pname(&specs[i], i, nbuf, sizeof nbuf), specs[i].numel, specs[i].row_len);
            return -1;
        }
    }
    return 0;
}

/* Step 1: the specs expanded into layout parameters. A spec cut into row
 * chunks gives one parameter per chunk (spec_off = its first element), each
 * with a bucket break before it, and a break after the last one. On success
 * *params [count] and *brk [count + 1] (1: a bucket starts at this param) are
 * allocated and the count is returned; -1: too large. */
static int layout_expand_specs(const LayoutParamSpec* specs, int nspecs, size_t bucket_size, int world,
                               size_t align, LayoutParam** params_out, unsigned char** brk_out) {
    size_t* chunk_rows = xcalloc((size_t)nspecs, sizeof *chunk_rows); /* 0: not cut */
    size_t nexp = 0;
    for (int s = 0; s < nspecs; s++) {
        size_t rl = specs[s].row_len;
        size_t rows = rl ? specs[s].numel / rl : 0;
        size_t cr = rl ? layout_chunk_rows(rows, rl, specs[s].row_align, bucket_size, world, align) : 1;
        if (cr == 0) {
            free(chunk_rows);
            return -1;
        }
        if (rl && cr < rows) {
            chunk_rows[s] = cr;
            nexp += (rows + cr - 1) / cr;
        } else {
            nexp++;
        }
    }
    if (nexp > (size_t)INT_MAX) {
        free(chunk_rows);
        return -1;
    }
    LayoutParam* params = xcalloc(nexp, sizeof *params);
    unsigned char* brk = xcalloc(nexp + 1, 1);
    int k = 0;
    for (int s = 0; s < nspecs; s++) {
        if (specs[s].new_bucket) brk[k] = 1;
        size_t rl = specs[s].row_len, cr = chunk_rows[s];
        size_t rows = cr ? specs[s].numel / rl : 1, chunk = cr ? cr * rl : specs[s].numel;
        for (size_t r0 = 0; r0 < rows; r0 += cr ? cr : 1) {
            size_t off = r0 * (cr ? rl : 0);
            if (cr) brk[k] = 1;
            params[k].numel = specs[s].numel - off < chunk ? specs[s].numel - off : chunk;
            params[k].spec = s;
            params[k].spec_off = off;
            params[k].name = specs[s].name;
            params[k].decay = specs[s].decay;
            k++;
        }
        if (cr) brk[k] = 1; /* the bucket closes after the last chunk */
    }
    free(chunk_rows);
    *params_out = params;
    *brk_out = brk;
    return (int)nexp;
}

/* Step 2: offsets and buckets (the placement rules at the top of this file);
 * fills L->params' offset and bucket, L->buckets, L->nbuckets, L->total and
 * L->total_params. 0, or -1: too large. */
static int layout_place(Layout* L, const unsigned char* brk, size_t m, int buckets_per_group) {
    LayoutParam* params = L->params;
    const int nparams = L->nparams;
    LayoutBucket* buckets = xcalloc((size_t)nparams, sizeof *buckets); /* at most one per param */
    L->buckets = buckets;
    size_t bstart = 0;
    int i = 0;
    while (i < nparams) {
        LayoutBucket* B = &buckets[L->nbuckets];
        B->start = bstart;
        B->first_param = i;
        size_t end = bstart; /* end of the last parameter placed in this bucket */
        for (;;) {
            size_t off = end;
            if (i > B->first_param && !layout_round_up(end, L->align, &off)) return -1;
            if (off > SIZE_MAX - params[i].numel) return -1;
            params[i].offset = off;
            params[i].bucket = L->nbuckets;
            end = off + params[i].numel;
            L->total_params += params[i].numel; /* <= end, cannot overflow */
            i++;
            if (end - bstart >= L->bucket_size || i == nparams || brk[i]) break;
        }
        size_t bend;
        if (!layout_round_up(end, m, &bend)) return -1;
        B->len = bend - bstart;
        B->slice_len = B->len / (size_t)L->world;
        B->nparams = i - B->first_param;
        B->group = L->nbuckets / buckets_per_group;
        L->nbuckets++;
        bstart = bend;
    }
    L->total = bstart;
    return 0;
}

/* Step 3: the pieces (a parameter meets owners r0..r1 of its bucket):
 * counted, then filled in buffer order and sorted stably by owner with a
 * counting sort; fills L->pieces, npieces, rank_first_piece, rank_owned.
 * 0, or -1: more pieces than an int counts. */
static int layout_cut_pieces(Layout* L) {
    const int world = L->world;
    const LayoutParam* params = L->params;
    size_t* count = xcalloc((size_t)world + 1, sizeof *count);
    size_t np = 0;
    for (int p = 0; p < L->nparams; p++) {
        const LayoutBucket* B = &L->buckets[params[p].bucket];
        size_t r0 = (params[p].offset - B->start) / B->slice_len;
        size_t r1 = (params[p].offset + params[p].numel - 1 - B->start) / B->slice_len;
        np += r1 - r0 + 1;
        for (size_t r = r0; r <= r1; r++) count[r]++;
    }
    if (np > (size_t)INT_MAX || (size_t)world + 1 > SIZE_MAX / sizeof(int)) {
        free(count);
        return -1;
    }
    int* first = xmalloc(((size_t)world + 1) * sizeof *first);
    size_t* owned = xcalloc((size_t)world, sizeof *owned);
    size_t* next_state = xcalloc((size_t)world, sizeof *next_state);
    LayoutPiece* pieces = xcalloc(np, sizeof *pieces);
    size_t acc = 0;
    for (int r = 0; r < world; r++) {
        first[r] = (int)acc;
        acc += count[r];
        count[r] = (size_t)first[r]; /* now: next free slot of rank r */
    }
    first[world] = (int)acc;
    for (int p = 0; p < L->nparams; p++) {
        const LayoutBucket* B = &L->buckets[params[p].bucket];
        size_t x = params[p].offset, pend = params[p].offset + params[p].numel;
        while (x < pend) {
            size_t r = (x - B->start) / B->slice_len;
            size_t slice_end = B->start + (r + 1) * B->slice_len; /* <= B->start + len */
            size_t e = pend < slice_end ? pend : slice_end;
            LayoutPiece* P = &pieces[count[r]++];
            P->param = p;
            P->param_off = x - params[p].offset;
            P->buf_off = x;
            P->len = e - x;
            P->state_off = next_state[r];
            P->owner = (int)r;
            P->decay = params[p].decay;
            next_state[r] += P->len;
            owned[r] += P->len;
            x = e;
        }
    }
    free(count);
    free(next_state);
    L->npieces = (int)np;
    L->pieces = pieces;
    L->rank_first_piece = first;
    L->rank_owned = owned;
    return 0;
}

int layout_build(Layout* L, const LayoutParamSpec* specs, int nspecs, size_t bucket_size, int buckets_per_group,
                 int world, size_t align, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!L) {
        layout_set_err(err, errlen, "layout: no Layout to fill");
        return -1;
    }
    memset(L, 0, sizeof *L);
    if (layout_check_args(specs, nspecs, bucket_size, buckets_per_group, world, align, err, errlen) != 0)
        return -1;
    size_t m; /* every bucket length is a multiple of m */
    if (!layout_lcm((size_t)world, 128, &m) || !layout_lcm(m, align, &m)) {
        layout_set_err(err, errlen, "layout: lcm(world %d, 128, align %zu) overflows size_t", world, align);
        return -1;
    }
    L->world = world;
    L->align = align;
    L->bucket_size = bucket_size;
    L->nspecs = nspecs;
    unsigned char* brk = NULL;
    L->nparams = layout_expand_specs(specs, nspecs, bucket_size, world, align, &L->params, &brk);
    int rc = L->nparams < 0 ? -1 : layout_place(L, brk, m, buckets_per_group);
    if (rc == 0) rc = layout_cut_pieces(L);
    free(brk);
    if (rc != 0) {
        free(L->params);
        free(L->buckets);
        memset(L, 0, sizeof *L);
        layout_set_err(err, errlen,
                       "layout: the flat buffer (%d parameters, world %d, align %zu) is too large to "
                       "address with size_t",
                       nspecs, world, align);
        return -1;
    }
    L->ngroups = (L->nbuckets + buckets_per_group - 1) / buckets_per_group;
    L->group_first_bucket = xmalloc(((size_t)L->ngroups + 1) * sizeof *L->group_first_bucket);
    for (int g = 0; g < L->ngroups; g++) L->group_first_bucket[g] = g * buckets_per_group;
    L->group_first_bucket[L->ngroups] = L->nbuckets;
    return 0;
}

void layout_free(Layout* L) {
    if (!L) return;
    free(L->params);
    free(L->buckets);
    free(L->group_first_bucket);
    free(L->pieces);
    free(L->rank_first_piece);
    free(L->rank_owned);
    memset(L, 0, sizeof *L);
}

OptPiece* layout_opt_pieces(const Layout* L, int rank, int* n) {
    if (!L || !L->params) fatal("layout_opt_pieces: the layout was not built");
    if (rank < -1 || rank >= L->world) fatal("layout_opt_pieces: rank %d is outside [-1, %d)", rank, L->world);
    if (rank == -1) {
        OptPiece* out = xmalloc((size_t)L->nparams * sizeof *out);
        size_t state = 0;
        for (int p = 0; p < L->nparams; p++) {
            out[p].buf_off = L->params[p].offset;
            out[p].grad_off = L->params[p].offset;
            out[p].rng_off = L->params[p].offset;
            out[p].state_off = state;
            out[p].len = L->params[p].numel;
            out[p].decay = L->params[p].decay;
            state += L->params[p].numel;
        }
        if (n) *n = L->nparams;
        return out;
    }
    int a = L->rank_first_piece[rank], b = L->rank_first_piece[rank + 1];
    OptPiece* out = xmalloc((size_t)(b - a) * sizeof *out); /* non-NULL even when empty */
    for (int k = a; k < b; k++) {
        out[k - a].buf_off = L->pieces[k].buf_off;
        out[k - a].grad_off = L->pieces[k].buf_off;
        out[k - a].rng_off = L->pieces[k].buf_off;
        out[k - a].state_off = L->pieces[k].state_off;
        out[k - a].len = L->pieces[k].len;
        out[k - a].decay = L->pieces[k].decay;
    }
    if (n) *n = b - a;
    return out;
}

size_t layout_owned(const Layout* L, int rank) {
    if (!L || !L->rank_owned) fatal("layout_owned: the layout was not built");
    if (rank < 0 || rank >= L->world) fatal("layout_owned: rank %d is outside [0, %d)", rank, L->world);
    return L->rank_owned[rank];
}

void layout_print(const Layout* L, FILE* f) {
    if (!L || !L->params) {
        fprintf(f, "layout: (not built)\n");
        return;
    }
    size_t pad = L->total - L->total_params;
    double pct = L->total ? 100.0 * (double)pad / (double)L->total : 0.0;
    size_t bmin = SIZE_MAX, bmax = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        if (L->buckets[b].len < bmin) bmin = L->buckets[b].len;
        if (L->buckets[b].len > bmax) bmax = L->buckets[b].len;
    }
    fprintf(f,
            "layout: %d params, %d buckets (len %zu..%zu) in %d groups, world %d, align %zu, "
            "bucket_size %zu\n",
            L->nparams, L->nbuckets, bmin, bmax, L->ngroups, L->world, L->align, L->bucket_size);
    fprintf(f, "layout: %zu elements = %zu params + %zu padding (%.2f%%), %d pieces\n", L->total,
            L->total_params, pad, pct, L->npieces);
    if (L->nparams > L->nspecs) {
        /* the row-chunked specs: how many chunks of how many rows */
        for (int p = 0; p < L->nparams;) {
            int q = p;
            while (q + 1 < L->nparams && L->params[q + 1].spec == L->params[p].spec) q++;
            if (q > p)
                fprintf(f, "layout: %s cut into %d row chunks of %zu elements (last %zu), a bucket each\n",
                        L->params[p].name ? L->params[p].name : "a parameter", q - p + 1, L->params[p].numel,
                        L->params[q].numel);
            p = q + 1;
        }
    }
    if (L->world <= 8) {
        fprintf(f, "layout: owned per rank:");
        for (int r = 0; r < L->world; r++) fprintf(f, " r%d=%zu", r, L->rank_owned[r]);
        fprintf(f, "\n");
    } else {
        int rmin = 0, rmax = 0;
        for (int r = 1; r < L->world; r++) {
            if (L->rank_owned[r] < L->rank_owned[rmin]) rmin = r;
            if (L->rank_owned[r] > L->rank_owned[rmax]) rmax = r;
        }
        fprintf(f, "layout: owned per rank: min %zu (rank %d), max %zu (rank %d), mean %.1f\n",
                L->rank_owned[rmin], rmin, L->rank_owned[rmax], rmax,
                (double)L->total_params / (double)L->world);
    }
}

/* ---- ZeRO-2 shard arithmetic (see layout.h) ---- */

size_t* layout_shard_offsets(const Layout* L) {
    if (!L || !L->buckets) fatal("layout_shard_offsets: the layout was not built");
    size_t* off = xmalloc(((size_t)L->nbuckets + 1) * sizeof *off);
    size_t s = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        off[b] = s;
        s += L->buckets[b].slice_len;
    }
    off[L->nbuckets] = s;
    return off;
}

OptPiece* layout_shard_pieces(const Layout* L, int rank, int* n) {
    if (rank < 0 || rank >= L->world) fatal("layout_shard_pieces: rank %d is outside [0, %d)", rank, L->world);
    size_t* off = layout_shard_offsets(L);
    int np;
    OptPiece* out = layout_opt_pieces(L, rank, &np);
    int a = L->rank_first_piece[rank];
    for (int k = 0; k < np; k++) {
        const LayoutPiece* pc = &L->pieces[a + k];
        int b = L->params[pc->param].bucket;
        const LayoutBucket* bk = &L->buckets[b];
        size_t slice_start = bk->start + (size_t)rank * bk->slice_len;
        if (pc->buf_off < slice_start || pc->buf_off + pc->len > slice_start + bk->slice_len)
            fatal("internal: piece %d of rank %d lies outside its slice of bucket %d", k, rank, b);
        out[k].grad_off = off[b] + (pc->buf_off - slice_start);
    }
    free(off);
    if (n) *n = np;
    return out;
}

/* ---- row chunks (see layout.h) ---- */

size_t layout_chunk_rows(size_t rows, size_t row_len, size_t row_align, size_t bucket_size, int world,
                         size_t align) {
    if (rows == 0 || row_len == 0 || world < 1 || align < 1) return rows;
    if (rows > SIZE_MAX / row_len) return 0;
    if (rows * row_len <= bucket_size) return rows; /* fits one bucket: not cut */
    size_t m, u;
    if (!layout_lcm((size_t)world, 128, &m) || !layout_lcm(m, align, &m)) return 0;
    /* smallest u with u * row_len divisible by m */
    u = m / layout_gcd(m, row_len);
    if (row_align > 1 && !layout_lcm(u, row_align, &u)) return 0;
    if (u > SIZE_MAX / row_len) return 0;
    /* largest multiple of u whose length is at most bucket_size, at least u */
    size_t cr = bucket_size / row_len / u * u;
    if (cr < u) cr = u;
    /* at most LAYOUT_MAX_ROW_CHUNKS chunks */
    size_t few;
    if (!layout_round_up((rows + LAYOUT_MAX_ROW_CHUNKS - 1) / LAYOUT_MAX_ROW_CHUNKS, u, &few)) return 0;
    if (few > cr) cr = few;
    return cr < rows ? cr : rows;
}
