/* checkpoint/checkpoint.h — training checkpoints that resume at any world
 * size: the on-disk format, the parallel writer and reader, atomic saving,
 * checksums, finding the newest complete checkpoint, keeping the newest K,
 * and the start-up checks of --output_dir.
 *
 * A checkpoint of a run that has completed S optimizer steps is a directory
 *   <output_dir>/ckpt_<S as %08d>/
 *     model.bin  llm.c model file, fp32 (version 3), written by rank 0
 *     state.bin  our training state (below), written by every rank
 *     DONE       the completion marker, written last, text:
 *                  gpt2-checkpoint v1
 *                  step <S>
 *                  model.bin <bytes> crc32 <8 hex digits>
 *                  state.bin <bytes> crc32 <8 hex digits>
 *
 * state.bin: a 1024-byte header of 128 little-endian uint64 slots (CKPT_H_*
 * in checkpoint.c: magic, version, step, data position, AdamW step count,
 * the model shape and the run's hyperparameters), then three fp32 arrays of
 * P = num_parameters elements: the master weights, AdamW m, AdamW v. Each
 * array is in llm.c's file order (tensor by tensor, the order of model.bin),
 * with no padding: element e of a tensor that starts at file_off lies at
 * byte 1024 + 4 * (a * P + file_off + e) for array a (0 master, 1 m, 2 v).
 * Nothing in the file depends on the world size, the bucket size or the
 * zero_stage, so a run saved at N ranks resumes at any other N and stage.
 *
 * Saving (collective; ckpt_save):
 *   1. rank 0 makes ckpt_<S>.tmp/ (removing a stale one of a crashed save);
 *   2. rank 0 writes model.bin; every rank pwrite()s the master/m/v ranges
 *      it owns (its slice of every bucket: layout_opt_pieces(L, rank), also
 *      under zero_stage 0 where every rank holds the full state) into the
 *      one state.bin at their canonical offsets, and fsyncs;
 *   3. barrier; rank 0 computes both files' CRC-32 (zlib's polynomial),
 *      fsyncs the directory, renames ckpt_<S>.tmp to ckpt_<S>, fsyncs
 *      output_dir, and writes DONE (DONE.tmp, fsync, rename, fsync);
 *   4. rank 0 deletes complete checkpoints beyond the newest --checkpoints_keep
 *      (DONE first, so a crash mid-delete leaves an incomplete directory, not
 *      a corrupt "complete" one) and leftovers of crashed saves older than S.
 * Only a directory named ckpt_<digits> that holds DONE is complete; a crash
 * at any point leaves the previous complete checkpoint untouched. A write
 * error (disk full) is fatal with a message naming the file; the .tmp
 * directory it leaves is never taken for complete.
 *
 * Resuming (collective; ckpt_start with resume = 1): rank 0 finds the newest
 * complete checkpoint, checks DONE, the presence and sizes of both files,
 * both checksums, both headers against the run's model shape, and the
 * hyperparameters that must agree (sequence_length, seed, shuffle, and the
 * number of rows of the training data: the data order depends on them); it
 * shares its verdict, so a bad checkpoint gives the same clear error on
 * every rank and nothing is written. Then every rank loads model.bin into
 * the param buffer and reads exactly the state ranges its optimizer holds
 * (zero_stage 1: its pieces; zero_stage 0: everything), and the optimizer's
 * step count is restored. Other hyperparameters (learning rate and schedule,
 * warmup, betas, eps, weight decay, clipping, num_iterations,
 * total_batch_size, batch_size, ranks, zero_stage) may change: each change
 * is printed. The data position is stored as the global row index of the
 * next step, so it does not depend on N or on the micro-batch size.
 */
#ifndef CHECKPOINT_CHECKPOINT_H
#define CHECKPOINT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "../comm/comm.h"
#include "../ddp/layout.h"
#include "../model/gpt2.h"
#include "../zero/optimizer.h"

#define CKPT_MAGIC 20261203
#define CKPT_VERSION 1
#define CKPT_HEADER_BYTES 1024

/* The run's settings recorded in state.bin. */
typedef struct {
    /* must match on resume */
    int sequence_length;
    int seed;
    int shuffle;
    uint64_t train_rows;        /* rows of T+1 tokens in one epoch of the training data */
    /* recorded; may change on resume (each change is printed) */
    long long total_batch_size;
    int batch_size, world, zero_stage, num_iterations;
    int lr_schedule, warmup_iters;
    float learning_rate, lr_decay_frac, weight_decay, beta1, beta2, eps, grad_clip;
} CkptHparams;

/* Where the training loop stands. */
typedef struct {
    int step;                   /* optimizer steps completed (skipped ones included) */
    uint64_t next_row;          /* global row index of the next step's first row */
    int bad_streak;             /* consecutive skipped (non-finite) steps so far */
} CkptProgress;

/* state.bin's header, decoded. */
typedef struct {
    int version;
    uint64_t num_parameters;
    GPT2Config cfg;
    CkptProgress progress;
    int opt_t;                  /* AdamW updates taken (bias correction) */
    int dtype;                  /* the run's DType at save (informational) */
    CkptHparams hp;
} CkptHeader;

/* DONE, parsed. */
typedef struct {
    int step;
    long long model_bytes, state_bytes;
    uint32_t model_crc, state_crc;
} CkptDone;

/* One range of this rank's optimizer state and where it lives in the
 * canonical arrays of state.bin. */
typedef struct {
    size_t state_off;           /* element offset in the optimizer's master/m/v */
    size_t canon_off;           /* element offset in each canonical array */
    size_t len;
} CkptSpan;

typedef struct {
    Comm* comm;
    GPT2* model;
    Optimizer* opt;
    const char* dir;            /* --output_dir */
    int every, keep;            /* --checkpoint_every, --checkpoints_keep */
    CkptHparams hp;
    CkptSpan* own;              /* ranges this rank writes (its slice of every bucket) */
    int nown;
    CkptSpan* held;             /* ranges of this rank's optimizer state (read on resume) */
    int nheld;
    int last_step;              /* step of the newest complete checkpoint, -1 if none */
} Checkpointer;

/* ---- the trainer's interface ---- */

/* Binds the checkpointer to the run (no I/O). dir may be "" when every == 0. */
void ckpt_init(Checkpointer* c, Comm* comm, GPT2* model, const Layout* L, Optimizer* opt,
               const char* dir, int every, int keep, const CkptHparams* hp);
/* Start-up, collective, before training writes anything. If dir is set:
 * creates it, checks on rank 0 that a file can be written there (and, when
 * checkpointing, that the file system has room for one checkpoint), and
 * fails on every rank otherwise. resume = 0 with checkpointing on: fails if
 * dir already holds a complete checkpoint (nothing is overwritten; pass
 * --resume). resume = 1: loads the newest complete checkpoint into the
 * model and the optimizer, fills *p and returns 1; returns 0 with *p zeroed
 * when dir holds none (the run starts from step 0). Any problem with the
 * checkpoint is one clear error on every rank. */
int ckpt_start(Checkpointer* c, int resume, CkptProgress* p);
/* 1 if a checkpoint is due after step_done completed steps. */
int ckpt_due(const Checkpointer* c, int step_done);
/* Saves a checkpoint of the current state (collective). */
void ckpt_save(Checkpointer* c, const CkptProgress* p);
void ckpt_free(Checkpointer* c);

/* Prints "error: <msg>" on every rank that calls it, then ends them all
 * with a non-zero exit. Every rank must call it (a shared verdict). */
NORETURN void ckpt_fail_all(Comm* comm, const char* fmt, ...) PRINTF_LIKE(2, 3);

/* log.jsonl on resume at step: keeps the lines the uninterrupted run had
 * written before its validation at `step` (training lines of steps <= step,
 * validation lines of steps < step), drops the rest (rank 0 only; no file is
 * fine). Returns 0, or -1 with a reason in err. */
int ckpt_log_trim(const char* path, int step, char* err, size_t errlen);

/* ---- the pieces, exposed for the unit test and the fuzz harness ---- */

/* For each buffer range of `want` (each inside one parameter and one piece
 * of `held`), the matching range of the optimizer state described by
 * `held` and its canonical offset (via m->layout_to_tensor, the layout
 * parameter's spec_off inside its tensor (a row chunk of wte) and file_off). */
CkptSpan* ckpt_spans(const Layout* L, const GPT2* m, const OptPiece* held, int nheld,
                     const OptPiece* want, int nwant, int* n);

/* CRC-32 (zlib's polynomial 0xEDB88320, init and final xor 0xFFFFFFFF). */
uint32_t ckpt_crc32(uint32_t crc, const void* data, size_t n);
/* CRC-32 and size of a file. Returns 0, or -1 with a reason in err. */
int ckpt_crc32_file(const char* path, uint32_t* crc, long long* bytes, char* err, size_t errlen);

void ckpt_header_encode(const CkptHeader* h, unsigned char out[CKPT_HEADER_BYTES]);
/* Decodes and checks a header (magic, version, sane shape). 0 or -1 + err. */
int ckpt_header_decode(const unsigned char* buf, size_t n, CkptHeader* h, char* err, size_t errlen);
/* Parses DONE's text (n bytes). 0 or -1 + err. */
int ckpt_done_parse(const char* text, size_t n, CkptDone* d, char* err, size_t errlen);
/* Everything rank 0 checks before a resume, on the checkpoint directory
 * `path`: DONE, both files present with the recorded sizes and checksums,
 * model.bin's header equal to cfg, state.bin's header consistent with cfg
 * and P. Fills *h. 0 or -1 + err (one line naming the file). */
int ckpt_verify(const char* path, const GPT2Config* cfg, size_t P, CkptHeader* h, char* err,
                size_t errlen);
/* Writes the spans of master/m/v (backend memory) into path at their
 * canonical offsets (creating the file, never truncating it: every rank
 * writes its own ranges into the one file), and the header too when header
 * != NULL (rank 0); then fsyncs. 0 or -1 + err naming the file. */
int ckpt_write_state(const char* path, Backend* be, size_t P, const unsigned char* header,
                     const CkptSpan* spans, int nspans, const float* master, const float* m,
                     const float* v, char* err, size_t errlen);
/* Reads the spans of state.bin (P parameters) into master/m/v (backend
 * memory, through a host staging buffer). 0 or -1 + err. */
int ckpt_read_state(const char* path, Backend* be, size_t P, const CkptSpan* spans, int nspans,
                    float* master, float* m, float* v, char* err, size_t errlen);

#endif
