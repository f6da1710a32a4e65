/* ddp/ddp.h — bucketed gradient reduction overlapped with backward, the
 * ZeRO-1/2 parameter all-gather (optionally overlapped with the next
 * forward), and, at zero_stage 2, where the gradients live.
 *
 * Backward calls ddp_param_ready() for each tensor as its gradient becomes
 * final. Readiness is counted per parameter per micro-step (a parameter
 * marked twice in one micro-step is an internal error: the tied embedding,
 * or each of its row chunks, is marked once, after the encoder's backward of
 * its rows). As soon as every parameter of
 * every bucket of a bucket group is ready, the group's reductions are
 * launched at once on the communicator:
 *   zero_stage 0: all-reduce (sum) of each bucket;
 *   zero_stage 1: reduce-scatter (sum) of each bucket: rank r then holds
 *                 the reduced gradient of its slice;
 * on the LAST micro-step of a step only; earlier micro-steps only accumulate
 * (no communication).
 *   zero_stage 2: reduce-scatter of each bucket on EVERY micro-step (below).
 * Averaging happens exactly once, and before the reduction: the trainer
 * seeds backward with dloss = 1 / (tokens of the whole global batch), so each
 * rank's gradient is already its share of the global mean and the collective
 * is a plain sum. Every rank's gradient then carries the same scale as the
 * single-process run over the same global batch (1/(B*T*accum*N) rounded
 * once), and the results differ from it only by summation order; a
 * post-reduction 1/N (ncclAvg) would round differently from the
 * single-process run whenever N is not a power of two.
 *
 * ZeRO-2 (zero_stage 2). The persistent gradient storage, d->grads, is this
 * rank's SHARD: its slice of every bucket back to back (layout_shard_offsets),
 * total/N elements, allocated here as MEM_GRADS. Backward accumulates a
 * micro-step's gradients into per-bucket WORKING buffers from a pool: the
 * model's need_grads hook (ddp_need_grads) hands a bucket a zeroed buffer
 * before the first kernel that writes into it and points the model's
 * grad_ptr entries of its tensors there; when the bucket is complete its
 * reduce-scatter is launched from that buffer, and once the reduce-scatter
 * is waited on, this rank's reduced slice is added into the shard and the
 * buffer goes back to the pool. Accumulation over micro-steps is therefore
 * "reduce every micro-step, accumulate the reduced slice": a step with
 * accumulation A moves A times the gradient bytes of stage 1 (which reduces
 * once, after the last micro-step); in exchange, no rank ever holds a
 * full-size gradient buffer. Pool policy (deterministic, so the pool is the
 * same on every rank and every step): a bucket needing a buffer takes the
 * smallest free one that fits; if none is free it first completes the
 * oldest in-flight reduce-scatter when DDP_ZERO2_INFLIGHT or more are in
 * flight, else it allocates a new buffer (sized to fit any bucket but the
 * largest, or the bucket itself if larger). A bucket whose reduce-scatter of
 * the previous micro-step is still in flight completes it first, so its
 * reduced slices are added into the shard in micro-step order. The working
 * set is the buckets one layer spans plus the in-flight ones, each at most
 * the largest bucket. (The tied embedding used to hold a full-size buffer
 * through the whole backward: the classifier wrote its gradient first, the
 * encoder completed it last. Now the layout cuts it into row chunks of about
 * a bucket each and the model computes the lm head's dW at the end, chunk by
 * chunk next to the encoder's rows, so each chunk's buffer lives only for
 * its own GEMM + encoder + reduce-scatter: issue 8, docs/ZERO.md.)
 * At world size 1 the shard is the whole buffer and backward accumulates
 * straight into it (no working buffers, no reductions): bit for bit stage 1.
 *
 * Overlapped all-gather (ddp_set_gather(d, 1, ...), zero_stage 1 or 2): the
 * all-gathers launched after the update are not waited for; the model's
 * need_params hook (ddp_need_params) waits, before a kernel reads a tensor
 * (every bucket of it, for a row-chunked wte; in launch order),
 * on the all-gather of the bucket that tensor actually lives in
 * (L->params[i].bucket), never on "the next one in the list", so any launch
 * order is correct and only the overlap depends on it. Forward asks for
 * every tensor, so after one forward every all-gather is complete; backward
 * checks that (a reduction never starts with an all-gather outstanding).
 * Anything else that reads the params (a checkpoint, a model file) calls
 * ddp_wait_gathers() first. */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "layout.h"
#include "../comm/comm.h"

/* ZeRO-2: in-flight reduce-scatters allowed before a bucket that needs a
 * working buffer waits for the oldest instead of allocating another. */
#define DDP_ZERO2_INFLIGHT 2

typedef struct {
    void* buf;      /* backend memory, cap elements of be->dtype */
    size_t cap;
    int bucket;     /* the bucket using it, -1 when free */
} DDPSlot;

typedef struct {
    const Layout* L;
    Comm* comm;
    Backend* be;
    int zero_stage;
    void* params;
    void* grads;              /* this rank's reduced gradients: the flat buffer (stages 0, 1;
                               * the caller's) or the shard (stage 2; owned here) */
    OptPiece* own;            /* the pieces this rank owns, buf_off into grads: what the grad
                               * norm reads (stage 2: shard offsets, layout_shard_pieces) */
    int nown;
    int last_micro;           /* stages 0, 1: reductions launch only on the last micro-step */
    unsigned char* marked;    /* [nparams] marked in this micro-step */
    int* bucket_pending;      /* [nbuckets] params not yet ready */
    int* group_pending;       /* [ngroups] buckets not yet complete */
    CommHandle* handles;      /* [nbuckets] reductions */
    int launched;             /* buckets launched this micro-step */
    double backward_start_time; /* wall time at the start of the last micro-step */
    double* launch_time;      /* [nbuckets] launch time of each bucket's reduction, from that start */
    double backward_end_time; /* end of backward, from that start */

    /* ---- param all-gather (stages 1, 2) ---- */
    int overlap_gather;       /* launch and return; the next forward waits per bucket */
    int gather_reverse;       /* testing: launch in bucket order (backward order), not forward order */
    int gather_hold;          /* testing: hold each all-gather back until a wait needs it (or one
                               * launched after it), as the slowest network would */
    int* gather_order;        /* [nbuckets] the bucket at each launch position */
    int gather_launched;      /* launch positions [0, gather_launched) are launched */
    CommHandle* gather_handles;     /* [nbuckets] */
    unsigned char* gather_pending;  /* [nbuckets] launched, not yet waited for */
    int ngather_pending;
    int* gather_launch_pos;   /* [nbuckets] position of the bucket in the last launch order */
    int gather_next_pos;      /* next launch position expected by an in-order consumer */
    int gather_out_of_order;  /* waits (since the last launch) on a bucket other than the next launched */
    int gather_waits;         /* waits since the last launch */
    double gather_wait_s;     /* host time spent blocked in those waits */

    /* ---- ZeRO-2 ---- */
    size_t* shard_off;        /* [nbuckets + 1] */
    size_t shard_elems;
    int direct;               /* world 1: backward accumulates straight into the shard */
    void** grad_ptr;          /* the model's table (by layout index), filled here */
    DDPSlot* slots;
    int nslots;
    size_t slot_cap;          /* capacity of a regular slot: the largest bucket but one */
    int* wslot;               /* [nbuckets] slot backward writes this micro-step, or -1 */
    int* rslot;               /* [nbuckets] slot of its in-flight reduce-scatter, or -1 */
    int* fifo;                /* [nbuckets] in-flight reduce-scatters, in launch order */
    int fifo_head, fifo_n;
    size_t work_bytes;        /* working buffers allocated */
} DDP;

/* stages 0, 1: grads is the caller's flat gradient buffer. stage 2: pass
 * grads = NULL; the shard is allocated here (d->grads). */
void ddp_init(DDP* d, const Layout* L, Comm* comm, Backend* be, int zero_stage, void* params,
              void* grads);
/* All-gather options (stages 1, 2): overlap with the next forward; testing
 * aids: launch in bucket order instead of forward order (the forward must
 * still wait for exactly the buckets it reads), and hold each launch back
 * until a wait needs it or a bucket launched after it (overlap only): a
 * forward that read a bucket without waiting for it would then read the
 * previous step's params, deterministically. */
void ddp_set_gather(DDP* d, int overlap, int reverse_order, int hold);
/* Stage 2: the model's per-tensor gradient pointer table (GPT2.grad_ptr, by
 * layout index), which ddp_need_grads fills. */
void ddp_set_grad_table(DDP* d, void** grad_ptr);
/* Before each micro-step's forward. */
void ddp_begin_micro_step(DDP* d, int is_last_micro_step);
/* gpt2_need_fn-compatible (ctx is the DDP): before forward reads these
 * tensors' params, wait for the all-gathers of their buckets. */
void ddp_need_params(void* ctx, const int* layout_indices, int n);
/* gpt2_need_fn-compatible (stage 2): before backward writes these tensors'
 * gradients, give their buckets working buffers. */
void ddp_need_grads(void* ctx, const int* layout_indices, int n);
/* gpt2_ready_fn-compatible: ctx is the DDP. */
void ddp_param_ready(void* ctx, int layout_index);
/* After the last micro-step's backward: waits for every reduction (stage 2:
 * and adds the last reduced slices into the shard). Fatal if a bucket was
 * never launched (a parameter never marked ready). */
void ddp_finish_reductions(DDP* d);
/* Sum of squares of this rank's reduced gradients (its pieces), local. */
double ddp_grad_sumsq(DDP* d);
/* Zero this rank's gradients for the next step (one memset). */
void ddp_zero_grads(DDP* d);
/* Stages 1, 2: after the update, all-gather the param buffer bucket by
 * bucket; with overlap, return without waiting. */
void ddp_gather_params(DDP* d);
/* Wait for every outstanding all-gather (no-op when none). */
void ddp_wait_gathers(DDP* d);
/* One line: when each bucket's reduction was launched, against the end of
 * backward (the evidence that communication overlaps backward); with the
 * overlapped all-gather, a second line on how the last forward waited. */
void ddp_overlap_report(const DDP* d, FILE* f);
/* Stage 2: one line on the gradient memory of this rank (shard and working
 * buffers). */
void ddp_zero2_report(const DDP* d, int rank, FILE* f);
void ddp_free(DDP* d);

#endif
