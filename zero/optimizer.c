/* zero/optimizer.c — see optimizer.h. */
#include "optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void optimizer_init(Optimizer* o, Backend* be, const OptBuffer* bufs, int nbufs) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->nbufs = nbufs;
    o->bufs = xmalloc(sizeof(OptBuffer) * (size_t)(nbufs ? nbufs : 1));
    for (int k = 0; k < nbufs; k++) {
        o->bufs[k] = bufs[k];
        for (int i = 0; i < bufs[k].npieces; i++) o->bufs[k].pieces[i].state_off += o->nstate;
        for (int i = 0; i < bufs[k].npieces; i++) o->nstate += bufs[k].pieces[i].len;
    }
    size_t bytes = o->nstate * sizeof(float);
    o->master = be->alloc(be, bytes, MEM_MASTER);
    o->m = be->alloc(be, bytes, MEM_ADAM_M);
    o->v = be->alloc(be, bytes, MEM_ADAM_V);
    be->zero(be, o->m, bytes);
    be->zero(be, o->v, bytes);
    size_t es = dtype_size(be->dtype);
    for (int k = 0; k < nbufs; k++)
        for (int i = 0; i < o->bufs[k].npieces; i++) {
            const OptPiece* pc = &o->bufs[k].pieces[i];
            be->x_to_f32(be, o->master + pc->state_off, (const char*)o->bufs[k].params + pc->buf_off * es,
                         pc->len);
        }
}

void optimizer_step(Optimizer* o, float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_scale, uint32_t seed) {
    o->t++;
    AdamWArgs a = {lr, beta1, beta2, eps, weight_decay, grad_scale, o->t, seed};
    for (int k = 0; k < o->nbufs; k++)
        o->be->adamw(o->be, o->bufs[k].params, o->bufs[k].grads, o->master, o->m, o->v, o->bufs[k].pieces,
                     o->bufs[k].npieces, &a);
}

void optimizer_free(Optimizer* o) {
    size_t bytes = o->nstate * sizeof(float);
    if (o->master) {
        o->be->release(o->be, o->master, bytes, MEM_MASTER);
        o->be->release(o->be, o->m, bytes, MEM_ADAM_M);
        o->be->release(o->be, o->v, bytes, MEM_ADAM_V);
    }
    for (int k = 0; k < o->nbufs; k++) free(o->bufs[k].pieces);
    free(o->bufs);
    memset(o, 0, sizeof *o);
}

float lr_at_step(LrSchedule s, int step, int warmup, int total, float max_lr, float final_frac) {
    if (step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
    if (s == LR_CONSTANT || total <= warmup) return max_lr;
    double min_lr = (double)max_lr * final_frac;
    double ratio = (double)(step - warmup) / (double)(total - warmup);
    if (ratio > 1.0) ratio = 1.0;
    double coeff = s == LR_COSINE ? 0.5 * (1.0 + cos(M_PI * ratio)) : 1.0 - ratio;
    return (float)(min_lr + coeff * ((double)max_lr - min_lr));
}

static const char* schedule_names[] = {"cosine", "linear", "constant"};

int lr_schedule_parse(const char* name, LrSchedule* out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, schedule_names[i]) == 0) {
            *out = (LrSchedule)i;
            return 0;
        }
    return -1;
}

const char* lr_schedule_name(LrSchedule s) { return schedule_names[s]; }
