/* train/args.h — the trainer's flags: the table (name, type, default, help),
 * parsing (--flag value and --flag=value), and the checks a flag can be given
 * alone. Every rank parses the same command line, so every rank fails alike,
 * with one line naming the flag. */
#ifndef TRAIN_ARGS_H
#define TRAIN_ARGS_H

#include "../kernels/kernels.h"
#include "../zero/optimizer.h"

typedef struct {
    /* data, model, output */
    const char *input_bin, *input_val_bin, *tokenizer, *model, *output_dir, *save_model, *save_dtype;
    int n_embd, n_head, max_seq_len;
    /* batch and schedule */
    int batch_size, sequence_length, num_iterations, warmup_iters;
    long long total_batch_size;
    const char* lr_schedule;
    float learning_rate, learning_rate_decay_frac, weight_decay, grad_clip, beta1, beta2, eps;
    /* evaluation and sampling */
    int val_loss_every, val_max_steps, sample_every, sample_tokens;
    /* compute */
    const char *dtype, *device;
    int tf32, recompute;
    /* data parallelism */
    const char* comm;
    float comm_timeout;
    int zero_stage, buckets_per_group;
    long long bucket_size;
    int overlap_param_gather; /* zero_stage 1/2: all-gather overlapped with the next forward */
    const char* gather_order; /* testing: forward | reverse launch order of the all-gathers */
    int gather_hold;          /* testing: hold each all-gather back until the forward waits for it */
    /* pipeline parallelism */
    int pipeline_parallel, virtual_pipeline_parallel;
    const char* pp_schedule;
    int check_tied_embedding; /* testing: the tied copies compared after every step */
    int pp_reduce_early;      /* testing: reductions launched in a chunk's first backward */
    /* data order and seeds */
    int shuffle, seed;
    /* checkpoints and faults */
    int checkpoint_every, resume, checkpoints_keep, max_bad_steps;
    int checkpoint_on_signal; /* SIGTERM/SIGUSR1: save at the next step boundary, exit 75 (common/stop_signal.h) */
    int inject_nan_at_step, inject_nan_steps;

    /* resolved by args_parse from the flags above */
    int use_cuda;     /* --device */
    DType dt;         /* --dtype */
    LrSchedule sched; /* --lr_schedule */
    int save_version; /* --save_dtype: llm.c model file version 3 (fp32) or 5 (bf16) */
} Args;

/* Defaults, then argv; --help prints the table on rank 0 and exits 0. Checks
 * every flag that can be checked alone (ranges, names, combinations) and
 * resolves device, dtype, schedule and save version (fatal, one line, on a
 * bad value). */
void args_parse(Args* a, int argc, char** argv, int rank);

#endif
