/* zero/optimizer.h — the (distributed) AdamW optimizer.
 *
 * One mechanism for both stages: the optimizer keeps fp32 master weights and
 * the two AdamW moments for a list of pieces of the flat buffer, back to back
 * (OptPiece.state_off), and updates exactly those elements.
 *   zero_stage 0 (DDP): the pieces are every parameter (layout_opt_pieces(L, -1)):
 *                       full optimizer state on every rank, 16 bytes/param.
 *   zero_stage 1:       the pieces are this rank's slices (layout_opt_pieces(L, rank)):
 *                       12/N bytes/param of state; afterwards the param buffer
 *                       is all-gathered bucket by bucket (ddp/ddp.c).
 *   zero_stage 2:       the same pieces and state as stage 1, but the reduced
 *                       gradients live in this rank's shard (ddp/ddp.h), not
 *                       at the pieces' buf_off in a full-size buffer:
 *                       optimizer_set_grad_pieces() says where.
 * The learning-rate schedule lives here too. */
#ifndef ZERO_OPTIMIZER_H
#define ZERO_OPTIMIZER_H

#include "../kernels/kernels.h"

typedef struct {
    Backend* be;
    OptPiece* pieces;     /* host copy */
    int npieces;
    size_t nstate;        /* elements of state: sum of piece lengths */
    float *master, *m, *v;  /* backend memory, nstate each */
    int t;                /* steps taken */
    /* gradient placement (optimizer_set_grad_pieces): runs of consecutive
     * pieces whose gradient sits at grads + buf_off + shift (elements);
     * nruns 0 = shift 0 for all */
    int nruns;
    int *run_first, *run_n;
    long long* run_shift;
} Optimizer;

/* Takes ownership of pieces; master <- the current params of the pieces. */
void optimizer_init(Optimizer* o, Backend* be, OptPiece* pieces, int npieces, const void* params);
/* ZeRO-2: piece i's gradient is at grads + grad_pieces[i].buf_off instead
 * of grads + pieces[i].buf_off (grad_pieces: the same pieces, as
 * layout_shard_pieces gives them; fatal if order or lengths differ). The
 * params are still written at pieces[i].buf_off, so the update, and the
 * bf16 stochastic rounding (hashed on the param index), are exactly stage
 * 1's. AdamW then runs once per run of pieces sharing one offset shift (one
 * run per bucket). */
void optimizer_set_grad_pieces(Optimizer* o, const OptPiece* grad_pieces, int n);
/* AdamW on the pieces: params[pieces] <- updated master. */
void optimizer_step(Optimizer* o, void* params, const void* grads, float lr, float beta1,
                    float beta2, float eps, float weight_decay, float grad_scale, uint32_t seed);
void optimizer_free(Optimizer* o);

typedef enum { LR_COSINE = 0, LR_LINEAR = 1, LR_CONSTANT = 2 } LrSchedule;
/* step is 0-based. Linear warmup over `warmup` steps to max_lr, then decay
 * (cosine or linear) to max_lr * final_frac at step `total`, or constant. */
float lr_at_step(LrSchedule s, int step, int warmup, int total, float max_lr, float final_frac);
int lr_schedule_parse(const char* name, LrSchedule* out);
const char* lr_schedule_name(LrSchedule s);

#endif
