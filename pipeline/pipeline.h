/* pipeline/pipeline.h — pipeline parallelism: the rank grid, the model chunks
 * a rank holds (each with its own model, layout, flat buffers and DDP), one
 * step's forwards and backwards run over the schedule (pipeline/schedule.h)
 * with activations and their gradients passed point to point, and the tied
 * embedding's two copies.
 *
 * Grid. world = P * DP; global rank r is pipeline rank p = r / DP and DP rank
 * d = r % DP. Communicators: dp (the ranks of one stage: each chunk's DDP
 * reduces and gathers over it), pp (the P stages of one replica: transfers),
 * emb (the first and last stage of one replica, when P > 1: the tied
 * embedding), and the world (grad norm, loss). P = 1 and V = 1 is plain data
 * parallelism: one chunk, the whole model, no transfers.
 *
 * Chunks. The L layers are cut into P*V model chunks (pp_split_layers);
 * global chunk c = v*P + p is this rank's local chunk v. Chunk 0 holds the
 * embeddings, chunk P*V-1 the final layernorm and the LM head, so with P > 1
 * the tied token embedding wte is held twice: by the encoder's chunk on the
 * first stage and by the head's chunk on the last. Both copies start equal
 * (the same init stream or file), both stages lay wte out alike (a bucket of
 * its own: gpt2_describe), and after the reductions the two gradients are
 * summed over emb, piece by piece of what the optimizer reads, so both copies
 * take the same update: the copies stay bit-identical, the parameter is
 * updated once per step, and the head's copy is left out of the grad norm.
 *
 * A step (pipeline_forward_backward): the rank's schedule, op by op. F(v, i):
 * receive the chunk's input from the previous chunk's rank (unless chunk 0,
 * which reads token ids), forward, send the output to the next chunk's rank
 * (unless the last chunk, which adds the micro-batch's loss). B(v, i): mark
 * the chunk's DDP micro-step (its last backward in the schedule is the one
 * whose complete buckets launch their reductions, at zero_stage 0/1), receive
 * the output's gradient (unless the last chunk), backward, send the input's
 * gradient back (unless chunk 0). Sends go from per-micro-batch copies and
 * are waited for only at the end of the step, so a send never blocks the
 * schedule (which pp_simulate proves deadlock-free with buffered sends); a
 * receive blocks, and the time blocked in receives is the measured bubble.
 * Micro-batch i of DP rank d reads the rows first_row + (i*DP + d)*B.
 * Afterwards the trainer waits for each chunk's reductions
 * (pipeline_finish_reductions: also the tied-embedding sum), takes the norm
 * (pipeline_grad_sumsq), steps the optimizer over every chunk's buffer and
 * all-gathers and zeroes per chunk. */
#ifndef PIPELINE_PIPELINE_H
#define PIPELINE_PIPELINE_H

#include "schedule.h"
#include "../comm/comm.h"
#include "../data/dataloader.h"
#include "../data/tokenizer.h"
#include "../ddp/ddp.h"
#include "../model/gpt2.h"
#include "../zero/optimizer.h"
#include "../train/sample.h"

typedef struct {
    int c, v;   /* global and local chunk index */
    GPT2 model; /* model.part: its layers, embeddings, head */
    LayoutParamSpec* specs;
    Layout layout;
    DDP ddp;
    int last_bwd;      /* index in the rank's ops of its last backward */
    void** send_buf;   /* [m] outgoing data of micro-batch i (output or input gradient) */
    CommHandle* send;  /* [m] */
    size_t send_bytes; /* bytes of send buffers allocated */
    OptPiece* tied;    /* pieces (of the optimizer's) of the tied wte to sum over emb */
    int ntied;
    int first_launch_op; /* op indices of the backwards that launched reductions in the last */
    int last_launch_op;  /* step (-1: none): at zero_stage 0/1 only the chunk's last backward;
                          * at zero_stage 2 every backward, the last being the last backward */
} PPChunk;

typedef struct {
    int P, V, DP, p, d, m; /* grid, micro-batches per step */
    int B, T;
    Comm *world, dp, pp, emb;
    Backend* be;
    PPChunk* chunks; /* [V] */
    PPScheduleKind kind;
    PPOp* ops; /* this rank's schedule, 2*V*m */
    int nops;
    int* first_layer; /* [P*V + 1] */
    double wait_s;    /* seconds blocked in receives during the last step */
    int reduce_early; /* testing: launch each chunk's reductions in its FIRST backward */
} Pipeline;

typedef struct {
    int P, V, m;          /* stages, chunks per rank, micro-batches per step */
    const char* schedule; /* "1f1b" | "gpipe" */
    int B, T, recompute;
    int zero_stage; /* DDPConfig of every chunk */
    DDPConfig ddp;
    size_t bucket_size;
    int buckets_per_group;
    int reduce_early; /* testing aid (see Pipeline) */
} PipelineConfig;

/* Builds the grid and communicators over world, the schedule and this rank's
 * model chunks: described, laid out over DP, bound (gradients sharded at
 * zero_stage 2), activations for the chunk's peak micro-batches in flight.
 * Fatal, one line naming the flags, when P does not divide the world size,
 * P*V exceeds the layers, V > 1 with P = 1, or the schedule refuses m. */
void pipeline_init(Pipeline* pp, Comm* world, Backend* be, const GPT2Config* cfg, const PipelineConfig* pc);
/* After the weights are in (gpt2_init_random or gpt2_load on each chunk):
 * each chunk's DDP over dp; fills bufs[0..V) for optimizer_init. */
void pipeline_setup_ddp(Pipeline* pp, const PipelineConfig* pc, OptBuffer* bufs);
/* One step's forwards and backwards (the file comment). dloss: the backward
 * seed. Returns the sum over this rank's micro-batches of their mean loss
 * (last stage; 0 elsewhere). */
double pipeline_forward_backward(Pipeline* pp, DataLoader* dl, uint64_t first_row, float dloss, int* inputs,
                                 int* targets);
/* Waits for every chunk's reductions, then sums the tied embedding's two
 * gradients over emb. */
void pipeline_finish_reductions(Pipeline* pp);
/* Sum of squares of this rank's reduced gradients over its chunks, without
 * the head's copy of the tied embedding (local; all-reduce over the world). */
double pipeline_grad_sumsq(Pipeline* pp);
/* After the update: each chunk's all-gather (or its launch), then zeroed gradients. */
void pipeline_after_update(Pipeline* pp, int updated);
void pipeline_wait_gathers(Pipeline* pp);
/* The loss of a validation batch (forward only, dloss 0) through the stages:
 * returns the batch's mean loss on the last stage, 0 elsewhere. */
double pipeline_eval(Pipeline* pp, const int* inputs, const int* targets);
/* Collective over the replica's stages (every DP replica draws the same
 * text): prints on rank 0 up to ntokens tokens sampled after the end-of-text
 * token, the generator seeded by `seed` (the same seed, the same text).
 * Runs forward on batch 1 through the stages, overwriting slot 0. */
void pipeline_sample(Pipeline* pp, const Tokenizer* tok, int ntokens, uint64_t seed);
/* Testing aid: fatal on every rank unless the two copies of the tied
 * embedding are bit-identical (P > 1; no-op otherwise). */
void pipeline_check_tied(Pipeline* pp);
/* Start-up lines: the grid (rank 0) and, per rank in turn, its chunks (layers,
 * parameters, params, grads, optimizer state, activations and their slots,
 * transfer buffers). */
void pipeline_print_grid(const Pipeline* pp, FILE* f);
void pipeline_print_chunks(const Pipeline* pp, const Optimizer* opt, FILE* f);
/* After a step: per chunk, when its reductions launched against its last backward. */
void pipeline_overlap_report(const Pipeline* pp, FILE* f);
void pipeline_free(Pipeline* pp);

#endif
