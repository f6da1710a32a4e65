/* ddp/bucket.h — a bucket of a model chunk's flat buffers and a bucket group,
 * each holding its own communication state.
 *
 * A Bucket is one LayoutBucket (a contiguous range of the param and gradient
 * buffers) plus what DDP tracks about it during a step: how many of its
 * parameters are still to be marked ready, the handle of its gradient
 * reduction, the handle and position of its param all-gather, and under
 * ZeRO-2 the working buffers it writes and reduces from. A BucketGroup is a
 * run of consecutive buckets whose reductions launch together, once every
 * bucket in it is complete.
 *
 * The functions here act on one bucket and know nothing of the schedule: the
 * DDP (ddp.h) decides when they run. */
#ifndef DDP_BUCKET_H
#define DDP_BUCKET_H

#include "layout.h"
#include "../comm/comm.h"

typedef struct {
    int index;              /* its index in the layout */
    const LayoutBucket* lb; /* start, len, slice_len, its parameters */
    /* gradient reduction */
    int pending;        /* parameters not yet marked ready in this micro-step */
    int launched;       /* its reduction was launched in this micro-step */
    int nlaunch;        /* reductions launched since the last ddp_finish_reductions */
    CommHandle reduce;  /* all-reduce (stage 0) or reduce-scatter (stages 1, 2) */
    double launch_time; /* seconds after the start of the micro-step */
    /* param all-gather (stages 1, 2) */
    CommHandle gather;
    int gather_pending; /* in the last launch order and not yet waited for */
    int gather_pos;     /* its position in the last launch order */
    /* ZeRO-2 working buffers (indices into GradShard's pool; -1 = none) */
    int wslot; /* the one backward accumulates into this micro-step */
    int rslot; /* the one its in-flight reduce-scatter reads */
} Bucket;

typedef struct {
    int first, n; /* buckets [first, first + n) */
    int pending;  /* buckets not yet complete in this micro-step */
} BucketGroup;

/* Buckets and groups of a layout, their state reset (nothing pending or in
 * flight). Caller frees both arrays. */
Bucket* buckets_create(const Layout* L);
BucketGroup* bucket_groups_create(const Layout* L);

/* Start of a micro-step: every parameter pending, nothing launched. */
void bucket_begin_micro_step(Bucket* b);
void bucket_group_begin_micro_step(BucketGroup* g);

/* Launch the reduction of the bucket's gradients, grads = its len elements
 * of dtype (its range of the flat gradient buffer, or a ZeRO-2 working
 * buffer): all-reduce when allreduce, else reduce-scatter (this rank's slice
 * then holds the sum). Records the launch time against t0. */
void bucket_reduce_launch(Bucket* b, Comm* comm, void* grads, DType dt, int allreduce, double t0);

/* Launch the all-gather of the bucket's range of the param buffer. */
void bucket_gather_launch(Bucket* b, Comm* comm, void* params, DType dt);

#endif
