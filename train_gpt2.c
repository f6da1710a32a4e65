/* train_gpt2.c — GPT-2 training, one step read top to bottom.
 *
 *   mpirun -np N ./train_gpt2 --zero_stage 1 ...      (or ./train_gpt2 alone)
 *
 * Start-up: bootstrap the communicator (MPI), parse flags, create the compute
 * backend (cpu or cuda), choose the collective backend, describe the model,
 * build the flat-buffer layout (ddp/layout.c), bind the model to it, init or
 * load weights, set up the optimizer over this rank's pieces (zero/), the
 * bucketed reducer (ddp/ddp.c) and the data loaders (data/).
 *
 * One step:
 *   for each micro-step: forward (--overlap_param_gather: waiting per bucket
 *     for last step's all-gathers); backward, which marks tensors ready, and on
 *     the last micro-step each complete bucket group launches its all-reduce
 *     (zero_stage 0) or reduce-scatter (zero_stage 1) while backward goes on
 *     (zero_stage 2: reduce-scatter on every micro-step from per-bucket working
 *     buffers, each rank adding its reduced slice into its gradient shard)
 *   wait for the reductions
 *   grad norm: sum of squares over this rank's pieces, all-reduced once
 *   AdamW over the optimizer's pieces, with the clip scale
 *   zero_stage 1, 2: all-gather the params bucket by bucket (overlapped: not
 *     waited for here; see ddp/ddp.h and docs/ZERO.md)
 *   zero this rank's gradients (one memset)
 * A step whose loss or grad norm is not finite makes no update (its grads
 * are dropped); --max_bad_steps such steps in a row end the run. Every
 * --checkpoint_every steps the training state goes to a checkpoint
 * (checkpoint/), from which --resume continues at any number of ranks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <errno.h>

#include "common/util.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "ddp/layout.h"
#include "ddp/ddp.h"
#include "zero/optimizer.h"
#include "comm/comm.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "checkpoint/checkpoint.h"
#include "common/threads.h"
#include "common/stop_signal.h"

/* ------------------------------------------------------------------------ */
/* Flags                                                                     */

typedef struct {
    const char *input_bin, *input_val_bin, *tokenizer, *model, *output_dir, *save_model;
    const char *save_dtype, *dtype, *device, *comm, *lr_schedule;
    int batch_size, sequence_length, num_iterations, warmup_iters;
    long long total_batch_size;
    int n_embd, n_head, max_seq_len;
    float learning_rate, learning_rate_decay_frac, weight_decay, grad_clip, beta1, beta2, eps;
    int val_loss_every, val_max_steps, sample_every, sample_tokens;
    int zero_stage, shuffle, seed, buckets_per_group, tf32, recompute;
    long long bucket_size;
    float comm_timeout;
    int checkpoint_every, resume, checkpoints_keep, max_bad_steps;
    int checkpoint_on_signal;   /* SIGTERM/SIGUSR1: save at the next step boundary, exit 75 (common/stop_signal.h) */
    int inject_nan_at_step, inject_nan_steps;
    int overlap_param_gather;   /* ZeRO-1/2: all-gather overlapped with the next forward */
    const char* gather_order;   /* testing: forward | reverse launch order of the all-gathers */
    int gather_hold;            /* testing: hold each all-gather back until the forward waits for it */
} Args;

typedef enum { F_STR, F_INT, F_LL, F_FLOAT, F_SWITCH } FlagType;
typedef struct {
    const char* name;
    FlagType type;
    void* ptr;
    const char* help;
} Flag;

static void args_defaults(Args* a) {
    memset(a, 0, sizeof *a);
    a->input_bin = "data/cache/kjv/train_*.bin";
    a->input_val_bin = "data/cache/kjv/val_*.bin";
    a->tokenizer = "data/cache/kjv/tokenizer.bin";
    a->model = "d12";
    a->output_dir = "";
    a->save_model = "";
    a->save_dtype = "fp32";
    a->dtype = "auto";
    a->device = "auto";
    a->comm = "auto";
    a->lr_schedule = "cosine";
    a->batch_size = 4;
    a->sequence_length = 1024;
    a->total_batch_size = -1;
    a->num_iterations = 10;
    a->learning_rate = 3e-4f;
    a->warmup_iters = 0;
    a->learning_rate_decay_frac = 1.0f;
    a->weight_decay = 0.0f;
    a->grad_clip = 1.0f;
    a->beta1 = 0.9f;
    a->beta2 = 0.95f;
    a->eps = 1e-8f;
    a->val_loss_every = 0;
    a->val_max_steps = 20;
    a->sample_every = 0;
    a->sample_tokens = 64;
    a->zero_stage = 0;
    a->gather_order = "forward";
    a->shuffle = 0;
    a->seed = 1337;
    a->bucket_size = 4000000;
    a->buckets_per_group = 1;
    a->comm_timeout = 300.0f;
    a->max_bad_steps = 5;
    a->inject_nan_steps = 1;
}

#define NFLAGS 64   /* capacity of the flag table */
static int make_flags(Args* a, Flag* f) {
    int n = 0;
#define FL(nm, ty, p, h) do { if (n >= NFLAGS) fatal("internal: more than %d flags", NFLAGS); f[n++] = (Flag){nm, ty, p, h}; } while (0)
    FL("input_bin", F_STR, &a->input_bin, "glob of training token shards (llm.c format)");
    FL("input_val_bin", F_STR, &a->input_val_bin, "glob of validation token shards ('' = none)");
    FL("tokenizer", F_STR, &a->tokenizer, "llm.c tokenizer file, to decode samples");
    FL("model", F_STR, &a->model, "preset dN (N layers, 64N channels, N heads; d12 = GPT-2 124M) or an llm.c model file");
    FL("n_embd", F_INT, &a->n_embd, "override the preset's channels (0 = preset)");
    FL("n_head", F_INT, &a->n_head, "override the preset's heads (0 = preset)");
    FL("max_seq_len", F_INT, &a->max_seq_len, "override the preset's maximum sequence length (0 = preset, 1024)");
    FL("batch_size", F_INT, &a->batch_size, "micro-batch size B per rank");
    FL("sequence_length", F_INT, &a->sequence_length, "sequence length T");
    FL("total_batch_size", F_LL, &a->total_batch_size, "tokens per optimizer step (-1 = B*T*ranks); must divide by B*T*ranks: the quotient is the gradient accumulation");
    FL("num_iterations", F_INT, &a->num_iterations, "optimizer steps");
    FL("learning_rate", F_FLOAT, &a->learning_rate, "maximum learning rate");
    FL("lr_schedule", F_STR, &a->lr_schedule, "cosine | linear | constant (after warmup)");
    FL("warmup_iters", F_INT, &a->warmup_iters, "linear warmup steps");
    FL("learning_rate_decay_frac", F_FLOAT, &a->learning_rate_decay_frac, "final learning rate as a fraction of the maximum");
    FL("weight_decay", F_FLOAT, &a->weight_decay, "AdamW decoupled weight decay (matmul weights and embeddings only)");
    FL("beta1", F_FLOAT, &a->beta1, "AdamW beta1");
    FL("beta2", F_FLOAT, &a->beta2, "AdamW beta2");
    FL("eps", F_FLOAT, &a->eps, "AdamW epsilon");
    FL("grad_clip", F_FLOAT, &a->grad_clip, "clip the global gradient norm to this (0 = off)");
    FL("val_loss_every", F_INT, &a->val_loss_every, "evaluate the validation loss every K steps (0 = never)");
    FL("val_max_steps", F_INT, &a->val_max_steps, "validation batches per evaluation");
    FL("sample_every", F_INT, &a->sample_every, "print generated text every K steps (0 = never)");
    FL("sample_tokens", F_INT, &a->sample_tokens, "tokens to generate per sample");
    FL("output_dir", F_STR, &a->output_dir, "write log.jsonl (per-step figures) and checkpoints here ('' = nowhere)");
    FL("save_model", F_STR, &a->save_model, "write the final weights to this llm.c model file ('' = no)");
    FL("save_dtype", F_STR, &a->save_dtype, "fp32 (llm.c version 3) | bf16 (version 5) for saved models");
    FL("device", F_STR, &a->device, "auto | cpu | cuda");
    FL("dtype", F_STR, &a->dtype, "auto | fp32 | bf16 (auto: bf16 on cuda, fp32 on cpu)");
    FL("tf32", F_INT, &a->tf32, "allow TF32 matmuls in fp32 mode on cuda (0 | 1)");
    FL("recompute", F_INT, &a->recompute, "activation recomputation: 0 none, 1 GELU outputs, 2 also layernorm outputs");
    FL("zero_stage", F_INT, &a->zero_stage, "0 = DDP (all-reduce, full optimizer state), 1 = ZeRO-1 distributed optimizer, 2 = ZeRO-2 (also shards the gradients)");
    FL("use_distributed_optimizer", F_SWITCH, &a->zero_stage, "alias of --zero_stage 1 (takes no value)");
    FL("overlap_param_gather", F_SWITCH, &a->overlap_param_gather, "zero_stage 1/2: overlap the param all-gather with the next forward, which waits per bucket (takes no value)");
    FL("gather_order", F_STR, &a->gather_order, "testing: launch order of the param all-gathers, forward | reverse (bucket order, which the forward does not follow)");
    FL("gather_hold", F_INT, &a->gather_hold, "testing, with --overlap_param_gather: 1 = launch each all-gather only when a wait needs it or a later one (the slowest network): a read without its wait would see last step's params");
    FL("bucket_size", F_LL, &a->bucket_size, "gradient bucket size in ELEMENTS (suffix K or M allowed: 4M = 4,000,000)");
    FL("buckets_per_group", F_INT, &a->buckets_per_group, "buckets whose reductions launch together");
    FL("comm", F_STR, &a->comm, "auto | nccl | mpi: collective backend");
    FL("comm_timeout", F_FLOAT, &a->comm_timeout, "seconds before a stuck collective ends the run on every rank");
    FL("shuffle", F_INT, &a->shuffle, "0 = sequential rows, 1 = rows shuffled per epoch (seeded by --seed)");
    FL("seed", F_INT, &a->seed, "seed of weight init, data shuffle and sampling");
    FL("checkpoint_every", F_INT, &a->checkpoint_every, "save a checkpoint in --output_dir every K steps and at the end (0 = never)");
    FL("resume", F_SWITCH, &a->resume, "continue from the newest complete checkpoint in --output_dir, at any number of ranks (takes no value)");
    FL("checkpoint_on_signal", F_SWITCH, &a->checkpoint_on_signal, "on SIGTERM or SIGUSR1 (any rank): stop after the step in progress, save a checkpoint in --output_dir and exit 75, for --resume (without it: exit 128+signal, no checkpoint) (takes no value)");
    FL("checkpoints_keep", F_INT, &a->checkpoints_keep, "keep only the newest K complete checkpoints (0 = keep all)");
    FL("max_bad_steps", F_INT, &a->max_bad_steps, "stop after K steps in a row with a non-finite loss or grad norm (each is skipped)");
    FL("inject_nan_at_step", F_INT, &a->inject_nan_at_step, "testing aid: poison steps K .. K+inject_nan_steps-1 (as printed, from 1) on the last rank, alternately a NaN gradient and an infinite loss (0 = off)");
    FL("inject_nan_steps", F_INT, &a->inject_nan_steps, "testing aid: how many steps in a row --inject_nan_at_step poisons");
#undef FL
    return n;
}

static void print_help(Args* a, Flag* f, int n) {
    printf("usage: [mpirun -np N] ./train_gpt2 [--flag value]...\n\nflags (default in brackets):\n");
    for (int i = 0; i < n; i++) {
        char def[512];
        switch (f[i].type) {
        case F_STR: snprintf(def, sizeof def, "'%s'", *(const char**)f[i].ptr); break;
        case F_INT: snprintf(def, sizeof def, "%d", *(int*)f[i].ptr); break;
        case F_LL: snprintf(def, sizeof def, "%lld", *(long long*)f[i].ptr); break;
        case F_FLOAT: snprintf(def, sizeof def, "%g", *(float*)f[i].ptr); break;
        case F_SWITCH: snprintf(def, sizeof def, "off"); break;
        }
        printf("  --%-26s %s [%s]\n", f[i].name, f[i].help, def);
    }
    printf("\nFlags also take the form --flag=value. See README.md for the file formats.\n");
    (void)a;
}

static long long parse_size(const char* flag, const char* s) {
    size_t n = strlen(s);
    long long mult = 1;
    char buf[64];
    if (n > 0 && n < sizeof buf && (s[n - 1] == 'K' || s[n - 1] == 'M')) {
        mult = s[n - 1] == 'K' ? 1000 : 1000000;
        memcpy(buf, s, n - 1);
        buf[n - 1] = '\0';
        s = buf;
    }
    return parse_int_flag(flag, s) * mult;
}

static void parse_args(Args* a, int argc, char** argv, int rank) {
    Flag flags[NFLAGS];
    int nf = make_flags(a, flags);
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            if (rank == 0) print_help(a, flags, nf);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) fatal("unexpected argument '%s' (flags start with --; see --help)", arg);
        char name[128];
        const char* val = NULL;
        const char* eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) fatal("unknown flag '%s' (see --help)", arg);
        memcpy(name, arg + 2, len);
        name[len] = '\0';
        int k = -1;
        for (int j = 0; j < nf; j++)
            if (strcmp(flags[j].name, name) == 0) k = j;
        if (k < 0) fatal("unknown flag '--%s' (see --help)", name);
        char flagname[140];
        snprintf(flagname, sizeof flagname, "--%s", name);
        if (flags[k].type == F_SWITCH) {
            if (eq) fatal("flag %s takes no value", flagname);
            *(int*)flags[k].ptr = 1;
            continue;
        }
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else fatal("flag %s needs a value", flagname);
        switch (flags[k].type) {
        case F_STR: *(const char**)flags[k].ptr = val; break;
        case F_INT: {
            long long v = parse_int_flag(flagname, val);
            if (v < -2147483647LL || v > 2147483647LL) fatal("flag %s: %s is out of range", flagname, val);
            *(int*)flags[k].ptr = (int)v;
            break;
        }
        case F_LL: *(long long*)flags[k].ptr = parse_size(flagname, val); break;
        case F_FLOAT: {
            double v = parse_float_flag(flagname, val);
            if (!isfinite(v)) fatal("flag %s: '%s' is not a finite number", flagname, val);
            *(float*)flags[k].ptr = (float)v;
            break;
        }
        case F_SWITCH: break;
        }
    }
}

static void check_positive(const char* flag, long long v) {
    if (v <= 0) fatal("flag %s must be positive (got %lld)", flag, v);
}
static void check_nonneg(const char* flag, double v) {
    if (v < 0) fatal("flag %s must not be negative (got %g)", flag, v);
}

/* ------------------------------------------------------------------------ */

typedef struct {
    FILE* f;
} RunLog;

/* resume_step >= 0: keep the log of the steps before it and append. */
static void log_open(RunLog* lg, const char* dir, int rank, int resume_step) {
    lg->f = NULL;
    if (!dir[0] || rank != 0) return;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("--output_dir %s: cannot create: %s", dir, strerror(errno));
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    if (resume_step >= 0 && ckpt_log_trim(path, resume_step, err, sizeof err) != 0) fatal("--output_dir: %s", err);
    lg->f = fopen(path, resume_step >= 0 ? "a" : "w");
    if (!lg->f) fatal("--output_dir: cannot write %s: %s", path, strerror(errno));
}

static void sample_text(GPT2* m, const Tokenizer* tok, int ntokens, int T, uint64_t seed) {
    int V = m->cfg.vocab_size;
    int* ids = xmalloc(sizeof(int) * (size_t)(T));
    float* row = xmalloc(sizeof(float) * (size_t)V);
    Rng r;
    rng_seed(&r, seed);
    ids[0] = (int)tok->eot;
    int n = 1;
    printf("---- sample ----\n");
    for (; n < ntokens + 1 && n < T; n++) {
        gpt2_forward(m, ids, NULL, 1, n, 0.0f);
        gpt2_logits_row(m, 0, n - 1, row);
        double mx = row[0];
        for (int i = 1; i < V; i++) if (row[i] > mx) mx = row[i];
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
        double u = (double)rng_uniform(&r) * sum, acc = 0;
        int next = V - 1;
        for (int i = 0; i < V; i++) {
            acc += exp((double)row[i] - mx);
            if (acc > u) { next = i; break; }
        }
        ids[n] = next;
    }
    tokenizer_print(tok, ids + 1, n - 1, stdout);
    printf("\n----------------\n");
    fflush(stdout);
    free(ids);
    free(row);
}

/* --inject_nan_at_step, a testing aid: poisons this rank's share of the k-th
 * poisoned step: even k a NaN in the first gradient element it owns (the
 * grad norm turns NaN), odd k an infinite loss. Returns the loss to use. */
static double inject_fault(Backend* be, void* grads, const OptPiece* owned, int nowned, int k, double loss) {
    if (k % 2 == 1 || nowned == 0) return INFINITY;
    float nan32 = NAN;
    uint16_t nan16 = 0x7fc0;
    size_t es = dtype_size(be->dtype);
    be->to_device(be, (char*)grads + owned[0].buf_off * es, es == 4 ? (const void*)&nan32 : (const void*)&nan16, es);
    be->synchronize(be);
    return loss;
}

static double mb(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

int main(int argc, char** argv) {
    Comm comm;
    comm_bootstrap(&comm, &argc, &argv);
    const int rank = comm.rank, world = comm.world;

    Args a;
    args_defaults(&a);
    parse_args(&a, argc, argv, rank);

    /* ---- validate flags (every rank sees the same flags: every rank fails alike) ---- */
    check_positive("--batch_size", a.batch_size);
    check_positive("--sequence_length", a.sequence_length);
    check_nonneg("--num_iterations", a.num_iterations);
    check_nonneg("--learning_rate", a.learning_rate);
    check_nonneg("--warmup_iters", a.warmup_iters);
    check_nonneg("--weight_decay", a.weight_decay);
    check_nonneg("--grad_clip", a.grad_clip);
    check_nonneg("--val_loss_every", a.val_loss_every);
    check_nonneg("--sample_every", a.sample_every);
    check_positive("--val_max_steps", a.val_max_steps);
    check_positive("--sample_tokens", a.sample_tokens);
    check_positive("--bucket_size", a.bucket_size);
    check_positive("--buckets_per_group", a.buckets_per_group);
    check_positive("--comm_timeout", (long long)ceil(a.comm_timeout));
    check_nonneg("--n_embd", a.n_embd);
    check_nonneg("--n_head", a.n_head);
    check_nonneg("--max_seq_len", a.max_seq_len);
    check_nonneg("--checkpoint_every", a.checkpoint_every);
    check_nonneg("--checkpoints_keep", a.checkpoints_keep);
    check_positive("--max_bad_steps", a.max_bad_steps);
    check_nonneg("--inject_nan_at_step", a.inject_nan_at_step);
    check_positive("--inject_nan_steps", a.inject_nan_steps);
    if ((a.checkpoint_every > 0 || a.resume || a.checkpoint_on_signal) && !a.output_dir[0])
        fatal("--checkpoint_every, --checkpoint_on_signal and --resume need --output_dir (the checkpoints live there)");
    if (a.learning_rate_decay_frac < 0 || a.learning_rate_decay_frac > 1)
        fatal("flag --learning_rate_decay_frac must be in [0, 1] (got %g)", a.learning_rate_decay_frac);
    if (a.beta1 < 0 || a.beta1 >= 1) fatal("flag --beta1 must be in [0, 1) (got %g)", a.beta1);
    if (a.beta2 < 0 || a.beta2 >= 1) fatal("flag --beta2 must be in [0, 1) (got %g)", a.beta2);
    if (a.eps <= 0) fatal("flag --eps must be positive (got %g)", a.eps);
    if (a.zero_stage < 0 || a.zero_stage > 2)
        fatal("--zero_stage %d is not supported: 0 = DDP, 1 = ZeRO-1 distributed optimizer, 2 = ZeRO-2", a.zero_stage);
    if (a.overlap_param_gather && a.zero_stage == 0)
        fatal("--overlap_param_gather needs --zero_stage 1 or 2 (zero_stage 0 has no param all-gather)");
    if (strcmp(a.gather_order, "forward") != 0 && strcmp(a.gather_order, "reverse") != 0)
        fatal("--gather_order: unknown value '%s' (expected forward or reverse)", a.gather_order);
    if (a.gather_hold != 0 && a.gather_hold != 1) fatal("flag --gather_hold must be 0 or 1 (got %d)", a.gather_hold);
    if (a.gather_hold && !a.overlap_param_gather) fatal("--gather_hold 1 needs --overlap_param_gather");
    if (a.shuffle != 0 && a.shuffle != 1) fatal("flag --shuffle must be 0 or 1 (got %d)", a.shuffle);
    if (a.recompute < 0 || a.recompute > 2) fatal("flag --recompute must be 0, 1 or 2 (got %d)", a.recompute);
    if (a.tf32 != 0 && a.tf32 != 1) fatal("flag --tf32 must be 0 or 1 (got %d)", a.tf32);
    LrSchedule sched;
    if (lr_schedule_parse(a.lr_schedule, &sched) != 0)
        fatal("--lr_schedule: unknown schedule '%s' (expected cosine, linear or constant)", a.lr_schedule);
    int save_version;
    if (strcmp(a.save_dtype, "fp32") == 0) save_version = 3;
    else if (strcmp(a.save_dtype, "bf16") == 0) save_version = 5;
    else fatal("--save_dtype: unknown value '%s' (expected fp32 or bf16)", a.save_dtype);

    stop_signal_install();   /* SIGTERM/SIGUSR1 from here on: stop at a step boundary (common/stop_signal.h) */
    threads_setup(&comm);    /* OpenMP threads per rank, printed per rank (common/threads.h) */

    /* ---- compute backend ---- */
    int use_cuda;
    if (strcmp(a.device, "auto") == 0) use_cuda = backend_cuda_available();
    else if (strcmp(a.device, "cpu") == 0) use_cuda = 0;
    else if (strcmp(a.device, "cuda") == 0) use_cuda = 1;
    else fatal("--device: unknown value '%s' (expected auto, cpu or cuda)", a.device);
    DType dt;
    if (strcmp(a.dtype, "auto") == 0) dt = use_cuda ? DTYPE_BF16 : DTYPE_FP32;
    else if (strcmp(a.dtype, "fp32") == 0) dt = DTYPE_FP32;
    else if (strcmp(a.dtype, "bf16") == 0) dt = DTYPE_BF16;
    else fatal("--dtype: unknown value '%s' (expected auto, fp32 or bf16)", a.dtype);
    if (!use_cuda && dt == DTYPE_BF16) fatal("--dtype bf16 needs --device cuda (the CPU backend computes in fp32)");
    if (!use_cuda && a.tf32) fatal("--tf32 1 needs --device cuda");
    Backend* be = use_cuda ? backend_cuda_create(dt, comm.device_index, a.tf32) : backend_cpu_create();
    comm_setup(&comm, a.comm, be, a.comm_timeout);

    /* ---- model shape ---- */
    GPT2Config cfg;
    int from_file = 0;
    if (gpt2_preset(a.model, &cfg) == 0) {
        if (a.n_embd) cfg.channels = a.n_embd;
        if (a.n_head) cfg.num_heads = a.n_head;
        if (a.max_seq_len) cfg.max_seq_len = a.max_seq_len;
        if (cfg.channels % cfg.num_heads != 0)
            fatal("--n_embd %d does not divide by the number of heads %d", cfg.channels, cfg.num_heads);
    } else {
        int version;
        FILE* probe = fopen(a.model, "rb");
        if (!probe) fatal("--model '%s' is neither a preset (d2 ... d48) nor a readable file: %s", a.model, strerror(errno));
        fclose(probe);
        gpt2_read_header(a.model, &cfg, &version);
        if ((a.n_embd && a.n_embd != cfg.channels) || (a.n_head && a.n_head != cfg.num_heads) ||
            (a.max_seq_len && a.max_seq_len != cfg.max_seq_len))
            fatal("%s: the model file's shape (C %d, NH %d, maxT %d) disagrees with --n_embd/--n_head/--max_seq_len",
                  a.model, cfg.channels, cfg.num_heads, cfg.max_seq_len);
        from_file = 1;
    }
    const int B = a.batch_size, T = a.sequence_length;
    if (T > cfg.max_seq_len)
        fatal("--sequence_length %d exceeds the model's maximum sequence length %d", T, cfg.max_seq_len);
    long long tokens_per_micro = (long long)B * T * world;
    if (a.total_batch_size == -1) a.total_batch_size = tokens_per_micro;
    check_positive("--total_batch_size", a.total_batch_size);
    if (a.total_batch_size % tokens_per_micro != 0)
        fatal("--total_batch_size %lld does not divide by batch_size*sequence_length*ranks = %d*%d*%d = %lld",
              a.total_batch_size, B, T, world, tokens_per_micro);
    const int accum = (int)(a.total_batch_size / tokens_per_micro);

    /* ---- flat buffers and the model bound to them ---- */
    GPT2 model;
    memset(&model, 0, sizeof model);
    int nspecs;
    LayoutParamSpec* specs = gpt2_describe(&model, &cfg, &nspecs);
    Layout layout;
    char err[256];
    if (layout_build(&layout, specs, nspecs, (size_t)a.bucket_size, a.buckets_per_group, world, 64, err,
                     sizeof err) != 0)
        fatal("layout: %s", err);
    model.shard_grads = a.zero_stage == 2;   /* ZeRO-2: no full-size gradient buffer */
    gpt2_bind(&model, be, &layout);
    if (from_file) gpt2_load(&model, a.model);
    else gpt2_init_random(&model, (uint64_t)a.seed);
    model.recompute = a.recompute;
    gpt2_alloc_activations(&model, B, T);

    /* ---- optimizer over this rank's pieces; reducer over the buckets ---- */
    int nopt;
    OptPiece* opt_pieces = layout_opt_pieces(&layout, a.zero_stage >= 1 ? rank : -1, &nopt);
    Optimizer opt;
    optimizer_init(&opt, be, opt_pieces, nopt, model.params);
    DDP ddp;   /* ddp.grads: this rank's reduced gradients (zero_stage 2: its shard), ddp.own its pieces */
    ddp_init(&ddp, &layout, &comm, be, a.zero_stage, model.params, model.grads);
    ddp_set_gather(&ddp, a.overlap_param_gather, strcmp(a.gather_order, "reverse") == 0, a.gather_hold);
    model.need_params = ddp_need_params;   /* waits only for an overlapped all-gather */
    model.need_params_ctx = &ddp;
    if (a.zero_stage == 2) {
        ddp_set_grad_table(&ddp, model.grad_ptr);
        model.need_grads = ddp_need_grads;
        model.need_grads_ctx = &ddp;
        int ng;
        OptPiece* grad_pieces = layout_shard_pieces(&layout, rank, &ng);
        optimizer_set_grad_pieces(&opt, grad_pieces, ng);
        free(grad_pieces);
    }

    /* ---- data ---- */
    DataLoader train, val;
    const size_t rows_per_step = (size_t)B * world * accum;
    dataloader_init(&train, a.input_bin, T, (size_t)B * T + 1, cfg.vocab_size, a.shuffle, (uint64_t)a.seed);
    if (train.nrows < rows_per_step)
        fatal("--input_bin: the training data holds %zu rows of %d+1 tokens, fewer than one step needs "
              "(batch_size %d x ranks %d x accumulation %d = %zu): use fewer ranks or a smaller batch",
              train.nrows, T, B, world, accum, rows_per_step);
    int have_val = a.val_loss_every > 0 && a.input_val_bin[0];
    if (have_val) dataloader_init(&val, a.input_val_bin, T, (size_t)B * T + 1, cfg.vocab_size, 0, 0);
    Tokenizer tok;
    int have_tok = a.sample_every > 0;
    if (have_tok) tokenizer_init(&tok, a.tokenizer);

    /* ---- start-up report ---- */
    if (rank == 0) {
        printf("train_gpt2 | device %s | dtype %s | ranks %d | comm %s | zero_stage %d%s\n", be->name,
               dtype_name(be->dtype), world, comm_kind_name(comm.kind), a.zero_stage,
               a.overlap_param_gather ? " | param all-gather overlapped with forward" : "");
        printf("model %s: L %d, NH %d, C %d, maxT %d, V %d (padded %d), %zu parameters\n", a.model,
               cfg.num_layers, cfg.num_heads, cfg.channels, cfg.max_seq_len, cfg.vocab_size,
               cfg.padded_vocab_size, model.num_parameters);
        printf("batch: B %d x T %d x ranks %d x accumulation %d = %lld tokens per step\n", B, T, world,
               accum, a.total_batch_size);
        printf("train data: %zu rows of %d tokens in %d shard(s)%s\n", train.nrows, T, train.nshards,
               a.shuffle ? ", shuffled" : "");
        if (have_val) printf("val data: %zu rows\n", val.nrows);
        layout_print(&layout, stdout);
    }
    for (int r = 0; r < world; r++) {
        comm_barrier(&comm);
        if (r != rank) continue;
        const MemTracker* mt = &be->mem;
        size_t opt_bytes = mt->current[MEM_MASTER] + mt->current[MEM_ADAM_M] + mt->current[MEM_ADAM_V];
        /* zero_stage 2: grads = this rank's shard; the bucket working buffers
         * are allocated during the first step (ddp_zero2_report after it) */
        printf("rank %d memory: params %.2f MB, grads %.2f MB, master %.2f MB, adam_m %.2f MB, adam_v %.2f MB, "
               "activations %.2f MB | optimizer state %zu bytes for %zu owned of %zu parameters (%.2f bytes/param)\n",
               rank, mb(mt->current[MEM_PARAMS]), mb(mt->current[MEM_GRADS]), mb(mt->current[MEM_MASTER]),
               mb(mt->current[MEM_ADAM_M]), mb(mt->current[MEM_ADAM_V]), mb(mt->current[MEM_ACTIVATIONS]),
               opt_bytes, opt.nstate, layout.total_params, (double)opt_bytes / (double)layout.total_params);
        fflush(stdout);
    }
    comm_barrier(&comm);

    /* ---- checkpoints: check --output_dir; with --resume, load the newest complete one ---- */
    CkptHparams hp = {.sequence_length = T, .seed = a.seed, .shuffle = a.shuffle, .train_rows = train.nrows,
                      .total_batch_size = a.total_batch_size, .batch_size = B, .world = world,
                      .zero_stage = a.zero_stage, .num_iterations = a.num_iterations, .lr_schedule = (int)sched,
                      .warmup_iters = a.warmup_iters, .learning_rate = a.learning_rate,
                      .lr_decay_frac = a.learning_rate_decay_frac, .weight_decay = a.weight_decay,
                      .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps, .grad_clip = a.grad_clip};
    Checkpointer ck;
    ckpt_init(&ck, &comm, &model, &layout, &opt, a.output_dir, a.checkpoint_every, a.checkpoints_keep, &hp);
    CkptProgress prog;   /* steps done, the data position, non-finite steps in a row */
    int resumed = ckpt_start(&ck, a.resume, &prog);

    RunLog lg;
    log_open(&lg, a.output_dir, rank, resumed ? prog.step : -1);
    int* inputs = xmalloc(sizeof(int) * (size_t)B * T);
    int* targets = xmalloc(sizeof(int) * (size_t)B * T);
    /* the mean over the whole global batch: the reduction is then a plain sum (ddp/ddp.h) */
    const float dloss = (float)(1.0 / (double)a.total_batch_size);
    const double flops_per_step = gpt2_flops_per_token(&model, T) * (double)a.total_batch_size;
    const double peak_flops = !use_cuda ? 0.0 : dt == DTYPE_BF16 ? 989e12 : a.tf32 ? 494e12 : 67e12;
    double total_time = 0.0;
    int timed_steps = 0;

    const int prog_first_step = prog.step;
    for (int step = prog.step; step <= a.num_iterations; step++) {
        int last = step == a.num_iterations;
        /* ---- validation ---- */
        if (have_val && (step % a.val_loss_every == 0 || last)) {
            double vsum = 0.0;
            int nb = a.val_max_steps;
            for (int k = 0; k < nb; k++) {
                dataloader_rows(&val, ((uint64_t)k * world + rank) * B, B, inputs, targets);
                vsum += gpt2_forward(&model, inputs, targets, B, T, 0.0f);
            }
            comm_allreduce_host_sum(&comm, &vsum, 1);
            double vloss = vsum / ((double)nb * world);
            if (rank == 0) {
                printf("step %d | val loss %.6f\n", step, vloss);
                if (lg.f) { fprintf(lg.f, "{\"step\":%d,\"val_loss\":%.9g}\n", step, vloss); fflush(lg.f); }
            }
        }
        /* ---- sample ---- */
        if (have_tok && rank == 0 && step > 0 && (step % a.sample_every == 0 || last))
            sample_text(&model, &tok, a.sample_tokens, T, (uint64_t)a.seed + (uint64_t)step);
        if (last) break;

        /* ---- one training step ----
         * be->synchronize also waits for the communication stream, i.e. for
         * the all-gathers that --overlap_param_gather hides behind the next
         * forward: then the step is timed on the host alone (the forward's
         * input copy and loss read wait for the compute stream). */
        if (!a.overlap_param_gather) be->synchronize(be);
        be->reset_peak(be);
        double t0 = wall_time_s();
        double loss_sum = 0.0;
        for (int micro = 0; micro < accum; micro++) {
            uint64_t first = prog.next_row + ((uint64_t)micro * world + rank) * B;
            dataloader_rows(&train, first, B, inputs, targets);
            ddp_begin_micro_step(&ddp, micro == accum - 1);
            loss_sum += gpt2_forward(&model, inputs, targets, B, T, dloss);
            gpt2_backward(&model, ddp_param_ready, &ddp);
        }
        ddp_finish_reductions(&ddp);
        if (rank == 0 && world > 1 && (step == 0 || step == a.num_iterations - 1)) ddp_overlap_report(&ddp, stdout);
        int poisoned = step + 1 - a.inject_nan_at_step;
        if (a.inject_nan_at_step > 0 && poisoned >= 0 && poisoned < a.inject_nan_steps && rank == world - 1)
            loss_sum = inject_fault(be, ddp.grads, ddp.own, ddp.nown, poisoned, loss_sum);
        double sq = ddp_grad_sumsq(&ddp);
        double sums[2] = {sq, loss_sum / accum};
        comm_allreduce_host_sum(&comm, sums, 2);
        double norm = sqrt(sums[0]);
        double loss = sums[1] / world;
        float lr = lr_at_step(sched, step, a.warmup_iters, a.num_iterations, a.learning_rate,
                              a.learning_rate_decay_frac);
        /* every rank sees the same reduced loss and norm, so every rank decides alike */
        int finite = isfinite(loss) && isfinite(norm);
        if (finite) {
            float scale = (a.grad_clip > 0 && norm > a.grad_clip) ? (float)(a.grad_clip / norm) : 1.0f;
            optimizer_step(&opt, model.params, ddp.grads, lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                           scale, (uint32_t)a.seed * 7919u + (uint32_t)step);   /* unsigned: no overflow for any --seed */
            if (a.zero_stage >= 1) ddp_gather_params(&ddp);   /* overlapped: waited for in the next forward */
            prog.bad_streak = 0;
        } else {
            prog.bad_streak++;   /* no update: the params and the optimizer state stay as they were */
        }
        ddp_zero_grads(&ddp);
        if (!a.overlap_param_gather) be->synchronize(be);
        prog.step = step + 1;
        prog.next_row += rows_per_step;
        double dt_s = wall_time_s() - t0;

        if (step > 0 || a.num_iterations == 1) { total_time += dt_s; timed_steps++; }
        double tps = (double)a.total_batch_size / dt_s;
        double mfu = peak_flops > 0 ? flops_per_step / dt_s / peak_flops : -1.0;
        double peak_alloc = mb(be->mem.peak), peak_res = mb(be->peak_reserved(be));
        if (rank == 0 && !finite) {
            const char* what = !isfinite(loss) && !isfinite(norm) ? "loss and grad norm" : !isfinite(loss) ? "loss" : "grad norm";
            printf("step %4d/%d | non-finite %s (loss %g, norm %g): update skipped (%d in a row, --max_bad_steps %d)\n",
                   step + 1, a.num_iterations, what, loss, norm, prog.bad_streak, a.max_bad_steps);
            if (lg.f) {
                fprintf(lg.f, "{\"step\":%d,\"skipped\":1,\"bad_in_a_row\":%d}\n", step + 1, prog.bad_streak);
                fflush(lg.f);
            }
        } else if (rank == 0) {
            int left = a.num_iterations - step - 1;
            double avg = timed_steps ? total_time / timed_steps : dt_s;
            double eta = left * avg;
            char mfus[32];
            if (mfu >= 0) snprintf(mfus, sizeof mfus, "%.1f%%", 100.0 * mfu);
            else snprintf(mfus, sizeof mfus, "n/a");
            printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | mfu %s | "
                   "peak %.1f MB alloc, %.1f MB %s | eta %dm%02ds\n",
                   step + 1, a.num_iterations, loss, lr, norm, 1000.0 * dt_s, tps, mfus, peak_alloc,
                   peak_res, use_cuda ? "reserved" : "rss", (int)(eta / 60), (int)eta % 60);
            if (lg.f) {
                fprintf(lg.f, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,"
                        "\"tokens_per_s\":%.1f,\"mfu\":%.5f,\"peak_alloc_mb\":%.2f,\"peak_reserved_mb\":%.2f}\n",
                        step + 1, loss, lr, norm, 1000.0 * dt_s, tps, mfu >= 0 ? mfu : 0.0, peak_alloc, peak_res);
                fflush(lg.f);
            }
        }
        if (prog.bad_streak >= a.max_bad_steps) {
            char last[4200];
            if (ck.last_step >= 0)
                snprintf(last, sizeof last, "the last complete checkpoint is %s/ckpt_%08d (step %d): fix the cause "
                         "(e.g. a lower --learning_rate) and continue with --resume", a.output_dir, ck.last_step, ck.last_step);
            else
                snprintf(last, sizeof last, "no checkpoint was written (--checkpoint_every %d)", a.checkpoint_every);
            if (lg.f) fclose(lg.f);
            ckpt_fail_all(&comm, "step %d: %d steps in a row had a non-finite loss or grad norm (--max_bad_steps %d): "
                          "stopping; %s", step + 1, prog.bad_streak, a.max_bad_steps, last);
        }
        if (rank == 0 && step == prog_first_step) ddp_zero2_report(&ddp, rank, stdout);
        if (ckpt_due(&ck, prog.step)) {
            ddp_wait_gathers(&ddp);   /* the checkpoint reads the params */
            ckpt_save(&ck, &prog);
        }
        int sig = stop_signal_agree(&comm);   /* a rank got SIGTERM/SIGUSR1: every rank stops here */
        if (sig) {
            char saved[4200];
            snprintf(saved, sizeof saved, "%s/ckpt_%08d", a.output_dir, prog.step);
            if (a.checkpoint_on_signal && ck.last_step != prog.step) { ddp_wait_gathers(&ddp); ckpt_save(&ck, &prog); }
            if (lg.f) fclose(lg.f);
            stop_signal_exit(&comm, sig, prog.step, a.checkpoint_on_signal ? saved : NULL);
        }
    }
    ddp_wait_gathers(&ddp);   /* before anything reads the params */
    if (a.checkpoint_every > 0 && ck.last_step != prog.step) ckpt_save(&ck, &prog);

    if (a.save_model[0] && rank == 0) {
        gpt2_save(&model, a.save_model, save_version);
        printf("saved model to %s\n", a.save_model);
    }
    if (rank == 0 && timed_steps)
        printf("done: %d steps, average %.1f ms/step, %.0f tok/s\n", a.num_iterations,
               1000.0 * total_time / timed_steps, a.total_batch_size / (total_time / timed_steps));
    if (lg.f) fclose(lg.f);
    comm_barrier(&comm);

    free(inputs);
    free(targets);
    ckpt_free(&ck);
    if (have_tok) tokenizer_free(&tok);
    if (have_val) dataloader_free(&val);
    dataloader_free(&train);
    ddp_free(&ddp);
    optimizer_free(&opt);
    gpt2_free(&model);
    layout_free(&layout);
    free(specs);
    comm_finalize(&comm);   /* before the backend: it releases its scratch through be, and NCCL needs the device */
    be->destroy(be);
    return 0;
}
