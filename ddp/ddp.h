/* ddp/ddp.h — bucketed gradient reduction overlapped with backward, and the
 * ZeRO-1 parameter all-gather.
 *
 * Backward calls ddp_param_ready() for each tensor as its gradient becomes
 * final. Readiness is counted per parameter per micro-step (a parameter
 * marked twice in one micro-step is an internal error: the tied embedding is
 * marked once, after the encoder's backward). On the LAST micro-step of a
 * step, as soon as every parameter of every bucket of a bucket group is
 * ready, the group's reductions are launched at once on the communicator:
 *   zero_stage 0: all-reduce (sum) of each bucket;
 *   zero_stage 1: reduce-scatter (sum) of each bucket: rank r then holds
 *                 the reduced gradient of its slice.
 * Earlier micro-steps only accumulate (no communication).
 * Averaging happens exactly once, and before the reduction: the trainer
 * seeds backward with dloss = 1 / (tokens of the whole global batch), so each
 * rank's gradient is already its share of the global mean and the collective
 * is a plain sum. Every rank's gradient then carries the same scale as the
 * single-process run over the same global batch (1/(B*T*accum*N) rounded
 * once), and the results differ from it only by summation order; a
 * post-reduction 1/N (ncclAvg) would round differently from the
 * single-process run whenever N is not a power of two. */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "layout.h"
#include "../comm/comm.h"

typedef struct {
    const Layout* L;
    Comm* comm;
    Backend* be;
    int zero_stage;
    void* params;
    void* grads;
    int last_micro;           /* reductions launch only on the last micro-step */
    unsigned char* marked;    /* [nparams] marked in this micro-step */
    int* bucket_pending;      /* [nbuckets] params not yet ready */
    int* group_pending;       /* [ngroups] buckets not yet complete */
    CommHandle* handles;      /* [nbuckets] */
    int launched;             /* buckets launched this step */
    double backward_start_time; /* wall time at the start of the last micro-step */
    double* launch_time;      /* [nbuckets] launch time of each bucket's reduction, from that start */
    double backward_end_time; /* end of backward, from that start */
} DDP;

void ddp_init(DDP* d, const Layout* L, Comm* comm, Backend* be, int zero_stage, void* params,
              void* grads);
/* Before each micro-step's backward. */
void ddp_begin_micro_step(DDP* d, int is_last_micro_step);
/* gpt2_ready_fn-compatible: ctx is the DDP. */
void ddp_param_ready(void* ctx, int layout_index);
/* After the last micro-step's backward: waits for every reduction. Fatal if a
 * bucket was never launched (a parameter never marked ready). */
void ddp_finish_reductions(DDP* d);
/* ZeRO-1: after the update, all-gather the param buffer bucket by bucket. */
void ddp_gather_params(DDP* d);
/* One line: when each bucket's reduction was launched, against the end of
 * backward (the evidence that communication overlaps backward). */
void ddp_overlap_report(const DDP* d, FILE* f);
void ddp_free(DDP* d);

#endif
