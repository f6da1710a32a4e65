/* ddp/ddp.c — readiness counting, bucketed reductions, the param all-gather
 * (blocking or overlapped with the next forward) and the ZeRO-2 gradient
 * shard with its pool of per-bucket working buffers. See ddp.h.
 *
 * Device ordering (CUDA), by construction: every kernel here runs on the
 * compute stream; a collective is enqueued after the compute stream's work so
 * far (comm/), and comm_wait makes the compute stream wait on it. So:
 *  - a working buffer's reduce-scatter starts after the backward kernels that
 *    wrote it; the add into the shard, the zeroing for its next user and that
 *    user's kernels all follow the comm_wait on the compute stream;
 *  - an all-gather starts after AdamW wrote this rank's slice, and a forward
 *    kernel that reads a bucket is enqueued only after the comm_wait of that
 *    bucket's all-gather. */
#include "ddp.h"

#include <stdlib.h>
#include <string.h>

static size_t es_of(const DDP* d) { return dtype_size(d->be->dtype); }

void ddp_init(DDP* d, const Layout* L, Comm* comm, Backend* be, int zero_stage, void* params,
              void* grads) {
    memset(d, 0, sizeof *d);
    if (zero_stage < 0 || zero_stage > 2) fatal("internal: ddp_init with zero_stage %d", zero_stage);
    d->L = L;
    d->comm = comm;
    d->be = be;
    d->zero_stage = zero_stage;
    d->params = params;
    d->marked = xcalloc((size_t)L->nparams, 1);
    d->bucket_pending = xcalloc((size_t)L->nbuckets, sizeof(int));
    d->group_pending = xcalloc((size_t)L->ngroups, sizeof(int));
    d->handles = xcalloc((size_t)L->nbuckets, sizeof(CommHandle));
    d->launch_time = xcalloc((size_t)L->nbuckets, sizeof(double));
    d->gather_handles = xcalloc((size_t)L->nbuckets, sizeof(CommHandle));
    d->gather_pending = xcalloc((size_t)L->nbuckets, 1);
    d->gather_launch_pos = xcalloc((size_t)L->nbuckets, sizeof(int));
    d->gather_order = xcalloc((size_t)L->nbuckets, sizeof(int));
    if (zero_stage < 2) {
        if (!grads) fatal("internal: ddp_init stage %d without a gradient buffer", zero_stage);
        d->grads = grads;
        d->own = layout_opt_pieces(L, comm->rank, &d->nown);
        return;
    }
    if (grads) fatal("internal: ddp_init stage 2 with a full-size gradient buffer");
    d->shard_off = layout_shard_offsets(L);
    d->shard_elems = d->shard_off[L->nbuckets];
    size_t bytes = d->shard_elems * es_of(d);
    d->grads = be->alloc(be, bytes, MEM_GRADS);
    be->zero(be, d->grads, bytes);
    d->own = layout_shard_pieces(L, comm->rank, &d->nown);
    d->direct = L->world == 1;
    if (d->direct && d->shard_elems != L->total)
        fatal("internal: at world 1 the gradient shard (%zu) is not the whole buffer (%zu)", d->shard_elems,
              L->total);
    d->wslot = xmalloc(sizeof(int) * (size_t)L->nbuckets);
    d->rslot = xmalloc(sizeof(int) * (size_t)L->nbuckets);
    d->fifo = xmalloc(sizeof(int) * (size_t)L->nbuckets);
    for (int b = 0; b < L->nbuckets; b++) d->wslot[b] = d->rslot[b] = -1;
    /* regular slots fit every bucket but the largest */
    int big = 0;
    for (int b = 1; b < L->nbuckets; b++)
        if (L->buckets[b].len > L->buckets[big].len) big = b;
    for (int b = 0; b < L->nbuckets; b++)
        if (b != big && L->buckets[b].len > d->slot_cap) d->slot_cap = L->buckets[b].len;
}

void ddp_set_gather(DDP* d, int overlap, int reverse_order, int hold) {
    if (overlap && d->zero_stage == 0)
        fatal("internal: overlapped all-gather at zero_stage 0 (there is no all-gather)");
    if (hold && !overlap) fatal("internal: held all-gathers without overlap");
    d->overlap_gather = overlap;
    d->gather_reverse = reverse_order;
    d->gather_hold = hold;
}

void ddp_set_grad_table(DDP* d, void** grad_ptr) {
    if (d->zero_stage != 2) fatal("internal: ddp_set_grad_table at zero_stage %d", d->zero_stage);
    const Layout* L = d->L;
    d->grad_ptr = grad_ptr;
    for (int li = 0; li < L->nparams; li++)
        grad_ptr[li] = d->direct ? (char*)d->grads + L->params[li].offset * es_of(d) : NULL;
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

/* ------------------------------------------------------ ZeRO-2 working buffers */

/* Complete the oldest in-flight reduce-scatter: wait, add this rank's
 * reduced slice into the shard, free its working buffer. */
static void zero2_complete_oldest(DDP* d) {
    const Layout* L = d->L;
    if (d->fifo_n == 0) fatal("internal: no reduce-scatter in flight to complete");
    int b = d->fifo[d->fifo_head];
    d->fifo_head = (d->fifo_head + 1) % L->nbuckets;
    d->fifo_n--;
    comm_wait(d->comm, &d->handles[b]);
    const LayoutBucket* bk = &L->buckets[b];
    DDPSlot* s = &d->slots[d->rslot[b]];
    size_t es = es_of(d);
    char* dst = (char*)d->grads + d->shard_off[b] * es;
    const char* src = (const char*)s->buf + (size_t)d->comm->rank * bk->slice_len * es;
    /* shard += reduced slice (the shard is zeroed at the end of each step, so
     * the first micro-step's add is exact: 0 + x = x) */
    d->be->residual_forward(d->be, dst, dst, src, bk->slice_len);
    s->bucket = -1;
    d->rslot[b] = -1;
}

/* A zeroed working buffer for bucket b, and the model's grad pointers of its
 * tensors into it. */
static void zero2_acquire(DDP* d, int b) {
    const Layout* L = d->L;
    if (d->wslot[b] >= 0) return;
    if (d->ngather_pending)
        fatal("internal: backward writes gradients while %d all-gathers are outstanding", d->ngather_pending);
    while (d->rslot[b] >= 0) zero2_complete_oldest(d);   /* its previous micro-step's reduction first */
    const LayoutBucket* bk = &L->buckets[b];
    for (;;) {
        int best = -1;
        for (int i = 0; i < d->nslots; i++)
            if (d->slots[i].bucket < 0 && d->slots[i].cap >= bk->len &&
                (best < 0 || d->slots[i].cap < d->slots[best].cap))
                best = i;
        if (best >= 0) {
            d->wslot[b] = best;
            break;
        }
        if (d->fifo_n >= DDP_ZERO2_INFLIGHT) {
            zero2_complete_oldest(d);
            continue;
        }
        DDPSlot* ns = realloc(d->slots, sizeof(DDPSlot) * (size_t)(d->nslots + 1));
        if (!ns) fatal("out of host memory growing the gradient working-buffer pool");
        d->slots = ns;
        DDPSlot* s = &d->slots[d->nslots];
        s->cap = bk->len > d->slot_cap ? bk->len : d->slot_cap;
        s->buf = d->be->alloc(d->be, s->cap * es_of(d), MEM_GRADS);
        s->bucket = -1;
        d->work_bytes += s->cap * es_of(d);
        d->wslot[b] = d->nslots++;
        break;
    }
    DDPSlot* s = &d->slots[d->wslot[b]];
    s->bucket = b;
    size_t es = es_of(d);
    d->be->zero(d->be, s->buf, bk->len * es);   /* kernels accumulate (+=); padding stays 0 */
    for (int li = bk->first_param; li < bk->first_param + bk->nparams; li++)
        d->grad_ptr[li] = (char*)s->buf + (L->params[li].offset - bk->start) * es;
}

void ddp_need_grads(void* ctx, const int* li, int n) {
    DDP* d = ctx;
    if (d->zero_stage != 2 || d->direct) return;
    if (!d->grad_ptr) fatal("internal: ddp_need_grads before ddp_set_grad_table");
    for (int i = 0; i < n; i++) {
        if (li[i] < 0 || li[i] >= d->L->nparams) fatal("internal: ddp_need_grads(%d) out of range", li[i]);
        zero2_acquire(d, d->L->params[li[i]].bucket);
    }
}

/* ------------------------------------------------------------ reductions */

static void launch_bucket(DDP* d, int b) {
    const Layout* L = d->L;
    const LayoutBucket* bk = &L->buckets[b];
    if (d->zero_stage == 2 && !d->direct) {
        int s = d->wslot[b];
        if (s < 0) fatal("internal: bucket %d complete but backward never wrote into it", b);
        comm_reduce_scatter(d->comm, d->slots[s].buf, bk->len, d->be->dtype, 0, &d->handles[b]);
        d->rslot[b] = s;
        d->wslot[b] = -1;
        d->fifo[(d->fifo_head + d->fifo_n) % L->nbuckets] = b;
        d->fifo_n++;
        /* complete: nothing may write its gradients again this micro-step */
        for (int li = bk->first_param; li < bk->first_param + bk->nparams; li++) d->grad_ptr[li] = NULL;
    } else {
        void* p = (char*)d->grads + bk->start * es_of(d);
        if (d->zero_stage == 0)
            comm_allreduce(d->comm, p, bk->len, d->be->dtype, 0, &d->handles[b]);
        else
            comm_reduce_scatter(d->comm, p, bk->len, d->be->dtype, 0, &d->handles[b]);
    }
    d->launch_time[b] = wall_time_s() - d->backward_start_time;
    d->launched++;
}

void ddp_param_ready(void* ctx, int li) {
    DDP* d = ctx;
    const Layout* L = d->L;
    if (li < 0 || li >= L->nparams) fatal("internal: ddp_param_ready(%d) out of range", li);
    if (d->marked[li]) fatal("internal: parameter at layout index %d marked ready twice in one micro-step", li);
    if (d->ngather_pending)
        fatal("internal: a gradient is ready while %d all-gathers are outstanding (forward did not ask for every bucket)",
              d->ngather_pending);
    d->marked[li] = 1;
    /* keep the reductions already launched moving while backward computes */
    for (int bb = 0; bb < L->nbuckets; bb++) comm_progress(d->comm, &d->handles[bb]);
    int b = L->params[li].bucket;
    if (--d->bucket_pending[b] > 0) return;
    int g = L->buckets[b].group;
    if (--d->group_pending[g] > 0) return;
    /* stages 0, 1 (and stage 2 at world 1, which accumulates in place):
     * earlier micro-steps only accumulate; stage 2 reduces every micro-step */
    int every_micro = d->zero_stage == 2 && !d->direct;
    if (!d->last_micro && !every_micro) return;
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
    if (d->zero_stage == 2 && !d->direct) {
        while (d->fifo_n > 0) zero2_complete_oldest(d);
        for (int b = 0; b < L->nbuckets; b++)
            if (d->wslot[b] >= 0) fatal("internal: bucket %d still holds a working buffer", b);
        return;
    }
    for (int b = 0; b < L->nbuckets; b++) comm_wait(d->comm, &d->handles[b]);
}

double ddp_grad_sumsq(DDP* d) { return d->be->grad_sumsq(d->be, d->grads, d->own, d->nown); }

void ddp_zero_grads(DDP* d) {
    size_t elems = d->zero_stage == 2 ? d->shard_elems : d->L->total;
    d->be->zero(d->be, d->grads, elems * es_of(d));
}

/* ------------------------------------------------------------- all-gather */

/* Launch the all-gathers at launch positions [gather_launched, upto). */
static void gather_launch_upto(DDP* d, int upto) {
    const Layout* L = d->L;
    size_t es = es_of(d);
    for (; d->gather_launched < upto; d->gather_launched++) {
        int b = d->gather_order[d->gather_launched];
        comm_allgather(d->comm, (char*)d->params + L->buckets[b].start * es, L->buckets[b].len, d->be->dtype,
                       &d->gather_handles[b]);
    }
}

void ddp_gather_params(DDP* d) {
    const Layout* L = d->L;
    if (d->zero_stage == 0) fatal("internal: ddp_gather_params at zero_stage 0");
    ddp_wait_gathers(d);   /* (none outstanding in a normal step: the forward waited for all) */
    /* Forward order: the buckets are laid out in backward-finish order, so
     * forward meets them in descending bucket index (the embeddings' buckets,
     * the last ones, first: wte's row chunks, last chunk first, then wpe's;
     * the final layernorm's, bucket 0, last). The tied wte is read again by
     * the classifier at the end: its buckets are complete by then. */
    for (int k = 0; k < L->nbuckets; k++) {
        int b = d->gather_reverse ? k : L->nbuckets - 1 - k;
        d->gather_order[k] = b;
        d->gather_pending[b] = 1;
        d->gather_launch_pos[b] = k;
    }
    d->gather_launched = 0;
    if (!d->gather_hold) gather_launch_upto(d, L->nbuckets);
    d->ngather_pending = L->nbuckets;
    d->gather_next_pos = 0;
    d->gather_out_of_order = 0;
    d->gather_waits = 0;
    d->gather_wait_s = 0.0;
    if (!d->overlap_gather) ddp_wait_gathers(d);
}

static void gather_wait_bucket(DDP* d, int b) {
    if (!d->gather_pending[b]) return;
    if (d->gather_launch_pos[b] != d->gather_next_pos) d->gather_out_of_order++;
    d->gather_next_pos = d->gather_launch_pos[b] + 1;
    gather_launch_upto(d, d->gather_launch_pos[b] + 1);   /* (held launches: up to this one) */
    double t0 = wall_time_s();
    comm_wait(d->comm, &d->gather_handles[b]);
    d->gather_wait_s += wall_time_s() - t0;
    d->gather_waits++;
    d->gather_pending[b] = 0;
    d->ngather_pending--;
}

void ddp_need_params(void* ctx, const int* li, int n) {
    DDP* d = ctx;
    const Layout* L = d->L;
    if (d->ngather_pending == 0) return;
    /* the buckets these tensors live in (a row-chunked tensor, wte, spans
     * several), waited for in launch order: a kernel that needs several
     * buckets takes them as the network delivers them */
    int fixed[16];
    int* bk = n <= 16 ? fixed : xmalloc(sizeof(int) * (size_t)n);
    int nb = 0;
    for (int i = 0; i < n; i++) {
        if (li[i] < 0 || li[i] >= L->nparams) fatal("internal: ddp_need_params(%d) out of range", li[i]);
        int b = L->params[li[i]].bucket;   /* the bucket the tensor lives in */
        if (!d->gather_pending[b]) continue;
        int j = nb++;
        while (j > 0 && d->gather_launch_pos[bk[j - 1]] > d->gather_launch_pos[b]) {
            bk[j] = bk[j - 1];
            j--;
        }
        bk[j] = b;
    }
    for (int k = 0; k < nb; k++)
        if (k == 0 || bk[k] != bk[k - 1]) gather_wait_bucket(d, bk[k]);
    if (bk != fixed) free(bk);
    /* the all-gathers still in flight progress while this kernel computes */
    for (int b = 0; b < L->nbuckets && d->ngather_pending; b++)
        if (d->gather_pending[b]) comm_progress(d->comm, &d->gather_handles[b]);
}

void ddp_wait_gathers(DDP* d) {
    const Layout* L = d->L;
    if (d->ngather_pending == 0) return;
    /* in launch order */
    for (int k = 0; k < L->nbuckets; k++)
        for (int b = 0; b < L->nbuckets; b++)
            if (d->gather_pending[b] && d->gather_launch_pos[b] == k) gather_wait_bucket(d, b);
}

/* ---------------------------------------------------------------- reports */

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
    if (d->overlap_gather && d->gather_waits > 0)
        fprintf(f, "overlap: forward waited per bucket on %d all-gathers launched in %s order, %d of them out of "
                "launch order, %.2f ms blocked\n",
                d->gather_waits, d->gather_reverse ? "bucket (reverse)" : "forward", d->gather_out_of_order,
                1000.0 * d->gather_wait_s);
}

void ddp_zero2_report(const DDP* d, int rank, FILE* f) {
    if (d->zero_stage != 2) return;
    size_t es = es_of(d);
    size_t full = d->L->total * es;
    fprintf(f, "rank %d zero_stage 2 gradients: shard %.2f MB + %d working buffer(s) %.2f MB = %.2f MB "
            "(a full gradient buffer: %.2f MB)\n",
            rank, (double)(d->shard_elems * es) / 1048576.0, d->nslots, (double)d->work_bytes / 1048576.0,
            (double)(d->shard_elems * es + d->work_bytes) / 1048576.0, (double)full / 1048576.0);
}

void ddp_free(DDP* d) {
    if (!d->L) return;
    ddp_wait_gathers(d);
    if (d->zero_stage == 2) {
        while (d->fifo_n > 0) zero2_complete_oldest(d);
        for (int i = 0; i < d->nslots; i++)
            d->be->release(d->be, d->slots[i].buf, d->slots[i].cap * es_of(d), MEM_GRADS);
        if (d->grads) d->be->release(d->be, d->grads, d->shard_elems * es_of(d), MEM_GRADS);
    }
    free(d->slots);
    free(d->wslot);
    free(d->rslot);
    free(d->fifo);
    free(d->shard_off);
    free(d->own);
    free(d->marked);
    free(d->bucket_pending);
    free(d->group_pending);
    free(d->handles);
    free(d->launch_time);
    free(d->gather_handles);
    free(d->gather_pending);
    free(d->gather_launch_pos);
    free(d->gather_order);
    memset(d, 0, sizeof *d);
}
