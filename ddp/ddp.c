/* ddp/ddp.c — readiness counting, bucketed reductions, the param all-gather
 * and the wiring of model, DDP and optimizer. See ddp.h. */
#include "ddp.h"

#include <stdlib.h>
#include <string.h>

static size_t es_of(const DDP* d) { return dtype_size(d->be->dtype); }

static void ddp_init(DDP* d, const Layout* L, Comm* comm, Backend* be, const DDPConfig* cfg, void* params,
                     void* grads) {
    memset(d, 0, sizeof *d);
    if (cfg->zero_stage < 0 || cfg->zero_stage > 2)
        fatal("internal: ddp_init with zero_stage %d", cfg->zero_stage);
    if (cfg->overlap_gather && cfg->zero_stage == 0)
        fatal("internal: overlapped all-gather at zero_stage 0 (there is no all-gather)");
    if (cfg->gather_hold && !cfg->overlap_gather) fatal("internal: held all-gathers without overlap");
    d->L = L;
    d->comm = comm;
    d->be = be;
    d->cfg = *cfg;
    d->params = params;
    d->buckets = buckets_create(L);
    d->groups = bucket_groups_create(L);
    d->marked = xcalloc((size_t)L->nparams, 1);
    d->gather_order = xcalloc((size_t)L->nbuckets, sizeof(int));
    if (cfg->zero_stage < 2) {
        if (!grads) fatal("internal: ddp_init stage %d without a gradient buffer", cfg->zero_stage);
        d->grads = grads;
        d->own = layout_opt_pieces(L, comm->rank, &d->nown);
        return;
    }
    if (grads) fatal("internal: ddp_init stage 2 with a full-size gradient buffer");
    grad_shard_init(&d->shard, L, comm, be);
    d->grads = d->shard.shard;
    d->own = layout_shard_pieces(L, comm->rank, &d->nown);
    d->sharded = !d->shard.direct;
}

void ddp_setup(DDP* d, GPT2* m, Comm* comm, const DDPConfig* cfg, OptBuffer* ob) {
    const Layout* L = m->layout;
    if (m->shard_grads != (cfg->zero_stage == 2))
        fatal("internal: ddp_setup: the model was bound %s a full gradient buffer at zero_stage %d",
              m->shard_grads ? "without" : "with", cfg->zero_stage);
    ddp_init(d, L, comm, m->be, cfg, m->params, m->grads);
    m->need_params = ddp_need_params; /* waits only for an overlapped all-gather */
    m->need_params_ctx = d;
    int n;
    OptPiece* pieces;
    if (cfg->zero_stage == 2) {
        d->grad_ptr = m->grad_ptr;
        for (int li = 0; li < L->nparams; li++)
            d->grad_ptr[li] = grad_shard_param_ptr(&d->shard, d->buckets, li);
        m->need_grads = ddp_need_grads;
        m->need_grads_ctx = d;
        pieces = layout_shard_pieces(L, comm->rank, &n);
    } else {
        pieces = layout_opt_pieces(L, cfg->zero_stage == 1 ? comm->rank : -1, &n);
    }
    *ob = (OptBuffer){.params = m->params, .grads = d->grads, .pieces = pieces, .npieces = n};
}

void ddp_begin_micro_step(DDP* d, int is_last) {
    const Layout* L = d->L;
    d->last_micro = is_last;
    d->micro_start = wall_time_s();
    memset(d->marked, 0, (size_t)L->nparams);
    for (int b = 0; b < L->nbuckets; b++) bucket_begin_micro_step(&d->buckets[b]);
    for (int g = 0; g < L->ngroups; g++) bucket_group_begin_micro_step(&d->groups[g]);
}

/* ------------------------------------------------------------ reductions */

void ddp_need_grads(void* ctx, const int* li, int n) {
    DDP* d = ctx;
    if (!d->sharded) return;
    const Layout* L = d->L;
    for (int i = 0; i < n; i++) {
        if (li[i] < 0 || li[i] >= L->nparams) fatal("internal: ddp_need_grads(%d) out of range", li[i]);
        int b = L->params[li[i]].bucket;
        if (d->buckets[b].wslot >= 0) continue;
        if (d->ngather_pending)
            fatal("internal: backward writes gradients while %d all-gathers are outstanding",
                  d->ngather_pending);
        grad_shard_acquire(&d->shard, d->buckets, b);
        const LayoutBucket* lb = d->buckets[b].lb;
        for (int p = lb->first_param; p < lb->first_param + lb->nparams; p++)
            d->grad_ptr[p] = grad_shard_param_ptr(&d->shard, d->buckets, p);
    }
}

static void launch_bucket(DDP* d, int b) {
    Bucket* bk = &d->buckets[b];
    if (d->sharded) {
        grad_shard_reduce(&d->shard, d->buckets, b, d->micro_start);
        /* complete: nothing may write its gradients again this micro-step */
        for (int p = bk->lb->first_param; p < bk->lb->first_param + bk->lb->nparams; p++) d->grad_ptr[p] = NULL;
    } else {
        bucket_reduce_launch(bk, d->comm, (char*)d->grads + bk->lb->start * es_of(d), d->be->dtype,
                             d->cfg.zero_stage == 0, d->micro_start);
    }
}

void ddp_param_ready(void* ctx, int li) {
    DDP* d = ctx;
    const Layout* L = d->L;
    if (li < 0 || li >= L->nparams) fatal("internal: ddp_param_ready(%d) out of range", li);
    if (d->marked[li]) fatal("internal: parameter at layout index %d marked ready twice in one micro-step", li);
    if (d->ngather_pending)
        fatal(
            "internal: a gradient is ready while %d all-gathers are outstanding (forward did not ask for every bucket)",
            d->ngather_pending);
    d->marked[li] = 1;
    /* keep the reductions already launched moving while backward computes */
    for (int b = 0; b < L->nbuckets; b++) comm_progress(d->comm, &d->buckets[b].reduce);
    Bucket* bk = &d->buckets[L->params[li].bucket];
    if (--bk->pending > 0) return;
    BucketGroup* g = &d->groups[bk->lb->group];
    if (--g->pending > 0) return;
    /* stages 0, 1 (and stage 2 at world 1, which accumulates in place):
     * earlier micro-steps only accumulate; stage 2 reduces every micro-step */
    if (!d->last_micro && !d->sharded) return;
    for (int b = g->first; b < g->first + g->n; b++) launch_bucket(d, b);
}

void ddp_finish_reductions(DDP* d) {
    const Layout* L = d->L;
    d->backward_end = wall_time_s() - d->micro_start;
    for (int b = 0; b < L->nbuckets; b++) {
        if (d->buckets[b].pending != 0)
            fatal("internal: bucket %d has %d parameters never marked ready", b, d->buckets[b].pending);
        if (!d->buckets[b].nlaunch) fatal("internal: bucket %d was never launched", b);
        d->buckets[b].nlaunch = 0;
    }
    if (d->sharded) {
        grad_shard_drain(&d->shard, d->buckets);
        return;
    }
    for (int b = 0; b < L->nbuckets; b++) comm_wait(d->comm, &d->buckets[b].reduce);
}

void ddp_norm_skip(DDP* d, size_t lo, size_t hi) {
    int k = 0;
    for (int i = 0; i < d->nown; i++)
        if (!(d->own[i].buf_off >= lo && d->own[i].buf_off + d->own[i].len <= hi)) d->own[k++] = d->own[i];
    d->nown = k;
}

double ddp_grad_sumsq(DDP* d) { return d->be->grad_sumsq(d->be, d->grads, d->own, d->nown); }

void ddp_zero_grads(DDP* d) {
    if (d->cfg.zero_stage == 2) grad_shard_zero(&d->shard);
    else d->be->zero(d->be, d->grads, d->L->total * es_of(d));
}

/* ------------------------------------------------------------- all-gather */

/* Launch the all-gathers at launch positions [gather_launched, upto). */
static void gather_launch_upto(DDP* d, int upto) {
    for (; d->gather_launched < upto; d->gather_launched++)
        bucket_gather_launch(&d->buckets[d->gather_order[d->gather_launched]], d->comm, d->params,
                             d->be->dtype);
}

void ddp_gather_params(DDP* d) {
    const Layout* L = d->L;
    if (d->cfg.zero_stage == 0) return;
    ddp_wait_gathers(d); /* (none outstanding in a normal step: the forward waited for all) */
    /* Forward order: the buckets are laid out in backward-finish order, so
     * forward meets them in descending bucket index (the embeddings' buckets,
     * the last ones, first: wte's row chunks, last chunk first, then wpe's;
     * the final layernorm's, bucket 0, last). The tied wte is read again by
     * the classifier at the end: its buckets are complete by then. */
    for (int k = 0; k < L->nbuckets; k++) {
        int b = d->cfg.gather_reverse ? k : L->nbuckets - 1 - k;
        d->gather_order[k] = b;
        d->buckets[b].gather_pending = 1;
        d->buckets[b].gather_pos = k;
    }
    d->gather_launched = 0;
    if (!d->cfg.gather_hold) gather_launch_upto(d, L->nbuckets);
    d->ngather_pending = L->nbuckets;
    d->gather_next_pos = 0;
    d->gather_out_of_order = 0;
    d->gather_waits = 0;
    d->gather_wait_s = 0.0;
    if (!d->cfg.overlap_gather) ddp_wait_gathers(d);
}

static void gather_wait_bucket(DDP* d, Bucket* bk) {
    if (!bk->gather_pending) return;
    if (bk->gather_pos != d->gather_next_pos) d->gather_out_of_order++;
    d->gather_next_pos = bk->gather_pos + 1;
    gather_launch_upto(d, bk->gather_pos + 1); /* (held launches: up to this one) */
    double t0 = wall_time_s();
    comm_wait(d->comm, &bk->gather);
    d->gather_wait_s += wall_time_s() - t0;
    d->gather_waits++;
    bk->gather_pending = 0;
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
    int* bks = n <= 16 ? fixed : xmalloc(sizeof(int) * (size_t)n);
    int nb = 0;
    for (int i = 0; i < n; i++) {
        if (li[i] < 0 || li[i] >= L->nparams) fatal("internal: ddp_need_params(%d) out of range", li[i]);
        int b = L->params[li[i]].bucket; /* the bucket the tensor lives in */
        if (!d->buckets[b].gather_pending) continue;
        int j = nb++;
        while (j > 0 && d->buckets[bks[j - 1]].gather_pos > d->buckets[b].gather_pos) {
            bks[j] = bks[j - 1];
            j--;
        }
        bks[j] = b;
    }
    for (int k = 0; k < nb; k++)
        if (k == 0 || bks[k] != bks[k - 1]) gather_wait_bucket(d, &d->buckets[bks[k]]);
    if (bks != fixed) free(bks);
    /* the all-gathers still in flight progress while this kernel computes */
    for (int b = 0; b < L->nbuckets && d->ngather_pending; b++)
        if (d->buckets[b].gather_pending) comm_progress(d->comm, &d->buckets[b].gather);
}

void ddp_wait_gathers(DDP* d) {
    if (d->ngather_pending == 0) return;
    for (int k = 0; k < d->L->nbuckets; k++) gather_wait_bucket(d, &d->buckets[d->gather_order[k]]);
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
        fprintf(f, " %.1f", 1000.0 * d->buckets[b].launch_time);
    }
    fprintf(f, " ms of a %.1f ms forward+backward (last micro-step)\n", 1000.0 * d->backward_end);
    if (d->cfg.overlap_gather && d->gather_waits > 0)
        fprintf(f,
                "overlap: forward waited per bucket on %d all-gathers launched in %s order, %d of them out of "
                "launch order, %.2f ms blocked\n",
                d->gather_waits, d->cfg.gather_reverse ? "bucket (reverse)" : "forward", d->gather_out_of_order,
                1000.0 * d->gather_wait_s);
}

void ddp_memory_report(const DDP* d, int rank, FILE* f) {
    if (d->cfg.zero_stage == 2) grad_shard_report(&d->shard, rank, f);
}

void ddp_free(DDP* d) {
    if (!d->L) return;
    ddp_wait_gathers(d);
    if (d->cfg.zero_stage == 2) grad_shard_free(&d->shard, d->buckets);
    free(d->own);
    free(d->buckets);
    free(d->groups);
    free(d->marked);
    free(d->gather_order);
    memset(d, 0, sizeof *d);
}
