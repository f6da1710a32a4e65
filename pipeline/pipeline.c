/* pipeline/pipeline.c — see pipeline.h. */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

static size_t es_of(const Pipeline* pp) { return dtype_size(pp->be->dtype); }
static size_t act_elems(const Pipeline* pp, const PPChunk* ch) {
    return (size_t)pp->B * pp->T * (size_t)ch->model.cfg.channels;
}
static int is_first(const Pipeline* pp, const PPChunk* ch) {
    (void)pp;
    return ch->c == 0;
}
static int is_last(const Pipeline* pp, const PPChunk* ch) { return ch->c == pp->P * pp->V - 1; }

/* Where global chunk c lives: pipeline rank c % P, local chunk c / P. */
static int rank_of(const Pipeline* pp, int c) { return c % pp->P; }
static int local_of(const Pipeline* pp, int c) { return c / pp->P; }

/* The tag of a message to (receiving local chunk v, micro i, direction dir:
 * 0 activations, 1 gradients). Messages of a pair travel in order anyway; the
 * tag lets the MPI backend check that both sides agree. */
static int msg_tag(const Pipeline* pp, int v, int i, int dir) { return (dir * pp->V + v) * pp->m + i; }

void pipeline_init(Pipeline* pp, Comm* world, Backend* be, const GPT2Config* cfg, const PipelineConfig* pc) {
    memset(pp, 0, sizeof *pp);
    const int P = pc->P, V = pc->V, L = cfg->num_layers;
    char err[256];
    if (P < 1) fatal("flag --pipeline_parallel must be positive (got %d)", P);
    if (V < 1) fatal("flag --virtual_pipeline_parallel must be positive (got %d)", V);
    if (world->world % P != 0)
        fatal("--pipeline_parallel %d does not divide the %d ranks (ranks = pipeline stages x data-parallel "
              "replicas)",
              P, world->world);
    if (V > 1 && P == 1)
        fatal(
            "--virtual_pipeline_parallel %d needs --pipeline_parallel > 1 (one stage has nothing to interleave)",
            V);
    if (P * V > L)
        fatal(
            "--pipeline_parallel %d x --virtual_pipeline_parallel %d = %d model chunks, more than the model's %d "
            "layers",
            P, V, P * V, L);
    pp->P = P;
    pp->V = V;
    pp->DP = world->world / P;
    pp->p = world->rank / pp->DP;
    pp->d = world->rank % pp->DP;
    pp->m = pc->m;
    pp->B = pc->B;
    pp->T = pc->T;
    pp->world = world;
    pp->be = be;
    pp->reduce_early = pc->reduce_early;
    if (pp_schedule_kind(V, pc->schedule, &pp->kind, err, sizeof err) != 0) fatal("--pp_schedule: %s", err);
    pp->nops = 2 * V * pp->m;
    pp->ops = xmalloc(sizeof(PPOp) * (size_t)pp->nops);
    if (pp_schedule(pp->kind, P, V, pp->m, pp->p, pp->ops, err, sizeof err) < 0)
        fatal(
            "--pp_schedule %s with --pipeline_parallel %d, --virtual_pipeline_parallel %d and %d micro-batches "
            "(--total_batch_size / (batch_size x sequence_length x data-parallel ranks)): %s",
            pc->schedule, P, V, pp->m, err);
    pp->first_layer = xmalloc(sizeof(int) * (size_t)(P * V + 1));
    if (pp_split_layers(L, P * V, pp->first_layer, err, sizeof err) != 0) fatal("pipeline: %s", err);

    /* communicators: the stage's replicas, the replica's stages, the embedding pair */
    comm_split(world, pp->p, pp->d, &pp->dp);
    comm_split(world, pp->d, pp->p, &pp->pp);
    int in_emb = P > 1 && (pp->p == 0 || pp->p == P - 1);
    comm_split(world, in_emb ? pp->d : COMM_COLOR_NONE, pp->p, &pp->emb);
    comm_p2p_setup(&pp->pp);

    pp->chunks = xcalloc((size_t)V, sizeof(PPChunk));
    for (int v = 0; v < V; v++) {
        PPChunk* ch = &pp->chunks[v];
        ch->v = v;
        ch->c = v * P + pp->p;
        ch->last_bwd = pp_last_backward(pp->ops, pp->nops, v);
        ch->first_launch_op = ch->last_launch_op = -1;
        GPT2* m = &ch->model;
        if (P * V > 1)
            m->part = (GPT2Part){.layer_first = pp->first_layer[ch->c],
                                 .layer_count = pp->first_layer[ch->c + 1] - pp->first_layer[ch->c],
                                 .has_embed = is_first(pp, ch),
                                 .has_head = is_last(pp, ch)};
        int nspecs;
        ch->specs = gpt2_describe(m, cfg, &nspecs);
        if (layout_build(&ch->layout, ch->specs, nspecs, pc->bucket_size, pc->buckets_per_group, pp->DP, 64,
                         err, sizeof err) != 0)
            fatal("layout: %s", err);
        m->shard_grads = pc->zero_stage == 2; /* ZeRO-2: DDP keeps the gradients, in a shard */
        gpt2_bind(m, be, &ch->layout);
        m->recompute = pc->recompute;
        m->nslots = pp_max_inflight(pp->ops, pp->nops, v);
        gpt2_alloc_activations(m, pp->B, pp->T);
        /* what it sends: outputs forward (all but the last chunk), input gradients back (all but chunk 0) */
        if (!is_last(pp, ch) || !is_first(pp, ch)) {
            size_t bytes = act_elems(pp, ch) * es_of(pp);
            int n = (!is_last(pp, ch)) + (!is_first(pp, ch));
            ch->send_buf = xcalloc((size_t)pp->m * 2, sizeof(void*));
            ch->send = xcalloc((size_t)pp->m * 2, sizeof(CommHandle));
            for (int k = 0; k < pp->m * n; k++) ch->send_buf[k] = be->alloc(be, bytes, MEM_ACTIVATIONS);
            ch->send_bytes = (size_t)pp->m * (size_t)n * bytes;
        }
    }
}

void pipeline_setup_ddp(Pipeline* pp, const PipelineConfig* pc, OptBuffer* bufs) {
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        ddp_setup(&ch->ddp, &ch->model, &pp->dp, &pc->ddp, &bufs[v]);
        if (pp->P == 1 || (!is_first(pp, ch) && !is_last(pp, ch))) continue;
        /* the tied wte: the optimizer's pieces that lie in it (what the two
         * stages' sums must cover); the head's copy counts not in the norm */
        const GPT2Tensor* te = gpt2_tensor(&ch->model, GPT2_WTE, -1);
        size_t lo = te->buf_off, hi = te->buf_off + te->numel;
        ch->tied = xmalloc(sizeof(OptPiece) * (size_t)(bufs[v].npieces ? bufs[v].npieces : 1));
        for (int k = 0; k < bufs[v].npieces; k++) {
            OptPiece* pc2 = &bufs[v].pieces[k];
            if (pc2->buf_off < lo || pc2->buf_off + pc2->len > hi) continue;
            /* bf16 rounding by the index within wte, the same on both stages */
            pc2->rng_off = pc2->buf_off - lo;
            ch->tied[ch->ntied++] = *pc2;
        }
        if (is_last(pp, ch)) ddp_norm_skip(&ch->ddp, lo, hi);
    }
    (void)pc;
}

/* ------------------------------------------------------------------ a step */

static void recv_wait(Pipeline* pp, void* buf, size_t count, int peer, int tag) {
    CommHandle h;
    comm_recv(&pp->pp, buf, count, pp->be->dtype, peer, tag, &h);
    double t0 = wall_time_s();
    comm_wait(&pp->pp, &h);
    pp->wait_s += wall_time_s() - t0;
}

/* Send the n elements at src to peer from the chunk's buffer k (a copy: src
 * may be reused before the send completes). */
static void send_copy(Pipeline* pp, PPChunk* ch, int k, const void* src, size_t count, int peer, int tag) {
    pp->be->copy(pp->be, ch->send_buf[k], src, count * es_of(pp));
    comm_send(&pp->pp, ch->send_buf[k], count, pp->be->dtype, peer, tag, &ch->send[k]);
}

static void run_forward(Pipeline* pp, PPChunk* ch, const PPOp* op, DataLoader* dl, uint64_t first_row,
                        float dloss, int* inputs, int* targets, double* loss_sum) {
    GPT2* m = &ch->model;
    const size_t n = act_elems(pp, ch);
    gpt2_use_slot(m, op->slot);
    if (!is_first(pp, ch)) {
        int c = ch->c - 1;
        recv_wait(pp, gpt2_input(m), n, rank_of(pp, c), msg_tag(pp, ch->v, op->micro, 0));
    }
    if (is_first(pp, ch) || is_last(pp, ch))
        dataloader_rows(dl, first_row + ((uint64_t)op->micro * pp->DP + pp->d) * pp->B, pp->B, inputs, targets);
    float loss = gpt2_forward(m, inputs, is_last(pp, ch) ? targets : NULL, pp->B, pp->T, dloss);
    if (is_last(pp, ch)) {
        *loss_sum += loss;
        return;
    }
    int c = ch->c + 1;
    send_copy(pp, ch, op->micro, gpt2_output(m), n, rank_of(pp, c), msg_tag(pp, local_of(pp, c), op->micro, 0));
}

static void run_backward(Pipeline* pp, PPChunk* ch, const PPOp* op, int op_index) {
    GPT2* m = &ch->model;
    const size_t n = act_elems(pp, ch);
    gpt2_use_slot(m, op->slot);
    int launch = pp->reduce_early ? op->micro == 0 : op_index == ch->last_bwd;
    ddp_begin_micro_step(&ch->ddp, launch);
    if (!is_last(pp, ch)) {
        int c = ch->c + 1;
        recv_wait(pp, gpt2_dres(m), n, rank_of(pp, c), msg_tag(pp, ch->v, op->micro, 1));
    }
    gpt2_backward(m, ddp_param_ready, &ch->ddp);
    if (ch->ddp.buckets[0].launched) { /* (every bucket completes in every backward: all launched or none) */
        if (ch->first_launch_op < 0) ch->first_launch_op = op_index;
        ch->last_launch_op = op_index;
    }
    if (is_first(pp, ch)) return;
    int c = ch->c - 1;
    int k = (is_last(pp, ch) ? 0 : pp->m) + op->micro;
    send_copy(pp, ch, k, gpt2_dres(m), n, rank_of(pp, c), msg_tag(pp, local_of(pp, c), op->micro, 1));
}

double pipeline_forward_backward(Pipeline* pp, DataLoader* dl, uint64_t first_row, float dloss, int* inputs,
                                 int* targets) {
    double loss_sum = 0.0;
    pp->wait_s = 0.0;
    for (int v = 0; v < pp->V; v++) pp->chunks[v].first_launch_op = pp->chunks[v].last_launch_op = -1;
    for (int k = 0; k < pp->nops; k++) {
        const PPOp* op = &pp->ops[k];
        PPChunk* ch = &pp->chunks[op->chunk];
        if (op->kind == PP_FWD) run_forward(pp, ch, op, dl, first_row, dloss, inputs, targets, &loss_sum);
        else run_backward(pp, ch, op, k);
    }
    /* every receive is posted by now on every rank: the sends complete */
    double t0 = wall_time_s();
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        for (int k = 0; ch->send && k < 2 * pp->m; k++) comm_wait(&pp->pp, &ch->send[k]);
    }
    pp->wait_s += wall_time_s() - t0;
    return loss_sum;
}

void pipeline_finish_reductions(Pipeline* pp) {
    for (int v = 0; v < pp->V; v++) ddp_finish_reductions(&pp->chunks[v].ddp);
    /* the tied embedding: first + last stage, over each piece the optimizer
     * reads (both stages hold the same pieces: the same layout of wte) */
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        size_t es = es_of(pp);
        for (int k = 0; k < ch->ntied; k++) {
            CommHandle h;
            comm_allreduce(&pp->emb, (char*)ch->ddp.grads + ch->tied[k].grad_off * es, ch->tied[k].len,
                           pp->be->dtype, 0, &h);
            comm_wait(&pp->emb, &h);
        }
    }
}

double pipeline_grad_sumsq(Pipeline* pp) {
    double s = 0.0;
    for (int v = 0; v < pp->V; v++) s += ddp_grad_sumsq(&pp->chunks[v].ddp);
    return s;
}

void pipeline_after_update(Pipeline* pp, int updated) {
    for (int v = 0; v < pp->V; v++) {
        if (updated) ddp_gather_params(&pp->chunks[v].ddp); /* overlapped: waited for in the next forward */
        ddp_zero_grads(&pp->chunks[v].ddp);
    }
}

void pipeline_wait_gathers(Pipeline* pp) {
    for (int v = 0; v < pp->V; v++) ddp_wait_gathers(&pp->chunks[v].ddp);
}

double pipeline_eval(Pipeline* pp, const int* inputs, const int* targets) {
    double loss = 0.0;
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        GPT2* m = &ch->model;
        const size_t n = act_elems(pp, ch);
        gpt2_use_slot(m, 0);
        if (!is_first(pp, ch)) recv_wait(pp, gpt2_input(m), n, rank_of(pp, ch->c - 1), msg_tag(pp, v, 0, 0));
        float l = gpt2_forward(m, inputs, is_last(pp, ch) ? targets : NULL, pp->B, pp->T, 0.0f);
        if (is_last(pp, ch)) {
            loss = l;
            continue;
        }
        CommHandle h;
        int c = ch->c + 1;
        comm_send(&pp->pp, gpt2_output(m), n, pp->be->dtype, rank_of(pp, c), msg_tag(pp, local_of(pp, c), 0, 0),
                  &h);
        comm_wait(&pp->pp, &h); /* the next chunk's rank posts its receive before anything of ours */
    }
    return loss;
}

void pipeline_check_tied(Pipeline* pp) {
    if (pp->P == 1) return;
    /* a 64-bit hash of this rank's copy of wte (the bytes of the param buffer) */
    uint64_t hsh = 1469598103934665603ull;
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        if (!is_first(pp, ch) && !is_last(pp, ch)) continue;
        const GPT2Tensor* te = gpt2_tensor(&ch->model, GPT2_WTE, -1);
        size_t bytes = te->numel * es_of(pp);
        unsigned char* h = xmalloc(bytes);
        pp->be->to_host(pp->be, h, (char*)ch->model.params + te->buf_off * es_of(pp), bytes);
        for (size_t i = 0; i < bytes; i++) hsh = (hsh ^ h[i]) * 1099511628211ull;
        free(h);
    }
    /* the two stages of the pair hold equal hashes iff max == min */
    int in_emb = pp->p == 0 || pp->p == pp->P - 1;
    int lo = (int)(hsh & 0x7fffffff), hi = (int)(hsh >> 33);
    int bad = 0;
    if (in_emb) {
        int mx_lo = comm_allreduce_host_max_int(&pp->emb, lo),
            mn_lo = -comm_allreduce_host_max_int(&pp->emb, -lo);
        int mx_hi = comm_allreduce_host_max_int(&pp->emb, hi),
            mn_hi = -comm_allreduce_host_max_int(&pp->emb, -hi);
        bad = mx_lo != mn_lo || mx_hi != mn_hi;
    }
    if (comm_allreduce_host_max_int(pp->world, bad))
        fatal("the two copies of the tied embedding (first and last pipeline stage) differ");
}

/* ------------------------------------------------------------------ reports */

void pipeline_print_grid(const Pipeline* pp, FILE* f) {
    if (pp->world->rank != 0) return;
    fprintf(f,
            "pipeline: %d stages x %d data-parallel replicas, %d model chunk(s) per rank, schedule %s, %d "
            "micro-batches per step, theoretical bubble (P-1)/(V*m) = %.3f\n",
            pp->P, pp->DP, pp->V, pp_schedule_name(pp->kind), pp->m,
            (double)(pp->P - 1) / ((double)pp->V * pp->m));
    for (int p = 0; p < pp->P; p++) {
        fprintf(f, "  stage %d: ranks", p);
        for (int d = 0; d < pp->DP; d++) fprintf(f, " %d", p * pp->DP + d);
        fprintf(f, " (a data-parallel group); chunks");
        for (int v = 0; v < pp->V; v++) {
            int c = v * pp->P + p;
            fprintf(f, " %d: layers %d-%d%s%s", c, pp->first_layer[c], pp->first_layer[c + 1] - 1,
                    c == 0 ? " + embeddings" : "", c == pp->P * pp->V - 1 ? " + head" : "");
            if (v + 1 < pp->V) fprintf(f, ",");
        }
        fprintf(f, "\n");
    }
    for (int d = 0; d < pp->DP; d++) {
        fprintf(f, "  pipeline %d: ranks", d);
        for (int p = 0; p < pp->P; p++) fprintf(f, " %d", p * pp->DP + d);
        fprintf(f, "\n");
    }
}

void pipeline_print_chunks(const Pipeline* pp, const Optimizer* opt, FILE* f) {
    size_t es = es_of(pp);
    for (int v = 0; v < pp->V; v++) {
        const PPChunk* ch = &pp->chunks[v];
        const GPT2* m = &ch->model;
        size_t grads = ch->ddp.cfg.zero_stage == 2 ? ch->ddp.shard.elems * es : ch->layout.total * es;
        size_t state = 0; /* fp32 master, m, v of the chunk's pieces */
        for (int k = 0; k < opt->bufs[v].npieces; k++) state += 12 * opt->bufs[v].pieces[k].len;
        fprintf(f,
                "rank %d chunk %d (layers %d-%d%s%s): %zu params, params %.2f MB, grads %.2f MB, optimizer "
                "state %.2f MB, activations %.2f MB (peak: %d micro-batch slot(s)), transfer buffers %.2f MB\n",
                pp->world->rank, ch->c, m->part.layer_first, m->part.layer_first + m->part.layer_count - 1,
                m->part.has_embed ? " + embeddings" : "", m->part.has_head ? " + head" : "", m->part_parameters,
                (double)(ch->layout.total * es) / 1048576.0, (double)grads / 1048576.0,
                (double)state / 1048576.0, (double)m->acts_bytes / 1048576.0, m->nslots,
                (double)ch->send_bytes / 1048576.0);
    }
}

void pipeline_overlap_report(const Pipeline* pp, FILE* f) {
    for (int v = 0; v < pp->V; v++) {
        const PPChunk* ch = &pp->chunks[v];
        int lb = ch->last_bwd;
        fprintf(
            f,
            "rank %d chunk %d: reductions launched during ops %d..%d, its last backward is op %d (micro-batch "
            "%d)\n",
            pp->world->rank, ch->c, ch->first_launch_op, ch->last_launch_op, lb,
            lb >= 0 ? pp->ops[lb].micro : -1);
    }
}

void pipeline_free(Pipeline* pp) {
    for (int v = 0; pp->chunks && v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        ddp_free(&ch->ddp);
        size_t bytes = act_elems(pp, ch) * es_of(pp);
        for (int k = 0; ch->send_buf && k < 2 * pp->m; k++)
            if (ch->send_buf[k]) pp->be->release(pp->be, ch->send_buf[k], bytes, MEM_ACTIVATIONS);
        free(ch->send_buf);
        free(ch->send);
        free(ch->tied);
        gpt2_free(&ch->model);
        layout_free(&ch->layout);
        free(ch->specs);
    }
    free(pp->chunks);
    free(pp->ops);
    free(pp->first_layer);
    comm_finalize(&pp->emb);
    comm_finalize(&pp->pp);
    comm_finalize(&pp->dp);
    memset(pp, 0, sizeof *pp);
}

/* ------------------------------------------------------------------ samples */

/* Forward of ids[0..n) (batch 1) through the stages; the last stage fills
 * row with the logits of position n-1 and returns 1. */
static int chain_logits(Pipeline* pp, const int* ids, int n, float* row) {
    int have = 0;
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        GPT2* m = &ch->model;
        size_t count = (size_t)n * (size_t)m->cfg.channels;
        gpt2_use_slot(m, 0);
        if (!is_first(pp, ch))
            recv_wait(pp, gpt2_input(m), count, rank_of(pp, ch->c - 1), msg_tag(pp, v, 0, 0));
        gpt2_forward(m, ids, NULL, 1, n, 0.0f);
        if (is_last(pp, ch)) {
            gpt2_logits_row(m, 0, n - 1, row);
            have = 1;
            continue;
        }
        CommHandle h;
        int c = ch->c + 1;
        comm_send(&pp->pp, gpt2_output(m), count, pp->be->dtype, rank_of(pp, c),
                  msg_tag(pp, local_of(pp, c), 0, 0), &h);
        comm_wait(&pp->pp, &h);
    }
    return have;
}

void pipeline_sample(Pipeline* pp, const Tokenizer* tok, int ntokens, uint64_t seed) {
    const GPT2Config* cfg = &pp->chunks[0].model.cfg;
    int V = cfg->vocab_size, T = pp->T;
    int* ids = xmalloc(sizeof(int) * (size_t)T);
    float* row = xmalloc(sizeof(float) * (size_t)V);
    Rng r;
    rng_seed(&r, seed);
    ids[0] = (int)tok->eot;
    int n = 1;
    for (; n < ntokens + 1 && n < T; n++) {
        int next = -1;
        if (chain_logits(pp, ids, n, row)) next = sample_token(row, V, &r);
        /* the head's rank drew it; every rank of the pipeline takes it */
        ids[n] = pp->P > 1 ? comm_allreduce_host_max_int(&pp->pp, next) : next;
    }
    if (pp->world->rank == 0) {
        printf("---- sample ----\n");
        tokenizer_print(tok, ids + 1, n - 1, stdout);
        printf("\n----------------\n");
        fflush(stdout);
    }
    free(ids);
    free(row);
}
