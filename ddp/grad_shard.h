/* ddp/grad_shard.h — ZeRO-2's gradient storage: this rank's shard of a model
 * chunk's gradients and the pool of per-bucket working buffers that backward
 * writes into.
 *
 * The shard is this rank's slice of every bucket back to back
 * (layout_shard_offsets): total / world elements, allocated here as
 * MEM_GRADS. At world 1 the shard is the whole gradient buffer and backward
 * accumulates straight into it (`direct`: no working buffers, no reductions).
 *
 * Otherwise each micro-step, for each bucket:
 *   grad_shard_acquire    before the first kernel that writes the bucket's
 *                         gradients: a zeroed working buffer from the pool;
 *   grad_shard_reduce     once the bucket is complete: its reduce-scatter is
 *                         launched from that buffer;
 *   (completion)          once the reduce-scatter is waited on, this rank's
 *                         reduced slice is added into the shard and the
 *                         buffer returns to the pool.
 * So accumulation over micro-steps is "reduce every micro-step, accumulate
 * the reduced slice": A micro-steps move A times stage 1's gradient bytes,
 * and no rank ever holds a full-size gradient buffer.
 *
 * Pool policy, deterministic (the same pool on every rank and every step): a
 * bucket needing a buffer takes the smallest free one that fits; if none is
 * free it first completes the oldest in-flight reduce-scatter when
 * GRAD_SHARD_INFLIGHT or more are in flight, else it allocates a new buffer
 * (sized for any bucket but the largest, or for the bucket itself if that is
 * larger). A bucket whose reduce-scatter of the previous micro-step is still
 * in flight completes it first, so reduced slices enter the shard in
 * micro-step order. The working set is the buckets one layer spans plus the
 * in-flight ones.
 *
 * Device ordering: every kernel here runs on the compute stream; comm_wait
 * makes it wait for the collective, so the add into the shard, the zeroing
 * for the next user and that user's kernels all follow the reduce-scatter. */
#ifndef DDP_GRAD_SHARD_H
#define DDP_GRAD_SHARD_H

#include "bucket.h"

/* In-flight reduce-scatters allowed before a bucket that needs a working
 * buffer completes the oldest instead of allocating another buffer. */
#define GRAD_SHARD_INFLIGHT 2

typedef struct {
    void* buf; /* backend memory, cap elements of be->dtype */
    size_t cap;
    int bucket; /* the bucket using it, -1 when free */
} WorkBuf;

typedef struct {
    const Layout* L;
    Comm* comm;
    Backend* be;
    void* shard; /* this rank's reduced gradients, elems elements */
    size_t* off; /* [nbuckets + 1]: bucket b's slice at shard + off[b] */
    size_t elems;
    int direct; /* world 1: backward accumulates into the shard itself */
    WorkBuf* pool;
    int npool;
    size_t cap;        /* capacity of a regular working buffer */
    size_t work_bytes; /* working buffers allocated */
    int* fifo;         /* [nbuckets] in-flight reduce-scatters, in launch order */
    int fifo_head, fifo_n;
} GradShard;

void grad_shard_init(GradShard* s, const Layout* L, Comm* comm, Backend* be);
/* The address backward accumulates layout parameter li's gradient at, once
 * its bucket holds a working buffer (or always, when direct). */
void* grad_shard_param_ptr(const GradShard* s, const Bucket* buckets, int li);
/* Give bucket b a zeroed working buffer (no-op if it has one or when direct). */
void grad_shard_acquire(GradShard* s, Bucket* buckets, int b);
/* Launch bucket b's reduce-scatter from its working buffer. */
void grad_shard_reduce(GradShard* s, Bucket* buckets, int b, double t0);
/* Complete every in-flight reduce-scatter (end of backward). */
void grad_shard_drain(GradShard* s, Bucket* buckets);
void grad_shard_zero(GradShard* s);
/* One line on this rank's gradient memory (shard and working buffers). */
void grad_shard_report(const GradShard* s, int rank, FILE* f);
void grad_shard_free(GradShard* s, Bucket* buckets);

#endif
