/* checkpoint/checkpoint.c — owns the checkpoint format, its parallel writer
 * and reader, atomic saving, CRC-32 checksums, finding/keeping checkpoints
 * and the start-up checks of --output_dir. See checkpoint.h for the format
 * and the protocol. */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "checkpoint.c writes fp32 arrays in host order and assumes a little-endian host"
#endif

#define CKPT_PATH 4096
#define CKPT_CHUNK ((size_t)1 << 20)   /* elements per staging chunk (4 MB) */
#define CKPT_DONE_MAX 4096             /* DONE is a few lines; anything longer is corrupt */

/* state.bin header slots (uint64, little-endian). Signed values are stored
 * as int64 two's complement, floats as their IEEE bits. */
enum {
    CKPT_H_MAGIC = 0, CKPT_H_VERSION, CKPT_H_HEADER_BYTES, CKPT_H_NUM_PARAMETERS,
    CKPT_H_STEP, CKPT_H_NEXT_ROW, CKPT_H_OPT_T, CKPT_H_BAD_STREAK,
    CKPT_H_MAXT, CKPT_H_V, CKPT_H_VP, CKPT_H_L, CKPT_H_NH, CKPT_H_C,
    CKPT_H_SEQ_LEN, CKPT_H_SEED, CKPT_H_SHUFFLE, CKPT_H_TRAIN_ROWS,
    CKPT_H_TOTAL_BATCH, CKPT_H_BATCH, CKPT_H_WORLD, CKPT_H_ZERO_STAGE, CKPT_H_NUM_ITERATIONS,
    CKPT_H_LR_SCHEDULE, CKPT_H_WARMUP, CKPT_H_LR, CKPT_H_LR_DECAY_FRAC, CKPT_H_WEIGHT_DECAY,
    CKPT_H_BETA1, CKPT_H_BETA2, CKPT_H_EPS, CKPT_H_GRAD_CLIP, CKPT_H_DTYPE,
    CKPT_H_NSLOTS
};

static void ckpt_errf(char* err, size_t errlen, const char* fmt, ...) PRINTF_LIKE(3, 4);
static void ckpt_errf(char* err, size_t errlen, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ CRC-32 */

typedef uint32_t CkptCrcTable[8][256];

static void ckpt_crc_tables(CkptCrcTable t) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
}

static uint32_t ckpt_le32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* slicing-by-8 */
static uint32_t ckpt_crc_update(const CkptCrcTable t, uint32_t crc, const unsigned char* p, size_t n) {
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t one = ckpt_le32(p) ^ c, two = ckpt_le32(p + 4);
        c = t[7][one & 0xff] ^ t[6][(one >> 8) & 0xff] ^ t[5][(one >> 16) & 0xff] ^ t[4][one >> 24] ^
            t[3][two & 0xff] ^ t[2][(two >> 8) & 0xff] ^ t[1][(two >> 16) & 0xff] ^ t[0][two >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

uint32_t ckpt_crc32(uint32_t crc, const void* data, size_t n) {
    CkptCrcTable t;
    ckpt_crc_tables(t);
    return ckpt_crc_update(t, crc, (const unsigned char*)data, n);
}

/* ------------------------------------------------------------- file I/O */

static int ckpt_pread_full(int fd, void* buf, size_t bytes, long long off) {
    char* p = buf;
    while (bytes > 0) {
        ssize_t r = pread(fd, p, bytes, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) { errno = 0; return -1; }   /* end of file: truncated */
        p += r;
        bytes -= (size_t)r;
        off += r;
    }
    return 0;
}

static int ckpt_pwrite_full(int fd, const void* buf, size_t bytes, long long off) {
    const char* p = buf;
    while (bytes > 0) {
        ssize_t r = pwrite(fd, p, bytes, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) { errno = ENOSPC; return -1; }
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
    CkptCrcTable t;
    ckpt_crc_tables(t);
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
        c = ckpt_crc_update(t, c, buf, (size_t)r);
        total += r;
    }
    free(buf);
    close(fd);
    *crc = c;
    *bytes = total;
    return 0;
}

static int ckpt_fsync_path(const char* path, int is_dir, char* err, size_t errlen) {
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

static int ckpt_mkdir_p(const char* dir, char* err, size_t errlen) {
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

/* Removes a checkpoint directory (flat: files only). DONE goes first, so an
 * interrupted removal leaves an incomplete directory, never a damaged one
 * that still looks complete. */
static int ckpt_remove_dir(const char* path, char* err, size_t errlen) {
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

static int ckpt_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* -------------------------------------------------- listing checkpoints */

typedef struct {
    int step;
    int tmp;        /* name ends in .tmp */
    int complete;   /* not tmp, and DONE exists */
} CkptEntry;

/* "ckpt_" + at least 8 digits [+ ".tmp"]: the step, or -1. */
static int ckpt_parse_name(const char* name, int* tmp) {
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
    if (*p == '\0') { *tmp = 0; return (int)v; }
    if (strcmp(p, ".tmp") == 0) { *tmp = 1; return (int)v; }
    return -1;
}

static void ckpt_dir_name(char* out, size_t n, const char* dir, int step, int tmp) {
    if (snprintf(out, n, "%s/ckpt_%08d%s", dir, step, tmp ? ".tmp" : "") >= (int)n)
        fatal("--output_dir %s: path too long", dir);
}

static int ckpt_cmp_entry(const void* a, const void* b) {
    const CkptEntry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->tmp - y->tmp;
}

/* The checkpoint directories in dir, sorted by step. -1 + err if dir cannot be listed. */
static int ckpt_scan(const char* dir, CkptEntry** out, int* n, char* err, size_t errlen) {
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

/* ------------------------------------------------------------ the header */

static void ckpt_put(unsigned char* out, int slot, uint64_t v) {
    for (int b = 0; b < 8; b++) out[slot * 8 + b] = (unsigned char)(v >> (8 * b));
}
static uint64_t ckpt_get(const unsigned char* in, int slot) {
    uint64_t v = 0;
    for (int b = 0; b < 8; b++) v |= (uint64_t)in[slot * 8 + b] << (8 * b);
    return v;
}
static uint64_t ckpt_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float ckpt_bitsf(uint64_t v) {
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t ckpt_sll(long long v) { return (uint64_t)(int64_t)v; }

void ckpt_header_encode(const CkptHeader* h, unsigned char out[CKPT_HEADER_BYTES]) {
    memset(out, 0, CKPT_HEADER_BYTES);
    ckpt_put(out, CKPT_H_MAGIC, CKPT_MAGIC);
    ckpt_put(out, CKPT_H_VERSION, CKPT_VERSION);
    ckpt_put(out, CKPT_H_HEADER_BYTES, CKPT_HEADER_BYTES);
    ckpt_put(out, CKPT_H_NUM_PARAMETERS, h->num_parameters);
    ckpt_put(out, CKPT_H_STEP, ckpt_sll(h->progress.step));
    ckpt_put(out, CKPT_H_NEXT_ROW, h->progress.next_row);
    ckpt_put(out, CKPT_H_OPT_T, ckpt_sll(h->opt_t));
    ckpt_put(out, CKPT_H_BAD_STREAK, ckpt_sll(h->progress.bad_streak));
    ckpt_put(out, CKPT_H_MAXT, ckpt_sll(h->cfg.max_seq_len));
    ckpt_put(out, CKPT_H_V, ckpt_sll(h->cfg.vocab_size));
    ckpt_put(out, CKPT_H_VP, ckpt_sll(h->cfg.padded_vocab_size));
    ckpt_put(out, CKPT_H_L, ckpt_sll(h->cfg.num_layers));
    ckpt_put(out, CKPT_H_NH, ckpt_sll(h->cfg.num_heads));
    ckpt_put(out, CKPT_H_C, ckpt_sll(h->cfg.channels));
    const CkptHparams* p = &h->hp;
    ckpt_put(out, CKPT_H_SEQ_LEN, ckpt_sll(p->sequence_length));
    ckpt_put(out, CKPT_H_SEED, ckpt_sll(p->seed));
    ckpt_put(out, CKPT_H_SHUFFLE, ckpt_sll(p->shuffle));
    ckpt_put(out, CKPT_H_TRAIN_ROWS, p->train_rows);
    ckpt_put(out, CKPT_H_TOTAL_BATCH, ckpt_sll(p->total_batch_size));
    ckpt_put(out, CKPT_H_BATCH, ckpt_sll(p->batch_size));
    ckpt_put(out, CKPT_H_WORLD, ckpt_sll(p->world));
    ckpt_put(out, CKPT_H_ZERO_STAGE, ckpt_sll(p->zero_stage));
    ckpt_put(out, CKPT_H_NUM_ITERATIONS, ckpt_sll(p->num_iterations));
    ckpt_put(out, CKPT_H_LR_SCHEDULE, ckpt_sll(p->lr_schedule));
    ckpt_put(out, CKPT_H_WARMUP, ckpt_sll(p->warmup_iters));
    ckpt_put(out, CKPT_H_LR, ckpt_fbits(p->learning_rate));
    ckpt_put(out, CKPT_H_LR_DECAY_FRAC, ckpt_fbits(p->lr_decay_frac));
    ckpt_put(out, CKPT_H_WEIGHT_DECAY, ckpt_fbits(p->weight_decay));
    ckpt_put(out, CKPT_H_BETA1, ckpt_fbits(p->beta1));
    ckpt_put(out, CKPT_H_BETA2, ckpt_fbits(p->beta2));
    ckpt_put(out, CKPT_H_EPS, ckpt_fbits(p->eps));
    ckpt_put(out, CKPT_H_GRAD_CLIP, ckpt_fbits(p->grad_clip));
    ckpt_put(out, CKPT_H_DTYPE, ckpt_sll(h->dtype));
}

/* a signed slot that must fit an int in [lo, hi] */
static int ckpt_get_int(const unsigned char* in, int slot, long long lo, long long hi, int* out) {
    int64_t v = (int64_t)ckpt_get(in, slot);
    if (v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static size_t ckpt_num_parameters(const GPT2Config* cfg) {
    GPT2 tmp;
    memset(&tmp, 0, sizeof tmp);
    int n;
    free(gpt2_describe(&tmp, cfg, &n));
    free(tmp.tensors);
    free(tmp.layout_to_tensor);
    return tmp.num_parameters;
}

int ckpt_header_decode(const unsigned char* in, size_t n, CkptHeader* h, char* err, size_t errlen) {
    memset(h, 0, sizeof *h);
    if (n < CKPT_HEADER_BYTES) {
        ckpt_errf(err, errlen, "truncated: %zu bytes, shorter than the %d-byte header", n, CKPT_HEADER_BYTES);
        return -1;
    }
    if (ckpt_get(in, CKPT_H_MAGIC) != CKPT_MAGIC) {
        ckpt_errf(err, errlen, "wrong magic number %llu (expected %d): not a checkpoint state file",
                  (unsigned long long)ckpt_get(in, CKPT_H_MAGIC), CKPT_MAGIC);
        return -1;
    }
    if (ckpt_get(in, CKPT_H_VERSION) != CKPT_VERSION || ckpt_get(in, CKPT_H_HEADER_BYTES) != CKPT_HEADER_BYTES) {
        ckpt_errf(err, errlen, "unsupported checkpoint version %llu (header %llu bytes; expected version %d, %d bytes)",
                  (unsigned long long)ckpt_get(in, CKPT_H_VERSION),
                  (unsigned long long)ckpt_get(in, CKPT_H_HEADER_BYTES), CKPT_VERSION, CKPT_HEADER_BYTES);
        return -1;
    }
    h->version = CKPT_VERSION;
    const long long IMAX = 2147483647LL;
    GPT2Config* c = &h->cfg;
    CkptHparams* p = &h->hp;
    int bad = 0;
    bad |= ckpt_get_int(in, CKPT_H_MAXT, 1, 1 << 20, &c->max_seq_len);
    bad |= ckpt_get_int(in, CKPT_H_V, 1, 1 << 24, &c->vocab_size);
    bad |= ckpt_get_int(in, CKPT_H_VP, 1, 1 << 24, &c->padded_vocab_size);
    bad |= ckpt_get_int(in, CKPT_H_L, 1, 1024, &c->num_layers);
    bad |= ckpt_get_int(in, CKPT_H_NH, 1, 1 << 16, &c->num_heads);
    bad |= ckpt_get_int(in, CKPT_H_C, 1, 1 << 16, &c->channels);
    if (bad || c->padded_vocab_size < c->vocab_size || c->channels % c->num_heads != 0) {
        ckpt_errf(err, errlen, "invalid model shape in the header");
        return -1;
    }
    h->num_parameters = ckpt_get(in, CKPT_H_NUM_PARAMETERS);
    if (h->num_parameters != ckpt_num_parameters(c)) {
        ckpt_errf(err, errlen, "header says %llu parameters, but its model shape has %zu",
                  (unsigned long long)h->num_parameters, ckpt_num_parameters(c));
        return -1;
    }
    bad |= ckpt_get_int(in, CKPT_H_STEP, 0, IMAX, &h->progress.step);
    bad |= ckpt_get_int(in, CKPT_H_OPT_T, 0, IMAX, &h->opt_t);
    bad |= ckpt_get_int(in, CKPT_H_BAD_STREAK, 0, IMAX, &h->progress.bad_streak);
    h->progress.next_row = ckpt_get(in, CKPT_H_NEXT_ROW);
    bad |= ckpt_get_int(in, CKPT_H_SEQ_LEN, 1, c->max_seq_len, &p->sequence_length);
    bad |= ckpt_get_int(in, CKPT_H_SEED, -IMAX - 1, IMAX, &p->seed);
    bad |= ckpt_get_int(in, CKPT_H_SHUFFLE, 0, 1, &p->shuffle);
    p->train_rows = ckpt_get(in, CKPT_H_TRAIN_ROWS);
    p->total_batch_size = (long long)(int64_t)ckpt_get(in, CKPT_H_TOTAL_BATCH);
    bad |= ckpt_get_int(in, CKPT_H_BATCH, 1, IMAX, &p->batch_size);
    bad |= ckpt_get_int(in, CKPT_H_WORLD, 1, IMAX, &p->world);
    bad |= ckpt_get_int(in, CKPT_H_ZERO_STAGE, 0, 3, &p->zero_stage);   /* informational */
    bad |= ckpt_get_int(in, CKPT_H_NUM_ITERATIONS, 0, IMAX, &p->num_iterations);
    bad |= ckpt_get_int(in, CKPT_H_LR_SCHEDULE, 0, 2, &p->lr_schedule);
    bad |= ckpt_get_int(in, CKPT_H_WARMUP, 0, IMAX, &p->warmup_iters);
    bad |= ckpt_get_int(in, CKPT_H_DTYPE, 0, 1, &h->dtype);
    p->learning_rate = ckpt_bitsf(ckpt_get(in, CKPT_H_LR));
    p->lr_decay_frac = ckpt_bitsf(ckpt_get(in, CKPT_H_LR_DECAY_FRAC));
    p->weight_decay = ckpt_bitsf(ckpt_get(in, CKPT_H_WEIGHT_DECAY));
    p->beta1 = ckpt_bitsf(ckpt_get(in, CKPT_H_BETA1));
    p->beta2 = ckpt_bitsf(ckpt_get(in, CKPT_H_BETA2));
    p->eps = ckpt_bitsf(ckpt_get(in, CKPT_H_EPS));
    p->grad_clip = ckpt_bitsf(ckpt_get(in, CKPT_H_GRAD_CLIP));
    float fl[7] = {p->learning_rate, p->lr_decay_frac, p->weight_decay, p->beta1, p->beta2, p->eps, p->grad_clip};
    for (int i = 0; i < 7; i++) bad |= !isfinite(fl[i]);
    if (bad || p->total_batch_size <= 0 || p->train_rows == 0 || h->opt_t > h->progress.step ||
        h->progress.bad_streak > h->progress.step) {
        ckpt_errf(err, errlen, "invalid training state in the header (step %d, AdamW t %d, total batch %lld)",
                  h->progress.step, h->opt_t, p->total_batch_size);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ DONE */

/* Strict reader of DONE's text: each call consumes one expected token. */
typedef struct {
    const char* p;
    const char* end;
} CkptText;

static int ckpt_take(CkptText* t, const char* lit) {
    size_t n = strlen(lit);
    if ((size_t)(t->end - t->p) < n || memcmp(t->p, lit, n) != 0) return -1;
    t->p += n;
    return 0;
}

/* 1 to 18 decimal digits */
static int ckpt_take_dec(CkptText* t, long long* v) {
    int nd = 0;
    *v = 0;
    while (t->p < t->end && *t->p >= '0' && *t->p <= '9') {
        if (++nd > 18) return -1;
        *v = *v * 10 + (*t->p++ - '0');
    }
    return nd ? 0 : -1;
}

/* exactly 8 lower-case hex digits */
static int ckpt_take_hex8(CkptText* t, uint32_t* v) {
    *v = 0;
    for (int i = 0; i < 8; i++) {
        if (t->p >= t->end) return -1;
        char ch = *t->p++;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return -1;
        *v = (*v << 4) | (uint32_t)d;
    }
    return 0;
}

int ckpt_done_parse(const char* text, size_t n, CkptDone* d, char* err, size_t errlen) {
    memset(d, 0, sizeof *d);
    CkptText t = {text, text + n};
    long long step = -1;
    int bad = n >= CKPT_DONE_MAX;
    bad = bad || ckpt_take(&t, "gpt2-checkpoint v1\nstep ") || ckpt_take_dec(&t, &step) || step > 2147483647LL;
    bad = bad || ckpt_take(&t, "\nmodel.bin ") || ckpt_take_dec(&t, &d->model_bytes) ||
          ckpt_take(&t, " crc32 ") || ckpt_take_hex8(&t, &d->model_crc);
    bad = bad || ckpt_take(&t, "\nstate.bin ") || ckpt_take_dec(&t, &d->state_bytes) ||
          ckpt_take(&t, " crc32 ") || ckpt_take_hex8(&t, &d->state_crc);
    bad = bad || ckpt_take(&t, "\n") || t.p != t.end;
    if (bad) {
        memset(d, 0, sizeof *d);
        ckpt_errf(err, errlen, "malformed completion marker (expected the lines 'gpt2-checkpoint v1', "
                  "'step S', 'model.bin BYTES crc32 HEX8', 'state.bin BYTES crc32 HEX8')");
        return -1;
    }
    d->step = (int)step;
    return 0;
}

static int ckpt_read_small(const char* path, char* buf, size_t cap, size_t* n, char* err, size_t errlen) {
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

/* -------------------------------------------------------------- verify */

int ckpt_verify(const char* path, const GPT2Config* cfg, size_t P, CkptHeader* h, char* err,
                size_t errlen) {
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
    unsigned char mh[1024];
    int fd = open(f, O_RDONLY);
    if (fd < 0 || ckpt_pread_full(fd, mh, sizeof mh, 0) != 0) {
        ckpt_errf(err, errlen, "%s: shorter than the 1024-byte llm.c header", f);
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    int32_t hv[8];
    for (int i = 0; i < 8; i++) hv[i] = (int32_t)ckpt_le32(mh + 4 * i);
    if (hv[0] != 20240326 || hv[1] != 3) {
        ckpt_errf(err, errlen, "%s: not an fp32 llm.c model file (magic %d, version %d)", f, hv[0], hv[1]);
        return -1;
    }
    if (hv[2] != cfg->max_seq_len || hv[3] != cfg->vocab_size || hv[4] != cfg->num_layers ||
        hv[5] != cfg->num_heads || hv[6] != cfg->channels || hv[7] != cfg->padded_vocab_size) {
        ckpt_errf(err, errlen, "%s: the checkpoint's model shape (L %d, NH %d, C %d, maxT %d, V %d) differs "
                  "from the run's (L %d, NH %d, C %d, maxT %d, V %d)", f, hv[4], hv[5], hv[6], hv[2], hv[3],
                  cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size);
        return -1;
    }
    if (d.model_bytes != 1024 + 4 * (long long)P) {
        ckpt_errf(err, errlen, "%s: %lld bytes, but the model shape needs %lld", f, d.model_bytes,
                  1024 + 4 * (long long)P);
        return -1;
    }
    /* state.bin */
    snprintf(f, sizeof f, "%s/state.bin", path);
    unsigned char sh[CKPT_HEADER_BYTES];
    fd = open(f, O_RDONLY);
    if (fd < 0 || ckpt_pread_full(fd, sh, sizeof sh, 0) != 0) {
        ckpt_errf(err, errlen, "%s: truncated: shorter than the %d-byte header", f, CKPT_HEADER_BYTES);
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    if (ckpt_header_decode(sh, sizeof sh, h, e2, sizeof e2) != 0) {
        ckpt_errf(err, errlen, "%s: %s", f, e2);
        return -1;
    }
    const GPT2Config* hc = &h->cfg;
    if (hc->max_seq_len != cfg->max_seq_len || hc->vocab_size != cfg->vocab_size ||
        hc->padded_vocab_size != cfg->padded_vocab_size || hc->num_layers != cfg->num_layers ||
        hc->num_heads != cfg->num_heads || hc->channels != cfg->channels) {
        ckpt_errf(err, errlen, "%s: the checkpoint's model shape (L %d, NH %d, C %d, maxT %d, V %d) differs "
                  "from the run's (L %d, NH %d, C %d, maxT %d, V %d)", f, hc->num_layers, hc->num_heads,
                  hc->channels, hc->max_seq_len, hc->vocab_size, cfg->num_layers, cfg->num_heads,
                  cfg->channels, cfg->max_seq_len, cfg->vocab_size);
        return -1;
    }
    if (h->num_parameters != P) {
        ckpt_errf(err, errlen, "%s: holds %llu parameters, but the run has %zu", f,
                  (unsigned long long)h->num_parameters, P);
        return -1;
    }
    if (d.state_bytes != CKPT_HEADER_BYTES + 12 * (long long)P) {
        ckpt_errf(err, errlen, "%s: %lld bytes, but %zu parameters need %lld: the file is %s", f, d.state_bytes,
                  P, CKPT_HEADER_BYTES + 12 * (long long)P,
                  d.state_bytes < CKPT_HEADER_BYTES + 12 * (long long)P ? "truncated" : "too long");
        return -1;
    }
    if (h->progress.step != d.step) {
        ckpt_errf(err, errlen, "%s: header step %d differs from DONE's step %d", f, h->progress.step, d.step);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------- span map */

CkptSpan* ckpt_spans(const Layout* L, const GPT2* m, const OptPiece* held, int nheld,
                     const OptPiece* want, int nwant, int* n) {
    CkptSpan* out = xmalloc((size_t)(nwant > 0 ? nwant : 1) * sizeof *out);
    for (int i = 0; i < nwant; i++) {
        const OptPiece* w = &want[i];
        /* the parameter holding w: the last with offset <= buf_off (params are in buffer order) */
        int lo = 0, hi = L->nparams - 1;
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (L->params[mid].offset <= w->buf_off) lo = mid;
            else hi = mid - 1;
        }
        const LayoutParam* p = &L->params[lo];
        /* the held piece containing w (held pieces are in buffer order) */
        int a = 0, b = nheld - 1;
        while (a < b) {
            int mid = a + (b - a + 1) / 2;
            if (held[mid].buf_off <= w->buf_off) a = mid;
            else b = mid - 1;
        }
        if (nheld == 0 || w->len == 0 || p->offset > w->buf_off || w->buf_off + w->len > p->offset + p->numel ||
            held[a].buf_off > w->buf_off || w->buf_off + w->len > held[a].buf_off + held[a].len)
            fatal("checkpoint: internal error: buffer range [%zu, +%zu) is not inside one parameter "
                  "and one optimizer piece", w->buf_off, w->len);
        const GPT2Tensor* t = &m->tensors[m->layout_to_tensor[lo]];
        /* (a row chunk of wte starts spec_off elements into the tensor) */
        out[i].canon_off = t->file_off + p->spec_off + (w->buf_off - p->offset);
        out[i].state_off = held[a].state_off + (w->buf_off - held[a].buf_off);
        out[i].len = w->len;
    }
    *n = nwant;
    return out;
}

/* ---------------------------------------------------------- state I/O */

static long long ckpt_array_off(size_t P, int a, size_t canon) {
    return CKPT_HEADER_BYTES + 4LL * ((long long)a * (long long)P + (long long)canon);
}

int ckpt_read_state(const char* path, Backend* be, size_t P, const CkptSpan* spans, int nspans,
                    float* master, float* m, float* v, char* err, size_t errlen) {
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
            ckpt_errf(err, errlen, "%s: range [%zu, +%zu) is outside the %zu parameters", path,
                      sp->canon_off, sp->len, P);
            rc = -1;
            break;
        }
        for (int a = 0; a < 3 && rc == 0; a++) {
            for (size_t k = 0; k < sp->len && rc == 0; k += CKPT_CHUNK) {
                size_t cnt = sp->len - k < CKPT_CHUNK ? sp->len - k : CKPT_CHUNK;
                if (ckpt_pread_full(fd, buf, cnt * 4, ckpt_array_off(P, a, sp->canon_off + k)) != 0) {
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
                            const CkptSpan* spans, int nspans, const float* master, const float* m,
                            const float* v, char* err, size_t errlen) {
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
                if (ckpt_pwrite_full(fd, buf, cnt * 4, ckpt_array_off(P, a, spans[s].canon_off + k)) != 0) {
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
    comm_barrier(comm);   /* never completes: rank 0's abort ends this rank (or the timeout does) */
    exit(1);
}

/* What rank 0 found, shared with every rank. */
typedef struct {
    int status;                 /* 0 resume from path, 1 nothing to resume, -1 error */
    char msg[1024];
    char path[CKPT_PATH];
    unsigned char header[CKPT_HEADER_BYTES];
} CkptVerdict;

/* ------------------------------------------------------------- trainer */

void ckpt_init(Checkpointer* c, Comm* comm, GPT2* model, const Layout* L, Optimizer* opt,
               const char* dir, int every, int keep, const CkptHparams* hp) {
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->model = model;
    c->opt = opt;
    c->dir = dir ? dir : "";
    c->every = every;
    c->keep = keep;
    c->hp = *hp;
    c->last_step = -1;
    int nown;
    OptPiece* own = layout_opt_pieces(L, comm->rank, &nown);
    c->own = ckpt_spans(L, model, opt->pieces, opt->npieces, own, nown, &c->nown);
    free(own);
    c->held = ckpt_spans(L, model, opt->pieces, opt->npieces, opt->pieces, opt->npieces, &c->nheld);
}

void ckpt_free(Checkpointer* c) {
    free(c->own);
    free(c->held);
    memset(c, 0, sizeof *c);
}

int ckpt_due(const Checkpointer* c, int step_done) {
    return c->every > 0 && step_done > 0 && step_done % c->every == 0 && step_done != c->last_step;
}

static size_t ckpt_bytes(size_t P) { return 2 * 1024 + 16 * P; }

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
        struct statvfs sv;
        size_t need = ckpt_bytes(c->model->num_parameters);
        if (statvfs(c->dir, &sv) == 0) {
            unsigned long long avail = (unsigned long long)sv.f_bavail * sv.f_frsize;
            if (avail < need) {
                ckpt_errf(err, errlen, "--output_dir %s: %.1f MB free on its file system, but one checkpoint "
                          "needs %.1f MB", c->dir, avail / 1048576.0, need / 1048576.0);
                return -1;
            }
        }
    }
    return 0;
}

/* rank 0: settings that must agree; prints those that changed. */
static int ckpt_check_hparams(const CkptHeader* h, const CkptHparams* now, char* err, size_t errlen) {
    const CkptHparams* was = &h->hp;
    if (was->sequence_length != now->sequence_length) {
        ckpt_errf(err, errlen, "--sequence_length %d differs from the checkpoint's %d (the data rows depend on it)",
                  now->sequence_length, was->sequence_length);
        return -1;
    }
    if (was->seed != now->seed) {
        ckpt_errf(err, errlen, "--seed %d differs from the checkpoint's %d (the data order and the rounding "
                  "depend on it)", now->seed, was->seed);
        return -1;
    }
    if (was->shuffle != now->shuffle) {
        ckpt_errf(err, errlen, "--shuffle %d differs from the checkpoint's %d (the data order depends on it)",
                  now->shuffle, was->shuffle);
        return -1;
    }
    if (was->train_rows != now->train_rows) {
        ckpt_errf(err, errlen, "--input_bin: the training data holds %llu rows, but the checkpoint's run had "
                  "%llu: the data order would change (resume on the same data)",
                  (unsigned long long)now->train_rows, (unsigned long long)was->train_rows);
        return -1;
    }
    if (now->num_iterations < h->progress.step) {
        ckpt_errf(err, errlen, "--num_iterations %d is below the checkpoint's step %d", now->num_iterations,
                  h->progress.step);
        return -1;
    }
#define NOTE_I(name, field)                                                                         \
    if (was->field != now->field)                                                                   \
        printf("resume: %s changes from %lld (checkpoint) to %lld\n", name, (long long)was->field,   \
               (long long)now->field)
#define NOTE_F(name, field)                                                                         \
    if (was->field != now->field)                                                                   \
        printf("resume: %s changes from %g (checkpoint) to %g\n", name, (double)was->field,          \
               (double)now->field)
    NOTE_I("ranks", world);
    NOTE_I("--zero_stage", zero_stage);
    NOTE_I("--batch_size", batch_size);
    NOTE_I("--total_batch_size", total_batch_size);
    NOTE_I("--num_iterations", num_iterations);
    NOTE_I("--lr_schedule", lr_schedule);
    NOTE_I("--warmup_iters", warmup_iters);
    NOTE_F("--learning_rate", learning_rate);
    NOTE_F("--learning_rate_decay_frac", lr_decay_frac);
    NOTE_F("--weight_decay", weight_decay);
    NOTE_F("--beta1", beta1);
    NOTE_F("--beta2", beta2);
    NOTE_F("--eps", eps);
    NOTE_F("--grad_clip", grad_clip);
#undef NOTE_I
#undef NOTE_F
    return 0;
}

/* rank 0: the start-up verdict. */
static void ckpt_decide(const Checkpointer* c, int resume, CkptVerdict* v) {
    char* err = v->msg;
    size_t errlen = sizeof v->msg;
    v->status = 1;
    if (ckpt_probe_dir(c, err, errlen) != 0) { v->status = -1; return; }
    CkptEntry* e;
    int n;
    if (ckpt_scan(c->dir, &e, &n, err, errlen) != 0) { v->status = -1; return; }
    int latest = -1;
    for (int i = 0; i < n; i++)
        if (e[i].complete) latest = i;
    if (!resume) {
        if (c->every > 0 && latest >= 0) {
            ckpt_errf(err, errlen, "--output_dir %s already holds checkpoints (newest ckpt_%08d): pass --resume "
                      "to continue from it, or choose another --output_dir", c->dir, e[latest].step);
            v->status = -1;
        }
        free(e);
        return;
    }
    for (int i = 0; i < n; i++)
        if (!e[i].complete && (latest < 0 || e[i].step > e[latest].step))
            printf("resume: skipping the incomplete checkpoint %s/ckpt_%08d%s (its save did not finish)\n", c->dir,
                   e[i].step, e[i].tmp ? ".tmp" : "");
    if (latest < 0) {
        free(e);
        return;
    }
    int step = e[latest].step;
    free(e);
    ckpt_dir_name(v->path, sizeof v->path, c->dir, step, 0);
    CkptHeader h;
    if (ckpt_verify(v->path, &c->model->cfg, c->model->num_parameters, &h, err, errlen) != 0 ||
        ckpt_check_hparams(&h, &c->hp, err, errlen) != 0) {
        v->status = -1;
        return;
    }
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
    gpt2_load(c->model, f);
    snprintf(f, sizeof f, "%s/state.bin", v->path);
    Optimizer* o = c->opt;
    int bad = ckpt_read_state(f, o->be, c->model->num_parameters, c->held, c->nheld, o->master, o->m, o->v,
                              err, sizeof err);
    if (comm_allreduce_host_max_int(comm, bad ? 1 : 0) != 0)
        ckpt_fail_all(comm, "%s", bad ? err : "resume: reading the checkpoint failed on another rank (see its message)");
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

static void ckpt_write_done(const char* path, int step, long long mb, uint32_t mc, long long sb, uint32_t sc) {
    char f[CKPT_PATH + 16], t[CKPT_PATH + 16], text[512], err[1024];
    snprintf(f, sizeof f, "%s/DONE", path);
    snprintf(t, sizeof t, "%s/DONE.tmp", path);
    int len = snprintf(text, sizeof text, "gpt2-checkpoint v1\nstep %d\nmodel.bin %lld crc32 %08x\nstate.bin %lld crc32 %08x\n",
                       step, mb, mc, sb, sc);
    int fd = open(t, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ckpt_pwrite_full(fd, text, (size_t)len, 0) != 0 || fsync(fd) != 0)
        fatal("%s: write failed: %s", t, strerror(errno));
    close(fd);
    if (rename(t, f) != 0) fatal("cannot rename %s to %s: %s", t, f, strerror(errno));
    if (ckpt_fsync_path(path, 1, err, sizeof err) != 0) fatal("%s", err);
}

void ckpt_save(Checkpointer* c, const CkptProgress* p) {
    Comm* comm = c->comm;
    Optimizer* o = c->opt;
    const size_t P = c->model->num_parameters;
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

    /* 2. model.bin (rank 0) and every rank's ranges of state.bin */
    unsigned char header[CKPT_HEADER_BYTES];
    if (comm->rank == 0) {
        snprintf(f, sizeof f, "%s/model.bin", tmp);
        gpt2_save(c->model, f, 3);
        if (ckpt_fsync_path(f, 0, err, sizeof err) != 0) fatal("%s", err);
        CkptHeader h;
        memset(&h, 0, sizeof h);
        h.version = CKPT_VERSION;
        h.num_parameters = P;
        h.cfg = c->model->cfg;
        h.progress = *p;
        h.opt_t = o->t;
        h.dtype = (int)o->be->dtype;
        h.hp = c->hp;
        ckpt_header_encode(&h, header);
    }
    snprintf(f, sizeof f, "%s/state.bin", tmp);
    if (ckpt_write_state(f, o->be, P, comm->rank == 0 ? header : NULL, c->own, c->nown, o->master, o->m,
                         o->v, err, sizeof err) != 0)
        fatal("checkpoint: %s (the previous checkpoint is kept)", err);
    comm_barrier(comm);

    /* 3. rank 0: checksums, rename, DONE; 4. keep the newest K */
    if (comm->rank == 0) {
        uint32_t mc, sc;
        long long mb, sb;
        snprintf(f, sizeof f, "%s/model.bin", tmp);
        if (ckpt_crc32_file(f, &mc, &mb, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        snprintf(f, sizeof f, "%s/state.bin", tmp);
        if (ckpt_crc32_file(f, &sc, &sb, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        if (sb != CKPT_HEADER_BYTES + 12 * (long long)P)
            fatal("checkpoint: internal error: %s is %lld bytes, expected %lld", f, sb,
                  CKPT_HEADER_BYTES + 12 * (long long)P);
        if (ckpt_fsync_path(tmp, 1, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        if (ckpt_exists(fin) && ckpt_remove_dir(fin, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        if (rename(tmp, fin) != 0) fatal("checkpoint: cannot rename %s to %s: %s", tmp, fin, strerror(errno));
        if (ckpt_fsync_path(c->dir, 1, err, sizeof err) != 0) fatal("checkpoint: %s", err);
        ckpt_write_done(fin, p->step, mb, mc, sb, sc);
        ckpt_prune(c, p->step);
        printf("checkpoint: saved %s (%.1f MB) in %.2f s\n", fin, (double)(mb + sb) / 1048576.0,
               wall_time_s() - t0);
    }
    c->last_step = p->step;
}

/* ------------------------------------------------------------ log.jsonl */

static int ckpt_log_step(const char* line, int* step) {
    const char* s = strstr(line, "\"step\":");
    if (!s) return -1;
    char* end;
    long v = strtol(s + 7, &end, 10);
    if (end == s + 7) return -1;
    *step = (int)v;
    return 0;
}

int ckpt_log_trim(const char* path, int step, char* err, size_t errlen) {
    FILE* in = fopen(path, "rb");
    if (!in) return errno == ENOENT ? 0 : (ckpt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), -1);
    char tmp[CKPT_PATH + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* out = fopen(tmp, "wb");
    if (!out) {
        ckpt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        fclose(in);
        return -1;
    }
    char* line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, in)) > 0) {
        int s;
        if (ckpt_log_step(line, &s) == 0) {
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
        ckpt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
        return -1;
    }
    if (rename(tmp, path) != 0) {
        ckpt_errf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        return -1;
    }
    return 0;
}
