/* ddp/ddp.c — see ddp.h. */
#include "ddp.h"

#include <stdlib.h>
#include <string.h>

void ddp_init(DDP* d, const Layout* L, Comm* comm, Backend* be, int zero_stage, void* params,
              void* grads) {
    memset(d, 0, sizeof *d);
    d->L = L;
    d->comm = comm;
    d->be = be;
    d->zero_stage = zero_stage;
    d->params = params;
    d->grads = grads;
    d->marked = xcalloc((size_t)L->nparams, 1);
    d->bucket_pending = xcalloc((size_t)L->nbuckets, sizeof(int));
    d->group_pending = xcalloc((size_t)L->ngroups, sizeof(int));
    d->handles = xcalloc((size_t)L->nbuckets, sizeof(CommHandle));
    d->launch_time = xcalloc((size_t)L->nbuckets, sizeof(double));
}

void ddp_begin_micro_step(DDP* d, int is_last) {
    const Layout* L = d->L;
    d->last_micro = is_last;
    d->backward_start_time = wall_time_s();
    d->launched = 0;
    memset(d->marked, 0, (size_t)L->nparams);
    for (int b = 0; b < L->nbuckets; b++) d->bucket_pending[b] = L->buckets[b].nparams;
    for (int g = 0; g < L->ngroups; g++)
        d->group_pending[g] = L->group_first_bucket[g + 1] - L->group_first_bucket[g];
}

static void launch_bucket(DDP* d, int b) {
    const LayoutBucket* bk = &d->L->buckets[b];
    void* p = (char*)d->grads + bk->start * dtype_size(d->be->dtype);
    if (d->zero_stage == 0)
        comm_allreduce(d->comm, p, bk->len, d->be->dtype, 0, &d->handles[b]);
    else
        comm_reduce_scatter(d->comm, p, bk->len, d->be->dtype, 0, &d->handles[b]);
    d->launch_time[b] = wall_time_s() - d->backward_start_time;
    d->launched++;
}

void ddp_param_ready(void* ctx, int li) {
    DDP* d = ctx;
    const Layout* L = d->L;
    if (li < 0 || li >= L->nparams) fatal("internal: ddp_param_ready(%d) out of range", li);
    if (d->marked[li]) fatal("internal: parameter at layout index %d marked ready twice in one micro-step", li);
    d->marked[li] = 1;
    /* keep the reductions already launched moving while backward computes */
    for (int bb = 0; bb < L->nbuckets; bb++) comm_progress(d->comm, &d->handles[bb]);
    int b = L->params[li].bucket;
    if (--d->bucket_pending[b] > 0) return;
    int g = L->buckets[b].group;
    if (--d->group_pending[g] > 0) return;
    if (!d->last_micro) return;   /* accumulate only: no communication */
    for (int bb = L->group_first_bucket[g]; bb < L->group_first_bucket[g + 1]; bb++)
        launch_bucket(d, bb);
}

void ddp_finish_reductions(DDP* d) {
    const Layout* L = d->L;
    d->backward_end_time = wall_time_s() - d->backward_start_time;
    for (int b = 0; b < L->nbuckets; b++)
        if (d->bucket_pending[b] != 0)
            fatal("internal: bucket %d has %d parameters never marked ready", b, d->bucket_pending[b]);
    if (d->launched != L->nbuckets)
        fatal("internal: %d of %d buckets launched", d->launched, L->nbuckets);
    for (int b = 0; b < L->nbuckets; b++) comm_wait(d->comm, &d->handles[b]);
}

void ddp_gather_params(DDP* d) {
    const Layout* L = d->L;
    size_t es = dtype_size(d->be->dtype);
    for (int b = 0; b < L->nbuckets; b++)
        comm_allgather(d->comm, (char*)d->params + L->buckets[b].start * es, L->buckets[b].len,
                       d->be->dtype, &d->handles[b]);
    for (int b = 0; b < L->nbuckets; b++) comm_wait(d->comm, &d->handles[b]);
}

void ddp_overlap_report(const DDP* d, FILE* f) {
    const Layout* L = d->L;
    fprintf(f, "overlap: %d bucket reductions launched at", L->nbuckets);
    int shown = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        if (L->nbuckets > 8 && b >= 4 && b < L->nbuckets - 3) {
            if (!shown++) fprintf(f, " ...");
            continue;
        }
        fprintf(f, " %.1f", 1000.0 * d->launch_time[b]);
    }
    fprintf(f, " ms of a %.1f ms forward+backward (last micro-step)\n", 1000.0 * d->backward_end_time);
}

void ddp_free(DDP* d) {
    free(d->marked);
    free(d->bucket_pending);
    free(d->group_pending);
    free(d->handles);
    free(d->launch_time);
    memset(d, 0, sizeof *d);
}
