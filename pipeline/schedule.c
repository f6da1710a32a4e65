/* pipeline/schedule.c — layer split, per-rank schedules, activation slots and the discrete-time
 * simulator of pipeline/schedule.h. */
#include "schedule.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

static void pp_set_err(char* err, size_t errlen, const char* fmt, ...) PRINTF_LIKE(3, 4);
static void pp_set_err(char* err, size_t errlen, const char* fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int pp_min(int a, int b) { return a < b ? a : b; }
static int pp_max(int a, int b) { return a > b ? a : b; }

int pp_split_layers(int L, int nchunks, int* first, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!first) {
        pp_set_err(err, errlen, "no array for the layer split");
        return -1;
    }
    if (L < 1 || nchunks < 1) {
        pp_set_err(err, errlen, "cannot cut %d layers into %d model chunks: both must be >= 1", L, nchunks);
        return -1;
    }
    if (nchunks > L) {
        pp_set_err(err, errlen,
                   "cannot cut %d layers into %d model chunks (pipeline ranks x virtual stages): "
                   "every chunk needs at least one layer",
                   L, nchunks);
        return -1;
    }
    int base = L / nchunks, extra = L % nchunks;
    int middle = pp_max(nchunks - 2, 0); /* chunks 1..nchunks-2 hold neither end */
    first[0] = 0;
    for (int c = 0; c < nchunks; c++) {
        int more;
        if (c == 0) {
            more = extra > middle; /* at most one left over: extra <= nchunks-1 = middle+1 */
        } else if (c == nchunks - 1) {
            more = 0;
        } else {
            more = c >= nchunks - 1 - pp_min(extra, middle);
        }
        first[c + 1] = first[c] + base + more;
    }
    return 0;
}

int pp_schedule_kind(int V, const char* name, PPScheduleKind* kind, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (V < 1) {
        pp_set_err(err, errlen, "virtual stages per rank (V = %d) must be >= 1", V);
        return -1;
    }
    if (name && strcmp(name, "1f1b") == 0) {
        *kind = V == 1 ? PP_1F1B : PP_INTERLEAVED;
        return 0;
    }
    if (name && strcmp(name, "gpipe") == 0) {
        *kind = PP_GPIPE;
        return 0;
    }
    pp_set_err(err, errlen, "unknown pipeline schedule '%s' (1f1b or gpipe)", name ? name : "(null)");
    return -1;
}

const char* pp_schedule_name(PPScheduleKind kind) {
    switch (kind) {
    case PP_1F1B: return "1f1b";
    case PP_INTERLEAVED: return "interleaved";
    case PP_GPIPE: return "gpipe";
    }
    return NULL;
}

/* The k-th (chunk, micro) of the interleaved order for a multiple of P micro-batches: groups of P
 * micro-batches, in a group chunk 0..V-1 (reversed for the backward order), each on the group's
 * micro-batches in order. */
static void pp_interleaved_at(int P, int V, int k, int backward, int* v, int* i) {
    int g = k / (P * V), r = k % (P * V);
    *v = backward ? V - 1 - r / P : r / P;
    *i = g * P + r % P;
}

/* The k-th (chunk, micro) of kind's forward or backward order on a rank. */
static void pp_order_at(PPScheduleKind kind, int P, int V, int m, int k, int backward, int* v, int* i) {
    if (kind == PP_INTERLEAVED) {
        pp_interleaved_at(P, V, k, backward, v, i);
    } else if (kind == PP_GPIPE) {
        if (backward) k = V * m - 1 - k; /* exactly the reverse of the forward order */
        *v = k / m;
        *i = k % m;
    } else {
        *v = 0;
        *i = k;
    }
}

int pp_schedule(PPScheduleKind kind, int P, int V, int m, int p, PPOp* ops, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (P < 1 || V < 1 || m < 1) {
        pp_set_err(err, errlen, "pipeline ranks (%d), virtual stages (%d) and micro-batches (%d) must be >= 1",
                   P, V, m);
        return -1;
    }
    if (p < 0 || p >= P) {
        pp_set_err(err, errlen, "pipeline rank %d out of range [0, %d)", p, P);
        return -1;
    }
    if (!ops) {
        pp_set_err(err, errlen, "no array for the schedule");
        return -1;
    }
    if (V > 1 && P == 1) {
        pp_set_err(err, errlen, "virtual stages per rank (V = %d) need --pipeline_parallel >= 2", V);
        return -1;
    }
    if (V > 1 && kind == PP_1F1B) {
        pp_set_err(err, errlen,
                   "the 1f1b schedule without interleaving takes one model chunk per rank (V = %d)", V);
        return -1;
    }
    if (V == 1 && kind == PP_INTERLEAVED) {
        pp_set_err(err, errlen, "the interleaved schedule needs more than one model chunk per rank (V = 1)");
        return -1;
    }
    if (V > (1 << 20) / m || P > (1 << 20) / V) {
        pp_set_err(err, errlen, "pipeline too large: %d ranks x %d virtual stages x %d micro-batches", P, V, m);
        return -1;
    }
    /* The interleaved list of m micro-batches is that of mg, the next multiple of P, less the ops
     * of micro-batches >= m (the last group is smaller). Dropping a micro-batch from every rank
     * keeps the remaining ops in the same relative order on each rank with the same
     * dependencies, so a deadlock-free list stays deadlock-free. */
    int mg = kind == PP_INTERLEAVED ? (m + P - 1) / P * P : m;
    int total = V * mg, warm;
    switch (kind) {
    case PP_1F1B: warm = pp_min(P - p - 1, m); break;
    case PP_INTERLEAVED: warm = pp_min(2 * (P - p - 1) + (V - 1) * P, total); break;
    case PP_GPIPE: warm = total; break;
    default: pp_set_err(err, errlen, "unknown schedule kind %d", (int)kind); return -1;
    }
    int n = 0, nf = 0, nb = 0;
    while (nb < total) {
        /* warm forwards, then F and B in turn (one B after each F), then the backwards left */
        int backward = nf == total || (nf >= warm && nf - warm > nb);
        PPOp o = {.kind = backward ? PP_BWD : PP_FWD, .slot = 0};
        pp_order_at(kind, P, V, mg, backward ? nb++ : nf++, backward, &o.chunk, &o.micro);
        if (o.micro < m) ops[n++] = o;
    }
    if (pp_assign_slots(ops, n, V, m, err, errlen) != 0) return -1;
    return n;
}

static const char* pp_kind_name(int kind) { return kind == PP_FWD ? "F" : kind == PP_BWD ? "B" : "?"; }

int pp_check_ops(const PPOp* ops, int n, int V, int m, int check_slots, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (V < 1 || m < 1 || n != 2 * V * m || !ops) {
        pp_set_err(err, errlen, "a list of %d ops for %d chunks x %d micro-batches (needs 2*V*m = %d)", n, V, m,
                   2 * V * m);
        return -1;
    }
    /* state[v*m + i]: 0 nothing yet, 1 forward done, 2 backward done; fslot: the forward's slot */
    int* state = calloc((size_t)V * m, sizeof(int));
    int* fslot = calloc((size_t)V * m, sizeof(int));
    if (!state || !fslot) {
        free(state);
        free(fslot);
        pp_set_err(err, errlen, "out of memory checking a schedule of %d ops", n);
        return -1;
    }
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        const PPOp* o = &ops[k];
        if ((o->kind != PP_FWD && o->kind != PP_BWD) || o->chunk < 0 || o->chunk >= V || o->micro < 0 ||
            o->micro >= m) {
            pp_set_err(err, errlen, "op %d (kind %d, chunk %d, micro-batch %d) out of range", k, o->kind,
                       o->chunk, o->micro);
            rc = -1;
            break;
        }
        int* s = &state[o->chunk * m + o->micro];
        if (o->kind == PP_FWD && *s != 0) {
            pp_set_err(err, errlen, "op %d: second F of chunk %d, micro-batch %d", k, o->chunk, o->micro);
            rc = -1;
        } else if (o->kind == PP_BWD && *s != 1) {
            pp_set_err(err, errlen, "op %d: B of chunk %d, micro-batch %d %s", k, o->chunk, o->micro,
                       *s == 0 ? "before its F" : "a second time");
            rc = -1;
        } else if (check_slots && o->slot < 0) {
            pp_set_err(err, errlen, "op %d: negative slot %d", k, o->slot);
            rc = -1;
        } else if (check_slots && o->kind == PP_BWD && o->slot != fslot[o->chunk * m + o->micro]) {
            pp_set_err(err, errlen, "op %d: B of chunk %d, micro-batch %d in slot %d, its F in slot %d", k,
                       o->chunk, o->micro, o->slot, fslot[o->chunk * m + o->micro]);
            rc = -1;
        } else if (check_slots && o->kind == PP_FWD) {
            for (int i = 0; i < m; i++) {
                if (state[o->chunk * m + i] == 1 && fslot[o->chunk * m + i] == o->slot) {
                    pp_set_err(err, errlen,
                               "op %d: F of chunk %d, micro-batch %d takes slot %d, still held by "
                               "micro-batch %d",
                               k, o->chunk, o->micro, o->slot, i);
                    rc = -1;
                    break;
                }
            }
        }
        if (rc == 0) {
            *s += 1;
            if (o->kind == PP_FWD) fslot[o->chunk * m + o->micro] = o->slot;
        }
    }
    free(state);
    free(fslot);
    return rc; /* n = 2*V*m ops with no repeat: every F and B is there */
}

int pp_assign_slots(PPOp* ops, int n, int V, int m, char* err, size_t errlen) {
    if (pp_check_ops(ops, n, V, m, 0, err, errlen) != 0) return -1;
    /* held[v*m + s]: slot s of chunk v is taken; slot[v*m + i]: micro-batch i's slot on chunk v */
    char* held = calloc((size_t)V * m, 1);
    int* slot = malloc((size_t)V * m * sizeof(int));
    if (!held || !slot) {
        free(held);
        free(slot);
        pp_set_err(err, errlen, "out of memory assigning the slots of %d ops", n);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        PPOp* o = &ops[k];
        char* h = held + (size_t)o->chunk * m;
        if (o->kind == PP_FWD) {
            int s = 0;
            while (h[s]) s++; /* at most m micro-batches in flight on a chunk: s < m */
            h[s] = 1;
            o->slot = slot[o->chunk * m + o->micro] = s;
        } else {
            o->slot = slot[o->chunk * m + o->micro];
            h[o->slot] = 0;
        }
    }
    free(held);
    free(slot);
    return 0;
}

int pp_last_backward(const PPOp* ops, int n, int chunk) {
    for (int k = n - 1; k >= 0; k--)
        if (ops[k].kind == PP_BWD && ops[k].chunk == chunk) return k;
    return -1;
}

int pp_max_inflight(const PPOp* ops, int n, int chunk) {
    int cur = 0, peak = 0;
    for (int k = 0; k < n; k++) {
        if (chunk >= 0 && ops[k].chunk != chunk) continue;
        cur += ops[k].kind == PP_FWD ? 1 : -1;
        peak = pp_max(peak, cur);
    }
    return peak;
}

/* ---- simulator ---- */

int pp_simulate_ops(int P, int V, int m, const PPOp* const* ops, int t_fwd, int t_bwd, int* const* start,
                    PPSimResult* r, char* err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (P < 1 || P > PP_SIM_MAX_RANKS || V < 1 || m < 1 || t_fwd < 1 || t_bwd < 1 || !ops || !r) {
        pp_set_err(err, errlen,
                   "simulator arguments out of range (P %d in [1, %d], V %d, m %d, t_fwd %d, t_bwd %d)", P,
                   PP_SIM_MAX_RANKS, V, m, t_fwd, t_bwd);
        return -1;
    }
    int n = 2 * V * m, C = P * V;
    for (int p = 0; p < P; p++) {
        char why[200];
        if (pp_check_ops(ops[p], n, V, m, 0, why, sizeof why) != 0) {
            pp_set_err(err, errlen, "rank %d's schedule: %s", p, why);
            return -1;
        }
    }
    /* fend/bend[c*m + i]: when F(c, i) / B(c, i) ends, -1 until it has run (c global) */
    int* fend = malloc((size_t)C * m * sizeof(int));
    int* bend = malloc((size_t)C * m * sizeof(int));
    if (!fend || !bend) {
        free(fend);
        free(bend);
        pp_set_err(err, errlen, "out of memory simulating %d ranks x %d ops", P, n);
        return -1;
    }
    for (int k = 0; k < C * m; k++) fend[k] = bend[k] = -1;
    int pos[PP_SIM_MAX_RANKS] = {0}, free_at[PP_SIM_MAX_RANKS] = {0};
    int left = P * n, rc = 0;
    /* Each pass runs, on every rank, the ops whose dependencies have run. An op's start time is
     * max(its rank's previous op's end, its dependencies' ends) whatever the pass that reaches it,
     * so the times do not depend on the order of the passes. */
    while (left > 0) {
        int progress = 0;
        for (int p = 0; p < P; p++) {
            while (pos[p] < n) {
                const PPOp* o = &ops[p][pos[p]];
                int c = o->chunk * P + p, i = o->micro, dep;
                if (o->kind == PP_FWD) {
                    dep = c == 0 ? 0 : fend[(c - 1) * m + i];
                } else {
                    dep = c == C - 1 ? 0 : bend[(c + 1) * m + i];
                    /* its own forward has run: pp_check_ops put it earlier in this list */
                    dep = dep < 0 ? dep : pp_max(dep, fend[c * m + i]);
                }
                if (dep < 0) break;
                int t0 = pp_max(free_at[p], dep);
                if (start) start[p][pos[p]] = t0;
                free_at[p] = t0 + (o->kind == PP_FWD ? t_fwd : t_bwd);
                (o->kind == PP_FWD ? fend : bend)[c * m + i] = free_at[p];
                pos[p]++;
                left--;
                progress = 1;
            }
        }
        if (!progress) {
            int p = 0;
            while (pos[p] >= n) p++;
            const PPOp* o = &ops[p][pos[p]];
            int c = o->chunk * P + p, wc = o->kind == PP_FWD ? c - 1 : c + 1, q = wc % P;
            const PPOp* w = &ops[q][pos[q]]; /* rank q has not run wc's op: it is stuck too */
            pp_set_err(err, errlen,
                       "deadlock: rank %d stops at op %d (%s of chunk %d, micro-batch %d) waiting for rank "
                       "%d's %s of chunk %d, micro-batch %d; rank %d stops at op %d (%s of chunk %d, "
                       "micro-batch %d); %d ops not run",
                       p, pos[p], pp_kind_name(o->kind), o->chunk, o->micro, q, pp_kind_name(o->kind), wc / P,
                       o->micro, q, pos[q], pp_kind_name(w->kind), w->chunk, w->micro, left);
            rc = -1;
            break;
        }
    }
    if (rc == 0) {
        memset(r, 0, sizeof *r);
        r->busy = V * m * (t_fwd + t_bwd);
        for (int p = 0; p < P; p++) r->makespan = pp_max(r->makespan, free_at[p]);
        int worst = 0;
        for (int p = 0; p < P; p++) {
            r->idle[p] = r->makespan - r->busy;
            r->peak_inflight[p] = pp_max_inflight(ops[p], n, -1);
            worst = pp_max(worst, r->idle[p]);
        }
        r->bubble = (double)worst / r->busy;
        r->ideal_bubble = (double)(P - 1) / ((double)V * m);
        /* In order: for each receiving op kind, the sender's send order (its list order) of the
         * messages on one channel equals the receiver's list order of the matching receives. A
         * message is identified by its receiver's op (global chunk, micro); seq[] holds, per
         * message, its index in the sender's list; the receiver's ops must see it increase. */
        r->in_order = 1;
        int* seq = fend; /* reused: C*m entries */
        for (int kind = PP_FWD; kind <= PP_BWD; kind++) {
            for (int p = 0; p < P; p++) {
                for (int k = 0; k < n; k++) {
                    const PPOp* o = &ops[p][k];
                    if (o->kind != kind) continue;
                    int c = o->chunk * P + p, to = kind == PP_FWD ? c + 1 : c - 1;
                    if (to >= 0 && to < C) seq[to * m + o->micro] = k;
                }
            }
            for (int p = 0; p < P; p++) {
                int last = -1; /* one sender per receiver and kind: the rank of chunk c-1 (F), c+1 (B) */
                for (int k = 0; k < n; k++) {
                    const PPOp* o = &ops[p][k];
                    if (o->kind != kind) continue;
                    int c = o->chunk * P + p, from = kind == PP_FWD ? c - 1 : c + 1;
                    if (from < 0 || from >= C) continue;
                    if (seq[c * m + o->micro] < last) r->in_order = 0;
                    last = seq[c * m + o->micro];
                }
            }
        }
    }
    free(fend);
    free(bend);
    return rc;
}

int pp_simulate(PPScheduleKind kind, int P, int V, int m, int t_fwd, int t_bwd, PPSimResult* r, char* err,
                size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (P < 1 || P > PP_SIM_MAX_RANKS || V < 1 || m < 1) {
        pp_set_err(err, errlen, "simulator arguments out of range (P %d in [1, %d], V %d, m %d)", P,
                   PP_SIM_MAX_RANKS, V, m);
        return -1;
    }
    int n = 2 * V * m;
    PPOp* all = malloc((size_t)P * n * sizeof(PPOp));
    if (!all) {
        pp_set_err(err, errlen, "out of memory simulating %d ranks x %d ops", P, n);
        return -1;
    }
    const PPOp* lists[PP_SIM_MAX_RANKS];
    int rc = 0;
    for (int p = 0; p < P && rc == 0; p++) {
        lists[p] = all + (size_t)p * n;
        if (pp_schedule(kind, P, V, m, p, all + (size_t)p * n, err, errlen) < 0) rc = -1;
    }
    if (rc == 0) rc = pp_simulate_ops(P, V, m, lists, t_fwd, t_bwd, NULL, r, err, errlen);
    free(all);
    return rc;
}
