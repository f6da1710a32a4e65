/* checkpoint/checkpoint.h — training checkpoints that resume at any world
 * size: the collective save and resume protocol, keeping the newest K, and
 * the start-up checks of --output_dir. The trainer's interface is the first
 * block below. The format (directory, state.bin, DONE) is ckpt_format.h; the
 * file system side (writing and reading by spans, checksums, listing,
 * verifying a checkpoint directory) is ckpt_file.h.
 *
 * Saving (collective; ckpt_save):
 *   1. rank 0 makes ckpt_<S>.tmp/ (removing a stale one of a crashed save);
 *   2. rank 0 creates model.bin (header, full size) and each model chunk's
 *      writer (the chunk's data-parallel rank 0) pwrite()s its tensors at
 *      their places; every rank pwrite()s the master/m/v ranges it owns (its
 *      slice of every bucket of each of its chunks: layout_opt_pieces(L,
 *      dp_rank), also under zero_stage 0 where every rank holds the full
 *      state) into the one state.bin at their canonical offsets; each
 *      fsyncs. The tied embedding's second copy (the last pipeline stage's)
 *      is written by neither: the first stage writes it once;
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
 * complete checkpoint, checks it (ckpt_verify: DONE, the presence and sizes
 * of both files, both checksums, both headers against the run's model shape)
 * and the run's settings against the header (ckpt_header_check_resume: the
 * fields that must agree, and the printed changes of those that may change);
 * it shares its verdict, so a bad checkpoint gives the same clear error on
 * every rank and nothing is written. Then every rank loads model.bin into
 * the param buffer of each of its chunks and reads exactly the state ranges
 * its optimizer holds (zero_stage 1: its pieces; zero_stage 0: everything;
 * both copies of a tied embedding), and the optimizer's
 * step count is restored. The data position is stored as the global row
 * index of the next step, so it does not depend on N or on the micro-batch
 * size. Nothing in the files depends on the world size, the pipeline shape,
 * the bucket size or the zero stage: any run resumes any other's checkpoint.
 */
#ifndef CHECKPOINT_CHECKPOINT_H
#define CHECKPOINT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "../comm/comm.h"
#include "../ddp/layout.h"
#include "../model/gpt2.h"
#include "../zero/optimizer.h"
#include "ckpt_file.h"
#include "ckpt_format.h"

/* A model chunk as the checkpoint sees it (the whole model when there is no
 * pipeline): its tensors' file offsets and params, the layout its optimizer
 * pieces come from, and this rank's place. */
typedef struct {
    GPT2* model;
    const Layout* layout;
    int dp_rank;  /* this rank's index in the layout's world (its data-parallel rank) */
    int writer;   /* this rank writes the chunk's tensors into model.bin */
    int skip_wte; /* wte is a tied copy that another rank writes (tensor and state) */
} CkptChunk;

/* One rank's checkpointing, bound by ckpt_init to the run: its model chunks
 * and the optimizer (bufs[k]: chunk k's pieces; master, m, v on the backend;
 * t). The trainer reads last_step; the rest is the protocol's. */
typedef struct {
    Comm* comm;
    CkptChunk* chunks;
    int nchunks;
    GPT2Config cfg; /* the whole model's shape */
    size_t P;       /* and parameter count */
    Optimizer* opt;
    const char* dir; /* --output_dir */
    int every, keep; /* --checkpoint_every, --checkpoints_keep */
    CkptHparams hp;
    CkptSpan* own; /* ranges this rank writes (its slice of every bucket) */
    int nown;
    CkptSpan* held; /* ranges of this rank's optimizer state (read on resume) */
    int nheld;
    int last_step; /* step of the newest complete checkpoint, -1 if none */
} Checkpointer;

/* ---- the trainer's interface ---- */

/* Binds the checkpointer to the run (no I/O): chunks[k] is what opt->bufs[k]
 * updates. dir may be "" when every == 0. */
void ckpt_init(Checkpointer* c, Comm* comm, const CkptChunk* chunks, int nchunks, Optimizer* opt,
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
/* The current params as an llm.c model file (version 3 fp32 or 5 bf16),
 * written by the chunks' writers into path.tmp, then renamed over path
 * (collective; one clear error on every rank on failure). */
void ckpt_save_model(Checkpointer* c, const char* path, int version);
/* Start-up, collective, before training: checks on rank 0 that
 * ckpt_save_model(path, version) will be able to create path.tmp and that
 * its file system has room for the model file, so that a bad --save_model
 * ends the run before its steps are spent, not after. One clear error on
 * every rank otherwise. */
void ckpt_check_save_model(Checkpointer* c, const char* path, int version);
void ckpt_free(Checkpointer* c);

/* Prints "error: <msg>" on every rank that calls it, then ends them all
 * with a non-zero exit. Every rank must call it (a shared verdict). */
NORETURN void ckpt_fail_all(Comm* comm, const char* fmt, ...) PRINTF_LIKE(2, 3);

#endif
