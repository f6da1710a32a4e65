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

int ckpt_header_check_resume(const CkptHeader* h, const CkptHparams* now, char* notes, size_t notes_len,
                             char* err, size_t errlen) {
    if (notes && notes_len) notes[0] = '\0';
    size_t used = 0;
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
#define NOTE(fmt, name, a, b)                                                                       \
    if (notes && used < notes_len) {                                                                \
        int k = snprintf(notes + used, notes_len - used, "resume: %s changes from " fmt " (checkpoint) " \
                         "to " fmt "\n", name, a, b);                                                  \
        used = k < 0 ? notes_len : used + (size_t)k;                                                \
    }
#define NOTE_I(name, field) \
    if (was->field != now->field) NOTE("%lld", name, (long long)was->field, (long long)now->field)
#define NOTE_F(name, field) \
    if (was->field != now->field) NOTE("%g", name, (double)was->field, (double)now->field)
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
#undef NOTE
    return 0;
}

int ckpt_shape_check(const GPT2Config* saved, const GPT2Config* run, char* err, size_t errlen) {
    if (saved->max_seq_len != run->max_seq_len || saved->vocab_size != run->vocab_size ||
        saved->padded_vocab_size != run->padded_vocab_size || saved->num_layers != run->num_layers ||
        saved->num_heads != run->num_heads || saved->channels != run->channels) {
        ckpt_errf(err, errlen, "the checkpoint's model shape (L %d, NH %d, C %d, maxT %d, V %d) differs "
                  "from the run's (L %d, NH %d, C %d, maxT %d, V %d)", saved->num_layers, saved->num_heads,
                  saved->channels, saved->max_seq_len, saved->vocab_size, run->num_layers, run->num_heads,
                  run->channels, run->max_seq_len, run->vocab_size);
        return -1;
    }
    return 0;
}

static int32_t ckpt_le32s(const unsigned char* p) {
    return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

int ckpt_model_header_check(const unsigned char* buf, const GPT2Config* run, char* err, size_t errlen) {
    int32_t hv[8];
    for (int i = 0; i < 8; i++) hv[i] = ckpt_le32s(buf + 4 * i);
    if (hv[0] != 20240326 || hv[1] != 3) {
        ckpt_errf(err, errlen, "not an fp32 llm.c model file (magic %d, version %d)", hv[0], hv[1]);
        return -1;
    }
    GPT2Config saved = {.max_seq_len = hv[2], .vocab_size = hv[3], .num_layers = hv[4], .num_heads = hv[5],
                        .channels = hv[6], .padded_vocab_size = hv[7]};
    return ckpt_shape_check(&saved, run, err, errlen);
}

long long ckpt_model_bytes(size_t P) { return 1024 + 4 * (long long)P; }
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
        ckpt_errf(err, errlen, "malformed completion marker (expected the lines 'gpt2-checkpoint v1', "
                  "'step S', 'model.bin BYTES crc32 HEX8', 'state.bin BYTES crc32 HEX8')");
        return -1;
    }
    d->step = (int)step;
    return 0;
}

int ckpt_done_format(const CkptDone* d, char* out, size_t n) {
    return snprintf(out, n, "gpt2-checkpoint v1\nstep %d\nmodel.bin %lld crc32 %08x\nstate.bin %lld crc32 %08x\n",
                    d->step, d->model_bytes, d->model_crc, d->state_bytes, d->state_crc);
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
