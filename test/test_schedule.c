/* test/test_schedule.c — tests pipeline/schedule.c: hand-written op lists for small pipelines
 * (written from the definitions in schedule.h, slots included for some); a brute force over
 * P = 1..8, V = 1..4, m = 1..24 and every kind, checking each rank's list against independent
 * recomputation (every F and B once, F first, the forward and backward orders, the warm-up /
 * alternation pattern, slots, pp_last_backward and pp_max_inflight by direct scans), then the
 * simulation: no deadlock, every start time the earliest its rank and dependencies allow, the bubble
 * against (P-1)/(V*m), the in-flight bounds, interleaved below 1F1B; the direct reading of the
 * interleaved schedule with a smaller last group, which deadlocks for some m (why pp_schedule drops
 * micro-batches from a multiple of P instead); the simulator on hand-made faulty and deadlocking
 * lists; pp_split_layers over a grid; argument rejection.
 *
 * Also a printer for docs/PIPELINE.md:
 *   build/test_schedule --table P V m 1f1b|gpipe [t_fwd t_bwd]   a schedule as a rank x time table
 *   build/test_schedule --bubbles                                 the bubble tables (markdown) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../pipeline/schedule.h"
#include "test.h"

#define MAXP 8
#define MAXV 4
#define MAXM 24
#define MAXN (2 * MAXV * MAXM)

static int one_line(const char* s) { return s[0] != '\0' && strchr(s, '\n') == NULL; }

/* ---- hand-written lists ---- */

/* Parses "F1.2@0 B0 ...": kind, then local chunk '.' micro-batch (or the micro-batch alone for
 * chunk 0), then optionally '@' slot (-1 when absent: not compared). Returns the op count. */
static int parse_ops(const char* s, PPOp* ops, int max) {
    int n = 0;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        if (n == max) return -1;
        PPOp o = {.kind = *s == 'F' ? PP_FWD : PP_BWD, .chunk = 0, .slot = -1};
        char* end;
        long a = strtol(s + 1, &end, 10);
        if (*end == '.') {
            o.chunk = (int)a;
            a = strtol(end + 1, &end, 10);
        }
        o.micro = (int)a;
        if (*end == '@') o.slot = (int)strtol(end + 1, &end, 10);
        ops[n++] = o;
        s = end;
    }
    return n;
}

static void check_hand(PPScheduleKind kind, int P, int V, int m, int p, const char* expected) {
    PPOp want[MAXN], got[MAXN];
    char err[256];
    int nw = parse_ops(expected, want, MAXN);
    int n = pp_schedule(kind, P, V, m, p, got, err, sizeof err);
    CHECK(n == nw, "%s P=%d V=%d m=%d rank %d: %d ops, expected %d (%s)", pp_schedule_name(kind), P, V, m, p, n,
          nw, err);
    for (int k = 0; k < n && k < nw; k++) {
        int same = got[k].kind == want[k].kind && got[k].chunk == want[k].chunk &&
                   got[k].micro == want[k].micro && (want[k].slot < 0 || got[k].slot == want[k].slot);
        CHECK(same, "%s P=%d V=%d m=%d rank %d op %d: %c%d.%d@%d, expected %c%d.%d@%d", pp_schedule_name(kind),
              P, V, m, p, k, got[k].kind == PP_FWD ? 'F' : 'B', got[k].chunk, got[k].micro, got[k].slot,
              want[k].kind == PP_FWD ? 'F' : 'B', want[k].chunk, want[k].micro, want[k].slot);
        if (!same) break;
    }
}

static void test_hand(void) {
    /* 1F1B, P=2, m=3. Rank 0: warm-up min(2-0-1, 3) = 1 forward, then F1 B0, F2 B1, then B2; slots:
     * F0 takes 0, F1 1, B0 frees 0, F2 takes 0. Rank 1: no warm-up. */
    check_hand(PP_1F1B, 2, 1, 3, 0, "F0@0 F1@1 B0@0 F2@0 B1@1 B2@0");
    check_hand(PP_1F1B, 2, 1, 3, 1, "F0@0 B0@0 F1@0 B1@0 F2@0 B2@0");
    /* 1F1B, P=4, m=4. Rank 0: warm-up 3; rank 3: none. */
    check_hand(PP_1F1B, 4, 1, 4, 0, "F0@0 F1@1 F2@2 F3@3 B0@0 B1@1 B2@2 B3@3");
    check_hand(PP_1F1B, 4, 1, 4, 3, "F0 B0 F1 B1 F2 B2 F3 B3");
    /* 1F1B, P=4, m=2: rank 1's warm-up is min(2, 2): both forwards, then both backwards. */
    check_hand(PP_1F1B, 4, 1, 2, 1, "F0 F1 B0 B1");
    /* Interleaved, P=2, V=2, m=4: groups {0,1}, {2,3}. Forward order (chunk.micro):
     * 0.0 0.1 1.0 1.1 0.2 0.3 1.2 1.3; backward order: 1.0 1.1 0.0 0.1 1.2 1.3 0.2 0.3.
     * Rank 0: warm-up min(2*1 + 1*2, 8) = 4, then 4 F/B pairs, then 4 B. Chunk 0's slots: micro-batches
     * 0..3 are all in flight before B0.0, so 0..3; chunk 1: 1.0 and 1.1 take 0, 1; B1.0 and B1.1 free
     * them before F1.2 and F1.3 take them again.
     * Rank 1: warm-up min(0 + 2, 8) = 2, then 6 pairs, then 2 B. */
    check_hand(PP_INTERLEAVED, 2, 2, 4, 0,
               "F0.0@0 F0.1@1 F1.0@0 F1.1@1 F0.2@2 B1.0@0 F0.3@3 B1.1@1 F1.2@0 B0.0@0 F1.3@1 B0.1@1 "
               "B1.2@0 B1.3@1 B0.2@2 B0.3@3");
    check_hand(PP_INTERLEAVED, 2, 2, 4, 1,
               "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3");
    /* Interleaved, P=2, V=2, m=3: the lists of m=4 above without micro-batch 3. */
    check_hand(PP_INTERLEAVED, 2, 2, 3, 0, "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 B1.1 F1.2 B0.0 B0.1 B1.2 B0.2");
    check_hand(PP_INTERLEAVED, 2, 2, 3, 1, "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 B0.1 F1.2 B1.2 B0.2");
    /* GPipe, P=2, V=2, m=2: forwards chunk-major, then the exact reverse as backwards. */
    check_hand(PP_GPIPE, 2, 2, 2, 0, "F0.0@0 F0.1@1 F1.0@0 F1.1@1 B1.1@1 B1.0@0 B0.1@1 B0.0@0");
    check_hand(PP_GPIPE, 4, 1, 3, 2, "F0 F1 F2 B2 B1 B0");
}

/* ---- brute force ---- */

/* The forward (backward = 0) or backward order of (chunk, micro) from the definitions. */
static int ref_order(PPScheduleKind kind, int P, int V, int m, int backward, int* v, int* i) {
    int n = 0;
    if (kind == PP_1F1B) {
        for (int k = 0; k < m; k++, n++) v[n] = 0, i[n] = k;
    } else if (kind == PP_GPIPE) {
        for (int c = 0; c < V; c++)
            for (int k = 0; k < m; k++, n++) v[n] = c, i[n] = k;
        if (backward) {
            for (int a = 0, b = n - 1; a < b; a++, b--) {
                int t = v[a];
                v[a] = v[b];
                v[b] = t;
                t = i[a];
                i[a] = i[b];
                i[b] = t;
            }
        }
    } else {
        for (int g0 = 0; g0 < m; g0 += P) {
            int size = m - g0 < P ? m - g0 : P;
            for (int c = 0; c < V; c++)
                for (int k = 0; k < size; k++, n++) v[n] = backward ? V - 1 - c : c, i[n] = g0 + k;
        }
    }
    return n;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* Rank p's list against the definitions; returns 1 if it passed. */
static int check_list(PPScheduleKind kind, int P, int V, int m, int p, const PPOp* ops, int n) {
    char tag[96];
    snprintf(tag, sizeof tag, "%s P=%d V=%d m=%d rank %d", pp_schedule_name(kind), P, V, m, p);
    int ok = 1;
    if (n != 2 * V * m) {
        CHECK(0, "%s: %d ops, expected %d", tag, n, 2 * V * m);
        return 0;
    }
    /* every F and B exactly once, F first; slots: a free one at F, the F's at B */
    int fpos[MAXV][MAXM], bpos[MAXV][MAXM], slot[MAXV][MAXM], peak[MAXV] = {0}, cur[MAXV] = {0};
    int last_b[MAXV], total = 0, total_peak = 0;
    for (int v = 0; v < V; v++) {
        last_b[v] = -1;
        for (int i = 0; i < m; i++) fpos[v][i] = bpos[v][i] = -1;
    }
    for (int k = 0; k < n; k++) {
        const PPOp* o = &ops[k];
        if (o->chunk < 0 || o->chunk >= V || o->micro < 0 || o->micro >= m ||
            (o->kind != PP_FWD && o->kind != PP_BWD)) {
            CHECK(0, "%s: op %d out of range", tag, k);
            return 0;
        }
        int v = o->chunk, i = o->micro;
        if (o->kind == PP_FWD) {
            ok &= fpos[v][i] < 0;
            fpos[v][i] = k;
            for (int j = 0; j < m; j++)
                if (j != i && fpos[v][j] >= 0 && bpos[v][j] < 0 && slot[v][j] == o->slot) ok = 0;
            slot[v][i] = o->slot;
            ok &= o->slot >= 0;
            cur[v]++, total++;
        } else {
            ok &= fpos[v][i] >= 0 && bpos[v][i] < 0 && o->slot == slot[v][i];
            bpos[v][i] = k;
            last_b[v] = k;
            cur[v]--, total--;
        }
        if (cur[v] > peak[v]) peak[v] = cur[v];
        if (total > total_peak) total_peak = total;
    }
    CHECK(ok, "%s: an F or B missing, repeated or out of order, or a slot clash", tag);
    for (int v = 0; v < V; v++) {
        int max_slot = -1;
        for (int i = 0; i < m; i++) max_slot = slot[v][i] > max_slot ? slot[v][i] : max_slot;
        CHECK(pp_max_inflight(ops, n, v) == peak[v] && max_slot + 1 == peak[v],
              "%s chunk %d: pp_max_inflight %d, slots used %d, direct scan %d", tag, v,
              pp_max_inflight(ops, n, v), max_slot + 1, peak[v]);
        CHECK(pp_last_backward(ops, n, v) == last_b[v], "%s chunk %d: pp_last_backward %d, direct scan %d", tag,
              v, pp_last_backward(ops, n, v), last_b[v]);
    }
    CHECK(pp_max_inflight(ops, n, -1) == total_peak, "%s: pp_max_inflight(-1) %d, direct scan %d", tag,
          pp_max_inflight(ops, n, -1), total_peak);
    CHECK(pp_last_backward(ops, n, V) == -1, "%s: pp_last_backward of a chunk it does not hold", tag);
    char err[256];
    CHECK(pp_check_ops(ops, n, V, m, 1, err, sizeof err) == 0, "%s: pp_check_ops: %s", tag, err);

    /* the forward and backward orders */
    int rv[MAXV * MAXM], ri[MAXV * MAXM];
    for (int backward = 0; backward <= 1; backward++) {
        int nr = ref_order(kind, P, V, m, backward, rv, ri), j = 0, same = 1;
        for (int k = 0; k < n; k++) {
            if (ops[k].kind != (backward ? PP_BWD : PP_FWD)) continue;
            same &= j < nr && ops[k].chunk == rv[j] && ops[k].micro == ri[j];
            j++;
        }
        CHECK(same && j == nr, "%s: %s order differs from the definition", tag,
              backward ? "backward" : "forward");
    }
    /* the pattern: warm forwards, then F B pairs, then backwards (interleaved: when P divides m) */
    int warm = -1;
    if (kind == PP_1F1B) warm = imin(P - p - 1, m);
    if (kind == PP_GPIPE) warm = V * m;
    if (kind == PP_INTERLEAVED && m % P == 0) warm = imin(2 * (P - p - 1) + (V - 1) * P, V * m);
    if (warm >= 0) {
        int same = 1, k = 0, nf = 0;
        for (; k < warm; k++, nf++) same &= ops[k].kind == PP_FWD;
        for (; nf < V * m; nf++, k += 2) same &= ops[k].kind == PP_FWD && ops[k + 1].kind == PP_BWD;
        for (; k < n; k++) same &= ops[k].kind == PP_BWD;
        CHECK(same, "%s: not %d forwards, then forward/backward pairs, then backwards", tag, warm);
    }
    /* activation bounds */
    if (kind == PP_1F1B)
        CHECK(total_peak == imin(P - p, m), "%s: peak in flight %d, expected min(P-p, m) = %d", tag, total_peak,
              imin(P - p, m));
    if (kind == PP_GPIPE) CHECK(total_peak == V * m, "%s: peak in flight %d, expected V*m", tag, total_peak);
    if (kind == PP_INTERLEAVED) {
        int bound = imin(2 * (P - p - 1) + (V - 1) * P + 1, V * m);
        CHECK(total_peak <= bound, "%s: peak in flight %d > %d", tag, total_peak, bound);
    }
    return ok;
}

/* The simulated start times against the rules: each op starts at the later of its rank's previous
 * op's end and its dependencies' ends. */
static void check_times(const char* tag, int P, int V, int m, PPOp ops[][MAXN], int start[][MAXN], int tf,
                        int tb, const PPSimResult* r) {
    static int fend[MAXP * MAXV][MAXM], bend[MAXP * MAXV][MAXM];
    int n = 2 * V * m, C = P * V, ok = 1, makespan = 0;
    for (int p = 0; p < P; p++)
        for (int k = 0; k < n; k++) {
            int c = ops[p][k].chunk * P + p;
            int end = start[p][k] + (ops[p][k].kind == PP_FWD ? tf : tb);
            (ops[p][k].kind == PP_FWD ? fend : bend)[c][ops[p][k].micro] = end;
            if (end > makespan) makespan = end;
        }
    for (int p = 0; p < P; p++)
        for (int k = 0; k < n; k++) {
            const PPOp* o = &ops[p][k];
            int c = o->chunk * P + p, i = o->micro;
            int ready = k ? start[p][k - 1] + (ops[p][k - 1].kind == PP_FWD ? tf : tb) : 0;
            if (o->kind == PP_FWD && c > 0 && fend[c - 1][i] > ready) ready = fend[c - 1][i];
            if (o->kind == PP_BWD && fend[c][i] > ready) ready = fend[c][i];
            if (o->kind == PP_BWD && c < C - 1 && bend[c + 1][i] > ready) ready = bend[c + 1][i];
            ok &= start[p][k] == ready;
        }
    CHECK(ok, "%s: a start time is not the earliest its rank and dependencies allow", tag);
    CHECK(r->makespan == makespan && r->busy == V * m * (tf + tb),
          "%s: makespan %d (from the times %d), busy %d", tag, r->makespan, makespan, r->busy);
    for (int p = 0; p < P; p++)
        CHECK(r->idle[p] == makespan - r->busy, "%s: rank %d idle %d", tag, p, r->idle[p]);
}

static void test_brute(void) {
    static PPOp ops[MAXP][MAXN];
    static int start[MAXP][MAXN];
    char err[256];
    int combos = 0, accepted = 0;
    double worst_ratio = 0;
    for (int P = 1; P <= MAXP; P++)
        for (int V = 1; V <= MAXV; V++) {
            if (V > 1 && P == 1) {
                CHECK(pp_schedule(PP_GPIPE, 1, V, 4, 0, ops[0], err, sizeof err) < 0 && one_line(err),
                      "V=%d with P=1 accepted", V);
                continue;
            }
            for (int m = 1; m <= MAXM; m++) {
                for (int kind = PP_1F1B; kind <= PP_GPIPE; kind++) {
                    combos++;
                    int want = kind == PP_GPIPE || (kind == PP_1F1B) == (V == 1);
                    char tag[96];
                    snprintf(tag, sizeof tag, "%s P=%d V=%d m=%d", pp_schedule_name(kind), P, V, m);
                    int fine = 1;
                    for (int p = 0; p < P; p++) {
                        int n = pp_schedule(kind, P, V, m, p, ops[p], err, sizeof err);
                        if (!want) {
                            CHECK(n < 0 && one_line(err), "%s rank %d: accepted, expected rejected", tag, p);
                            fine = 0;
                            continue;
                        }
                        CHECK(n == 2 * V * m, "%s rank %d: rejected: %s", tag, p, err);
                        fine &= n == 2 * V * m && check_list(kind, P, V, m, p, ops[p], n);
                    }
                    if (!want || !fine) continue;
                    accepted++;
                    const PPOp* lists[MAXP];
                    int* starts[MAXP];
                    for (int p = 0; p < P; p++) lists[p] = ops[p], starts[p] = start[p];
                    for (int tb = 1; tb <= 2; tb++) {
                        PPSimResult r, r2;
                        int rc = pp_simulate_ops(P, V, m, lists, 1, tb, starts, &r, err, sizeof err);
                        CHECK(rc == 0, "%s F=1 B=%d: %s", tag, tb, err);
                        if (rc != 0) continue;
                        CHECK(pp_simulate((PPScheduleKind)kind, P, V, m, 1, tb, &r2, err, sizeof err) == 0 &&
                                  r2.makespan == r.makespan,
                              "%s: pp_simulate differs from pp_simulate_ops (%s)", tag, err);
                        char ttag[120];
                        snprintf(ttag, sizeof ttag, "%s F=1 B=%d", tag, tb);
                        check_times(ttag, P, V, m, ops, start, 1, tb, &r);
                        CHECK(r.in_order, "%s: a channel receives out of send order", ttag);
                        for (int p = 0; p < P; p++)
                            CHECK(r.peak_inflight[p] == pp_max_inflight(ops[p], 2 * V * m, -1),
                                  "%s: rank %d peak in flight %d", ttag, p, r.peak_inflight[p]);
                        if (kind == PP_1F1B)
                            CHECK(r.peak_inflight[0] <= P, "%s: first stage holds %d > P", ttag,
                                  r.peak_inflight[0]);
                        if (kind == PP_GPIPE)
                            CHECK(r.peak_inflight[0] == V * m, "%s: GPipe holds %d", ttag, r.peak_inflight[0]);
                        /* exactly (P-1)/(V*m): idle * V * m == (P-1) * busy (integers) */
                        int exact = r.idle[0] * V * m == (P - 1) * r.busy;
                        CHECK(r.ideal_bubble == (double)(P - 1) / (V * m), "%s: ideal %g", ttag,
                              r.ideal_bubble);
                        /* exact for 1F1B, for interleaved when P divides m, for GPipe when V = 1 or
                         * m >= P (with V > 1 and m < P, chunk v+1's first micro-batch comes back to
                         * rank 0 after P forwards, not m) */
                        if (kind == PP_1F1B || (kind == PP_INTERLEAVED && m % P == 0) ||
                            (kind == PP_GPIPE && (V == 1 || m >= P)))
                            CHECK(exact, "%s: bubble %.4f, expected (P-1)/(V*m) = %.4f", ttag, r.bubble,
                                  r.ideal_bubble);
                        else
                            CHECK(r.bubble > r.ideal_bubble, "%s: bubble %.4f below (P-1)/(V*m) = %.4f", ttag,
                                  r.bubble, r.ideal_bubble);
                        /* interleaved against 1F1B on the same P and m: below it whenever there
                         * are two micro-batches or more (so also for m a multiple of P, m >= 2P) */
                        if (kind == PP_INTERLEAVED) {
                            PPSimResult r1;
                            CHECK(pp_simulate(PP_1F1B, P, 1, m, 1, tb, &r1, err, sizeof err) == 0, "%s", err);
                            if (m % P != 0 && m >= 2 && r.bubble / r1.bubble > worst_ratio)
                                worst_ratio = r.bubble / r1.bubble;
                            if (m >= 2)
                                CHECK(r.bubble < r1.bubble, "%s: interleaved bubble %.4f not below 1F1B's %.4f",
                                      ttag, r.bubble, r1.bubble);
                            else
                                CHECK(r.bubble == r1.bubble, "%s: one micro-batch: %.4f vs 1F1B's %.4f", ttag,
                                      r.bubble, r1.bubble);
                        }
                    }
                }
            }
        }
    printf("brute force: %d (kind, P, V, m) combinations, %d accepted and simulated deadlock-free; "
           "interleaved with P not dividing m, m >= 2: bubble at most %.4f times 1F1B's\n",
           combos, accepted, worst_ratio);
}

/* ---- why the interleaved list of m micro-batches is the list of the next multiple of P less the
 * extra micro-batches: the direct reading of "the last group smaller" (the warm-up count of the
 * definition, then pairs, over the orders with a smaller last group) deadlocks for some m; where P
 * divides m it is pp_schedule's list. */
static int naive_interleaved(int P, int V, int m, int p, PPOp* ops) {
    int fv[MAXV * MAXM], fi[MAXV * MAXM], bv[MAXV * MAXM], bi[MAXV * MAXM];
    int total = ref_order(PP_INTERLEAVED, P, V, m, 0, fv, fi);
    ref_order(PP_INTERLEAVED, P, V, m, 1, bv, bi);
    int warm = imin(2 * (P - p - 1) + (V - 1) * P, total), n = 0, nf = 0, nb = 0;
    while (nf < warm) ops[n++] = (PPOp){PP_FWD, fv[nf], fi[nf], 0}, nf++;
    while (nf < total) {
        ops[n++] = (PPOp){PP_FWD, fv[nf], fi[nf], 0}, nf++;
        ops[n++] = (PPOp){PP_BWD, bv[nb], bi[nb], 0}, nb++;
    }
    while (nb < total) ops[n++] = (PPOp){PP_BWD, bv[nb], bi[nb], 0}, nb++;
    return n;
}

static void test_naive_interleaved(void) {
    static PPOp ops[MAXP][MAXN], mine[MAXN];
    const PPOp* lists[MAXP];
    char err[256], first[300] = "";
    int deadlocks = 0, tried = 0;
    for (int P = 2; P <= MAXP; P++)
        for (int V = 2; V <= MAXV; V++)
            for (int m = 1; m <= MAXM; m++) {
                int same = 1;
                for (int p = 0; p < P; p++) {
                    int n = naive_interleaved(P, V, m, p, ops[p]);
                    lists[p] = ops[p];
                    if (m % P == 0) {
                        pp_schedule(PP_INTERLEAVED, P, V, m, p, mine, err, sizeof err);
                        for (int k = 0; k < n; k++)
                            same &= mine[k].kind == ops[p][k].kind && mine[k].chunk == ops[p][k].chunk &&
                                    mine[k].micro == ops[p][k].micro;
                    }
                }
                CHECK(same, "interleaved P=%d V=%d m=%d: pp_schedule differs from the direct reading", P, V, m);
                PPSimResult r;
                if (m % P == 0) {
                    CHECK(pp_simulate_ops(P, V, m, lists, 1, 2, NULL, &r, err, sizeof err) == 0, "%s", err);
                    continue;
                }
                tried++;
                if (pp_simulate_ops(P, V, m, lists, 1, 2, NULL, &r, err, sizeof err) != 0) {
                    CHECK(strstr(err, "deadlock") != NULL, "%s", err);
                    if (!deadlocks++) snprintf(first, sizeof first, "P=%d V=%d m=%d: %s", P, V, m, err);
                }
            }
    CHECK(deadlocks > 0, "the direct reading of a smaller last group never deadlocks");
    printf("interleaved, smaller last group read directly: %d of %d (P, V, m) with P not dividing m "
           "deadlock, first %s\n",
           deadlocks, tried, first);
}

/* ---- the simulator on faulty lists ---- */
static void test_simulator_faults(void) {
    PPOp a[8], b[8];
    const PPOp* lists[2] = {a, b};
    PPSimResult r;
    char err[256];
    /* P=2, m=2. Rank 0 runs 1F1B without warm-up (F0 B0 F1 B1), rank 1 both forwards first
     * (F0 F1 B0 B1): rank 0's B0 waits for rank 1's B0, which comes after rank 1's F1, which waits
     * for rank 0's F1, which comes after rank 0's B0. */
    parse_ops("F0 B0 F1 B1", a, 8);
    parse_ops("F0 F1 B0 B1", b, 8);
    int rc = pp_simulate_ops(2, 1, 2, lists, 1, 1, NULL, &r, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "deadlock") && one_line(err), "deadlock not found: rc %d '%s'", rc, err);
    printf("a deadlocking pair of lists: %s\n", err);
    /* swapped, it runs: rank 0 with warm-up, rank 1 without */
    parse_ops("F0 F1 B0 B1", a, 8);
    parse_ops("F0 B0 F1 B1", b, 8);
    CHECK(pp_simulate_ops(2, 1, 2, lists, 1, 1, NULL, &r, err, sizeof err) == 0 && r.makespan == 6,
          "valid pair: %s, makespan %d", err, r.makespan);
    /* faulty lists */
    const char* faulty[] = {"F0 F0 B0 B1", "F0 B1 F1 B0", "F0 F1 B0", "F0 F1 B0 B0"};
    int counts[] = {4, 4, 3, 4};
    for (int t = 0; t < 4; t++) {
        parse_ops(faulty[t], b, 8);
        CHECK(pp_check_ops(b, counts[t], 1, 2, 0, err, sizeof err) == -1 && one_line(err),
              "'%s' passed pp_check_ops", faulty[t]);
        if (counts[t] == 4)
            CHECK(pp_simulate_ops(2, 1, 2, lists, 1, 1, NULL, &r, err, sizeof err) == -1 && one_line(err),
                  "'%s' simulated", faulty[t]);
    }
    /* slots: a clash and a B with another slot */
    parse_ops("F0@0 F1@0 B0@0 B1@0", b, 8);
    CHECK(pp_check_ops(b, 4, 1, 2, 1, err, sizeof err) == -1, "slot clash passed");
    CHECK(pp_check_ops(b, 4, 1, 2, 0, err, sizeof err) == 0, "slots checked when not asked: %s", err);
    parse_ops("F0@0 F1@1 B0@1 B1@0", b, 8);
    CHECK(pp_check_ops(b, 4, 1, 2, 1, err, sizeof err) == -1, "B in another slot passed");
    CHECK(pp_assign_slots(b, 4, 1, 2, err, sizeof err) == 0 && b[0].slot == 0 && b[1].slot == 1 &&
              b[2].slot == 0 && b[3].slot == 1,
          "pp_assign_slots: %s", err);
    CHECK(pp_simulate_ops(PP_SIM_MAX_RANKS + 1, 1, 2, lists, 1, 1, NULL, &r, err, sizeof err) == -1,
          "too many ranks");
    CHECK(pp_simulate_ops(2, 1, 2, lists, 0, 1, NULL, &r, err, sizeof err) == -1, "t_fwd 0 accepted");
}

/* ---- layer split ---- */
static void check_split(int L, int n, const int* want) {
    int first[64];
    char err[256];
    CHECK(pp_split_layers(L, n, first, err, sizeof err) == 0, "split %d/%d: %s", L, n, err);
    for (int c = 0; c <= n; c++)
        CHECK(first[c] == want[c], "split %d/%d: first[%d] = %d, expected %d", L, n, c, first[c], want[c]);
}

static void test_split(void) {
    /* hand: L=12 in 5: 2 each, the 2 extra to the middle chunks nearest the end (3, 2) */
    check_split(12, 5, (int[]){0, 2, 4, 7, 10, 12});
    /* L=12 in 8: 1 each, 4 extra to chunks 6, 5, 4, 3 */
    check_split(12, 8, (int[]){0, 1, 2, 3, 5, 7, 9, 11, 12});
    /* L=7 in 4: 1 each, 3 extra: both middle chunks, then chunk 0 */
    check_split(7, 4, (int[]){0, 2, 4, 6, 7});
    check_split(5, 2, (int[]){0, 3, 5});
    check_split(12, 1, (int[]){0, 12});
    check_split(12, 12, (int[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    check_split(48, 8, (int[]){0, 6, 12, 18, 24, 30, 36, 42, 48});

    int first[80];
    char err[256];
    for (int L = 1; L <= 64; L++)
        for (int n = 1; n <= 70; n++) {
            int rc = pp_split_layers(L, n, first, err, sizeof err);
            if (n > L) {
                CHECK(rc == -1 && one_line(err), "split %d/%d accepted", L, n);
                continue;
            }
            CHECK(rc == 0, "split %d/%d: %s", L, n, err);
            int ok = first[0] == 0 && first[n] == L, lo = L, hi = 0, sum = 0;
            for (int c = 0; c < n; c++) {
                int size = first[c + 1] - first[c];
                sum += size;
                lo = size < lo ? size : lo;
                hi = size > hi ? size : hi;
            }
            ok &= sum == L && lo >= 1 && hi - lo <= 1;
            /* the extras: the ends take none while the middle has room; chunk 0 before the last */
            int base = L / n, r = L % n;
            if (n >= 2 && r <= n - 2) ok &= first[1] - first[0] == base && first[n] - first[n - 1] == base;
            if (n >= 2 && r == n - 1) ok &= first[1] - first[0] == base + 1 && first[n] - first[n - 1] == base;
            /* the middle chunks with an extra layer are the last ones of the middle */
            for (int c = 2; c < n - 1; c++) ok &= first[c + 1] - first[c] >= first[c] - first[c - 1];
            CHECK(ok, "split %d/%d: sizes wrong (sum %d, min %d, max %d)", L, n, sum, lo, hi);
        }
    CHECK(pp_split_layers(0, 1, first, err, sizeof err) == -1 && one_line(err), "L=0 accepted");
    CHECK(pp_split_layers(4, 0, first, err, sizeof err) == -1 && one_line(err), "0 chunks accepted");
    CHECK(pp_split_layers(4, -2, first, err, sizeof err) == -1, "-2 chunks accepted");
    CHECK(pp_split_layers(4, 2, NULL, err, sizeof err) == -1, "NULL accepted");
    pp_split_layers(12, 16, first, err, sizeof err);
    printf("split 12 layers into 16 chunks: %s\n", err);
}

/* ---- names and argument rejection ---- */
static void test_args(void) {
    PPScheduleKind k = PP_GPIPE;
    char err[256];
    PPOp ops[64];
    CHECK(pp_schedule_kind(1, "1f1b", &k, err, sizeof err) == 0 && k == PP_1F1B, "1f1b V=1");
    CHECK(pp_schedule_kind(3, "1f1b", &k, err, sizeof err) == 0 && k == PP_INTERLEAVED, "1f1b V=3");
    CHECK(pp_schedule_kind(2, "gpipe", &k, err, sizeof err) == 0 && k == PP_GPIPE, "gpipe");
    CHECK(pp_schedule_kind(1, "zb", &k, err, sizeof err) == -1 && one_line(err), "unknown name accepted");
    CHECK(pp_schedule_kind(0, "1f1b", &k, err, sizeof err) == -1, "V=0 accepted");
    CHECK(strcmp(pp_schedule_name(PP_INTERLEAVED), "interleaved") == 0, "name");
    struct {
        PPScheduleKind kind;
        int P, V, m, p;
    } bad[] = {
        {PP_1F1B, 2, 2, 4, 0},  {PP_INTERLEAVED, 2, 1, 4, 0},    {PP_INTERLEAVED, 1, 2, 4, 0},
        {PP_1F1B, 0, 1, 4, 0},  {PP_1F1B, 2, 1, 0, 0},           {PP_1F1B, 2, 1, 4, 2},
        {PP_1F1B, 2, 1, 4, -1}, {(PPScheduleKind)7, 2, 1, 4, 0},
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        err[0] = '\0';
        CHECK(pp_schedule(bad[t].kind, bad[t].P, bad[t].V, bad[t].m, bad[t].p, ops, err, sizeof err) == -1 &&
                  one_line(err),
              "case %zu accepted", t);
        printf("rejected: %s\n", err);
    }
}

/* ---- printers for docs/PIPELINE.md ---- */

static int print_table(int P, int V, int m, const char* name, int tf, int tb) {
    char err[256];
    PPScheduleKind kind;
    if (P < 1 || P > PP_SIM_MAX_RANKS || V < 1 || m < 1 || tf < 1 || tb < 1 ||
        pp_schedule_kind(V, name, &kind, err, sizeof err) != 0) {
        fprintf(stderr, "--table: bad arguments %s\n", err);
        return 2;
    }
    int n = 2 * V * m;
    PPOp* ops = malloc((size_t)P * n * sizeof *ops);
    int* start = malloc((size_t)P * n * sizeof *start);
    const PPOp* lists[PP_SIM_MAX_RANKS];
    int* starts[PP_SIM_MAX_RANKS];
    PPSimResult r;
    int rc = 0;
    for (int p = 0; p < P && rc == 0; p++) {
        lists[p] = ops + (size_t)p * n;
        starts[p] = start + (size_t)p * n;
        if (pp_schedule(kind, P, V, m, p, ops + (size_t)p * n, err, sizeof err) < 0) rc = 1;
    }
    if (rc == 0 && pp_simulate_ops(P, V, m, lists, tf, tb, starts, &r, err, sizeof err) != 0) rc = 1;
    if (rc != 0) {
        fprintf(stderr, "--table: %s\n", err);
        free(ops);
        free(start);
        return 1;
    }
    /* cell: F<micro> or B<micro> (V = 1), F<chunk>.<micro> (V > 1); "." idle; an op longer than one
     * unit repeats its label */
    int w = V == 1 ? (m > 10 ? 3 : 2) : (m > 10 ? 5 : 4);
    printf("%s, P=%d V=%d m=%d, F=%d B=%d time units: makespan %d, bubble %.4f ((P-1)/(V*m) = %.4f)\n",
           pp_schedule_name(kind), P, V, m, tf, tb, r.makespan, r.bubble, r.ideal_bubble);
    /* each line built in line[]: the header's trailing blanks go */
    size_t cap = (size_t)(r.makespan + 2) * (w + 1) + 64, len = 0;
    char* line = malloc(cap);
    for (int t = 0; t < r.makespan; t++) len += snprintf(line + len, cap - len, " %-*d", w, t);
    while (len > 0 && line[len - 1] == ' ') line[--len] = '\0';
    printf("t     %s\n", line);
    for (int p = 0; p < P; p++) {
        len = 0;
        line[0] = '\0';
        int k = 0;
        for (int t = 0; t < r.makespan; t++) {
            while (k < n && starts[p][k] + (lists[p][k].kind == PP_FWD ? tf : tb) <= t) k++;
            char cell[16] = ".";
            if (k < n && starts[p][k] <= t) {
                const PPOp* o = &lists[p][k];
                if (V == 1) snprintf(cell, sizeof cell, "%c%d", o->kind == PP_FWD ? 'F' : 'B', o->micro);
                else snprintf(cell, sizeof cell, "%c%d.%d", o->kind == PP_FWD ? 'F' : 'B', o->chunk, o->micro);
            }
            len += snprintf(line + len, cap - len, " %-*s", w, cell);
        }
        printf("rank %d%s   (peak %d in flight)\n", p, line, r.peak_inflight[p]);
    }
    free(line);
    free(ops);
    free(start);
    return 0;
}

static void print_bubbles(void) {
    char err[256];
    printf("| P | V | m | schedule | makespan | bubble | (P-1)/(V*m) | rank 0 peak | GPipe bubble "
           "| GPipe peak |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int Ps[] = {2, 4}, Ms[] = {4, 8, 16};
    for (int a = 0; a < 2; a++)
        for (int V = 1; V <= 2; V++)
            for (int b = 0; b < 3; b++) {
                int P = Ps[a], m = Ms[b];
                PPSimResult r, g;
                PPScheduleKind kind = V == 1 ? PP_1F1B : PP_INTERLEAVED;
                if (pp_simulate(kind, P, V, m, 1, 2, &r, err, sizeof err) != 0 ||
                    pp_simulate(PP_GPIPE, P, V, m, 1, 2, &g, err, sizeof err) != 0) {
                    printf("error: %s\n", err);
                    return;
                }
                printf("| %d | %d | %d | %s | %d | %.4f | %.4f | %d | %.4f | %d |\n", P, V, m,
                       pp_schedule_name(kind), r.makespan, r.bubble, r.ideal_bubble, r.peak_inflight[0],
                       g.bubble, g.peak_inflight[0]);
            }
    printf("\n| P | V | m | interleaved bubble | (P-1)/(V*m) | 1f1b bubble | rank 0 peak |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    int Mx[] = {1, 2, 3, 5, 6, 7, 9, 10, 12};
    for (int b = 0; b < 9; b++) {
        PPSimResult r, r1;
        if (pp_simulate(PP_INTERLEAVED, 4, 2, Mx[b], 1, 2, &r, err, sizeof err) != 0 ||
            pp_simulate(PP_1F1B, 4, 1, Mx[b], 1, 2, &r1, err, sizeof err) != 0) {
            printf("error: %s\n", err);
            return;
        }
        printf("| 4 | 2 | %d | %.4f | %.4f | %.4f | %d |\n", Mx[b], r.bubble, r.ideal_bubble, r1.bubble,
               r.peak_inflight[0]);
    }
}

int main(int argc, char** argv) {
    if (argc >= 6 && strcmp(argv[1], "--table") == 0)
        return print_table(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argv[5], argc > 6 ? atoi(argv[6]) : 1,
                           argc > 7 ? atoi(argv[7]) : 1);
    if (argc == 2 && strcmp(argv[1], "--bubbles") == 0) {
        print_bubbles();
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--table P V m 1f1b|gpipe [t_fwd t_bwd] | --bubbles]\n", argv[0]);
        return 2;
    }
    test_hand();
    test_brute();
    test_naive_interleaved();
    test_simulator_faults();
    test_split();
    test_args();
    return test_done("test_schedule");
}
