/* ddp/grad_shard.c — see grad_shard.h. */
#include "grad_shard.h"

#include <stdlib.h>
#include <string.h>

static size_t es_of(const GradShard* s) { return dtype_size(s->be->dtype); }

void grad_shard_init(GradShard* s, const Layout* L, Comm* comm, Backend* be) {
    memset(s, 0, sizeof *s);
    s->L = L;
    s->comm = comm;
    s->be = be;
    s->off = layout_shard_offsets(L);
    s->elems = s->off[L->nbuckets];
    size_t bytes = s->elems * es_of(s);
    s->shard = be->alloc(be, bytes, MEM_GRADS);
    be->zero(be, s->shard, bytes);
    s->direct = L->world == 1;
    if (s->direct && s->elems != L->total)
        fatal("internal: at world 1 the gradient shard (%zu) is not the whole buffer (%zu)", s->elems,
              L->total);
    s->fifo = xmalloc(sizeof(int) * (size_t)L->nbuckets);
    /* regular working buffers fit every bucket but the largest */
    int big = 0;
    for (int b = 1; b < L->nbuckets; b++)
        if (L->buckets[b].len > L->buckets[big].len) big = b;
    for (int b = 0; b < L->nbuckets; b++)
        if (b != big && L->buckets[b].len > s->cap) s->cap = L->buckets[b].len;
}

void* grad_shard_param_ptr(const GradShard* s, const Bucket* buckets, int li) {
    const LayoutParam* p = &s->L->params[li];
    if (s->direct) return (char*)s->shard + p->offset * es_of(s);
    const Bucket* bk = &buckets[p->bucket];
    if (bk->wslot < 0) return NULL;
    return (char*)s->pool[bk->wslot].buf + (p->offset - bk->lb->start) * es_of(s);
}

/* Complete the oldest in-flight reduce-scatter: wait, add this rank's
 * reduced slice into the shard, free its working buffer. */
static void complete_oldest(GradShard* s, Bucket* buckets) {
    const Layout* L = s->L;
    if (s->fifo_n == 0) fatal("internal: no reduce-scatter in flight to complete");
    Bucket* bk = &buckets[s->fifo[s->fifo_head]];
    s->fifo_head = (s->fifo_head + 1) % L->nbuckets;
    s->fifo_n--;
    comm_wait(s->comm, &bk->reduce);
    WorkBuf* w = &s->pool[bk->rslot];
    size_t es = es_of(s);
    char* dst = (char*)s->shard + s->off[bk->index] * es;
    const char* src = (const char*)w->buf + (size_t)s->comm->rank * bk->lb->slice_len * es;
    /* shard += reduced slice (the shard is zeroed after each step, so the
     * first micro-step's add is exact: 0 + x = x) */
    s->be->residual_forward(s->be, dst, dst, src, bk->lb->slice_len);
    w->bucket = -1;
    bk->rslot = -1;
}

void grad_shard_acquire(GradShard* s, Bucket* buckets, int b) {
    Bucket* bk = &buckets[b];
    if (s->direct || bk->wslot >= 0) return;
    while (bk->rslot >= 0) complete_oldest(s, buckets); /* its previous micro-step's reduction first */
    for (;;) {
        int best = -1;
        for (int i = 0; i < s->npool; i++)
            if (s->pool[i].bucket < 0 && s->pool[i].cap >= bk->lb->len &&
                (best < 0 || s->pool[i].cap < s->pool[best].cap))
                best = i;
        if (best >= 0) {
            bk->wslot = best;
            break;
        }
        if (s->fifo_n >= GRAD_SHARD_INFLIGHT) {
            complete_oldest(s, buckets);
            continue;
        }
        WorkBuf* np = realloc(s->pool, sizeof(WorkBuf) * (size_t)(s->npool + 1));
        if (!np) fatal("out of host memory growing the gradient working-buffer pool");
        s->pool = np;
        WorkBuf* w = &s->pool[s->npool];
        w->cap = bk->lb->len > s->cap ? bk->lb->len : s->cap;
        w->buf = s->be->alloc(s->be, w->cap * es_of(s), MEM_GRADS);
        w->bucket = -1;
        s->work_bytes += w->cap * es_of(s);
        bk->wslot = s->npool++;
        break;
    }
    WorkBuf* w = &s->pool[bk->wslot];
    w->bucket = b;
    s->be->zero(s->be, w->buf, bk->lb->len * es_of(s)); /* kernels accumulate (+=); padding stays 0 */
}

void grad_shard_reduce(GradShard* s, Bucket* buckets, int b, double t0) {
    Bucket* bk = &buckets[b];
    if (bk->wslot < 0) fatal("internal: bucket %d complete but backward never wrote into it", b);
    bucket_reduce_launch(bk, s->comm, s->pool[bk->wslot].buf, s->be->dtype, 0, t0);
    bk->rslot = bk->wslot;
    bk->wslot = -1;
    s->fifo[(s->fifo_head + s->fifo_n) % s->L->nbuckets] = b;
    s->fifo_n++;
}

void grad_shard_drain(GradShard* s, Bucket* buckets) {
    while (s->fifo_n > 0) complete_oldest(s, buckets);
    for (int b = 0; b < s->L->nbuckets; b++)
        if (buckets[b].wslot >= 0) fatal("internal: bucket %d still holds a working buffer", b);
}

void grad_shard_zero(GradShard* s) { s->be->zero(s->be, s->shard, s->elems * es_of(s)); }

void grad_shard_report(const GradShard* s, int rank, FILE* f) {
    size_t es = es_of(s);
    fprintf(f,
            "rank %d zero_stage 2 gradients: shard %.2f MB + %d working buffer(s) %.2f MB = %.2f MB "
            "(a full gradient buffer: %.2f MB)\n",
            rank, (double)(s->elems * es) / 1048576.0, s->npool, (double)s->work_bytes / 1048576.0,
            (double)(s->elems * es + s->work_bytes) / 1048576.0, (double)(s->L->total * es) / 1048576.0);
}

void grad_shard_free(GradShard* s, Bucket* buckets) {
    if (!s->L) return;
    while (s->fifo_n > 0) complete_oldest(s, buckets);
    for (int i = 0; i < s->npool; i++)
        s->be->release(s->be, s->pool[i].buf, s->pool[i].cap * es_of(s), MEM_GRADS);
    s->be->release(s->be, s->shard, s->elems * es_of(s), MEM_GRADS);
    free(s->pool);
    free(s->fifo);
    free(s->off);
    memset(s, 0, sizeof *s);
}
