/* ddp/layout.h — the flat parameter/gradient buffer, its buckets and each
 * rank's shard of it. Pure arithmetic: no MPI, no device, unit-testable.
 *
 * Rules (docs/ARCHITECTURE.md names the terms; docs/ZERO.md explains them):
 *  - Parameters are placed in the order given (the caller gives them in the
 *    order backward finishes their gradients), each starting at an offset that
 *    is a multiple of `align` elements.
 *  - A bucket takes whole parameters until it holds at least `bucket_size`
 *    elements (its last bucket may hold less); its end is padded so that its
 *    length divides by lcm(world, 128). Bucket b covers
 *    [start, start + len); the gap left by aligning the next parameter, and
 *    the end padding, belong to the bucket and are never a parameter.
 *  - Rank r owns [start + r*len/world, start + (r+1)*len/world) of every
 *    bucket. A parameter may straddle two ranks' slices.
 *  - Pieces: the maximal runs where one parameter meets one rank's slice, in
 *    buffer order. Padding is never inside a piece. A rank's optimizer state
 *    holds its pieces back to back (state_off), with no padding.
 *  - Bucket groups: consecutive runs of `buckets_per_group` buckets whose
 *    reductions are launched together.
 *  - Row chunks: a spec with row_len > 0 that
 *    holds more than bucket_size elements is cut into consecutive chunks of
 *    whole rows (layout_chunk_rows), each a layout parameter of its own that
 *    starts its own bucket. Every chunk but the last has a length divisible
 *    by lcm(world, 128, align), so its bucket has no padding and the next
 *    chunk starts right where it ends: the chunks of a spec are ONE
 *    contiguous range of the flat buffer, in row order (whoever reads the
 *    tensor whole, e.g. the forward, sees no gap). The bucket closes after
 *    the last chunk too. So L->nparams may exceed the number of specs;
 *    params[i].spec and params[i].spec_off say where a parameter comes from.
 */
#ifndef DDP_LAYOUT_H
#define DDP_LAYOUT_H

#include <stddef.h>
#include "../kernels/kernels.h" /* OptPiece */

typedef struct {
    const char* name; /* for messages; not copied: must outlive the layout */
    size_t numel;     /* > 0 */
    int decay;        /* weight decay applies to it */
    /* optional (zero-initialise the specs): */
    size_t row_len;   /* > 0: a matrix of numel / row_len rows (row_len must divide numel)
                       * that may be cut into row chunks (see above); 0: never cut */
    size_t row_align; /* row chunks: their row counts are also multiples of this (0 or 1:
                       * no extra requirement), e.g. to keep a column slice of a GEMM
                       * operand aligned */
    int new_bucket;   /* 1: this parameter starts a new bucket (the one before closes) */
} LayoutParamSpec;

typedef struct {
    size_t offset; /* element offset of the parameter in the flat buffer */
    size_t numel;
    int bucket; /* the bucket that holds it */
    int decay;
    int spec;         /* the spec it comes from (its index in layout_build's specs) */
    size_t spec_off;  /* element offset inside that spec's parameter: 0, or where this row
                       * chunk starts (a multiple of row_len) */
    const char* name; /* the spec's name (not copied; may be NULL) */
} LayoutParam;

typedef struct {
    size_t start;     /* element offset of the bucket */
    size_t len;       /* padded length: divisible by lcm(world, 128) */
    size_t slice_len; /* len / world */
    int first_param;  /* parameters [first_param, first_param + nparams) */
    int nparams;
    int group; /* the bucket group it belongs to */
} LayoutBucket;

typedef struct {
    int param;        /* index into params */
    size_t param_off; /* element offset inside the parameter */
    size_t buf_off;   /* element offset in the flat buffer */
    size_t len;
    size_t state_off; /* offset in the owner's optimizer state */
    int owner;        /* the rank whose slice holds it */
    int decay;
} LayoutPiece;

typedef struct {
    int world;
    size_t align, bucket_size;
    int nparams;
    LayoutParam* params;
    int nbuckets;
    LayoutBucket* buckets;
    int ngroups;
    int* group_first_bucket; /* [ngroups + 1]: group g = buckets [gfb[g], gfb[g+1]) */
    size_t total;            /* elements in the flat buffer, padding included */
    size_t total_params;     /* sum of numel */
    /* every piece of every rank, sorted by (owner, buf_off); pieces of rank r
     * are pieces[rank_first_piece[r] .. rank_first_piece[r+1]) */
    int npieces;
    LayoutPiece* pieces;
    int* rank_first_piece; /* [world + 1] */
    size_t* rank_owned;    /* [world]: parameter elements rank r owns */
    int nspecs;            /* specs it was built from; <= nparams */
} Layout;

/* Builds the layout from nspecs specs (L->nparams counts the parameters
 * after row chunks are cut). Returns 0, or -1 with a one-line reason in err
 * (which has errlen bytes) for invalid arguments (world < 1, align < 1,
 * bucket_size < 1, nspecs < 1, a zero numel, bucket_per_group < 1, a
 * row_len that does not divide numel) and for a layout too large for size_t;
 * on -1, L is zeroed (nothing to free). */
int layout_build(Layout* L, const LayoutParamSpec* specs, int nspecs, size_t bucket_size, int buckets_per_group,
                 int world, size_t align, char* err, size_t errlen);
void layout_free(Layout* L);

/* The pieces rank r owns, as OptPieces (state_off in r's state, grad_off =
 * buf_off: the gradients in a full flat buffer), in a newly allocated array;
 * *n receives the count. rank = -1 gives the pieces of the whole buffer as one
 * rank would own them (DDP: full optimizer state on every rank), with
 * state_off running over all parameters. Caller frees. */
OptPiece* layout_opt_pieces(const Layout* L, int rank, int* n);

/* Parameter elements owned by rank r (sum of its pieces' lengths). */
size_t layout_owned(const Layout* L, int rank);

/* Print the layout summary (buckets, padding, per-rank ownership) to f. */
void layout_print(const Layout* L, FILE* f);

/* ---- The gradient shard (ZeRO-2) ----
 * A rank that keeps only its own slice of every bucket's gradient stores the
 * slices back to back in a "shard": bucket b's slice starts at
 * shard_off[b] = the sum of slice_len over the buckets before b, and the
 * shard holds shard_off[nbuckets] = total / world elements. */
size_t* layout_shard_offsets(const Layout* L); /* [nbuckets + 1]; caller frees */
/* Rank r's pieces, exactly as layout_opt_pieces(L, r) (same order, buf_off,
 * length, state_off, decay), but with grad_off the element offset of the
 * piece's gradient in r's shard. */
OptPiece* layout_shard_pieces(const Layout* L, int rank, int* n);

/* ---- Row chunks ----
 * The rows per chunk when a spec of `rows` rows of row_len elements (row
 * alignment row_align, as in the spec) is laid out with (bucket_size, world,
 * align); `rows` itself when it is not cut (rows * row_len <= bucket_size).
 * The unit U is the smallest row count whose length divides by
 * M = lcm(world, 128, align), made a multiple of row_align as well; a chunk
 * is the largest multiple of U whose length is at most bucket_size (at least
 * U), but never so small that the spec needs more than LAYOUT_MAX_ROW_CHUNKS
 * chunks (each chunk costs a collective and, in the model, a kernel call or
 * two: a tiny --bucket_size must not turn a 50k-row embedding into thousands
 * of buckets). Returns 0 if the arithmetic overflows size_t. */
#define LAYOUT_MAX_ROW_CHUNKS 32
size_t layout_chunk_rows(size_t rows, size_t row_len, size_t row_align, size_t bucket_size, int world,
                         size_t align);

#endif
