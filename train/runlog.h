/* train/runlog.h — what a run reports as it goes: one writer for the console
 * lines and for <output_dir>/log.jsonl (one JSON object a line), written by
 * rank 0 only (the other ranks' RunLog is inert).
 *
 * log.jsonl lines:
 *   {"step":S,"loss":..,"lr":..,"grad_norm":..,"ms":..,"tokens_per_s":..,"mfu":..,
 *    "peak_alloc_mb":..,"peak_reserved_mb":..[,"bubble":..]}
 *                                                 a training step S (1-based); bubble: with a pipeline
 *   {"step":S,"skipped":1,"bad_in_a_row":K}         a step with a non-finite loss or norm
 *   {"step":S,"val_loss":..}                        validation before step S+1
 * On resume at step S the log keeps what the uninterrupted run had written
 * before its validation at S (runlog_trim) and appends. */
#ifndef TRAIN_RUNLOG_H
#define TRAIN_RUNLOG_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    int active; /* rank 0: prints and writes */
    FILE* f;    /* log.jsonl, or NULL without --output_dir */
} RunLog;

/* One training step as it is reported. */
typedef struct {
    int step, num_iterations; /* step: completed steps, 1-based as printed */
    int finite;               /* 0: the update was skipped */
    double loss, norm;
    float lr;
    double seconds, tokens_per_s;
    double mfu; /* < 0: not known (CPU) */
    double peak_alloc_mb, peak_reserved_mb;
    const char* reserved_name; /* "reserved" (device) or "rss" (host) */
    double eta_s;
    int bad_in_a_row, max_bad_steps;
    double bubble;        /* pipeline: measured bubble fraction; < 0: no pipeline */
    double bubble_theory; /* (P - 1) / (V * m) */
} StepLog;

/* Rank 0 with dir set: creates dir, opens log.jsonl (resume_step >= 0:
 * trimmed to that step and appended to; else truncated). Fatal, naming the
 * file, when it cannot. */
void runlog_open(RunLog* lg, const char* dir, int rank, int resume_step);
void runlog_step(RunLog* lg, const StepLog* s);
void runlog_val(RunLog* lg, int step, double val_loss);
void runlog_close(RunLog* lg);

/* log.jsonl at `path` on resume at `step`: keeps the training lines of steps
 * <= step and the validation lines of steps < step, drops the rest (no file
 * is fine). Returns 0, or -1 with a one-line reason in err. */
int runlog_trim(const char* path, int step, char* err, size_t errlen);

#endif
