/* checkpoint/ckpt_file.c — owns the checkpoint files: full pread/pwrite,
 * fsync, directories, listing, atomic small files, file checksums, the
 * verification of a checkpoint directory, and state.bin's arrays by spans.
 * See ckpt_file.h. */
#define _GNU_SOURCE
#include "ckpt_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------- file I/O */

int ckpt_pread_full(int fd, void* buf, size_t bytes, long long off) {
    char* p = buf;
    while (bytes > 0) {
        ssize_t r = pread(fd, p, bytes, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) {
            errno = 0;
            return -1;
        } /* end of file: truncated */
        p += r;
        bytes -= (size_t)r;
        off += r;
    }
    return 0;
}

int ckpt_pwrite_full(int fd, const void* buf, size_t bytes, long long off) {
    const char* p = buf;
    while (bytes > 0) {
        ssize_t r = pwrite(fd, p, bytes, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += r;
        bytes -= (size_t)r;
        off += r;
    }
    return 0;
}

int ckpt_crc32_file(const char* path, uint32_t* crc, long long* bytes, char* err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ckpt_errf(err, errlen, "%s: %s", path,
                  errno == ENOENT ? "missing: the checkpoint is incomplete" : strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ckpt_errf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t cap = 4 * CKPT_CHUNK;
    unsigned char* buf = xmalloc(cap);
    uint32_t c = 0;
    long long total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ckpt_errf(err, errlen, "%s: read error: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        c = ckpt_crc32(c, buf, (size_t)r);
        total += r;
    }
    free(buf);
    close(fd);
    *crc = c;
    *bytes = total;
    return 0;
}

int ckpt_fsync_path(const char* path, int is_dir, char* err, size_t errlen) {
    int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) {
        ckpt_errf(err, errlen, "%s: cannot open to fsync: %s", path, strerror(errno));
        return -1;
    }
    /* some file systems refuse fsync on a directory (EINVAL): nothing to flush there */
    if (fsync(fd) != 0 && !(is_dir && errno == EINVAL)) {
        ckpt_errf(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

int ckpt_mkdir_p(const char* dir, char* err, size_t errlen) {
    char buf[CKPT_PATH];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        ckpt_errf(err, errlen, "--output_dir %s: path too long", dir);
        return -1;
    }
    for (char* p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char keep = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                ckpt_errf(err, errlen, "--output_dir %s: cannot create %s: %s", dir, buf, strerror(errno));
                return -1;
            }
            *p = keep;
            if (keep == '\0') break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ckpt_errf(err, errlen, "--output_dir %s: exists but is not a directory", dir);
        return -1;
    }
    return 0;
}

int ckpt_remove_dir(const char* path, char* err, size_t errlen) {
    char f[CKPT_PATH];
    snprintf(f, sizeof f, "%s/DONE", path);
    if (unlink(f) == 0) ckpt_fsync_path(path, 1, err, errlen);
    DIR* d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return 0;
        ckpt_errf(err, errlen, "%s: cannot list: %s", path, strerror(errno));
        return -1;
    }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (unlink(f) != 0) {
            ckpt_errf(err, errlen, "%s: cannot delete: %s", f, strerror(errno));
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    if (rmdir(path) != 0) {
        ckpt_errf(err, errlen, "%s: cannot delete: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int ckpt_read_small(const char* path, char* buf, size_t cap, size_t* n, char* err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ckpt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ckpt_errf(err, errlen, "%s: read error: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got == cap) break;
    }
    close(fd);
    *n = got;
    return 0;
}

int ckpt_write_small(const char* dir, const char* name, const void* data, size_t n, char* err, size_t errlen) {
    char f[CKPT_PATH + 16], t[CKPT_PATH + 16];
    snprintf(f, sizeof f, "%s/%s", dir, name);
    snprintf(t, sizeof t, "%s/%s.tmp", dir, name);
    int fd = open(t, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ckpt_pwrite_full(fd, data, n, 0) != 0 || fsync(fd) != 0) {
        ckpt_errf(err, errlen, "%s: write failed: %s", t, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    if (rename(t, f) != 0) {
        ckpt_errf(err, errlen, "cannot rename %s to %s: %s", t, f, strerror(errno));
        return -1;
    }
    return ckpt_fsync_path(dir, 1, err, errlen);
}

/* -------------------------------------------------- listing checkpoints */

int ckpt_parse_name(const char* name, int* tmp) {
    if (strncmp(name, "ckpt_", 5) != 0) return -1;
    const char* p = name + 5;
    long long v = 0;
    int nd = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 2147483647LL) return -1;
        p++;
        nd++;
    }
    if (nd < 8) return -1;
    if (*p == '\0') {
        *tmp = 0;
        return (int)v;
    }
    if (strcmp(p, ".tmp") == 0) {
        *tmp = 1;
        return (int)v;
    }
    return -1;
}

void ckpt_dir_name(char* out, size_t n, const char* dir, int step, int tmp) {
    if (snprintf(out, n, "%s/ckpt_%08d%s", dir, step, tmp ? ".tmp" : "") >= (int)n)
        fatal("--output_dir %s: path too long", dir);
}

static int ckpt_cmp_entry(const void* a, const void* b) {
    const CkptEntry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->tmp - y->tmp;
}

int ckpt_scan(const char* dir, CkptEntry** out, int* n, char* err, size_t errlen) {
    *out = NULL;
    *n = 0;
    DIR* d = opendir(dir);
    if (!d) {
        ckpt_errf(err, errlen, "--output_dir %s: cannot list: %s", dir, strerror(errno));
        return -1;
    }
    int cap = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int tmp;
        int step = ckpt_parse_name(e->d_name, &tmp);
        if (step < 0) continue;
        char path[CKPT_PATH], done[CKPT_PATH + 8];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        snprintf(done, sizeof done, "%s/DONE", path);
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            CkptEntry* ne = realloc(*out, (size_t)cap * sizeof *ne);
            if (!ne) fatal("out of host memory listing %s", dir);
            *out = ne;
        }
        (*out)[*n] = (CkptEntry){step, tmp, !tmp && ckpt_exists(done)};
        (*n)++;
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, ckpt_cmp_entry);
    return 0;
}

/* -------------------------------------------------------------- verify */

/* The first `bytes` bytes of path into buf; -1 if the file is shorter or unreadable. */
static int ckpt_read_head(const char* path, unsigned char* buf, size_t bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = ckpt_pread_full(fd, buf, bytes, 0);
    close(fd);
    return rc;
}

int ckpt_verify(const char* path, const GPT2Config* cfg, size_t P, CkptHeader* h, char* err, size_t errlen) {
    char f[CKPT_PATH + 16], e2[512];
    char text[CKPT_DONE_MAX];
    size_t n;
    CkptDone d;
    snprintf(f, sizeof f, "%s/DONE", path);
    if (ckpt_read_small(f, text, sizeof text, &n, err, errlen) != 0) return -1;
    if (ckpt_done_parse(text, n, &d, e2, sizeof e2) != 0) {
        ckpt_errf(err, errlen, "%s: %s", f, e2);
        return -1;
    }
    const char* names[2] = {"model.bin", "state.bin"};
    long long want_bytes[2] = {d.model_bytes, d.state_bytes};
    uint32_t want_crc[2] = {d.model_crc, d.state_crc};
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s/%s", path, names[i]);
        uint32_t crc;
        long long bytes;
        if (ckpt_crc32_file(f, &crc, &bytes, err, errlen) != 0) return -1;
        if (bytes != want_bytes[i]) {
            ckpt_errf(err, errlen, "%s: %lld bytes, but DONE records %lld: the file is %s", f, bytes,
                      want_bytes[i], bytes < want_bytes[i] ? "truncated" : "too long");
            return -1;
        }
        if (crc != want_crc[i]) {
            ckpt_errf(err, errlen, "%s: checksum mismatch (crc32 %08x, DONE records %08x): the file is corrupt",
                      f, crc, want_crc[i]);
            return -1;
        }
    }
    /* model.bin: llm.c header, fp32, the run's shape */
    snprintf(f, sizeof f, "%s/model.bin", path);
    unsigned char mh[GPT2_HEADER_INTS * 4];
    if (ckpt_read_head(f, mh, sizeof mh) != 0) {
        ckpt_errf(err, errlen, "%s: shorter than the %zu-byte llm.c header", f, sizeof mh);
        return -1;
    }
    if (ckpt_model_header_check(mh, cfg, e2, sizeof e2) != 0) {
        ckpt_errf(err, errlen, "%s: %s", f, e2);
        return -1;
    }
    if (d.model_bytes != ckpt_model_bytes(P)) {
        ckpt_errf(err, errlen, "%s: %lld bytes, but the model shape needs %lld", f, d.model_bytes,
                  ckpt_model_bytes(P));
        return -1;
    }
    /* state.bin */
    snprintf(f, sizeof f, "%s/state.bin", path);
    unsigned char sh[CKPT_HEADER_BYTES];
    if (ckpt_read_head(f, sh, sizeof sh) != 0) {
        ckpt_errf(err, errlen, "%s: truncated: shorter than the %d-byte header", f, CKPT_HEADER_BYTES);
        return -1;
    }
    if (ckpt_header_decode(sh, sizeof sh, h, e2, sizeof e2) != 0 ||
        ckpt_shape_check(&h->cfg, cfg, e2, sizeof e2) != 0) {
        ckpt_errf(err, errlen, "%s: %s", f, e2);
        return -1;
    }
    if (h->num_parameters != P) {
        ckpt_errf(err, errlen, "%s: holds %llu parameters, but the run has %zu", f,
                  (unsigned long long)h->num_parameters, P);
        return -1;
    }
    if (d.state_bytes != ckpt_state_bytes(P)) {
        ckpt_errf(err, errlen, "%s: %lld bytes, but %zu parameters need %lld: the file is %s", f, d.state_bytes,
                  P, ckpt_state_bytes(P), d.state_bytes < ckpt_state_bytes(P) ? "truncated" : "too long");
        return -1;
    }
    if (h->progress.step != d.step) {
        ckpt_errf(err, errlen, "%s: header step %d differs from DONE's step %d", f, h->progress.step, d.step);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------- state I/O */

int ckpt_read_state(const char* path, Backend* be, size_t P, const CkptSpan* spans, int nspans, float* master,
                    float* m, float* v, char* err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ckpt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    static const char* what[3] = {"master weights", "AdamW m", "AdamW v"};
    float* arrays[3] = {master, m, v};
    float* buf = xmalloc(CKPT_CHUNK * sizeof(float));
    int rc = 0;
    for (int s = 0; s < nspans && rc == 0; s++) {
        const CkptSpan* sp = &spans[s];
        if (sp->canon_off + sp->len > P) {
            ckpt_errf(err, errlen, "%s: range [%zu, +%zu) is outside the %zu parameters", path, sp->canon_off,
                      sp->len, P);
            rc = -1;
            break;
        }
        for (int a = 0; a < 3 && rc == 0; a++) {
            for (size_t k = 0; k < sp->len && rc == 0; k += CKPT_CHUNK) {
                size_t cnt = sp->len - k < CKPT_CHUNK ? sp->len - k : CKPT_CHUNK;
                if (ckpt_pread_full(fd, buf, cnt * 4, ckpt_state_offset(P, a, sp->canon_off + k)) != 0) {
                    ckpt_errf(err, errlen, "%s: %s", path, errno ? strerror(errno) : "truncated");
                    rc = -1;
                    break;
                }
                for (size_t i = 0; i < cnt; i++)
                    if (!isfinite(buf[i]) || (a == 2 && buf[i] < 0)) {
                        ckpt_errf(err, errlen, "%s: invalid %s value %g at parameter element %zu", path,
                                  what[a], (double)buf[i], sp->canon_off + k + i);
                        rc = -1;
                        break;
                    }
                if (rc) break;
                be->to_device(be, arrays[a] + sp->state_off + k, buf, cnt * 4);
                be->synchronize(be);
            }
        }
    }
    free(buf);
    close(fd);
    return rc;
}

int ckpt_write_state(const char* path, Backend* be, size_t P, const unsigned char* header,
                     const CkptSpan* spans, int nspans, const float* master, const float* m, const float* v,
                     char* err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        ckpt_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    if (header && ckpt_pwrite_full(fd, header, CKPT_HEADER_BYTES, 0) != 0) rc = -1;
    const float* arrays[3] = {master, m, v};
    float* buf = xmalloc(CKPT_CHUNK * sizeof(float));
    for (int s = 0; s < nspans && rc == 0; s++)
        for (int a = 0; a < 3 && rc == 0; a++)
            for (size_t k = 0; k < spans[s].len; k += CKPT_CHUNK) {
                size_t cnt = spans[s].len - k < CKPT_CHUNK ? spans[s].len - k : CKPT_CHUNK;
                be->to_host(be, buf, arrays[a] + spans[s].state_off + k, cnt * 4);
                if (ckpt_pwrite_full(fd, buf, cnt * 4, ckpt_state_offset(P, a, spans[s].canon_off + k)) != 0) {
                    rc = -1;
                    break;
                }
            }
    free(buf);
    if (rc == 0 && fsync(fd) != 0) rc = -1;
    if (rc != 0) ckpt_errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0) {
        ckpt_errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}
