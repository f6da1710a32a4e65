/* train/runlog.c — see runlog.h. */
#include "runlog.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../common/util.h"

void runlog_open(RunLog* lg, const char* dir, int rank, int resume_step) {
    lg->active = rank == 0;
    lg->f = NULL;
    if (!dir[0] || rank != 0) return;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fatal("--output_dir %s: cannot create: %s", dir, strerror(errno));
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    if (resume_step >= 0 && runlog_trim(path, resume_step, err, sizeof err) != 0)
        fatal("--output_dir: %s", err);
    lg->f = fopen(path, resume_step >= 0 ? "a" : "w");
    if (!lg->f) fatal("--output_dir: cannot write %s: %s", path, strerror(errno));
}

static void json_line(RunLog* lg, const char* fmt, ...) PRINTF_LIKE(2, 3);
static void json_line(RunLog* lg, const char* fmt, ...) {
    if (!lg->f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(lg->f, fmt, ap);
    va_end(ap);
    fflush(lg->f);
}

void runlog_step(RunLog* lg, const StepLog* s) {
    if (!lg->active) return;
    if (!s->finite) {
        const char* what = !isfinite(s->loss) && !isfinite(s->norm) ? "loss and grad norm"
                           : !isfinite(s->loss)                     ? "loss"
                                                                    : "grad norm";
        printf(
            "step %4d/%d | non-finite %s (loss %g, norm %g): update skipped (%d in a row, --max_bad_steps %d)\n",
            s->step, s->num_iterations, what, s->loss, s->norm, s->bad_in_a_row, s->max_bad_steps);
        json_line(lg, "{\"step\":%d,\"skipped\":1,\"bad_in_a_row\":%d}\n", s->step, s->bad_in_a_row);
        return;
    }
    char mfus[32];
    if (s->mfu >= 0) snprintf(mfus, sizeof mfus, "%.1f%%", 100.0 * s->mfu);
    else snprintf(mfus, sizeof mfus, "n/a");
    char bub[64] = "", bubj[32] = "";
    if (s->bubble >= 0) {
        snprintf(bub, sizeof bub, " | bubble %.1f%% (theory %.1f%%)", 100.0 * s->bubble,
                 100.0 * s->bubble_theory);
        snprintf(bubj, sizeof bubj, ",\"bubble\":%.5f", s->bubble);
    }
    printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | mfu %s | "
           "peak %.1f MB alloc, %.1f MB %s%s | eta %dm%02ds\n",
           s->step, s->num_iterations, s->loss, s->lr, s->norm, 1000.0 * s->seconds, s->tokens_per_s, mfus,
           s->peak_alloc_mb, s->peak_reserved_mb, s->reserved_name, bub, (int)(s->eta_s / 60),
           (int)s->eta_s % 60);
    json_line(lg,
              "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
              "\"mfu\":%.5f,\"peak_alloc_mb\":%.2f,\"peak_reserved_mb\":%.2f%s}\n",
              s->step, s->loss, s->lr, s->norm, 1000.0 * s->seconds, s->tokens_per_s,
              s->mfu >= 0 ? s->mfu : 0.0, s->peak_alloc_mb, s->peak_reserved_mb, bubj);
}

void runlog_val(RunLog* lg, int step, double val_loss) {
    if (!lg->active) return;
    printf("step %d | val loss %.6f\n", step, val_loss);
    json_line(lg, "{\"step\":%d,\"val_loss\":%.9g}\n", step, val_loss);
}

void runlog_close(RunLog* lg) {
    if (lg->f) fclose(lg->f);
    lg->f = NULL;
}

/* ---------------------------------------------------------------- trimming */

static void trim_err(char* err, size_t errlen, const char* fmt, ...) PRINTF_LIKE(3, 4);
static void trim_err(char* err, size_t errlen, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* the "step" of a log line; -1 if it has none */
static int line_step(const char* line, int* step) {
    const char* s = strstr(line, "\"step\":");
    if (!s) return -1;
    char* end;
    long v = strtol(s + 7, &end, 10);
    if (end == s + 7) return -1;
    *step = (int)v;
    return 0;
}

int runlog_trim(const char* path, int step, char* err, size_t errlen) {
    FILE* in = fopen(path, "rb");
    if (!in) {
        if (errno == ENOENT) return 0;
        trim_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* out = fopen(tmp, "wb");
    if (!out) {
        trim_err(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        fclose(in);
        return -1;
    }
    char* line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, in)) > 0) {
        int s;
        if (line_step(line, &s) == 0) {
            int is_val = strstr(line, "\"val_loss\"") != NULL;
            if (is_val ? s >= step : s > step) break;
        }
        if (fwrite(line, 1, (size_t)len, out) != (size_t)len) break;
    }
    free(line);
    fclose(in);
    int werr = ferror(out);
    if (fclose(out) != 0) werr = 1;
    if (werr) {
        trim_err(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
        return -1;
    }
    if (rename(tmp, path) != 0) {
        trim_err(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        return -1;
    }
    return 0;
}
