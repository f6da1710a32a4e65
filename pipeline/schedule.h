/* pipeline/schedule.h — pipeline-parallel schedules: how the model's layers are cut into model
 * chunks, which forward and backward each pipeline rank runs in which order, and a discrete-time
 * simulator that proves a schedule deadlock-free and measures its bubble. Pure arithmetic: no MPI,
 * no device, no model; unit-testable (test/test_schedule.c). docs/PIPELINE.md, "Schedules", shows
 * the schedules as tables.
 *
 * Terms:
 *  - P pipeline ranks (stages), V model chunks per rank (virtual stages), so P*V model chunks.
 *    Global chunk c = v*P + p lives on pipeline rank p as its local chunk v. Chunk 0 also holds the
 *    embeddings, chunk P*V-1 the final layernorm and the LM head.
 *  - A step runs m micro-batches (the gradient-accumulation count) through the chunks.
 *    F(c, i), the forward of chunk c on micro-batch i, needs F(c-1, i) (its output activation comes
 *    from the rank holding c-1; chunk 0 needs nothing). B(c, i) needs F(c, i) on this rank and
 *    B(c+1, i) (its input gradient comes from the rank holding c+1; the last chunk needs only its
 *    own forward).
 *
 * Schedules (a rank's list of 2*V*m operations, run in order):
 *  - PP_1F1B (V = 1, any m >= 1): warm-up of min(P-p-1, m) forwards, then one forward and one
 *    backward in turn, then the remaining backwards; micro-batches in order 0..m-1. Rank p holds at
 *    most min(P-p, m) micro-batches in flight.
 *  - PP_INTERLEAVED (V > 1, P > 1, any m >= 1): the interleaved 1F1B of Megatron-LM. Micro-batches
 *    go in groups of P, [g*P, min((g+1)*P, m)): the last group is smaller when P does not divide m
 *    (one group of m when m < P). Forward order: group by group, and in a group chunk v = 0..V-1,
 *    each on the group's micro-batches in order. Backward order: the same with the chunks reversed
 *    (v = V-1..0). When P divides m: a warm-up of w = min(2*(P-p-1) + (V-1)*P, V*m) forwards, then
 *    one forward and one backward in turn, then the remaining backwards. When it does not: the list
 *    for mg = m rounded up to a multiple of P, less every op of micro-batches m..mg-1 (so some
 *    steady-state forwards or backwards lose their partner). Dropping a micro-batch on every rank
 *    keeps a deadlock-free schedule deadlock-free; the direct reading (warm-up w with V*m, then
 *    pairs over the orders above) deadlocks for some m, e.g. P=4, V=3, m=5. pp_simulate finds the
 *    rule deadlock-free for P <= 8, V <= 4, m <= 24 (test_schedule); its bubble is (P-1)/(V*m)
 *    when P divides m, larger when not, and below 1F1B's (P-1)/m for every m >= 2 (equal at m = 1).
 *    Rank p holds at most min(w+1, V*m) chunk activations (each 1/V of a stage's layers).
 *  - PP_GPIPE (any V, any m >= 1): all forwards chunk-major (v = 0..V-1, each on micro-batches
 *    0..m-1), then all backwards in exactly the reverse order. The simple reference: a rank holds
 *    all V*m chunk activations at its peak. Bubble (P-1)/(V*m) when V = 1 or m >= P.
 *  V > 1 needs P > 1 for every kind (a single rank has nothing to interleave).
 *
 * Messages: under every schedule above, the activations that one rank sends to another are
 * received there in the order they are sent, and so are the gradients, so one in-order channel per
 * (sender, receiver, activations or gradients) suffices (PPSimResult.in_order checks it).
 * pp_simulate assumes sends do not wait for the receiver (buffered or non-blocking); a rank that
 * blocks in a send until the matching receive is posted may deadlock where the simulator finds none.
 *
 * Activation slots: pp_schedule gives every op a slot: F takes the lowest slot of its chunk that
 * no micro-batch in flight on that chunk holds, its B uses (and then frees) the same slot. So chunk
 * v needs pp_max_inflight(ops, n, v) activation buffers, slots 0..that-1.
 *
 * Errors: functions that take err write one line there (no trailing newline, no prefix naming this
 * module: the caller adds its own) and return -1. */
#ifndef PIPELINE_SCHEDULE_H
#define PIPELINE_SCHEDULE_H

#include <stddef.h>

/* Cut L transformer layers into nchunks model chunks: chunk c holds layers [first[c], first[c+1]);
 * first has nchunks+1 entries, first[0] = 0 and first[nchunks] = L. Every chunk gets L/nchunks
 * layers; the L % nchunks extra layers (one each) go to the middle chunks nearest the end (chunks
 * nchunks-2, nchunks-3, ...), which hold neither the embeddings nor the LM head and, at later
 * pipeline stages, keep fewer micro-batches in flight; when every middle chunk has one and one is
 * left, it goes to chunk 0 (an embedding lookup is cheap, the LM head is not). 1 <= nchunks <= L,
 * else -1. Returns 0. */
int pp_split_layers(int L, int nchunks, int* first, char* err, size_t errlen);

typedef enum { PP_FWD = 0, PP_BWD = 1 } PPOpKind;

typedef enum { PP_1F1B = 0, PP_INTERLEAVED = 1, PP_GPIPE = 2 } PPScheduleKind;

typedef struct {
    int kind;  /* PP_FWD or PP_BWD */
    int chunk; /* local chunk v in [0, V): global chunk v*P + p */
    int micro; /* micro-batch in [0, m) */
    int slot;  /* the activation slot of (chunk, micro): see "Activation slots" above */
} PPOp;

/* The schedule a name selects: "1f1b" is PP_1F1B for V = 1 and PP_INTERLEAVED for V > 1; "gpipe"
 * is PP_GPIPE. Unknown name or V < 1: -1. Returns 0 and sets *kind. */
int pp_schedule_kind(int V, const char* name, PPScheduleKind* kind, char* err, size_t errlen);

/* "1f1b", "interleaved" or "gpipe" (NULL for an unknown kind). */
const char* pp_schedule_name(PPScheduleKind kind);

/* Rank p's list: fills ops[0 .. 2*V*m) (see "Schedules" above) with slots assigned. Returns 2*V*m,
 * or -1 for arguments out of range (P, V, m >= 1, 0 <= p < P), a kind that does not fit V
 * (PP_1F1B needs V = 1, PP_INTERLEAVED V > 1), V > 1 with P = 1, or V*m or P*V over 2^20. */
int pp_schedule(PPScheduleKind kind, int P, int V, int m, int p, PPOp* ops, char* err, size_t errlen);

/* Checks one rank's list of n ops for V chunks and m micro-batches: n = 2*V*m, every (chunk, micro)
 * has exactly one F and one B and its F comes first; with check_slots, also every slot is >= 0, a
 * B has its F's slot and no two micro-batches in flight on one chunk share a slot. Returns 0 or -1
 * naming the first fault. */
int pp_check_ops(const PPOp* ops, int n, int V, int m, int check_slots, char* err, size_t errlen);

/* Assigns the slots of a list that passes pp_check_ops (without slots), as pp_schedule does.
 * Returns 0 or -1 (the list's fault, or out of memory). */
int pp_assign_slots(PPOp* ops, int n, int V, int m, char* err, size_t errlen);

/* Index in ops[0..n) of the last PP_BWD of local chunk `chunk` (the trainer starts that chunk's
 * gradient reductions during it); -1 if there is none. */
int pp_last_backward(const PPOp* ops, int n, int chunk);

/* The peak number of micro-batches whose forward on local chunk `chunk` is done and backward not,
 * over the list (the activation slots that chunk needs); chunk < 0: summed over all chunks (the
 * rank's peak). The list must pass pp_check_ops. */
int pp_max_inflight(const PPOp* ops, int n, int chunk);

/* ---- simulator ---- */

#define PP_SIM_MAX_RANKS 64

typedef struct {
    int makespan;                        /* when the last op of any rank ends (time starts at 0) */
    int busy;                            /* compute time of one rank, V*m*(t_fwd + t_bwd): the same on all */
    int idle[PP_SIM_MAX_RANKS];          /* rank p's bubble: makespan - busy */
    int peak_inflight[PP_SIM_MAX_RANKS]; /* pp_max_inflight(rank p's list, -1) */
    double bubble;                       /* max over ranks of idle / busy */
    double ideal_bubble;                 /* (P - 1) / (V * m) */
    int in_order;                        /* 1: on every (sender, receiver, F or B) channel, messages are
                                          * received in the order they are sent */
} PPSimResult;

/* Runs the P ranks' lists ops[p][0 .. 2*V*m) in discrete time: an F takes t_fwd units, a B t_bwd
 * (>= 1 each); an op starts as soon as its rank has finished the op before it and its
 * dependencies (see "Terms") have finished on their ranks; sends are buffered, so a message never
 * waits for its receiver; no transfer time. Each list must pass pp_check_ops (slots not checked).
 * start: NULL, or start[p] (2*V*m entries) receives each op's start time. Returns 0 and fills *r;
 * -1 for a faulty list, P > PP_SIM_MAX_RANKS, or a deadlock (no rank can start its next op while
 * ops remain: err names a stuck rank and what it waits for). */
int pp_simulate_ops(int P, int V, int m, const PPOp* const* ops, int t_fwd, int t_bwd, int* const* start,
                    PPSimResult* r, char* err, size_t errlen);

/* pp_schedule for every rank, then pp_simulate_ops. Returns 0, or -1 (pp_schedule's message, or
 * the simulator's). */
int pp_simulate(PPScheduleKind kind, int P, int V, int m, int t_fwd, int t_bwd, PPSimResult* r, char* err,
                size_t errlen);

#endif
