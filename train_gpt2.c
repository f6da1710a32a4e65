/* train_gpt2.c — GPT-2 training, one step read top to bottom.
 *
 *   mpirun -np N ./train_gpt2 --zero_stage 1 ...      (or ./train_gpt2 alone)
 *
 * main: parse the flags (train/args.c); build the trainer: the compute
 * backend, the communicator, the pipeline grid and this rank's model chunks
 * (pipeline/; at --pipeline_parallel 1, one chunk: the whole model) on their
 * flat buffers (ddp/layout.c), each chunk's DDP, the optimizer over every
 * chunk's buffers, the checkpointer and the data; then loop: validation and a
 * sample when due, train_step(), the step's log line (train/runlog.c), a
 * checkpoint when due.
 *
 * train_step():
 *   the micro-batches' forwards and backwards, in the pipeline schedule's
 *   order (one stage: forward, backward, forward, backward, ...):
 *     forward   (--overlap_param_gather: each kernel first waits for the
 *                all-gather of the buckets it reads; between stages the
 *                activations go point to point)
 *     backward  (marks each tensor ready as its gradient is final; in a
 *                chunk's last backward a complete bucket group launches its
 *                reduction while backward goes on: all-reduce at zero_stage 0,
 *                reduce-scatter at 1; at zero_stage 2 a reduce-scatter in
 *                every backward into this rank's gradient shard)
 *   wait for the reductions; sum the tied embedding's two copies' gradients
 *   grad norm: the sum of squares over this rank's pieces, all-reduced once
 *   AdamW over the optimizer's pieces, with the clip scale
 *   zero_stage 1, 2: all-gather the params bucket by bucket (overlapped: not
 *                    waited for here but by the next forward)
 *   zero this rank's gradients
 * A step whose loss or grad norm is not finite makes no update (its gradients
 * are dropped); --max_bad_steps such steps in a row end the run. Every
 * --checkpoint_every steps the training state goes to a checkpoint
 * (checkpoint/), from which --resume continues at any number of ranks and
 * any pipeline shape. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "comm/comm.h"
#include "common/stop_signal.h"
#include "common/threads.h"
#include "common/util.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "ddp/ddp.h"
#include "ddp/layout.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "pipeline/pipeline.h"
#include "train/args.h"
#include "train/runlog.h"
#include "zero/optimizer.h"

/* Everything a run holds; built by trainer_build, freed by trainer_free. */
typedef struct {
    Args a;
    Comm comm;
    Backend* be;
    int rank, world;
    int B, T, accum; /* micro-batch, sequence length, micro-batches per step */
    Pipeline pp;     /* the grid and this rank's model chunks (one: the whole model, at P = 1) */
    Optimizer opt;   /* over every chunk's buffers */
    DataLoader train, val;
    int have_val, have_tok;
    Tokenizer tok;
    Checkpointer ck;
    CkptProgress prog; /* steps done, the data position, non-finite steps in a row */
    RunLog log;
    int *inputs, *targets; /* one micro-batch, B * T each */
    float dloss;           /* the backward seed: 1 / tokens of the global batch */
    double flops_per_step, peak_flops;
} Trainer;

/* What train_step reports. */
typedef struct {
    double loss, norm; /* mean over the global batch; global norm before clipping */
    float lr;
    int finite; /* 0: no update was made */
    double seconds;
    double bubble; /* pipeline: time blocked on transfers / step time; < 0 without one */
} StepResult;

static double mb(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* --inject_nan_at_step, a testing aid: poisons this rank's share of the k-th
 * poisoned step: even k a NaN in the first gradient element it owns (the
 * grad norm turns NaN), odd k an infinite loss. Returns the loss to use. */
static double inject_fault(const DDP* d, int k, double loss) {
    if (k % 2 == 1 || d->nown == 0) return INFINITY;
    float nan32 = NAN;
    uint16_t nan16 = 0x7fc0;
    size_t es = dtype_size(d->be->dtype);
    d->be->to_device(d->be, (char*)d->grads + d->own[0].grad_off * es,
                     es == 4 ? (const void*)&nan32 : (const void*)&nan16, es);
    d->be->synchronize(d->be);
    return loss;
}

/* ------------------------------------------------------------------------ */
/* One optimizer step                                                        */

static StepResult train_step(Trainer* t, int step) {
    const Args* a = &t->a;
    Pipeline* pp = &t->pp;
    /* be->synchronize also waits for the communication stream, i.e. for the
     * all-gathers that --overlap_param_gather hides behind the next forward:
     * then the step is timed on the host alone (the forward's input copy and
     * loss read wait for the compute stream). */
    if (!a->overlap_param_gather) t->be->synchronize(t->be);
    t->be->reset_peak(t->be);
    double t0 = wall_time_s();
    double loss_sum =
        pipeline_forward_backward(pp, &t->train, t->prog.next_row, t->dloss, t->inputs, t->targets);
    pipeline_finish_reductions(pp);
    if (t->rank == 0 && t->world > 1 && (step == 0 || step == a->num_iterations - 1))
        for (int v = 0; v < pp->V; v++) ddp_overlap_report(&pp->chunks[v].ddp, stdout);
    int poisoned = step + 1 - a->inject_nan_at_step;
    if (a->inject_nan_at_step > 0 && poisoned >= 0 && poisoned < a->inject_nan_steps && t->rank == t->world - 1)
        loss_sum = inject_fault(&pp->chunks[0].ddp, poisoned, loss_sum);

    StepResult r;
    /* the loss comes from the last stage's ranks, one per replica */
    double sums[2] = {pipeline_grad_sumsq(pp), loss_sum / t->accum};
    comm_allreduce_host_sum(&t->comm, sums, 2);
    r.norm = sqrt(sums[0]);
    r.loss = sums[1] / pp->DP;
    r.lr = lr_at_step(a->sched, step, a->warmup_iters, a->num_iterations, a->learning_rate,
                      a->learning_rate_decay_frac);
    /* every rank sees the same reduced loss and norm, so every rank decides alike */
    r.finite = isfinite(r.loss) && isfinite(r.norm);
    if (r.finite) {
        float scale = (a->grad_clip > 0 && r.norm > a->grad_clip) ? (float)(a->grad_clip / r.norm) : 1.0f;
        optimizer_step(&t->opt, r.lr, a->beta1, a->beta2, a->eps, a->weight_decay, scale,
                       (uint32_t)a->seed * 7919u + (uint32_t)step); /* unsigned: no overflow for any --seed */
        t->prog.bad_streak = 0;
    } else {
        t->prog.bad_streak++; /* no update: the params and the optimizer state stay as they were */
    }
    /* all-gathers (overlapped: waited for in the next forward), zeroed grads */
    pipeline_after_update(pp, r.finite);
    if (!a->overlap_param_gather) t->be->synchronize(t->be);
    t->prog.step = step + 1;
    t->prog.next_row += (uint64_t)t->B * pp->DP * t->accum;
    r.seconds = wall_time_s() - t0;
    r.bubble = pp->P > 1 ? pp->wait_s / r.seconds : -1.0;
    return r;
}

/* Validation loss over --val_max_steps batches of every replica, printed and logged. */
static void evaluate(Trainer* t, int step) {
    Pipeline* pp = &t->pp;
    double vsum = 0.0;
    int nb = t->a.val_max_steps;
    for (int k = 0; k < nb; k++) {
        dataloader_rows(&t->val, ((uint64_t)k * pp->DP + pp->d) * t->B, t->B, t->inputs, t->targets);
        vsum += pipeline_eval(pp, t->inputs, t->targets);
    }
    comm_allreduce_host_sum(&t->comm, &vsum, 1);
    runlog_val(&t->log, step, vsum / ((double)nb * pp->DP));
}

/* ------------------------------------------------------------------------ */
/* Building the trainer                                                      */

/* The model's shape: a preset with the --n_embd/--n_head/--max_seq_len
 * overrides, or an llm.c model file's header (*from_file = 1). */
static GPT2Config model_config(const Args* a, int* from_file) {
    GPT2Config cfg;
    *from_file = 0;
    if (gpt2_preset(a->model, &cfg) == 0) {
        if (a->n_embd) cfg.channels = a->n_embd;
        if (a->n_head) cfg.num_heads = a->n_head;
        if (a->max_seq_len) cfg.max_seq_len = a->max_seq_len;
        if (cfg.channels % cfg.num_heads != 0)
            fatal("--n_embd %d does not divide by the number of heads %d", cfg.channels, cfg.num_heads);
        return cfg;
    }
    FILE* probe = fopen(a->model, "rb");
    if (!probe)
        fatal("--model '%s' is neither a preset (d2 ... d48) nor a readable file: %s", a->model,
              strerror(errno));
    fclose(probe);
    int version;
    gpt2_read_header(a->model, &cfg, &version);
    if ((a->n_embd && a->n_embd != cfg.channels) || (a->n_head && a->n_head != cfg.num_heads) ||
        (a->max_seq_len && a->max_seq_len != cfg.max_seq_len))
        fatal(
            "%s: the model file's shape (C %d, NH %d, maxT %d) disagrees with --n_embd/--n_head/--max_seq_len",
            a->model, cfg.channels, cfg.num_heads, cfg.max_seq_len);
    *from_file = 1;
    return cfg;
}

/* Rank 0: the run's settings, the pipeline grid and its chunks' layout; then
 * every rank, in turn, its memory. */
static void trainer_report(Trainer* t) {
    const Args* a = &t->a;
    const Pipeline* pp = &t->pp;
    const GPT2* m0 = &pp->chunks[0].model;
    const GPT2Config* cfg = &m0->cfg;
    if (t->rank == 0) {
        printf("train_gpt2 | device %s | dtype %s | ranks %d | comm %s | zero_stage %d%s\n", t->be->name,
               dtype_name(t->be->dtype), t->world, comm_kind_name(t->comm.kind), a->zero_stage,
               a->overlap_param_gather ? " | param all-gather overlapped with forward" : "");
        printf("model %s: L %d, NH %d, C %d, maxT %d, V %d (padded %d), %zu parameters\n", a->model,
               cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size,
               cfg->padded_vocab_size, m0->num_parameters);
        if (pp->P > 1)
            printf("batch: B %d x T %d x data-parallel %d x micro-batches %d = %lld tokens per step\n", t->B,
                   t->T, pp->DP, t->accum, a->total_batch_size);
        else
            printf("batch: B %d x T %d x ranks %d x accumulation %d = %lld tokens per step\n", t->B, t->T,
                   t->world, t->accum, a->total_batch_size);
        printf("train data: %zu rows of %d tokens in %d shard(s)%s\n", t->train.nrows, t->T, t->train.nshards,
               a->shuffle ? ", shuffled" : "");
        if (t->have_val) printf("val data: %zu rows\n", t->val.nrows);
        if (pp->P > 1) pipeline_print_grid(pp, stdout);
        for (int v = 0; v < pp->V; v++) layout_print(&pp->chunks[v].layout, stdout);
    }
    for (int r = 0; r < t->world; r++) {
        comm_barrier(&t->comm);
        if (r != t->rank) continue;
        const MemTracker* mt = &t->be->mem;
        size_t opt_bytes = mt->current[MEM_MASTER] + mt->current[MEM_ADAM_M] + mt->current[MEM_ADAM_V];
        size_t held = 0;
        for (int v = 0; v < pp->V; v++) held += pp->chunks[v].layout.total_params;
        /* zero_stage 2: grads = this rank's shard; the bucket working buffers
         * are allocated during the first step (ddp_memory_report after it) */
        printf(
            "rank %d memory: params %.2f MB, grads %.2f MB, master %.2f MB, adam_m %.2f MB, adam_v %.2f MB, "
            "activations %.2f MB | optimizer state %zu bytes for %zu owned of %zu parameters (%.2f bytes/param)\n",
            t->rank, mb(mt->current[MEM_PARAMS]), mb(mt->current[MEM_GRADS]), mb(mt->current[MEM_MASTER]),
            mb(mt->current[MEM_ADAM_M]), mb(mt->current[MEM_ADAM_V]), mb(mt->current[MEM_ACTIVATIONS]),
            opt_bytes, t->opt.nstate, held, (double)opt_bytes / (double)held);
        if (pp->P > 1) pipeline_print_chunks(pp, &t->opt, stdout);
        fflush(stdout);
    }
    comm_barrier(&t->comm);
}

/* The batch: B rows of T tokens per micro-batch and data-parallel replica, and the micro-batches
 * per step (gradient accumulation, or the pipeline's m) from --total_batch_size. */
static void trainer_batch(Trainer* t, const GPT2Config* cfg) {
    Args* a = &t->a;
    t->B = a->batch_size;
    t->T = a->sequence_length;
    if (t->T > cfg->max_seq_len)
        fatal("--sequence_length %d exceeds the model's maximum sequence length %d", t->T, cfg->max_seq_len);
    if (t->world % a->pipeline_parallel != 0)
        fatal("--pipeline_parallel %d does not divide the %d ranks (ranks = pipeline stages x data-parallel "
              "replicas)",
              a->pipeline_parallel, t->world);
    const int DP = t->world / a->pipeline_parallel;
    long long tokens_per_micro = (long long)t->B * t->T * DP;
    if (a->total_batch_size == -1) a->total_batch_size = tokens_per_micro;
    if (a->total_batch_size <= 0)
        fatal("flag --total_batch_size must be positive (got %lld)", a->total_batch_size);
    if (a->total_batch_size % tokens_per_micro != 0) {
        if (a->pipeline_parallel > 1)
            fatal("--total_batch_size %lld does not divide by batch_size*sequence_length*data-parallel ranks = "
                  "%d*%d*%d = %lld",
                  a->total_batch_size, t->B, t->T, DP, tokens_per_micro);
        fatal("--total_batch_size %lld does not divide by batch_size*sequence_length*ranks = %d*%d*%d = %lld",
              a->total_batch_size, t->B, t->T, t->world, tokens_per_micro);
    }
    t->accum = (int)(a->total_batch_size / tokens_per_micro);
}

/* This rank's model chunks on their flat buffers (loaded or initialised), then DDP and one
 * optimizer over every chunk's buffers. */
static void trainer_model(Trainer* t, const GPT2Config* cfg, int from_file) {
    Args* a = &t->a;
    PipelineConfig pc = {
        .P = a->pipeline_parallel,
        .V = a->virtual_pipeline_parallel,
        .m = t->accum,
        .schedule = a->pp_schedule,
        .B = t->B,
        .T = t->T,
        .recompute = a->recompute,
        .zero_stage = a->zero_stage,
        .ddp = {.zero_stage = a->zero_stage,
                .overlap_gather = a->overlap_param_gather,
                .gather_reverse = strcmp(a->gather_order, "reverse") == 0,
                .gather_hold = a->gather_hold},
        .bucket_size = (size_t)a->bucket_size,
        .buckets_per_group = a->buckets_per_group,
        .reduce_early = a->pp_reduce_early};
    Pipeline* pp = &t->pp;
    pipeline_init(pp, &t->comm, t->be, cfg, &pc);
    for (int v = 0; v < pp->V; v++) {
        if (from_file) gpt2_load(&pp->chunks[v].model, a->model);
        else gpt2_init_random(&pp->chunks[v].model, (uint64_t)a->seed);
    }
    OptBuffer* bufs = xmalloc(sizeof(OptBuffer) * (size_t)pp->V);
    pipeline_setup_ddp(pp, &pc, bufs);
    optimizer_init(&t->opt, t->be, bufs, pp->V);
    free(bufs);
}

/* The training data (enough rows for one step), the validation data and the tokenizer. */
static void trainer_data(Trainer* t, const GPT2Config* cfg) {
    Args* a = &t->a;
    const int DP = t->pp.DP;
    const size_t rows_per_step = (size_t)t->B * DP * t->accum;
    dataloader_init(&t->train, a->input_bin, t->T, (size_t)t->B * t->T + 1, cfg->vocab_size, a->shuffle,
                    (uint64_t)a->seed);
    if (t->train.nrows < rows_per_step)
        fatal("--input_bin: the training data holds %zu rows of %d+1 tokens, fewer than one step needs "
              "(batch_size %d x ranks %d x accumulation %d = %zu): use fewer ranks or a smaller batch",
              t->train.nrows, t->T, t->B, DP, t->accum, rows_per_step);
    t->have_val = a->val_loss_every > 0 && a->input_val_bin[0];
    if (t->have_val)
        dataloader_init(&t->val, a->input_val_bin, t->T, (size_t)t->B * t->T + 1, cfg->vocab_size, 0, 0);
    t->have_tok = a->sample_every > 0;
    if (t->have_tok) tokenizer_init(&t->tok, a->tokenizer);
}

/* Checkpoints: checks --output_dir and --save_model; with --resume, loads the newest complete
 * checkpoint. Then the run log (trimmed to the resumed step). */
static void trainer_checkpoints(Trainer* t) {
    Args* a = &t->a;
    Pipeline* pp = &t->pp;
    CkptHparams hp = {
        .sequence_length = t->T,
        .seed = a->seed,
        .shuffle = a->shuffle,
        .train_rows = t->train.nrows,
        .total_batch_size = a->total_batch_size,
        .batch_size = t->B,
        .world = t->world,
        .zero_stage = a->zero_stage,
        .num_iterations = a->num_iterations,
        .lr_schedule = (int)a->sched,
        .warmup_iters = a->warmup_iters,
        .learning_rate = a->learning_rate,
        .lr_decay_frac = a->learning_rate_decay_frac,
        .weight_decay = a->weight_decay,
        .beta1 = a->beta1,
        .beta2 = a->beta2,
        .eps = a->eps,
        .grad_clip = a->grad_clip};
    CkptChunk* cks = xmalloc(sizeof(CkptChunk) * (size_t)pp->V);
    for (int v = 0; v < pp->V; v++) {
        PPChunk* ch = &pp->chunks[v];
        /* the last stage's wte is the tied copy: the first stage writes it */
        cks[v] = (CkptChunk){.model = &ch->model,
                             .layout = &ch->layout,
                             .dp_rank = pp->d,
                             .writer = pp->d == 0,
                             .skip_wte = pp->P > 1 && ch->model.part.has_head};
    }
    ckpt_init(&t->ck, &t->comm, cks, pp->V, &t->opt, a->output_dir, a->checkpoint_every, a->checkpoints_keep,
              &hp);
    free(cks);
    int resumed = ckpt_start(&t->ck, a->resume, &t->prog);
    if (a->save_model[0]) ckpt_check_save_model(&t->ck, a->save_model, a->save_version);
    runlog_open(&t->log, a->output_dir, t->rank, resumed ? t->prog.step : -1);
}

/* Everything before the first step, in order: the ranks, the flags, the backend, the batch, the
 * model chunks with DDP and the optimizer, the data, the start-up report, the checkpoints. */
static void trainer_build(Trainer* t, int argc, char** argv) {
    memset(t, 0, sizeof *t);
    Args* a = &t->a;
    comm_bootstrap(&t->comm, &argc, &argv);
    t->rank = t->comm.rank;
    t->world = t->comm.world;
    args_parse(a, argc, argv, t->rank);
    stop_signal_install();   /* SIGTERM/SIGUSR1 from here on: stop at a step boundary (common/stop_signal.h) */
    threads_setup(&t->comm); /* OpenMP threads per rank, printed per rank (common/threads.h) */
    t->be = a->use_cuda ? backend_cuda_create(a->dt, t->comm.device_index, a->tf32) : backend_cpu_create();
    comm_setup(&t->comm, a->comm, t->be, a->comm_timeout);

    int from_file;
    GPT2Config cfg = model_config(a, &from_file);
    trainer_batch(t, &cfg);
    trainer_model(t, &cfg, from_file);
    trainer_data(t, &cfg);
    trainer_report(t);
    trainer_checkpoints(t);
    t->inputs = xmalloc(sizeof(int) * (size_t)t->B * t->T);
    t->targets = xmalloc(sizeof(int) * (size_t)t->B * t->T);
    /* the mean over the whole global batch: the reduction is then a plain sum (ddp/ddp.h) */
    t->dloss = (float)(1.0 / (double)a->total_batch_size);
    t->flops_per_step = gpt2_flops_per_token(&t->pp.chunks[0].model, t->T) * (double)a->total_batch_size;
    t->peak_flops = !a->use_cuda ? 0.0 : a->dt == DTYPE_BF16 ? 989e12 : a->tf32 ? 494e12 : 67e12;
}

static void trainer_free(Trainer* t) {
    free(t->inputs);
    free(t->targets);
    runlog_close(&t->log);
    ckpt_free(&t->ck);
    if (t->have_tok) tokenizer_free(&t->tok);
    if (t->have_val) dataloader_free(&t->val);
    dataloader_free(&t->train);
    optimizer_free(&t->opt);
    pipeline_free(&t->pp);
    /* before the backend: the comm releases its scratch through be, and NCCL needs the device */
    comm_finalize(&t->comm);
    t->be->destroy(t->be);
}

/* --max_bad_steps non-finite steps in a row: every rank stops, pointing at the last checkpoint. */
static void stop_on_bad_steps(Trainer* t, int step) {
    char last[4200];
    if (t->ck.last_step >= 0)
        snprintf(last, sizeof last,
                 "the last complete checkpoint is %s/ckpt_%08d (step %d): fix the cause "
                 "(e.g. a lower --learning_rate) and continue with --resume",
                 t->a.output_dir, t->ck.last_step, t->ck.last_step);
    else
        snprintf(last, sizeof last, "no checkpoint was written (--checkpoint_every %d)", t->a.checkpoint_every);
    runlog_close(&t->log);
    ckpt_fail_all(&t->comm,
                  "step %d: %d steps in a row had a non-finite loss or grad norm (--max_bad_steps %d): "
                  "stopping; %s",
                  step + 1, t->prog.bad_streak, t->a.max_bad_steps, last);
}

/* A rank got SIGTERM or SIGUSR1 (SLURM cancelling, a time limit, a warning):
 * every rank stops after the step; with --checkpoint_on_signal it saves
 * that step first and exits 75 (resume with --resume), else 128 + signal. */
static void stop_on_signal(Trainer* t, int sig) {
    char saved[4200];
    snprintf(saved, sizeof saved, "%s/ckpt_%08d", t->a.output_dir, t->prog.step);
    pipeline_wait_gathers(&t->pp);
    if (t->a.checkpoint_on_signal && t->ck.last_step != t->prog.step) ckpt_save(&t->ck, &t->prog);
    runlog_close(&t->log);
    /* the groups' communicators go first, so that no NCCL watchdog of theirs
     * is left watching an operation while the job's communicator ends MPI */
    pipeline_free(&t->pp);
    stop_signal_exit(&t->comm, sig, t->prog.step, t->a.checkpoint_on_signal ? saved : NULL);
}

int main(int argc, char** argv) {
    Trainer t;
    trainer_build(&t, argc, argv);
    const Args* a = &t.a;
    Pipeline* pp = &t.pp;
    double total_time = 0.0;
    int timed_steps = 0;
    const int first_step = t.prog.step;
    for (int step = first_step; step <= a->num_iterations; step++) {
        int last = step == a->num_iterations;
        if (t.have_val && (step % a->val_loss_every == 0 || last)) evaluate(&t, step);
        if (t.have_tok && pp->d == 0 && step > 0 && (step % a->sample_every == 0 || last))
            pipeline_sample(pp, &t.tok, a->sample_tokens, (uint64_t)a->seed + (uint64_t)step);
        if (last) break;

        StepResult r = train_step(&t, step);

        if (step > 0 || a->num_iterations == 1) {
            total_time += r.seconds;
            timed_steps++;
        }
        StepLog sl = {
            .step = step + 1,
            .num_iterations = a->num_iterations,
            .finite = r.finite,
            .loss = r.loss,
            .norm = r.norm,
            .lr = r.lr,
            .seconds = r.seconds,
            .tokens_per_s = (double)a->total_batch_size / r.seconds,
            .mfu = t.peak_flops > 0 ? t.flops_per_step / r.seconds / t.peak_flops : -1.0,
            .peak_alloc_mb = mb(t.be->mem.peak),
            .peak_reserved_mb = mb(t.be->peak_reserved(t.be)),
            .reserved_name = a->use_cuda ? "reserved" : "rss",
            .eta_s = (a->num_iterations - step - 1) * (timed_steps ? total_time / timed_steps : r.seconds),
            .bad_in_a_row = t.prog.bad_streak,
            .max_bad_steps = a->max_bad_steps,
            .bubble = r.bubble,
            .bubble_theory = (double)(pp->P - 1) / ((double)pp->V * t.accum)};
        runlog_step(&t.log, &sl);
        if (t.prog.bad_streak >= a->max_bad_steps) stop_on_bad_steps(&t, step);
        if (step == first_step) {
            for (int v = 0; v < pp->V; v++)
                if (t.rank == 0) ddp_memory_report(&pp->chunks[v].ddp, t.rank, stdout);
            if (pp->P > 1) {
                for (int r2 = 0; r2 < t.world; r2++) {
                    comm_barrier(&t.comm);
                    if (r2 == t.rank) pipeline_overlap_report(pp, stdout), fflush(stdout);
                }
            }
        }
        if (a->check_tied_embedding) pipeline_check_tied(pp);
        if (ckpt_due(&t.ck, t.prog.step)) {
            pipeline_wait_gathers(pp); /* the checkpoint reads the params */
            ckpt_save(&t.ck, &t.prog);
        }
        int sig = stop_signal_agree(&t.comm); /* a rank got SIGTERM/SIGUSR1: every rank stops here */
        if (sig) stop_on_signal(&t, sig);
    }
    pipeline_wait_gathers(pp); /* before anything reads the params */
    if (a->checkpoint_every > 0 && t.ck.last_step != t.prog.step) ckpt_save(&t.ck, &t.prog);
    if (a->save_model[0]) {
        ckpt_save_model(&t.ck, a->save_model, a->save_version);
        if (t.rank == 0) printf("saved model to %s\n", a->save_model);
    }
    if (t.rank == 0 && timed_steps)
        printf("done: %d steps, average %.1f ms/step, %.0f tok/s\n", a->num_iterations,
               1000.0 * total_time / timed_steps, a->total_batch_size / (total_time / timed_steps));
    runlog_close(&t.log);
    comm_barrier(&t.comm);
    trainer_free(&t);
    return 0;
}
