/* ddp/ddp.h — data parallelism for one model chunk: bucketed gradient
 * reduction overlapped with backward, the ZeRO-1/2 param all-gather
 * (optionally overlapped with the next forward), and where the gradients
 * live; ddp_setup wires a model, its DDP and the optimizer together.
 *
 * Readiness. Backward calls ddp_param_ready() for each layout parameter as
 * its gradient becomes final, once per micro-step (twice is an internal
 * error: the tied embedding, or each of its row chunks, is marked once,
 * after the encoder's backward of its rows). When every parameter of every
 * bucket of a bucket group is ready, the group's reductions launch at once:
 *   zero_stage 0: all-reduce (sum) of each bucket, on the last micro-step;
 *   zero_stage 1: reduce-scatter (sum) of each bucket, on the last
 *                 micro-step: rank r then holds the reduced gradient of its
 *                 slice; earlier micro-steps only accumulate;
 *   zero_stage 2: reduce-scatter of each bucket on every micro-step, from a
 *                 working buffer, into this rank's shard (grad_shard.h); at
 *                 world 1 backward accumulates into the shard directly.
 *
 * Averaging happens once, before the reduction: the trainer seeds backward
 * with dloss = 1 / (tokens of the global batch), so each rank's gradient is
 * its share of the global mean and the collective is a plain sum. Every
 * rank's gradient then has the scale of the single-process run over the same
 * global batch, rounded once, and differs from it only by summation order (a
 * post-reduction 1/N would round differently whenever N is not a power of
 * two).
 *
 * Overlapped all-gather (DDPConfig.overlap_gather, stages 1, 2): the
 * all-gathers launched after the update are not waited for; the model's
 * need_params hook waits, before a kernel reads a tensor, for the all-gather
 * of every bucket that tensor lives in (in launch order), never for "the next
 * one in the list", so any launch order is correct and only the overlap
 * depends on it. Forward asks for every tensor, so after one forward every
 * all-gather is complete; backward checks that. Anything else that reads the
 * params (a checkpoint, a model file) calls ddp_wait_gathers() first.
 *
 * One step, in the order the trainer calls:
 *   per micro-step: ddp_begin_micro_step; forward (need_params); backward
 *                   (need_grads, ddp_param_ready);
 *   ddp_finish_reductions; ddp_grad_sumsq; optimizer_step on ddp.grads;
 *   ddp_gather_params; ddp_zero_grads.
 *
 * Device ordering (CUDA): every kernel runs on the compute stream; a
 * collective is enqueued after the compute stream's work so far (comm/), and
 * comm_wait makes the compute stream wait for it. So a reduction starts after
 * the kernels that wrote its gradients, and a forward kernel that reads a
 * bucket is enqueued after the wait for that bucket's all-gather. */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "bucket.h"
#include "grad_shard.h"
#include "../model/gpt2.h"
#include "../zero/optimizer.h"

typedef struct {
    int zero_stage;     /* 0 DDP, 1 ZeRO-1, 2 ZeRO-2 */
    int overlap_gather; /* stages 1, 2: the all-gather hides behind the next forward */
    int gather_reverse; /* testing: launch the all-gathers in bucket order, not forward order */
    int gather_hold;    /* testing, with overlap: hold each all-gather back until a wait needs
                         * it (or one launched after it), as the slowest network would: a
                         * forward that read a bucket without waiting would see last step's
                         * params */
} DDPConfig;

typedef struct {
    const Layout* L;
    Comm* comm;
    Backend* be;
    DDPConfig cfg;
    void* params;  /* the model chunk's flat param buffer */
    void* grads;   /* this rank's reduced gradients: the model's flat gradient buffer
                    * (stages 0, 1) or the shard (stage 2) */
    OptPiece* own; /* the pieces this rank owns, grad_off into grads: what the grad
                    * norm reads */
    int nown;
    Bucket* buckets;       /* [L->nbuckets] */
    BucketGroup* groups;   /* [L->ngroups] */
    unsigned char* marked; /* [L->nparams] marked ready in this micro-step */
    int last_micro;        /* stages 0, 1 reduce on the last micro-step only */
    double micro_start;    /* wall time at the start of the micro-step */
    double backward_end;   /* end of the last backward, seconds after micro_start */
    /* param all-gather */
    int* gather_order;   /* [nbuckets] the bucket at each launch position */
    int gather_launched; /* positions [0, gather_launched) are launched */
    int ngather_pending;
    int gather_next_pos;     /* next position an in-order consumer would wait for */
    int gather_out_of_order; /* waits (since the last launch) on another bucket than that */
    int gather_waits;
    double gather_wait_s; /* host time blocked in those waits */
    /* gradients */
    int sharded;     /* stage 2 at world > 1: working buffers reduced every micro-step */
    GradShard shard; /* stage 2 */
    void** grad_ptr; /* the model's table (GPT2.grad_ptr), filled here at stage 2 */
} DDP;

/* Wires a bound model chunk (gpt2_bind, with shard_grads = zero_stage == 2)
 * to data parallelism over comm (its data-parallel group): the DDP over the
 * model's layout, the model's hooks (need_params; at stage 2 need_grads and
 * its grad_ptr table into the shard), and *ob, what the optimizer updates of
 * this chunk: its param buffer, this rank's reduced gradients (the flat
 * buffer or the shard) and this rank's pieces with their gradient offsets
 * (stage 0: every parameter; stages 1, 2: its slices; stage 2: gradients in
 * the shard), for optimizer_init. */
void ddp_setup(DDP* d, GPT2* m, Comm* comm, const DDPConfig* cfg, OptBuffer* ob);
/* Before each micro-step's forward. */
void ddp_begin_micro_step(DDP* d, int is_last_micro_step);
/* gpt2_need_fn (ctx is the DDP): before forward reads these tensors'
 * params, wait for the all-gathers of their buckets. */
void ddp_need_params(void* ctx, const int* layout_indices, int n);
/* gpt2_need_fn (stage 2): before backward writes these tensors' gradients,
 * give their buckets working buffers. */
void ddp_need_grads(void* ctx, const int* layout_indices, int n);
/* gpt2_ready_fn: ctx is the DDP. */
void ddp_param_ready(void* ctx, int layout_index);
/* After the last micro-step's backward: waits for every reduction (stage 2:
 * and adds the last reduced slices into the shard). Fatal if a bucket was
 * never launched (a parameter never marked ready). */
void ddp_finish_reductions(DDP* d);
/* The pieces of the param range [lo, hi) are counted by another rank (the
 * head's copy of a tied embedding, held again by the first pipeline stage):
 * drop them from what ddp_grad_sumsq reads. */
void ddp_norm_skip(DDP* d, size_t lo, size_t hi);
/* Sum of squares of this rank's reduced gradients (its pieces), local. */
double ddp_grad_sumsq(DDP* d);
/* Zero this rank's gradients for the next step (one memset). */
void ddp_zero_grads(DDP* d);
/* After the update, stages 1, 2: all-gather the param buffer bucket by
 * bucket, in forward order (with overlap: return without waiting). No-op at
 * stage 0. */
void ddp_gather_params(DDP* d);
/* Wait for every outstanding all-gather (no-op when none). */
void ddp_wait_gathers(DDP* d);
/* When each bucket's reduction was launched against the end of backward (the
 * evidence that communication overlaps backward); with the overlapped
 * all-gather, a second line on how the last forward waited. */
void ddp_overlap_report(const DDP* d, FILE* f);
/* Stage 2: one line on this rank's gradient memory. */
void ddp_memory_report(const DDP* d, int rank, FILE* f);
void ddp_free(DDP* d);

#endif
