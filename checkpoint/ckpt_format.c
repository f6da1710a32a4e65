/* checkpoint/ckpt_format.c — owns the checkpoint format: the header's field
 * table and the encoder, decoder and resume checks it drives, DONE's text,
 * the canonical offsets of the optimizer state, CRC-32. No I/O. See
 * ckpt_format.h for the format. */
#define _GNU_SOURCE
#include "ckpt_format.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "the checkpoint format is little-endian and this code assumes a little-endian host"
#endif

void ckpt_errf(char* err, size_t errlen, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------ the fields */

#define IMAX 2147483647LL
#define IMIN (-IMAX - 1)

/* A row: the slot, the CkptHeader member (its C type picks the slot's
 * encoding; any other type does not compile), the printed name, the decode
 * range [lo, hi], the role on resume, and for MUST_MATCH the error (two %s:
 * the run's value, the checkpoint's). */
/* clang-format off */
#define CKPT_TYPE_OF(member) \
    _Generic(((CkptHeader*)0)->member, int: CKPT_I32, long long: CKPT_I64, uint64_t: CKPT_U64, float: CKPT_F32)
#define FIELD(slot, member, name, lo, hi, role, mismatch) \
    {slot, name, CKPT_TYPE_OF(member), offsetof(CkptHeader, member), lo, hi, CKPT_##role, mismatch}

/* In the order of the resume checks and of the printed changes; the slots are
 * explicit. Constraints between fields are code in ckpt_header_decode and
 * ckpt_header_check_resume. */
const CkptField ckpt_fields[] = {
    /*   slot  member                  name                          lo    hi           role */
    FIELD(3,  num_parameters,          "num_parameters",             0,    CKPT_NO_MAX, DERIVED, NULL),
    FIELD(4,  progress.step,           "step",                       0,    IMAX,        PROGRESS, NULL),
    FIELD(5,  progress.next_row,       "next_row",                   0,    CKPT_NO_MAX, PROGRESS, NULL),
    FIELD(6,  opt_t,                   "AdamW t",                    0,    IMAX,        PROGRESS, NULL),
    FIELD(7,  progress.bad_streak,     "bad_streak",                 0,    IMAX,        PROGRESS, NULL),
    FIELD(8,  cfg.max_seq_len,         "maxT",                       1,    1 << 20,     SHAPE, NULL),
    FIELD(9,  cfg.vocab_size,          "V",                          1,    1 << 24,     SHAPE, NULL),
    FIELD(10, cfg.padded_vocab_size,   "padded V",                   1,    1 << 24,     SHAPE, NULL),
    FIELD(11, cfg.num_layers,          "L",                          1,    1024,        SHAPE, NULL),
    FIELD(12, cfg.num_heads,           "NH",                         1,    1 << 16,     SHAPE, NULL),
    FIELD(13, cfg.channels,            "C",                          1,    1 << 16,     SHAPE, NULL),
    FIELD(14, hp.sequence_length,      "--sequence_length",          1,    IMAX,        MUST_MATCH,
          "--sequence_length %s differs from the checkpoint's %s (the data rows depend on it)"),
    FIELD(15, hp.seed,                 "--seed",                     IMIN, IMAX,        MUST_MATCH,
          "--seed %s differs from the checkpoint's %s (the data order and the rounding depend on it)"),
    FIELD(16, hp.shuffle,              "--shuffle",                  0,    1,           MUST_MATCH,
          "--shuffle %s differs from the checkpoint's %s (the data order depends on it)"),
    FIELD(17, hp.train_rows,           "training rows",              1,    CKPT_NO_MAX, MUST_MATCH,
          "--input_bin: the training data holds %s rows, but the checkpoint's run had %s: the data order "
          "would change (resume on the same data)"),
    FIELD(20, hp.world,                "ranks",                      1,    IMAX,        MAY_CHANGE, NULL),
    FIELD(21, hp.zero_stage,           "--zero_stage",               0,    3,           MAY_CHANGE, NULL),
    FIELD(19, hp.batch_size,           "--batch_size",               1,    IMAX,        MAY_CHANGE, NULL),
    FIELD(18, hp.total_batch_size,     "--total_batch_size",         1,    CKPT_NO_MAX, MAY_CHANGE, NULL),
    FIELD(22, hp.num_iterations,       "--num_iterations",           0,    IMAX,        MAY_CHANGE, NULL),
    FIELD(23, hp.lr_schedule,          "--lr_schedule",              0,    2,           MAY_CHANGE, NULL),
    FIELD(24, hp.warmup_iters,         "--warmup_iters",             0,    IMAX,        MAY_CHANGE, NULL),
    FIELD(25, hp.learning_rate,        "--learning_rate",            0,    0,           MAY_CHANGE, NULL),
    FIELD(26, hp.lr_decay_frac,        "--learning_rate_decay_frac", 0,    0,           MAY_CHANGE, NULL),
    FIELD(27, hp.weight_decay,         "--weight_decay",             0,    0,           MAY_CHANGE, NULL),
    FIELD(28, hp.beta1,                "--beta1",                    0,    0,           MAY_CHANGE, NULL),
    FIELD(29, hp.beta2,                "--beta2",                    0,    0,           MAY_CHANGE, NULL),
    FIELD(30, hp.eps,                  "--eps",                      0,    0,           MAY_CHANGE, NULL),
    FIELD(31, hp.grad_clip,            "--grad_clip",                0,    0,           MAY_CHANGE, NULL),
    FIELD(32, dtype,                   "dtype",                      0,    1,           INFO, NULL),
};
/* clang-format on */
const int ckpt_nfields = (int)(sizeof ckpt_fields / sizeof ckpt_fields[0]);

#undef FIELD
#undef CKPT_TYPE_OF

static const void* ckpt_member(const CkptField* f, const CkptHeader* h) { return (const char*)h + f->off; }
static void* ckpt_member_w(const CkptField* f, CkptHeader* h) { return (char*)h + f->off; }

static uint64_t ckpt_fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float ckpt_bitsf(uint64_t v) {
    uint32_t u = (uint32_t)v;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint64_t ckpt_field_bits(const CkptField* f, const CkptHeader* h) {
    const void* p = ckpt_member(f, h);
    switch (f->type) {
    case CKPT_I32: return (uint64_t)(int64_t) * (const int*)p;
    case CKPT_I64: return (uint64_t)(int64_t) * (const long long*)p;
    case CKPT_U64: return *(const uint64_t*)p;
    case CKPT_F32: return ckpt_fbits(*(const float*)p);
    }
    return 0;
}

/* Sets the member from the slot's value. Returns 1 if the value is out of
 * range (an I32 then stays as it was; the others hold the value anyway). */
static int ckpt_field_set(const CkptField* f, CkptHeader* h, uint64_t v) {
    void* p = ckpt_member_w(f, h);
    int64_t s = (int64_t)v;
    switch (f->type) {
    case CKPT_I32:
        if (s < f->lo || s > f->hi) return 1;
        *(int*)p = (int)s;
        return 0;
    case CKPT_I64: *(long long*)p = (long long)s; return s < f->lo || s > f->hi;
    case CKPT_U64:
        *(uint64_t*)p = v;
        return v < (uint64_t)f->lo || (f->hi != CKPT_NO_MAX && v > (uint64_t)f->hi);
    case CKPT_F32: *(float*)p = ckpt_bitsf(v); return !isfinite(*(float*)p);
    }
    return 1;
}

static int ckpt_field_equal(const CkptField* f, const CkptHeader* a, const CkptHeader* b) {
    const void *x = ckpt_member(f, a), *y = ckpt_member(f, b);
    switch (f->type) {
    case CKPT_I32: return *(const int*)x == *(const int*)y;
    case CKPT_I64: return *(const long long*)x == *(const long long*)y;
    case CKPT_U64: return *(const uint64_t*)x == *(const uint64_t*)y;
    case CKPT_F32: return *(const float*)x == *(const float*)y;
    }
    return 0;
}

void ckpt_field_str(const CkptField* f, const CkptHeader* h, char* out, size_t n) {
    const void* p = ckpt_member(f, h);
    switch (f->type) {
    case CKPT_I32: snprintf(out, n, "%lld", (long long)*(const int*)p); return;
    case CKPT_I64: snprintf(out, n, "%lld", *(const long long*)p); return;
    case CKPT_U64: snprintf(out, n, "%llu", (unsigned long long)*(const uint64_t*)p); return;
    case CKPT_F32: snprintf(out, n, "%g", (double)*(const float*)p); return;
    }
    if (n) out[0] = '\0';
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

void ckpt_header_encode(const CkptHeader* h, unsigned char out[CKPT_HEADER_BYTES]) {
    memset(out, 0, CKPT_HEADER_BYTES);
    ckpt_put(out, CKPT_SLOT_MAGIC, CKPT_MAGIC);
    ckpt_put(out, CKPT_SLOT_VERSION, CKPT_VERSION);
    ckpt_put(out, CKPT_SLOT_HEADER_BYTES, CKPT_HEADER_BYTES);
    for (int i = 0; i < ckpt_nfields; i++)
        ckpt_put(out, ckpt_fields[i].slot, ckpt_field_bits(&ckpt_fields[i], h));
}

int ckpt_header_decode(const unsigned char* in, size_t n, CkptHeader* h, char* err, size_t errlen) {
    memset(h, 0, sizeof *h);
    if (n < CKPT_HEADER_BYTES) {
        ckpt_errf(err, errlen, "truncated: %zu bytes, shorter than the %d-byte header", n, CKPT_HEADER_BYTES);
        return -1;
    }
    if (ckpt_get(in, CKPT_SLOT_MAGIC) != CKPT_MAGIC) {
        ckpt_errf(err, errlen, "wrong magic number %llu (expected %d): not a checkpoint state file",
                  (unsigned long long)ckpt_get(in, CKPT_SLOT_MAGIC), CKPT_MAGIC);
        return -1;
    }
    if (ckpt_get(in, CKPT_SLOT_VERSION) != CKPT_VERSION ||
        ckpt_get(in, CKPT_SLOT_HEADER_BYTES) != CKPT_HEADER_BYTES) {
        ckpt_errf(err, errlen,
                  "unsupported checkpoint version %llu (header %llu bytes; expected version %d, %d bytes)",
                  (unsigned long long)ckpt_get(in, CKPT_SLOT_VERSION),
                  (unsigned long long)ckpt_get(in, CKPT_SLOT_HEADER_BYTES), CKPT_VERSION, CKPT_HEADER_BYTES);
        return -1;
    }
    h->version = CKPT_VERSION;
    /* the shape first: the parameter count and the sequence length depend on it */
    const GPT2Config* c = &h->cfg;
    int bad = 0;
    for (int i = 0; i < ckpt_nfields; i++)
        if (ckpt_fields[i].role == CKPT_SHAPE)
            bad |= ckpt_field_set(&ckpt_fields[i], h, ckpt_get(in, ckpt_fields[i].slot));
    if (bad || c->padded_vocab_size < c->vocab_size || c->channels % c->num_heads != 0) {
        ckpt_errf(err, errlen, "invalid model shape in the header");
        return -1;
    }
    for (int i = 0; i < ckpt_nfields; i++)
        if (ckpt_fields[i].role != CKPT_SHAPE)
            bad |= ckpt_field_set(&ckpt_fields[i], h, ckpt_get(in, ckpt_fields[i].slot));
    size_t count = gpt2_num_parameters(c);
    if (h->num_parameters != count) {
        ckpt_errf(err, errlen, "header says %llu parameters, but its model shape has %zu",
                  (unsigned long long)h->num_parameters, count);
        return -1;
    }
    if (bad || h->hp.sequence_length > c->max_seq_len || h->opt_t > h->progress.step ||
        h->progress.bad_streak > h->progress.step) {
        ckpt_errf(err, errlen, "invalid training state in the header (step %d, AdamW t %d, total batch %lld)",
                  h->progress.step, h->opt_t, h->hp.total_batch_size);
        return -1;
    }
    return 0;
}

int ckpt_header_check_resume(const CkptHeader* h, const CkptHparams* now, char* notes, size_t notes_len,
                             char* err, size_t errlen) {
    if (notes && notes_len) notes[0] = '\0';
    /* the run as a header: the checkpoint's, with the run's settings */
    CkptHeader run = *h;
    run.hp = *now;
    char a[64], b[64];
    for (int i = 0; i < ckpt_nfields; i++) {
        const CkptField* f = &ckpt_fields[i];
        if (f->role != CKPT_MUST_MATCH || ckpt_field_equal(f, h, &run)) continue;
        ckpt_field_str(f, &run, a, sizeof a);
        ckpt_field_str(f, h, b, sizeof b);
        ckpt_errf(err, errlen, f->mismatch, a, b);
        return -1;
    }
    if (now->num_iterations < h->progress.step) {
        ckpt_errf(err, errlen, "--num_iterations %d is below the checkpoint's step %d", now->num_iterations,
                  h->progress.step);
        return -1;
    }
    size_t used = 0;
    for (int i = 0; i < ckpt_nfields && notes; i++) {
        const CkptField* f = &ckpt_fields[i];
        if (f->role != CKPT_MAY_CHANGE || ckpt_field_equal(f, h, &run)) continue;
        ckpt_field_str(f, h, b, sizeof b);
        ckpt_field_str(f, &run, a, sizeof a);
        if (used < notes_len) {
            int k = snprintf(notes + used, notes_len - used, "resume: %s changes from %s (checkpoint) to %s\n",
                             f->name, b, a);
            used = k < 0 ? notes_len : used + (size_t)k;
        }
    }
    return 0;
}

int ckpt_shape_check(const GPT2Config* saved, const GPT2Config* run, char* err, size_t errlen) {
    CkptHeader a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.cfg = *saved;
    b.cfg = *run;
    for (int i = 0; i < ckpt_nfields; i++)
        if (ckpt_fields[i].role == CKPT_SHAPE && !ckpt_field_equal(&ckpt_fields[i], &a, &b)) {
            ckpt_errf(err, errlen,
                      "the checkpoint's model shape (L %d, NH %d, C %d, maxT %d, V %d) differs "
                      "from the run's (L %d, NH %d, C %d, maxT %d, V %d)",
                      saved->num_layers, saved->num_heads, saved->channels, saved->max_seq_len,
                      saved->vocab_size, run->num_layers, run->num_heads, run->channels, run->max_seq_len,
                      run->vocab_size);
            return -1;
        }
    return 0;
}

int ckpt_model_header_check(const unsigned char* buf, const GPT2Config* run, char* err, size_t errlen) {
    int32_t h[GPT2_HEADER_INTS];
    memcpy(h, buf, sizeof h);                    /* little-endian host */
    if (h[0] != GPT2_MODEL_MAGIC || h[1] != 3) { /* a checkpoint's model.bin is fp32 */
        ckpt_errf(err, errlen, "not an fp32 llm.c model file (magic %d, version %d)", h[0], h[1]);
        return -1;
    }
    GPT2Config saved;
    int version;
    if (gpt2_header_decode(h, &saved, &version, err, errlen) != 0) return -1;
    return ckpt_shape_check(&saved, run, err, errlen);
}

long long ckpt_model_bytes(size_t P) { return GPT2_HEADER_INTS * 4 + 4 * (long long)P; }
long long ckpt_state_bytes(size_t P) { return CKPT_HEADER_BYTES + 12 * (long long)P; }
long long ckpt_state_offset(size_t P, int array, size_t canon) {
    return CKPT_HEADER_BYTES + 4LL * ((long long)array * (long long)P + (long long)canon);
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
        ckpt_errf(err, errlen,
                  "malformed completion marker (expected the lines 'gpt2-checkpoint v1', "
                  "'step S', 'model.bin BYTES crc32 HEX8', 'state.bin BYTES crc32 HEX8')");
        return -1;
    }
    d->step = (int)step;
    return 0;
}

int ckpt_done_format(const CkptDone* d, char* out, size_t n) {
    return snprintf(out, n,
                    "gpt2-checkpoint v1\nstep %d\nmodel.bin %lld crc32 %08x\nstate.bin %lld crc32 %08x\n",
                    d->step, d->model_bytes, d->model_crc, d->state_bytes, d->state_crc);
}

/* ---------------------------------------------------------- span map */

CkptSpan* ckpt_spans(const Layout* L, const GPT2* m, const OptPiece* held, int nheld, const OptPiece* want,
                     int nwant, int* n) {
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
                  "and one optimizer piece",
                  w->buf_off, w->len);
        const GPT2Tensor* t = &m->tensors[m->layout_to_tensor[lo]];
        /* (a row chunk of wte starts spec_off elements into the tensor) */
        out[i].canon_off = t->file_off + p->spec_off + (w->buf_off - p->offset);
        out[i].state_off = held[a].state_off + (w->buf_off - held[a].buf_off);
        out[i].len = w->len;
    }
    *n = nwant;
    return out;
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
