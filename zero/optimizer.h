/* zero/optimizer.h — the (distributed) AdamW optimizer and the learning-rate
 * schedule.
 *
 * One mechanism for every zero stage and any number of model chunks: the
 * optimizer keeps fp32 master weights and the two AdamW moments for a list of
 * pieces of one or more flat buffers (OptBuffer: a model chunk's param buffer
 * and its gradients), back to back in one state (OptPiece.state_off, counted
 * over all buffers in order), and updates exactly those elements. Each piece
 * says where its param is (buf_off, in its buffer's params) and where its
 * gradient is (grad_off, in its buffer's grads):
 *   zero_stage 0 (DDP): every parameter (layout_opt_pieces(L, -1)), gradients
 *                       in the full flat buffer: full optimizer state on every
 *                       rank, 16 bytes/param;
 *   zero_stage 1:       this rank's slices (layout_opt_pieces(L, rank)), the
 *                       same full gradient buffer: 12/N bytes/param of state;
 *   zero_stage 2:       the same pieces as stage 1, gradients in this rank's
 *                       shard (layout_shard_pieces(L, rank)).
 * After a step at stage 1 or 2 each buffer's params are all-gathered (ddp/). */
#ifndef ZERO_OPTIMIZER_H
#define ZERO_OPTIMIZER_H

#include "../kernels/kernels.h"

/* One flat buffer the optimizer updates: a model chunk's. */
typedef struct {
    void* params;      /* the flat param buffer (written by the step) */
    const void* grads; /* its reduced gradients (read by the step) */
    OptPiece* pieces;  /* owned by the optimizer once given to optimizer_init */
    int npieces;
} OptBuffer;

typedef struct {
    Backend* be;
    OptBuffer* bufs; /* owned copy of the list */
    int nbufs;
    size_t nstate;         /* elements of state: sum of all piece lengths */
    float *master, *m, *v; /* backend memory, nstate each */
    int t;                 /* steps taken */
} Optimizer;

/* The optimizer over nbufs buffers, taking ownership of each buffer's pieces
 * (given with state_off from 0 within the buffer; stored shifted past the
 * buffers before it). master <- the current params of the pieces: call it once
 * the params hold their initial or loaded values. */
void optimizer_init(Optimizer* o, Backend* be, const OptBuffer* bufs, int nbufs);
/* AdamW on the pieces of every buffer, reading each gradient at grads +
 * grad_off (times grad_scale) and writing params + buf_off <- the updated
 * master (bf16: stochastically rounded with `seed`). */
void optimizer_step(Optimizer* o, float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_scale, uint32_t seed);
void optimizer_free(Optimizer* o);

typedef enum { LR_COSINE = 0, LR_LINEAR = 1, LR_CONSTANT = 2 } LrSchedule;
/* step is 0-based. Linear warmup over `warmup` steps to max_lr, then decay
 * (cosine or linear) to max_lr * final_frac at step `total`, or constant. */
float lr_at_step(LrSchedule s, int step, int warmup, int total, float max_lr, float final_frac);
int lr_schedule_parse(const char* name, LrSchedule* out);
const char* lr_schedule_name(LrSchedule s);

#endif
