/* checkpoint/checkpoint.c — owns the collective checkpoint protocol: binding
 * to the run, the start-up verdict of rank 0 (probe of --output_dir, the
 * newest complete checkpoint, its checks) shared with every rank, the
 * parallel load on resume, the save (tmp directory, every rank's ranges,
 * checksums, rename, DONE) and keeping the newest K; also log.jsonl's trim on
 * resume. See checkpoint.h for the protocol. */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* --------------------------------------------------------- the verdicts */

void ckpt_fail_all(Comm* comm, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (comm->world == 1 || comm->rank != 0) {
        fprintf(stderr, "error: %s\n", msg);
        fflush(stderr);
    }
    if (comm->world == 1) exit(1);
    /* the others have printed before rank 0 prints and aborts them all
     * (MPI_Abort ends a job at once; a non-zero exit after MPI_Finalize
     * makes mpirun linger for seconds) */
    comm_barrier(comm);
    if (comm->rank == 0) comm_abort(comm, msg);
    comm_barrier(comm); /* never completes: rank 0's abort ends this rank (or the timeout does) */
    exit(1);
}

/* What rank 0 found, shared with every rank. */
typedef struct {
    int status; /* 0 resume from path, 1 nothing to resume, -1 error */
    char msg[1024];
    char path[CKPT_PATH];
    unsigned char header[CKPT_HEADER_BYTES];
} CkptVerdict;

/* ------------------------------------------------------------- trainer */

/* dst[*n ..] += src[0 .. k), growing dst; frees src. */
static CkptSpan* spans_append(CkptSpan* dst, int* n, CkptSpan* src, int k) {
    CkptSpan* out = realloc(dst, sizeof(CkptSpan) * (size_t)(*n + k + 1));
    if (!out) fatal("out of host memory (checkpoint spans)");
    if (k) memcpy(out + *n, src, sizeof(CkptSpan) * (size_t)k);
    *n += k;
    free(src);
    return out;
}

void ckpt_init(Checkpointer* c, Comm* comm, const CkptChunk* chunks, int nchunks, Optimizer* opt,
               const char* dir, int every, int keep, const CkptHparams* hp) {
    memset(c, 0, sizeof *c);
    if (nchunks != opt->nbufs)
        fatal("internal: ckpt_init: %d chunks for %d optimizer buffers", nchunks, opt->nbufs);
    c->comm = comm;
    c->nchunks = nchunks;
    c->chunks = xmalloc(sizeof(CkptChunk) * (size_t)nchunks);
    memcpy(c->chunks, chunks, sizeof(CkptChunk) * (size_t)nchunks);
    c->cfg = chunks[0].model->cfg;
    c->P = chunks[0].model->num_parameters;
    c->opt = opt;
    c->dir = dir ? dir : "";
    c->every = every;
    c->keep = keep;
    c->hp = *hp;
    c->last_step = -1;
    for (int k = 0; k < nchunks; k++) {
        const CkptChunk* ch = &chunks[k];
        const OptPiece* held = opt->bufs[k].pieces;
        int nheld = opt->bufs[k].npieces, nown, n;
        /* this rank writes its slice of every bucket of the chunk (under
         * zero_stage 0 too, where it holds everything), but not a tied copy */
        OptPiece* own = layout_opt_pieces(ch->layout, ch->dp_rank, &nown);
        if (ch->skip_wte) {
            const GPT2Tensor* te = gpt2_tensor(ch->model, GPT2_WTE, -1);
            int j = 0;
            for (int i = 0; i < nown; i++)
                if (!(own[i].buf_off >= te->buf_off && own[i].buf_off + own[i].len <= te->buf_off + te->numel))
                    own[j++] = own[i];
            nown = j;
        }
        CkptSpan* s = ckpt_spans(ch->layout, ch->model, held, nheld, own, nown, &n);
        c->own = spans_append(c->own, &c->nown, s, n);
        free(own);
        s = ckpt_spans(ch->layout, ch->model, held, nheld, held, nheld, &n);
        c->held = spans_append(c->held, &c->nheld, s, n);
    }
}

/* the bytes of a model file of version 3 (fp32) or 5 (bf16) */
static long long model_file_bytes(const Checkpointer* c, int version) {
    return (long long)sizeof(int32_t) * GPT2_HEADER_INTS + (long long)c->P * (version == 3 ? 4 : 2);
}

/* Collective: the model file at path, written by the chunks' writers (each
 * pwrites its tensors at their places) into a file rank 0 created with the
 * header and the full size; fsynced. version 3 or 5. 0, or -1 on every rank
 * with the reason in err (the failing rank's own; the others name it). */
static int write_model_file(Checkpointer* c, const char* path, int version, char* err, size_t errlen) {
    Comm* comm = c->comm;
    int bad = 0;
    err[0] = '\0';
    if (comm->rank == 0) {
        int32_t h[GPT2_HEADER_INTS];
        gpt2_header_encode(&c->cfg, version, h);
        long long bytes = model_file_bytes(c, version);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h || ftruncate(fd, (off_t)bytes) != 0) {
            ckpt_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
            bad = 1;
        }
        if (fd >= 0) close(fd);
    }
    if (comm_allreduce_host_max_int(comm, bad)) {
        if (!bad) ckpt_errf(err, errlen, "%s: writing it failed on rank 0", path);
        return -1;
    }
    for (int k = 0; k < c->nchunks && !bad; k++) {
        if (!c->chunks[k].writer) continue;
        int fd = open(path, O_WRONLY);
        if (fd < 0) {
            ckpt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
            bad = 1;
            break;
        }
        char e2[512];
        if (gpt2_write_tensors(c->chunks[k].model, fd, version, c->chunks[k].skip_wte, e2, sizeof e2) != 0) {
            ckpt_errf(err, errlen, "%s: %s", path, e2);
            bad = 1;
        } else if (fsync(fd) != 0) {
            ckpt_errf(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
            bad = 1;
        }
        close(fd);
    }
    if (comm_allreduce_host_max_int(comm, bad)) {
        if (!bad) ckpt_errf(err, errlen, "%s: writing it failed on another rank (see its message)", path);
        return -1;
    }
    return 0;
}

/* 0 if the file system holding path has need bytes free (or does not say),
 * else -1 with "<what>: X MB free on its file system, but <item> needs Y MB" */
static int check_room(const char* path, const char* what, const char* item, unsigned long long need, char* err,
                      size_t errlen) {
    struct statvfs sv;
    if (statvfs(path, &sv) != 0) return 0;
    const unsigned long long avail = (unsigned long long)sv.f_bavail * sv.f_frsize;
    if (avail >= need) return 0;
    ckpt_errf(err, errlen, "%s: %.1f MB free on its file system, but %s needs %.1f MB", what, avail / 1048576.0,
              item, need / 1048576.0);
    return -1;
}

/* rank 0: can path.tmp be created where path is, and does the model file
 * fit on its file system? 0, or -1 with the reason in err */
static int probe_save_model(const Checkpointer* c, const char* path, const char* tmp, int version, char* err,
                            size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        ckpt_errf(err, errlen, "--save_model %s is a directory (it names the model file to write)", path);
        return -1;
    }
    /* a tmp left by an earlier run's crash is overwritten by the save anyway:
     * remove only what this probe created */
    const int existed = stat(tmp, &st) == 0;
    int fd = open(tmp, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        ckpt_errf(err, errlen, "--save_model %s: cannot create %s: %s", path, tmp, strerror(errno));
        return -1;
    }
    close(fd);
    char what[CKPT_PATH + 16];
    snprintf(what, sizeof what, "--save_model %s", path);
    const int room =
        check_room(tmp, what, "the model file", (unsigned long long)model_file_bytes(c, version), err, errlen);
    if (!existed) unlink(tmp);
    return room;
}

/* tmp = path + ".tmp"; -1 if that does not fit in len */
static int save_model_tmp(char* tmp, size_t len, const char* path) {
    return snprintf(tmp, len, "%s.tmp", path) < (int)len ? 0 : -1;
}

void ckpt_check_save_model(Checkpointer* c, const char* path, int version) {
    char tmp[CKPT_PATH + 8];
    CkptVerdict* v = xcalloc(1, sizeof *v);
    if (save_model_tmp(tmp, sizeof tmp, path) != 0) {
        ckpt_errf(v->msg, sizeof v->msg, "--save_model: path too long: %s", path);
        v->status = -1;
    } else if (c->comm->rank == 0 && probe_save_model(c, path, tmp, version, v->msg, sizeof v->msg) != 0) {
        v->status = -1;
    }
    comm_broadcast_host(c->comm, v, sizeof *v);
    if (v->status < 0) ckpt_fail_all(c->comm, "%s", v->msg);
    free(v);
}

void ckpt_save_model(Checkpointer* c, const char* path, int version) {
    char tmp[CKPT_PATH + 8], err[1024];
    if (save_model_tmp(tmp, sizeof tmp, path) != 0)
        ckpt_fail_all(c->comm, "--save_model: path too long: %s", path);
    if (write_model_file(c, tmp, version, err, sizeof err) != 0)
        ckpt_fail_all(c->comm, "--save_model: %s", err);
    int bad = 0;
    if (c->comm->rank == 0 && rename(tmp, path) != 0) {
        ckpt_errf(err, sizeof err, "--save_model: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        bad = 1;
    }
    if (comm_allreduce_host_max_int(c->comm, bad))
        ckpt_fail_all(c->comm, "%s", bad ? err : "--save_model: renaming the file failed on rank 0");
}

void ckpt_free(Checkpointer* c) {
    free(c->chunks);
    free(c->own);
    free(c->held);
    memset(c, 0, sizeof *c);
}

int ckpt_due(const Checkpointer* c, int step_done) {
    return c->every > 0 && step_done > 0 && step_done % c->every == 0 && step_done != c->last_step;
}

/* one checkpoint on disk */
static size_t ckpt_bytes(size_t P) { return (size_t)(ckpt_model_bytes(P) + ckpt_state_bytes(P)); }

/* rank 0: can we write into dir (and hold one checkpoint)? */
static int ckpt_probe_dir(const Checkpointer* c, char* err, size_t errlen) {
    if (ckpt_mkdir_p(c->dir, err, errlen) != 0) return -1;
    char probe[CKPT_PATH];
    snprintf(probe, sizeof probe, "%s/.write_test.%ld", c->dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        ckpt_errf(err, errlen, "--output_dir %s is not writable: %s", c->dir, strerror(errno));
        return -1;
    }
    char zeros[4096];
    memset(zeros, 0, sizeof zeros);
    int bad = ckpt_pwrite_full(fd, zeros, sizeof zeros, 0) != 0 || fsync(fd) != 0;
    int e = errno;
    close(fd);
    unlink(probe);
    if (bad) {
        ckpt_errf(err, errlen, "--output_dir %s: writing a test file failed: %s", c->dir, strerror(e));
        return -1;
    }
    if (c->every > 0) {
        char what[CKPT_PATH + 16];
        snprintf(what, sizeof what, "--output_dir %s", c->dir);
        return check_room(c->dir, what, "one checkpoint", ckpt_bytes(c->P), err, errlen);
    }
    return 0;
}

/* rank 0: the start-up verdict. */
static void ckpt_decide(const Checkpointer* c, int resume, CkptVerdict* v) {
    char* err = v->msg;
    size_t errlen = sizeof v->msg;
    v->status = 1;
    if (ckpt_probe_dir(c, err, errlen) != 0) {
        v->status = -1;
        return;
    }
    CkptEntry* e;
    int n;
    if (ckpt_scan(c->dir, &e, &n, err, errlen) != 0) {
        v->status = -1;
        return;
    }
    int latest = -1;
    for (int i = 0; i < n; i++)
        if (e[i].complete) latest = i;
    if (!resume) {
        if (c->every > 0 && latest >= 0) {
            ckpt_errf(err, errlen,
                      "--output_dir %s already holds checkpoints (newest ckpt_%08d): pass --resume "
                      "to continue from it, or choose another --output_dir",
                      c->dir, e[latest].step);
            v->status = -1;
        }
        free(e);
        return;
    }
    for (int i = 0; i < n; i++)
        if (!e[i].complete && (latest < 0 || e[i].step > e[latest].step))
            printf("resume: skipping the incomplete checkpoint %s/ckpt_%08d%s (its save did not finish)\n",
                   c->dir, e[i].step, e[i].tmp ? ".tmp" : "");
    if (latest < 0) {
        free(e);
        return;
    }
    int step = e[latest].step;
    free(e);
    ckpt_dir_name(v->path, sizeof v->path, c->dir, step, 0);
    CkptHeader h;
    char notes[4096];
    if (ckpt_verify(v->path, &c->cfg, c->P, &h, err, errlen) != 0 ||
        ckpt_header_check_resume(&h, &c->hp, notes, sizeof notes, err, errlen) != 0) {
        v->status = -1;
        return;
    }
    fputs(notes, stdout);
    if (h.progress.step != step) {
        ckpt_errf(err, errlen, "%s: holds step %d, but its name says %d", v->path, h.progress.step, step);
        v->status = -1;
        return;
    }
    ckpt_header_encode(&h, v->header);
    v->status = 0;
}

int ckpt_start(Checkpointer* c, int resume, CkptProgress* p) {
    memset(p, 0, sizeof *p);
    if (!c->dir[0]) return 0;
    Comm* comm = c->comm;
    CkptVerdict* v = xcalloc(1, sizeof *v);
    if (comm->rank == 0) ckpt_decide(c, resume, v);
    comm_broadcast_host(comm, v, sizeof *v);
    if (v->status < 0) ckpt_fail_all(comm, "%s", v->msg);
    if (v->status == 1) {
        if (resume && comm->rank == 0)
            printf("resume: no complete checkpoint in %s: starting from step 0\n", c->dir);
        free(v);
        return 0;
    }
    CkptHeader h;
    char err[1024];
    if (ckpt_header_decode(v->header, sizeof v->header, &h, err, sizeof err) != 0)
        fatal("checkpoint: internal error decoding a verified header: %s", err);
    /* every rank: the params from model.bin, its state ranges from state.bin */
    char f[CKPT_PATH + 16];
    snprintf(f, sizeof f, "%s/model.bin", v->path);
    for (int k = 0; k < c->nchunks; k++) gpt2_load(c->chunks[k].model, f);
    snprintf(f, sizeof f, "%s/state.bin", v->path);
    Optimizer* o = c->opt;
    int bad = ckpt_read_state(f, o->be, c->P, c->held, c->nheld, o->master, o->m, o->v, err, sizeof err);
    if (comm_allreduce_host_max_int(comm, bad ? 1 : 0) != 0)
        ckpt_fail_all(comm, "%s",
                      bad ? err : "resume: reading the checkpoint failed on another rank (see its message)");
    o->t = h.opt_t;
    *p = h.progress;
    c->last_step = h.progress.step;
    if (comm->rank == 0)
        printf("resume: from %s: step %d, data row %llu, AdamW step %d (saved by %d rank(s), zero_stage %d)\n",
               v->path, p->step, (unsigned long long)p->next_row, o->t, h.hp.world, h.hp.zero_stage);
    free(v);
    return 1;
}

/* rank 0: delete complete checkpoints beyond the newest `keep`, and leftovers
 * of crashed saves older than `step`. Failures are reported, not fatal: the
 * new checkpoint is already complete. */
static void ckpt_prune(const Checkpointer* c, int step) {
    CkptEntry* e;
    int n;
    char err[1024];
    if (ckpt_scan(c->dir, &e, &n, err, sizeof err) != 0) {
        fprintf(stderr, "warning: %s\n", err);
        return;
    }
    int kept = 0;
    for (int i = n - 1; i >= 0; i--) {
        int drop = 0;
        if (e[i].complete) drop = c->keep > 0 && ++kept > c->keep;
        else drop = e[i].step < step;
        if (!drop) continue;
        char path[CKPT_PATH];
        ckpt_dir_name(path, sizeof path, c->dir, e[i].step, e[i].tmp);
        if (ckpt_remove_dir(path, err, sizeof err) != 0) fprintf(stderr, "warning: %s\n", err);
    }
    free(e);
}

/* rank 0: DONE of the renamed checkpoint directory `path` (fatal on failure). */
static void ckpt_write_done(const char* path, const CkptDone* d) {
    char text[512], err[1024];
    int len = ckpt_done_format(d, text, sizeof text);
    if (ckpt_write_small(path, "DONE", text, (size_t)len, err, sizeof err) != 0) fatal("%s", err);
}

void ckpt_save(Checkpointer* c, const CkptProgress* p) {
    Comm* comm = c->comm;
    Optimizer* o = c->opt;
    const size_t P = c->P;
    double t0 = wall_time_s();
    char tmp[CKPT_PATH], fin[CKPT_PATH], f[CKPT_PATH + 16], err[1024];
    ckpt_dir_name(tmp, sizeof tmp, c->dir, p->step, 1);
    ckpt_dir_name(fin, sizeof fin, c->dir, p->step, 0);

    /* 1. a fresh .tmp directory */
    CkptVerdict* v = xcalloc(1, sizeof *v);
    if (comm->rank == 0) {
        if (ckpt_exists(tmp) && ckpt_remove_dir(tmp, v->msg, sizeof v->msg) != 0) v->status = -1;
        else if (mkdir(tmp, 0755) != 0) {
            ckpt_errf(v->msg, sizeof v->msg, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
            v->status = -1;
        }
    }
    comm_broadcast_host(comm, v, sizeof *v);
    if (v->status < 0) ckpt_fail_all(comm, "%s", v->msg);
    free(v);

    /* 2. model.bin (each chunk's tensors by its writer) and every rank's ranges of state.bin */
    unsigned char header[CKPT_HEADER_BYTES];
    snprintf(f, sizeof f, "%s/model.bin", tmp);
    if (write_model_file(c, f, 3, err, sizeof err) != 0)
        ckpt_fail_all(comm, "checkpoint: %s (the previous checkpoint is kept)", err);
    if (comm->rank == 0) {
        CkptHeader h;
        memset(&h, 0, sizeof h);
        h.version = CKPT_VERSION;
        h.num_parameters = P;
        h.cfg = c->cfg;
        h.progress = *p;
        h.opt_t = o->t;
        h.dtype = (int)o->be->dtype;
        h.hp = c->hp;
        ckpt_header_encode(&h, header);
    }
    snprintf(f, sizeof f, "%s/state.bin", tmp);
    if (ckpt_write_state(f, o->be, P, comm->rank == 0 ? header : NULL, c->own, c->nown, o->master, o->m, o->v,
                         err, sizeof err) != 0)
        fatal("checkpoint: %s (the previous checkpoint is kept)", err);
    comm_barrier(comm);

    /* 3. rank 0: checksums, rename, DONE; 4. keep the newest K */
    if (comm->rank == 0) {
        CkptDone d = {.step = p->step};
        snprintf(f, sizeof f, "%s/model.bin", tmp);
        if (ckpt_crc32_file(f, &d.model_crc, &d.model_bytes, err, sizeof err) != 0)
            fatal("checkpoint: %s", err);
        snprintf(f, sizeof f, "%s/state.bin", tmp);
        if (ckpt_crc32_file(f, &d.state_crc, &d.state_bytes, err, sizeof err) != 0)
            fatal("checkpoint: %s", err);
        if (d.state_bytes != ckpt_state_bytes(P))
            fatal("checkpoint: internal error: %s is %lld bytes, expected %lld", f, d.state_bytes,
                  ckpt_state_bytes(P));
        if (ckpt_fsync_path(tmp, 1, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        if (ckpt_exists(fin) && ckpt_remove_dir(fin, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        if (rename(tmp, fin) != 0) fatal("checkpoint: cannot rename %s to %s: %s", tmp, fin, strerror(errno));
        if (ckpt_fsync_path(c->dir, 1, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        ckpt_write_done(fin, &d);
        ckpt_prune(c, p->step);
        printf("checkpoint: saved %s (%.1f MB) in %.2f s\n", fin,
               (double)(d.model_bytes + d.state_bytes) / 1048576.0, wall_time_s() - t0);
    }
    c->last_step = p->step;
}
