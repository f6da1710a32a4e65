/* train/args.c — see args.h. */
#include "args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

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
    a->pipeline_parallel = 1;
    a->virtual_pipeline_parallel = 1;
    a->pp_schedule = "1f1b";
    a->gather_order = "forward";
    a->shuffle = 0;
    a->seed = 1337;
    a->bucket_size = 4000000;
    a->buckets_per_group = 1;
    a->comm_timeout = 300.0f;
    a->max_bad_steps = 5;
    a->inject_nan_steps = 1;
}

#define NFLAGS 64 /* capacity of the flag table */
static int make_flags(Args* a, Flag* f) {
    int n = 0;
#define FL(nm, ty, p, h)                                                \
    do {                                                                \
        if (n >= NFLAGS) fatal("internal: more than %d flags", NFLAGS); \
        f[n++] = (Flag){nm, ty, p, h};                                  \
    } while (0)
    FL("input_bin", F_STR, &a->input_bin, "glob of training token shards (llm.c format)");
    FL("input_val_bin", F_STR, &a->input_val_bin, "glob of validation token shards ('' = none)");
    FL("tokenizer", F_STR, &a->tokenizer, "llm.c tokenizer file, to decode samples");
    FL("model", F_STR, &a->model,
       "preset dN (N layers, 64N channels, N heads; d12 = GPT-2 124M) or an llm.c model file");
    FL("n_embd", F_INT, &a->n_embd, "override the preset's channels (0 = preset)");
    FL("n_head", F_INT, &a->n_head, "override the preset's heads (0 = preset)");
    FL("max_seq_len", F_INT, &a->max_seq_len,
       "override the preset's maximum sequence length (0 = preset, 1024)");
    FL("batch_size", F_INT, &a->batch_size, "micro-batch size B per rank");
    FL("sequence_length", F_INT, &a->sequence_length, "sequence length T");
    FL("total_batch_size", F_LL, &a->total_batch_size,
       "tokens per optimizer step (-1 = B*T*ranks); must divide by B*T*ranks: the quotient is the gradient accumulation");
    FL("num_iterations", F_INT, &a->num_iterations, "optimizer steps");
    FL("learning_rate", F_FLOAT, &a->learning_rate, "maximum learning rate");
    FL("lr_schedule", F_STR, &a->lr_schedule, "cosine | linear | constant (after warmup)");
    FL("warmup_iters", F_INT, &a->warmup_iters, "linear warmup steps");
    FL("learning_rate_decay_frac", F_FLOAT, &a->learning_rate_decay_frac,
       "final learning rate as a fraction of the maximum");
    FL("weight_decay", F_FLOAT, &a->weight_decay,
       "AdamW decoupled weight decay (matmul weights and embeddings only)");
    FL("beta1", F_FLOAT, &a->beta1, "AdamW beta1");
    FL("beta2", F_FLOAT, &a->beta2, "AdamW beta2");
    FL("eps", F_FLOAT, &a->eps, "AdamW epsilon");
    FL("grad_clip", F_FLOAT, &a->grad_clip, "clip the global gradient norm to this (0 = off)");
    FL("val_loss_every", F_INT, &a->val_loss_every, "evaluate the validation loss every K steps (0 = never)");
    FL("val_max_steps", F_INT, &a->val_max_steps, "validation batches per evaluation");
    FL("sample_every", F_INT, &a->sample_every, "print generated text every K steps (0 = never)");
    FL("sample_tokens", F_INT, &a->sample_tokens, "tokens to generate per sample");
    FL("output_dir", F_STR, &a->output_dir,
       "write log.jsonl (per-step figures) and checkpoints here ('' = nowhere)");
    FL("save_model", F_STR, &a->save_model, "write the final weights to this llm.c model file ('' = no)");
    FL("save_dtype", F_STR, &a->save_dtype, "fp32 (llm.c version 3) | bf16 (version 5) for saved models");
    FL("device", F_STR, &a->device, "auto | cpu | cuda");
    FL("dtype", F_STR, &a->dtype, "auto | fp32 | bf16 (auto: bf16 on cuda, fp32 on cpu)");
    FL("tf32", F_INT, &a->tf32, "allow TF32 matmuls in fp32 mode on cuda (0 | 1)");
    FL("recompute", F_INT, &a->recompute,
       "activation recomputation: 0 none, 1 GELU outputs, 2 also layernorm outputs");
    FL("zero_stage", F_INT, &a->zero_stage,
       "0 = DDP (all-reduce, full optimizer state), 1 = ZeRO-1 distributed optimizer, 2 = ZeRO-2 (also shards the gradients)");
    FL("use_distributed_optimizer", F_SWITCH, &a->zero_stage, "alias of --zero_stage 1 (takes no value)");
    FL("pipeline_parallel", F_INT, &a->pipeline_parallel,
       "pipeline stages P: ranks = P x data-parallel replicas; the layers are cut into P x V model chunks");
    FL("virtual_pipeline_parallel", F_INT, &a->virtual_pipeline_parallel,
       "model chunks V per pipeline rank (V > 1: interleaved 1F1B; needs P > 1)");
    FL("pp_schedule", F_STR, &a->pp_schedule,
       "1f1b (interleaved when V > 1) | gpipe (all forwards, then all backwards: the reference)");
    FL("check_tied_embedding", F_SWITCH, &a->check_tied_embedding,
       "testing, pipeline: after every step check that the first and last stage hold bit-identical copies of the tied embedding (takes no value)");
    FL("pp_reduce_early", F_SWITCH, &a->pp_reduce_early,
       "testing, pipeline: launch each chunk's gradient reductions in its FIRST backward instead of its last (wrong on purpose) (takes no value)");
    FL("overlap_param_gather", F_SWITCH, &a->overlap_param_gather,
       "zero_stage 1/2: overlap the param all-gather with the next forward, which waits per bucket (takes no value)");
    FL("gather_order", F_STR, &a->gather_order,
       "testing: launch order of the param all-gathers, forward | reverse (bucket order, which the forward does not follow)");
    FL("gather_hold", F_INT, &a->gather_hold,
       "testing, with --overlap_param_gather: 1 = launch each all-gather only when a wait needs it or a later one (the slowest network): a read without its wait would see last step's params");
    FL("bucket_size", F_LL, &a->bucket_size,
       "gradient bucket size in ELEMENTS (suffix K or M allowed: 4M = 4,000,000)");
    FL("buckets_per_group", F_INT, &a->buckets_per_group, "buckets whose reductions launch together");
    FL("comm", F_STR, &a->comm, "auto | nccl | mpi: collective backend");
    FL("comm_timeout", F_FLOAT, &a->comm_timeout,
       "seconds before a stuck collective ends the run on every rank");
    FL("shuffle", F_INT, &a->shuffle, "0 = sequential rows, 1 = rows shuffled per epoch (seeded by --seed)");
    FL("seed", F_INT, &a->seed, "seed of weight init, data shuffle and sampling");
    FL("checkpoint_every", F_INT, &a->checkpoint_every,
       "save a checkpoint in --output_dir every K steps and at the end (0 = never)");
    FL("resume", F_SWITCH, &a->resume,
       "continue from the newest complete checkpoint in --output_dir, at any number of ranks (takes no value)");
    FL("checkpoint_on_signal", F_SWITCH, &a->checkpoint_on_signal,
       "on SIGTERM or SIGUSR1 (any rank): stop after the step in progress, save a checkpoint in --output_dir and exit 75, for --resume (without it: exit 128+signal, no checkpoint) (takes no value)");
    FL("checkpoints_keep", F_INT, &a->checkpoints_keep,
       "keep only the newest K complete checkpoints (0 = keep all)");
    FL("max_bad_steps", F_INT, &a->max_bad_steps,
       "stop after K steps in a row with a non-finite loss or grad norm (each is skipped)");
    FL("inject_nan_at_step", F_INT, &a->inject_nan_at_step,
       "testing aid: poison steps K .. K+inject_nan_steps-1 (as printed, from 1) on the last rank, alternately a NaN gradient and an infinite loss (0 = off)");
    FL("inject_nan_steps", F_INT, &a->inject_nan_steps,
       "testing aid: how many steps in a row --inject_nan_at_step poisons");
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

static void parse_flags(Args* a, int argc, char** argv, int rank) {
    Flag flags[NFLAGS];
    int nf = make_flags(a, flags);
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            if (rank == 0) print_help(a, flags, nf);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0)
            fatal("unexpected argument '%s' (flags start with --; see --help)", arg);
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

/* The checks each flag (or a pair of flags) allows alone, and the resolution
 * of the names device, dtype, schedule and save dtype. */
static void args_check(Args* a) {
    check_positive("--batch_size", a->batch_size);
    check_positive("--sequence_length", a->sequence_length);
    check_nonneg("--num_iterations", a->num_iterations);
    check_nonneg("--learning_rate", a->learning_rate);
    check_nonneg("--warmup_iters", a->warmup_iters);
    check_nonneg("--weight_decay", a->weight_decay);
    check_nonneg("--grad_clip", a->grad_clip);
    check_nonneg("--val_loss_every", a->val_loss_every);
    check_nonneg("--sample_every", a->sample_every);
    check_positive("--val_max_steps", a->val_max_steps);
    check_positive("--sample_tokens", a->sample_tokens);
    check_positive("--bucket_size", a->bucket_size);
    check_positive("--buckets_per_group", a->buckets_per_group);
    check_positive("--comm_timeout", (long long)ceil(a->comm_timeout));
    check_nonneg("--n_embd", a->n_embd);
    check_nonneg("--n_head", a->n_head);
    check_nonneg("--max_seq_len", a->max_seq_len);
    check_nonneg("--checkpoint_every", a->checkpoint_every);
    check_nonneg("--checkpoints_keep", a->checkpoints_keep);
    check_positive("--max_bad_steps", a->max_bad_steps);
    check_nonneg("--inject_nan_at_step", a->inject_nan_at_step);
    check_positive("--inject_nan_steps", a->inject_nan_steps);
    if ((a->checkpoint_every > 0 || a->resume || a->checkpoint_on_signal) && !a->output_dir[0])
        fatal(
            "--checkpoint_every, --checkpoint_on_signal and --resume need --output_dir (the checkpoints live there)");
    if (a->learning_rate_decay_frac < 0 || a->learning_rate_decay_frac > 1)
        fatal("flag --learning_rate_decay_frac must be in [0, 1] (got %g)", a->learning_rate_decay_frac);
    if (a->beta1 < 0 || a->beta1 >= 1) fatal("flag --beta1 must be in [0, 1) (got %g)", a->beta1);
    if (a->beta2 < 0 || a->beta2 >= 1) fatal("flag --beta2 must be in [0, 1) (got %g)", a->beta2);
    if (a->eps <= 0) fatal("flag --eps must be positive (got %g)", a->eps);
    if (a->zero_stage < 0 || a->zero_stage > 2)
        fatal("--zero_stage %d is not supported: 0 = DDP, 1 = ZeRO-1 distributed optimizer, 2 = ZeRO-2",
              a->zero_stage);
    check_positive("--pipeline_parallel", a->pipeline_parallel);
    check_positive("--virtual_pipeline_parallel", a->virtual_pipeline_parallel);
    if (a->virtual_pipeline_parallel > 1 && a->pipeline_parallel == 1)
        fatal(
            "--virtual_pipeline_parallel %d needs --pipeline_parallel > 1 (one stage has nothing to interleave)",
            a->virtual_pipeline_parallel);
    if (strcmp(a->pp_schedule, "1f1b") != 0 && strcmp(a->pp_schedule, "gpipe") != 0)
        fatal("--pp_schedule: unknown value '%s' (expected 1f1b or gpipe)", a->pp_schedule);
    if (a->overlap_param_gather && a->zero_stage == 0)
        fatal("--overlap_param_gather needs --zero_stage 1 or 2 (zero_stage 0 has no param all-gather)");
    if (strcmp(a->gather_order, "forward") != 0 && strcmp(a->gather_order, "reverse") != 0)
        fatal("--gather_order: unknown value '%s' (expected forward or reverse)", a->gather_order);
    if (a->gather_hold != 0 && a->gather_hold != 1)
        fatal("flag --gather_hold must be 0 or 1 (got %d)", a->gather_hold);
    if (a->gather_hold && !a->overlap_param_gather) fatal("--gather_hold 1 needs --overlap_param_gather");
    if (a->shuffle != 0 && a->shuffle != 1) fatal("flag --shuffle must be 0 or 1 (got %d)", a->shuffle);
    if (a->recompute < 0 || a->recompute > 2)
        fatal("flag --recompute must be 0, 1 or 2 (got %d)", a->recompute);
    if (a->tf32 != 0 && a->tf32 != 1) fatal("flag --tf32 must be 0 or 1 (got %d)", a->tf32);
    if (lr_schedule_parse(a->lr_schedule, &a->sched) != 0)
        fatal("--lr_schedule: unknown schedule '%s' (expected cosine, linear or constant)", a->lr_schedule);
    if (strcmp(a->save_dtype, "fp32") == 0) a->save_version = 3;
    else if (strcmp(a->save_dtype, "bf16") == 0) a->save_version = 5;
    else fatal("--save_dtype: unknown value '%s' (expected fp32 or bf16)", a->save_dtype);
    if (strcmp(a->device, "auto") == 0) a->use_cuda = backend_cuda_available();
    else if (strcmp(a->device, "cpu") == 0) a->use_cuda = 0;
    else if (strcmp(a->device, "cuda") == 0) a->use_cuda = 1;
    else fatal("--device: unknown value '%s' (expected auto, cpu or cuda)", a->device);
    if (strcmp(a->dtype, "auto") == 0) a->dt = a->use_cuda ? DTYPE_BF16 : DTYPE_FP32;
    else if (strcmp(a->dtype, "fp32") == 0) a->dt = DTYPE_FP32;
    else if (strcmp(a->dtype, "bf16") == 0) a->dt = DTYPE_BF16;
    else fatal("--dtype: unknown value '%s' (expected auto, fp32 or bf16)", a->dtype);
    if (!a->use_cuda && a->dt == DTYPE_BF16)
        fatal("--dtype bf16 needs --device cuda (the CPU backend computes in fp32)");
    if (!a->use_cuda && a->tf32) fatal("--tf32 1 needs --device cuda");
}

void args_parse(Args* a, int argc, char** argv, int rank) {
    args_defaults(a);
    parse_flags(a, argc, argv, rank);
    args_check(a);
}
