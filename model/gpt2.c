/* model/gpt2.c — GPT-2 over the kernel interface: tensors, init, llm.c
 * files, forward, backward. See gpt2.h for the contracts and the order of
 * the calls.
 *
 * Tensors are named by (kind, layer); gpt2_tensor_index is the only code that
 * turns a name into a position in llm.c's file order (= index in m->tensors).
 *
 * Forward reads parameters at params + buf_off; backward accumulates
 * gradients through the per-layout-parameter pointer table grad_ptr (by
 * default grads + offset, so a gradient sits at the same offset as its
 * parameter; ZeRO-2 points it at per-bucket working buffers instead). The
 * optional hooks need_params / need_grads run right before the kernel that
 * first touches a tensor, naming exactly the layout parameters that kernel
 * touches (for wte: all of its row chunks, or the one chunk a per-chunk
 * kernel writes). */
#include "gpt2.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/types.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static const char* kind_names[GPT2_NUM_KINDS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

static int kind_is_layer(int k) { return k >= GPT2_LN1W && k <= GPT2_FCPROJB; }
#define LAYER_KINDS (GPT2_FCPROJB - GPT2_LN1W + 1) /* 12 tensors per layer */
static int kind_decays(int k) {
    return k == GPT2_WTE || k == GPT2_WPE || k == GPT2_QKVW || k == GPT2_ATTPROJW || k == GPT2_FCW ||
           k == GPT2_FCPROJW;
}

static size_t kind_numel(const GPT2Config* c, int k) {
    size_t C = (size_t)c->channels;
    switch (k) {
    case GPT2_WTE: return (size_t)c->padded_vocab_size * C;
    case GPT2_WPE: return (size_t)c->max_seq_len * C;
    case GPT2_QKVW: return 3 * C * C;
    case GPT2_QKVB: return 3 * C;
    case GPT2_ATTPROJW: return C * C;
    case GPT2_FCW: return 4 * C * C;
    case GPT2_FCB: return 4 * C;
    case GPT2_FCPROJW: return 4 * C * C;
    default: return C; /* layernorm weights/biases, attprojb, fcprojb, lnf */
    }
}

int gpt2_preset(const char* name, GPT2Config* cfg) {
    if (name[0] != 'd' || name[1] == '\0') return -1;
    char* end = NULL;
    long n = strtol(name + 1, &end, 10);
    if (*end != '\0' || n < 2 || n > 48) return -1;
    cfg->max_seq_len = 1024;
    cfg->vocab_size = 50257;
    cfg->padded_vocab_size = 50304;
    cfg->num_layers = (int)n;
    cfg->num_heads = (int)n;
    cfg->channels = 64 * (int)n;
    return 0;
}

size_t gpt2_num_parameters(const GPT2Config* cfg) {
    size_t n = 0;
    for (int k = 0; k < GPT2_NUM_KINDS; k++)
        n += kind_numel(cfg, k) * (kind_is_layer(k) ? (size_t)cfg->num_layers : 1);
    return n;
}

/* The shape limits bound the parameter count (Vp * C <= 2^40, L * 12 C^2 < 2^46), so the file size
 * that the header describes fits in a long long, and every numel in a size_t. */
int gpt2_header_decode(const int32_t h[GPT2_HEADER_INTS], GPT2Config* cfg, int* version, char* err,
                       size_t errlen) {
    if (h[0] != GPT2_MODEL_MAGIC) {
        snprintf(err, errlen, "wrong magic number %d (expected %d): not an llm.c model file", h[0],
                 GPT2_MODEL_MAGIC);
        return -1;
    }
    if (h[1] != 3 && h[1] != 5) {
        snprintf(err, errlen, "unsupported model file version %d (expected 3 for fp32 or 5 for bf16)", h[1]);
        return -1;
    }
    GPT2Config c;
    c.max_seq_len = h[2];
    c.vocab_size = h[3];
    c.num_layers = h[4];
    c.num_heads = h[5];
    c.channels = h[6];
    c.padded_vocab_size = h[7];
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 ||
        c.padded_vocab_size < c.vocab_size || c.channels % c.num_heads != 0 || c.max_seq_len > (1 << 20) ||
        c.channels > (1 << 16) || c.num_layers > 1024 || c.padded_vocab_size > (1 << 24)) {
        snprintf(err, errlen, "invalid model shape in header (maxT %d, V %d, Vp %d, L %d, NH %d, C %d)", h[2],
                 h[3], h[7], h[4], h[5], h[6]);
        return -1;
    }
    *cfg = c;
    *version = h[1];
    return 0;
}

void gpt2_header_encode(const GPT2Config* cfg, int version, int32_t h[GPT2_HEADER_INTS]) {
    memset(h, 0, GPT2_HEADER_INTS * sizeof(int32_t));
    h[0] = GPT2_MODEL_MAGIC;
    h[1] = version;
    h[2] = cfg->max_seq_len;
    h[3] = cfg->vocab_size;
    h[4] = cfg->num_layers;
    h[5] = cfg->num_heads;
    h[6] = cfg->channels;
    h[7] = cfg->padded_vocab_size;
}

/* Reads and checks the header of the model file f (opened at its start, named path in messages):
 * fatal on a bad header or a file size other than the one the header describes. Leaves f at the
 * first parameter. */
static void read_header_from(FILE* f, const char* path, GPT2Config* cfg, int* version) {
    int32_t h[GPT2_HEADER_INTS];
    long long size = file_size(f);
    if (size < (long long)sizeof h)
        fatal("%s: file is truncated: %lld bytes, shorter than the %zu-byte header", path, size, sizeof h);
    xfread(h, sizeof(int32_t), GPT2_HEADER_INTS, f, path);
    char err[256];
    if (gpt2_header_decode(h, cfg, version, err, sizeof err) != 0) fatal("%s: %s", path, err);
    size_t elsize = *version == 3 ? 4 : 2;
    long long want = (long long)sizeof h + (long long)(gpt2_num_parameters(cfg) * elsize);
    if (size != want)
        fatal("%s: file is %s: %lld bytes, but its header describes %lld bytes", path,
              size < want ? "truncated" : "too long", size, want);
}

void gpt2_read_header(const char* path, GPT2Config* cfg, int* version) {
    FILE* f = xfopen(path, "rb");
    read_header_from(f, path, cfg, version);
    fclose(f);
}

int gpt2_tensor_index(const GPT2Config* cfg, int kind, int layer) {
    int L = cfg->num_layers;
    if (kind < 0 || kind >= GPT2_NUM_KINDS || (kind_is_layer(kind) ? layer < 0 || layer >= L : layer != -1))
        fatal("internal: no tensor of kind %d at layer %d (L %d)", kind, layer, L);
    /* llm.c's file order: wte, wpe, each layer kind for layers 0..L-1, lnfw, lnfb */
    if (kind == GPT2_WTE || kind == GPT2_WPE) return kind - GPT2_WTE;
    if (kind_is_layer(kind)) return 2 + (kind - GPT2_LN1W) * L + layer;
    return 2 + LAYER_KINDS * L + (kind - GPT2_LNFW);
}

GPT2Tensor* gpt2_tensor(const GPT2* m, int kind, int layer) {
    return &m->tensors[gpt2_tensor_index(&m->cfg, kind, layer)];
}

LayoutParamSpec* gpt2_describe(GPT2* m, const GPT2Config* cfg, int* n) {
    int L = cfg->num_layers;
    m->cfg = *cfg;
    GPT2Part* pt = &m->part;
    int whole = pt->layer_count == 0;
    if (whole) *pt = (GPT2Part){.layer_first = 0, .layer_count = L, .has_embed = 1, .has_head = 1};
    if (pt->layer_first < 0 || pt->layer_count < 1 || pt->layer_first + pt->layer_count > L)
        fatal("model chunk of layers [%d, %d) outside the model's %d layers", pt->layer_first,
              pt->layer_first + pt->layer_count, L);
    m->ntensors = LAYER_KINDS * L + 4;
    m->tensors = xcalloc((size_t)m->ntensors, sizeof(GPT2Tensor));
    m->layout_to_tensor = xcalloc((size_t)m->ntensors, sizeof(int));
    for (int k = 0; k < GPT2_NUM_KINDS; k++) {
        int nl = kind_is_layer(k) ? L : 1;
        for (int i = 0; i < nl; i++) {
            int l = kind_is_layer(k) ? i : -1;
            GPT2Tensor* t = gpt2_tensor(m, k, l);
            t->kind = k;
            t->layer = l;
            t->numel = kind_numel(cfg, k);
            t->decay = kind_decays(k);
            if (l >= 0) snprintf(t->name, sizeof t->name, "h%d.%s", l, kind_names[k]);
            else snprintf(t->name, sizeof t->name, "%s", kind_names[k]);
            t->present = l >= 0          ? l >= pt->layer_first && l < pt->layer_first + pt->layer_count
                         : k == GPT2_WTE ? pt->has_embed || pt->has_head
                         : k == GPT2_WPE ? pt->has_embed
                                         : pt->has_head;
        }
    }
    /* the file holds the tensors back to back in index order */
    size_t off = 0;
    m->part_parameters = 0;
    for (int i = 0; i < m->ntensors; i++) {
        m->tensors[i].file_off = off;
        off += m->tensors[i].numel;
        if (m->tensors[i].present) m->part_parameters += m->tensors[i].numel;
    }
    m->num_parameters = off;
    /* layout order: the order in which backward finishes the gradients */
    LayoutParamSpec* specs = xcalloc((size_t)m->ntensors, sizeof(LayoutParamSpec));
    int order_layer[LAYER_KINDS] = {GPT2_FCPROJW,  GPT2_FCPROJB,  GPT2_FCW,  GPT2_FCB,  GPT2_LN2W, GPT2_LN2B,
                                    GPT2_ATTPROJW, GPT2_ATTPROJB, GPT2_QKVW, GPT2_QKVB, GPT2_LN1W, GPT2_LN1B};
    int* seq = xmalloc(sizeof(int) * (size_t)m->ntensors);
    int ns = 0;
    if (pt->has_head) {
        seq[ns++] = gpt2_tensor_index(cfg, GPT2_LNFW, -1);
        seq[ns++] = gpt2_tensor_index(cfg, GPT2_LNFB, -1);
    }
    for (int l = pt->layer_first + pt->layer_count - 1; l >= pt->layer_first; l--)
        for (int j = 0; j < LAYER_KINDS; j++) seq[ns++] = gpt2_tensor_index(cfg, order_layer[j], l);
    if (pt->has_embed) seq[ns++] = gpt2_tensor_index(cfg, GPT2_WPE, -1);
    if (pt->has_embed || pt->has_head) seq[ns++] = gpt2_tensor_index(cfg, GPT2_WTE, -1);
    for (int li = 0; li < ns; li++) {
        GPT2Tensor* t = &m->tensors[seq[li]];
        t->layout_index = li;
        t->nchunks = 1;
        m->layout_to_tensor[li] = seq[li];
        specs[li].name = t->name;
        specs[li].numel = t->numel;
        specs[li].decay = t->decay;
        if (t->kind == GPT2_WTE) {
            /* may be cut into row chunks (vocabulary rows), a bucket each. 64
             * rows per unit: a chunk's lm-head dW GEMM reads the column slice
             * dlogits[:, r0:r1], which then starts 128 bytes (bf16) or more
             * into a row, an alignment cuBLASLt's fast kernels accept. */
            specs[li].row_len = (size_t)cfg->channels;
            specs[li].row_align = 64;
            specs[li].new_bucket = !whole;
        }
    }
    free(seq);
    m->npresent = ns;
    *n = ns;
    return specs;
}

void gpt2_bind(GPT2* m, Backend* be, const Layout* L) {
    m->be = be;
    m->layout = L;
    if (L->nspecs != m->npresent)
        fatal("internal: gpt2_bind: the layout has %d specs, the model %d tensors", L->nspecs, m->npresent);
    /* layout parameters -> tensors, through the spec each one comes from
     * (describe's map is by spec); a tensor's chunks must be consecutive
     * layout parameters forming one contiguous range of the buffer */
    int* spec_to_tensor = m->layout_to_tensor;
    m->nlayout = L->nparams;
    m->layout_to_tensor = xmalloc(sizeof(int) * (size_t)L->nparams);
    for (int i = 0; i < m->ntensors; i++) m->tensors[i].nchunks = 0;
    for (int li = 0; li < L->nparams; li++) {
        const LayoutParam* p = &L->params[li];
        if (p->spec < 0 || p->spec >= L->nspecs)
            fatal("internal: gpt2_bind: layout parameter %d has no spec", li);
        int ti = spec_to_tensor[p->spec];
        GPT2Tensor* t = &m->tensors[ti];
        m->layout_to_tensor[li] = ti;
        if (t->nchunks == 0) t->layout_index = li;
        const LayoutParam* p0 = &L->params[t->layout_index];
        if (li != t->layout_index + t->nchunks || p->offset != p0->offset + p->spec_off ||
            (t->nchunks == 0 && p->spec_off != 0))
            fatal("internal: gpt2_bind: tensor %s is not one contiguous run of layout parameters", t->name);
        t->nchunks++;
    }
    free(spec_to_tensor);
    for (int i = 0; i < m->ntensors; i++) {
        GPT2Tensor* t = &m->tensors[i];
        if (!t->present) continue;
        const LayoutParam* pl = &L->params[t->layout_index + t->nchunks - 1];
        if (t->nchunks == 0 || pl->spec_off + pl->numel != t->numel)
            fatal("internal: gpt2_bind: tensor %s is not covered by the layout", t->name);
        t->buf_off = L->params[t->layout_index].offset;
    }
    size_t bytes = L->total * dtype_size(be->dtype);
    m->params = be->alloc(be, bytes, MEM_PARAMS);
    be->zero(be, m->params, bytes);
    m->grads = NULL;
    if (!m->shard_grads) {
        m->grads = be->alloc(be, bytes, MEM_GRADS);
        be->zero(be, m->grads, bytes);
    }
    m->grad_ptr = xcalloc((size_t)m->nlayout, sizeof(void*));
    for (int li = 0; li < m->nlayout; li++)
        m->grad_ptr[li] = m->grads ? (char*)m->grads + L->params[li].offset * dtype_size(be->dtype) : NULL;
}

/* Host fp32 <-> flat buffer, one tensor at a time, through a staging buffer. */
static void put_tensor(GPT2* m, const GPT2Tensor* t, const float* src) {
    Backend* be = m->be;
    size_t es = dtype_size(be->dtype);
    char* dst = (char*)m->params + t->buf_off * es;
    if (be->dtype == DTYPE_FP32) {
        be->to_device(be, dst, src, t->numel * 4);
    } else {
        uint16_t* tmp = xmalloc(t->numel * 2);
        for (size_t i = 0; i < t->numel; i++) tmp[i] = f32_to_bf16(src[i]);
        be->to_device(be, dst, tmp, t->numel * 2);
        be->synchronize(be);
        free(tmp);
    }
}

static void get_tensor(GPT2* m, const void* buf, const GPT2Tensor* t, float* out) {
    Backend* be = m->be;
    size_t es = dtype_size(be->dtype);
    const char* src = (const char*)buf + t->buf_off * es;
    if (be->dtype == DTYPE_FP32) {
        be->to_host(be, out, src, t->numel * 4);
    } else {
        uint16_t* tmp = xmalloc(t->numel * 2);
        be->to_host(be, tmp, src, t->numel * 2);
        for (size_t i = 0; i < t->numel; i++) out[i] = bf16_to_f32(tmp[i]);
        free(tmp);
    }
}

void gpt2_params_to_host(GPT2* m, float* out) {
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].present) get_tensor(m, m->params, &m->tensors[i], out + m->tensors[i].file_off);
}
void gpt2_grads_to_host(GPT2* m, float* out) {
    if (!m->grads) fatal("internal: gpt2_grads_to_host with sharded gradients (zero_stage 2)");
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].present) get_tensor(m, m->grads, &m->tensors[i], out + m->tensors[i].file_off);
}
void gpt2_params_from_host(GPT2* m, const float* in) {
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].present) put_tensor(m, &m->tensors[i], in + m->tensors[i].file_off);
}

/* tensor t's initial values (fp32, numel) from its own stream */
static void init_tensor(const GPT2* m, const GPT2Tensor* t, uint64_t seed, float* w) {
    const GPT2Config* c = &m->cfg;
    float resid_std = 0.02f / sqrtf(2.0f * (float)c->num_layers);
    /* one stream per tensor, so a tensor's values do not depend on the others */
    Rng r;
    rng_seed(&r, seed * 1000003ull + (uint64_t)t->kind * 4099ull + (uint64_t)(t->layer + 1));
    size_t n = t->numel;
    switch (t->kind) {
    case GPT2_LN1W:
    case GPT2_LN2W:
    case GPT2_LNFW:
        for (size_t j = 0; j < n; j++) w[j] = 1.0f;
        break;
    case GPT2_LN1B:
    case GPT2_LN2B:
    case GPT2_LNFB:
    case GPT2_QKVB:
    case GPT2_ATTPROJB:
    case GPT2_FCB:
    case GPT2_FCPROJB: memset(w, 0, n * sizeof(float)); break;
    case GPT2_WTE: {
        size_t real = (size_t)c->vocab_size * (size_t)c->channels;
        for (size_t j = 0; j < n; j++) w[j] = j < real ? 0.02f * rng_normal(&r) : 0.0f;
        break;
    }
    case GPT2_ATTPROJW:
    case GPT2_FCPROJW:
        for (size_t j = 0; j < n; j++) w[j] = resid_std * rng_normal(&r);
        break;
    default:
        for (size_t j = 0; j < n; j++) w[j] = 0.02f * rng_normal(&r);
    }
}

void gpt2_init_random(GPT2* m, uint64_t seed) {
    /* The streams are independent, so the tensors are generated in parallel,
     * a group of (threads) tensors at a time (host memory: one group), and
     * copied to the device in order: the values do not depend on the thread
     * count. (One value at a time, billions of parameters take minutes.) */
    int group = 1;
#ifdef _OPENMP
    group = omp_get_max_threads();
#endif
    float** bufs = xmalloc((size_t)group * sizeof(float*));
    GPT2Tensor** ts = xmalloc((size_t)m->ntensors * sizeof(GPT2Tensor*));
    int np = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].present) ts[np++] = &m->tensors[i];
    for (int i0 = 0; i0 < np; i0 += group) {
        int n = np - i0 < group ? np - i0 : group;
        for (int k = 0; k < n; k++) bufs[k] = xmalloc(ts[i0 + k]->numel * sizeof(float));
#pragma omp parallel for schedule(dynamic, 1)
        for (int k = 0; k < n; k++) init_tensor(m, ts[i0 + k], seed, bufs[k]);
        for (int k = 0; k < n; k++) {
            put_tensor(m, ts[i0 + k], bufs[k]);
            free(bufs[k]);
        }
    }
    free(ts);
    free(bufs);
    m->be->synchronize(m->be);
}

void gpt2_load(GPT2* m, const char* path) {
    GPT2Config fc;
    int version;
    FILE* f = xfopen(path, "rb");
    read_header_from(f, path, &fc, &version);
    const GPT2Config* c = &m->cfg;
    if (fc.max_seq_len != c->max_seq_len || fc.vocab_size != c->vocab_size ||
        fc.padded_vocab_size != c->padded_vocab_size || fc.num_layers != c->num_layers ||
        fc.num_heads != c->num_heads || fc.channels != c->channels)
        fatal("%s: model shape (L %d, NH %d, C %d, maxT %d, V %d) differs from the run's "
              "(L %d, NH %d, C %d, maxT %d, V %d)",
              path, fc.num_layers, fc.num_heads, fc.channels, fc.max_seq_len, fc.vocab_size, c->num_layers,
              c->num_heads, c->channels, c->max_seq_len, c->vocab_size);
    const long long es = version == 3 ? 4 : 2;
    for (int i = 0; i < m->ntensors; i++) {
        const GPT2Tensor* t = &m->tensors[i];
        if (!t->present) continue;
        if (fseeko(f, (off_t)(GPT2_HEADER_INTS * 4 + (long long)t->file_off * es), SEEK_SET) != 0)
            fatal("%s: cannot seek to tensor %s", path, t->name);
        float* w = xmalloc(t->numel * sizeof(float));
        if (version == 3) {
            xfread(w, sizeof(float), t->numel, f, path);
        } else {
            uint16_t* h = xmalloc(t->numel * 2);
            xfread(h, 2, t->numel, f, path);
            for (size_t j = 0; j < t->numel; j++) w[j] = bf16_to_f32(h[j]);
            free(h);
        }
        for (size_t j = 0; j < t->numel; j++)
            if (!isfinite(w[j])) fatal("%s: tensor %s holds a non-finite value at %zu", path, t->name, j);
        put_tensor(m, t, w);
        free(w);
    }
    fclose(f);
    m->be->synchronize(m->be);
}

void gpt2_save(GPT2* m, const char* path, int version) {
    if (version != 3 && version != 5) fatal("internal: gpt2_save: model file version %d (3 or 5)", version);
    if (m->npresent != m->ntensors)
        fatal("internal: gpt2_save of a model chunk (gpt2_write_tensors writes parts)");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) fatal("path too long: %s", path);
    FILE* f = xfopen(tmp, "wb");
    int32_t h[GPT2_HEADER_INTS];
    gpt2_header_encode(&m->cfg, version, h);
    xfwrite(h, sizeof(int32_t), GPT2_HEADER_INTS, f, tmp);
    for (int i = 0; i < m->ntensors; i++) {
        const GPT2Tensor* t = &m->tensors[i];
        float* w = xmalloc(t->numel * sizeof(float));
        get_tensor(m, m->params, t, w);
        if (version == 3) {
            xfwrite(w, sizeof(float), t->numel, f, tmp);
        } else {
            uint16_t* hb = xmalloc(t->numel * 2);
            for (size_t j = 0; j < t->numel; j++) hb[j] = f32_to_bf16(w[j]);
            xfwrite(hb, 2, t->numel, f, tmp);
            free(hb);
        }
        free(w);
    }
    if (fflush(f) != 0 || fclose(f) != 0) fatal("%s: write failed (disk full?)", tmp);
    if (rename(tmp, path) != 0) fatal("cannot rename %s to %s", tmp, path);
}

int gpt2_write_tensors(GPT2* m, int fd, int version, int skip_wte, char* err, size_t errlen) {
    if (version != 3 && version != 5)
        fatal("internal: gpt2_write_tensors: model file version %d (3 or 5)", version);
    const size_t es = version == 3 ? 4 : 2;
    for (int i = 0; i < m->ntensors; i++) {
        const GPT2Tensor* t = &m->tensors[i];
        if (!t->present || (skip_wte && t->kind == GPT2_WTE)) continue;
        float* w = xmalloc(t->numel * sizeof(float));
        get_tensor(m, m->params, t, w);
        const void* src = w;
        uint16_t* hb = NULL;
        if (version == 5) {
            hb = xmalloc(t->numel * 2);
            for (size_t j = 0; j < t->numel; j++) hb[j] = f32_to_bf16(w[j]);
            src = hb;
        }
        size_t bytes = t->numel * es, done = 0;
        off_t at = (off_t)GPT2_HEADER_INTS * 4 + (off_t)(t->file_off * es);
        while (done < bytes) {
            ssize_t k = pwrite(fd, (const char*)src + done, bytes - done, at + (off_t)done);
            if (k <= 0) {
                snprintf(err, errlen, "writing tensor %s failed: %s", t->name,
                         k < 0 ? strerror(errno) : "no progress");
                free(w);
                free(hb);
                return -1;
            }
            done += (size_t)k;
        }
        free(w);
        free(hb);
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Activations. nslots slot blocks (what forward keeps for backward, one
 * micro-batch each) and one scratch block (forward temporaries, backward's
 * buffers, and the buffers that recomputation shares between layers), each
 * carved in a fixed order; sizes in elements. Per-layer arrays hold the
 * part's layers, indexed from its first layer. */
typedef struct {
    /* the slot */
    void* encoded;                                               /* [B,T,C]: the part's input */
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3; /* per layer */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
    void *lnf, *logits;                  /* head */
    float *lnf_mean, *lnf_rstd, *losses; /* head */
    int *inputs, *targets;               /* device token ids */
    /* scratch */
    void *attproj, *fcproj;   /* forward: each only feeds the residual add after it */
    void *dres, *dbtc, *dqkv; /* backward (the fc gradient goes into fch_gelu) */
} Acts;

/* Carves the slot block (scratch = 0) or the scratch block at base (NULL:
 * sizes only); returns its bytes. */
static size_t acts_layout(const GPT2* m, int B, int T, Acts* a, char* base, int scratch) {
    const GPT2Config* c = &m->cfg;
    size_t es = dtype_size(m->be->dtype);
    size_t BT = (size_t)B * T, C = (size_t)c->channels, L = (size_t)m->part.layer_count;
    size_t H = m->part.has_head ? 1 : 0;
    size_t off = 0;
#define CARVE(ptr, type, count)                                                                    \
    do {                                                                                           \
        if (base) ptr = (type*)(base + off);                                                       \
        off += (((size_t)(count) * (sizeof(type) == 1 ? es : sizeof(type))) + 255) & ~(size_t)255; \
    } while (0)
    /* X tensors are carved as char (sizeof 1 -> element size es) */
    /* recomputed buffers: one layer's worth, shared by the layers and the slots (scratch) */
    size_t Lln = m->recompute >= 2 ? 1 : L, Lgelu = m->recompute >= 1 ? 1 : L;
    int ln_here = (m->recompute >= 2) == scratch, gelu_here = (m->recompute >= 1) == scratch;
    if (!scratch) {
        CARVE(a->encoded, char, BT * C);
        CARVE(a->qkv, char, L * BT * 3 * C);
        CARVE(a->atty, char, L * BT * C);
        CARVE(a->res2, char, L * BT * C);
        CARVE(a->fch, char, L * BT * 4 * C);
        CARVE(a->res3, char, L * BT * C);
        CARVE(a->lnf, char, H * BT * C);
        CARVE(a->logits, char, H * BT * (size_t)c->padded_vocab_size);
        CARVE(a->ln1_mean, float, L * BT);
        CARVE(a->ln1_rstd, float, L * BT);
        CARVE(a->ln2_mean, float, L * BT);
        CARVE(a->ln2_rstd, float, L * BT);
        CARVE(a->lse, float, L * BT * (size_t)c->num_heads);
        CARVE(a->lnf_mean, float, H * BT);
        CARVE(a->lnf_rstd, float, H * BT);
        CARVE(a->losses, float, H * BT);
        CARVE(a->inputs, int, BT);
        CARVE(a->targets, int, BT);
    } else {
        CARVE(a->attproj, char, BT * C);
        CARVE(a->fcproj, char, BT * C);
        CARVE(a->dres, char, BT * C);
        CARVE(a->dbtc, char, BT * C);
        CARVE(a->dqkv, char, BT * 3 * C);
    }
    if (ln_here) {
        CARVE(a->ln1, char, Lln * BT * C);
        CARVE(a->ln2, char, Lln * BT * C);
    }
    if (gelu_here) CARVE(a->fch_gelu, char, Lgelu * BT * 4 * C);
#undef CARVE
    return off;
}

/* The current slot's activations and the scratch, for the allocated (B, T)
 * (buffers do not move; a forward uses B*T of them). */
static void acts_get(const GPT2* m, Acts* a) {
    if (!m->acts) fatal("internal: the model has no activations (gpt2_alloc_activations)");
    char* base = (char*)m->acts;
    acts_layout(m, m->B, m->T, a, base + (size_t)m->slot * m->slot_bytes, 0);
    acts_layout(m, m->B, m->T, a, base + (size_t)m->nslots * m->slot_bytes, 1);
}

void gpt2_alloc_activations(GPT2* m, int B, int T) {
    Acts a;
    m->B = B;
    m->T = T;
    if (m->nslots < 1) m->nslots = 1;
    m->slot = 0;
    m->slot_bytes = acts_layout(m, B, T, &a, NULL, 0);
    m->acts_bytes = (size_t)m->nslots * m->slot_bytes + acts_layout(m, B, T, &a, NULL, 1);
    m->acts = m->be->alloc(m->be, m->acts_bytes, MEM_ACTIVATIONS);
    m->losses_host = xmalloc((size_t)B * T * sizeof(float));
}

void gpt2_use_slot(GPT2* m, int slot) {
    if (slot < 0 || slot >= m->nslots) fatal("internal: activation slot %d of %d", slot, m->nslots);
    m->slot = slot;
}

void* gpt2_input(GPT2* m) {
    Acts a;
    acts_get(m, &a);
    return a.encoded;
}

void* gpt2_dres(GPT2* m) {
    Acts a;
    acts_get(m, &a);
    return a.dres;
}

/* element offset helpers */
static void* X(const GPT2* m, void* base, size_t elems) {
    return (char*)base + elems * dtype_size(m->be->dtype);
}
/* a parameter tensor inside the flat param buffer */
static void* P(const GPT2* m, void* buf, int kind, int layer) {
    return X(m, buf, gpt2_tensor(m, kind, layer)->buf_off);
}
/* where backward accumulates the gradient of layout parameter li */
static void* GPL(const GPT2* m, int li) {
    void* g = m->grad_ptr[li];
    if (!g)
        fatal("internal: no gradient buffer for tensor %s (layout parameter %d; need_grads hook missing?)",
              m->tensors[m->layout_to_tensor[li]].name, li);
    return g;
}
/* ... of tensor (kind, layer): its first layout parameter, which is the
 * whole tensor except for a chunked wte (and there, the whole tensor too
 * when the gradients are one full buffer: its chunks are contiguous) */
static void* GP(const GPT2* m, int kind, int layer) {
    return GPL(m, gpt2_tensor(m, kind, layer)->layout_index);
}
/* Tell a hook that the next kernel touches tensors (k1, layer) and, if
 * k2 >= 0, (k2, layer): every layout parameter of them. */
static void need(const GPT2* m, gpt2_need_fn fn, void* ctx, int layer, int k1, int k2) {
    if (!fn) return;
    int fixed[8];
    const GPT2Tensor* t1 = gpt2_tensor(m, k1, layer);
    const GPT2Tensor* t2 = k2 >= 0 ? gpt2_tensor(m, k2, layer) : NULL;
    int n = t1->nchunks + (t2 ? t2->nchunks : 0);
    int* li = n <= 8 ? fixed : xmalloc(sizeof(int) * (size_t)n);
    int k = 0;
    for (int c = 0; c < t1->nchunks; c++) li[k++] = t1->layout_index + c;
    for (int c = 0; t2 && c < t2->nchunks; c++) li[k++] = t2->layout_index + c;
    fn(ctx, li, n);
    if (li != fixed) free(li);
}
#define NEED_P(layer, k1, k2) need(m, m->need_params, m->need_params_ctx, (layer), (k1), (k2))
#define NEED_G(layer, k1, k2) need(m, m->need_grads, m->need_grads_ctx, (layer), (k1), (k2))

/* The activations of the part's j-th layer (with recompute, the shared
 * buffers are the same for every layer). */
typedef struct {
    void *res_in, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} LayerActs;

static void layer_acts(const GPT2* m, const Acts* a, int j, LayerActs* la) {
    size_t BTa = (size_t)m->B * m->T, C = (size_t)m->cfg.channels;
    size_t lln = m->recompute >= 2 ? 0 : (size_t)j, lg = m->recompute >= 1 ? 0 : (size_t)j;
    la->res_in = j == 0 ? a->encoded : X(m, a->res3, (size_t)(j - 1) * BTa * C);
    la->ln1 = X(m, a->ln1, lln * BTa * C);
    la->qkv = X(m, a->qkv, (size_t)j * BTa * 3 * C);
    la->atty = X(m, a->atty, (size_t)j * BTa * C);
    la->res2 = X(m, a->res2, (size_t)j * BTa * C);
    la->ln2 = X(m, a->ln2, lln * BTa * C);
    la->fch = X(m, a->fch, (size_t)j * BTa * 4 * C);
    la->fch_gelu = X(m, a->fch_gelu, lg * BTa * 4 * C);
    la->res3 = X(m, a->res3, (size_t)j * BTa * C);
    la->ln1_mean = a->ln1_mean + (size_t)j * BTa;
    la->ln1_rstd = a->ln1_rstd + (size_t)j * BTa;
    la->ln2_mean = a->ln2_mean + (size_t)j * BTa;
    la->ln2_rstd = a->ln2_rstd + (size_t)j * BTa;
    la->lse = a->lse + (size_t)j * BTa * (size_t)m->cfg.num_heads;
}

void* gpt2_output(GPT2* m) {
    Acts a;
    acts_get(m, &a);
    LayerActs la;
    layer_acts(m, &a, m->part.layer_count - 1, &la);
    return la.res3;
}

float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    Backend* be = m->be;
    const GPT2Config* c = &m->cfg;
    const GPT2Part* pt = &m->part;
    if (B > m->B || T > m->T || T > c->max_seq_len)
        fatal("internal: forward with B=%d T=%d exceeds the allocation B=%d T=%d", B, T, m->B, m->T);
    Acts a;
    acts_get(m, &a);
    size_t BT = (size_t)B * T, C = (size_t)c->channels;
    int NH = c->num_heads, l0 = pt->layer_first, nl = pt->layer_count;
    if (pt->has_embed) be->to_device(be, a.inputs, inputs, BT * sizeof(int));
    if (pt->has_head && targets) be->to_device(be, a.targets, targets, BT * sizeof(int));

    if (pt->has_embed) {
        NEED_P(-1, GPT2_WTE, GPT2_WPE);
        be->encoder_forward(be, a.encoded, a.inputs, P(m, m->params, GPT2_WTE, -1),
                            P(m, m->params, GPT2_WPE, -1), B, T, (int)C);
    }
    /* the first layer's ln1 stands alone; every later ln1 (and lnf) is fused
     * with the residual add that ends the layer before. */
    LayerActs la;
    layer_acts(m, &a, 0, &la);
    NEED_P(l0, GPT2_LN1W, GPT2_LN1B);
    be->layernorm_forward(be, la.ln1, la.ln1_mean, la.ln1_rstd, a.encoded, P(m, m->params, GPT2_LN1W, l0),
                          P(m, m->params, GPT2_LN1B, l0), (int)BT, (int)C);
    for (int j = 0; j < nl; j++) {
        const int l = l0 + j;
        layer_acts(m, &a, j, &la);
        NEED_P(l, GPT2_QKVW, GPT2_QKVB);
        be->matmul_forward(be, la.qkv, NULL, la.ln1, P(m, m->params, GPT2_QKVW, l),
                           P(m, m->params, GPT2_QKVB, l), (int)BT, (int)C, (int)(3 * C));
        be->attention_forward(be, la.atty, la.lse, la.qkv, B, T, (int)C, NH);
        NEED_P(l, GPT2_ATTPROJW, GPT2_ATTPROJB);
        be->matmul_forward(be, a.attproj, NULL, la.atty, P(m, m->params, GPT2_ATTPROJW, l),
                           P(m, m->params, GPT2_ATTPROJB, l), (int)BT, (int)C, (int)C);
        NEED_P(l, GPT2_LN2W, GPT2_LN2B);
        be->residual_layernorm_forward(
            be, la.res2, la.ln2, la.ln2_mean, la.ln2_rstd, la.res_in, a.attproj, P(m, m->params, GPT2_LN2W, l),
            P(m, m->params, GPT2_LN2B, l), (int)BT, (int)C);
        NEED_P(l, GPT2_FCW, GPT2_FCB);
        be->matmul_forward(be, la.fch_gelu, la.fch, la.ln2, P(m, m->params, GPT2_FCW, l),
                           P(m, m->params, GPT2_FCB, l), (int)BT, (int)C, (int)(4 * C));
        NEED_P(l, GPT2_FCPROJW, GPT2_FCPROJB);
        be->matmul_forward(be, a.fcproj, NULL, la.fch_gelu, P(m, m->params, GPT2_FCPROJW, l),
                           P(m, m->params, GPT2_FCPROJB, l), (int)BT, (int)(4 * C), (int)C);
        if (j + 1 < nl) {
            LayerActs next;
            layer_acts(m, &a, j + 1, &next);
            NEED_P(l + 1, GPT2_LN1W, GPT2_LN1B);
            be->residual_layernorm_forward(
                be, la.res3, next.ln1, next.ln1_mean, next.ln1_rstd, la.res2, a.fcproj,
                P(m, m->params, GPT2_LN1W, l + 1), P(m, m->params, GPT2_LN1B, l + 1), (int)BT, (int)C);
        } else if (pt->has_head) {
            NEED_P(-1, GPT2_LNFW, GPT2_LNFB);
            be->residual_layernorm_forward(
                be, la.res3, a.lnf, a.lnf_mean, a.lnf_rstd, la.res2, a.fcproj, P(m, m->params, GPT2_LNFW, -1),
                P(m, m->params, GPT2_LNFB, -1), (int)BT, (int)C);
        } else {
            be->residual_forward(be, la.res3, la.res2, a.fcproj, BT * C); /* the chunk's output */
        }
    }
    m->cur_B = B;
    m->cur_T = T;
    if (!pt->has_head) return 0.0f;
    NEED_P(-1, GPT2_WTE, -1);
    be->matmul_forward(be, a.logits, NULL, a.lnf, P(m, m->params, GPT2_WTE, -1), NULL, (int)BT, (int)C,
                       c->padded_vocab_size);
    if (!targets) return 0.0f;
    be->fused_classifier(be, a.logits, a.losses, a.targets, dloss, (int)BT, c->vocab_size,
                         c->padded_vocab_size);
    be->to_host(be, m->losses_host, a.losses, BT * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += m->losses_host[i];
    return (float)(sum / (double)BT);
}

static void mark_layer(GPT2* m, int layer, gpt2_ready_fn ready, void* ctx) {
    if (!ready) return;
    for (int k = GPT2_LN1W; k <= GPT2_FCPROJB; k++) ready(ctx, gpt2_tensor(m, k, layer)->layout_index);
}

/* The end of backward: wte's gradient = the lm head's dW (head; the GEMM,
 * first) + the encoder's token rows (embeddings); wpe's = the encoder's
 * position rows. */
static void embeddings_backward(GPT2* m, const Acts* a, gpt2_ready_fn ready, void* ctx) {
    Backend* be = m->be;
    const GPT2Config* c = &m->cfg;
    const GPT2Part* pt = &m->part;
    int B = m->cur_B, T = m->cur_T;
    size_t BT = (size_t)B * T, C = (size_t)c->channels;
    const GPT2Tensor* te = gpt2_tensor(m, GPT2_WTE, -1);
    const GPT2Tensor* tp = gpt2_tensor(m, GPT2_WPE, -1);
    const int Vp = c->padded_vocab_size;
    if (!m->shard_grads) {
        /* one full gradient buffer (zero_stage 0, 1): wte's chunks are one
         * contiguous range there. The dW GEMM chunk by chunk anyway (the same
         * GEMMs as ZeRO-2's, so the two give the same bits on every backend),
         * then one encoder backward for all rows (one sort on CUDA). */
        NEED_G(-1, GPT2_WTE, pt->has_embed ? GPT2_WPE : -1);
        for (int k = 0; pt->has_head && k < te->nchunks; k++) {
            int li = te->layout_index + k;
            const LayoutParam* lp = &m->layout->params[li];
            be->matmul_backward_weight(be, GPL(m, li), X(m, a->logits, lp->spec_off / C), Vp, a->lnf, (int)BT,
                                       (int)C, (int)(lp->numel / C));
        }
        if (pt->has_embed)
            be->encoder_backward(be, GP(m, GPT2_WTE, -1), GP(m, GPT2_WPE, -1), a->dres, a->inputs, B, T,
                                 (int)C);
        if (ready) {
            if (pt->has_embed) ready(ctx, tp->layout_index);
            for (int k = 0; k < te->nchunks; k++) ready(ctx, te->layout_index + k);
        }
        return;
    }
    /* sharded gradients (ZeRO-2): wpe first (its bucket can go), then one
     * wte chunk at a time, so that only a chunk's worth of wte gradient is
     * being written at once and each chunk's reduction starts as soon as it
     * is done */
    if (pt->has_embed) {
        NEED_G(-1, GPT2_WPE, -1);
        be->encoder_backward_range(be, NULL, GP(m, GPT2_WPE, -1), a->dres, a->inputs, B, T, (int)C, 0, 0);
        if (ready) ready(ctx, tp->layout_index);
    }
    for (int k = 0; k < te->nchunks; k++) {
        int li = te->layout_index + k;
        const LayoutParam* lp = &m->layout->params[li];
        const int r0 = (int)(lp->spec_off / C), rows = (int)(lp->numel / C);
        if (m->need_grads) m->need_grads(m->need_grads_ctx, &li, 1);
        void* g = GPL(m, li);
        if (pt->has_head)
            be->matmul_backward_weight(be, g, X(m, a->logits, (size_t)r0), Vp, a->lnf, (int)BT, (int)C, rows);
        if (pt->has_embed)
            be->encoder_backward_range(be, g, NULL, a->dres, a->inputs, B, T, (int)C, r0, r0 + rows);
        if (ready) ready(ctx, li);
    }
}

/* A layernorm backward that writes dres leaves it the gradient of res3 of
 * the part's layer j (the layer below it), and res3 = res2 + fcproj: the
 * column sums of dres are that layer's fcproj bias gradient, which the
 * layernorm sums as it writes (dsum). Its gradient buffer, or NULL when the
 * layer is not in this part (j < 0). */
static void* fcproj_bias_grad_below(GPT2* m, int j) {
    if (j < 0) return NULL;
    const int l = m->part.layer_first + j;
    NEED_G(l, GPT2_FCPROJB, -1);
    return GP(m, GPT2_FCPROJB, l);
}

void gpt2_backward(GPT2* m, gpt2_ready_fn ready, void* ctx) {
    Backend* be = m->be;
    const GPT2Config* c = &m->cfg;
    const GPT2Part* pt = &m->part;
    int B = m->cur_B, T = m->cur_T;
    Acts a;
    acts_get(m, &a);
    size_t BT = (size_t)B * T, C = (size_t)c->channels;
    int NH = c->num_heads, l0 = pt->layer_first, nl = pt->layer_count;
    void* W = m->params;
    LayerActs la;

    if (pt->has_head) {
        /* classifier: forward left dlogits in logits. Only dX here; the lm
         * head's dW (into wte's gradient) waits for the end of backward, where
         * the encoder's rows are added too. Nothing below overwrites logits or
         * lnf (backward's scratch is dres/dbtc/dqkv and each layer's
         * fch_gelu; recompute rewrites
         * only the shared ln1/ln2/GELU buffers). */
        be->matmul_backward(be, a.dbtc, NULL, NULL, a.logits, a.lnf, P(m, W, GPT2_WTE, -1), NULL, (int)BT,
                            (int)C, c->padded_vocab_size);
        be->zero(be, a.dres, BT * C * dtype_size(be->dtype));
        layer_acts(m, &a, nl - 1, &la);
        NEED_G(-1, GPT2_LNFW, GPT2_LNFB);
        be->layernorm_backward(be, a.dres, GP(m, GPT2_LNFW, -1), GP(m, GPT2_LNFB, -1),
                               fcproj_bias_grad_below(m, nl - 1), a.dbtc, la.res3, P(m, W, GPT2_LNFW, -1),
                               a.lnf_mean, a.lnf_rstd, (int)BT, (int)C);
        if (ready) {
            ready(ctx, gpt2_tensor(m, GPT2_LNFW, -1)->layout_index);
            ready(ctx, gpt2_tensor(m, GPT2_LNFB, -1)->layout_index);
        }
    }
    /* (without the head, the caller put the output's gradient in dres) */
    for (int j = nl - 1; j >= 0; j--) {
        const int l = l0 + j;
        layer_acts(m, &a, j, &la);
        /* recompute what forward did not keep (the shared buffers hold another layer's) */
        if (m->recompute >= 1) be->gelu_forward(be, la.fch_gelu, la.fch, BT * 4 * C);
        if (m->recompute >= 2)
            be->layernorm_forward(be, la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, P(m, W, GPT2_LN2W, l),
                                  P(m, W, GPT2_LN2B, l), (int)BT, (int)C);
        /* MLP: dres is the gradient of res3 (= res2 + fcproj). Its column
         * sums, the fcproj bias gradient, came from the layernorm backward
         * that wrote it (the next layer's ln1, or lnf); only in a model
         * chunk's last layer without the head, where dres came from the
         * next pipeline stage, does the matmul sum them. */
        const int fcproj_bias_summed = j < nl - 1 || pt->has_head;
        /* The gradient of the fc pre-activation overwrites the GELU output
         * it is computed from: the fcproj dW, its only other reader, comes
         * first inside matmul_backward (dinp may be inp), and it saves a
         * B*T*4C buffer. */
        NEED_G(l, GPT2_FCPROJW, GPT2_FCPROJB);
        void* dfch = la.fch_gelu;
        be->matmul_backward(be, dfch, GP(m, GPT2_FCPROJW, l),
                            fcproj_bias_summed ? NULL : GP(m, GPT2_FCPROJB, l), a.dres, la.fch_gelu,
                            P(m, W, GPT2_FCPROJW, l), la.fch, (int)BT, (int)(4 * C), (int)C);
        NEED_G(l, GPT2_FCW, GPT2_FCB);
        be->matmul_backward(be, a.dbtc, GP(m, GPT2_FCW, l), GP(m, GPT2_FCB, l), dfch, la.ln2,
                            P(m, W, GPT2_FCW, l), NULL, (int)BT, (int)C, (int)(4 * C));
        /* from here dres is the gradient of res2 (= res_in + attproj): its
         * column sums, summed as ln2's backward writes it, are the attproj
         * bias gradient */
        NEED_G(l, GPT2_LN2W, GPT2_LN2B);
        NEED_G(l, GPT2_ATTPROJB, -1);
        be->layernorm_backward(be, a.dres, GP(m, GPT2_LN2W, l), GP(m, GPT2_LN2B, l), GP(m, GPT2_ATTPROJB, l),
                               a.dbtc, la.res2, P(m, W, GPT2_LN2W, l), la.ln2_mean, la.ln2_rstd, (int)BT,
                               (int)C);
        /* attention */
        NEED_G(l, GPT2_ATTPROJW, -1);
        be->matmul_backward(be, a.dbtc, GP(m, GPT2_ATTPROJW, l), NULL, a.dres, la.atty,
                            P(m, W, GPT2_ATTPROJW, l), NULL, (int)BT, (int)C, (int)C);
        /* the qkv bias gradient comes from the attention backward (the
         * column sums of dqkv as it is written), so the qkv matmul gets none */
        NEED_G(l, GPT2_QKVW, GPT2_QKVB);
        be->attention_backward(be, a.dqkv, GP(m, GPT2_QKVB, l), a.dbtc, la.qkv, la.atty, la.lse, B, T, (int)C,
                               NH);
        if (m->recompute >= 2)
            be->layernorm_forward(be, la.ln1, la.ln1_mean, la.ln1_rstd, la.res_in, P(m, W, GPT2_LN1W, l),
                                  P(m, W, GPT2_LN1B, l), (int)BT, (int)C);
        be->matmul_backward(be, a.dbtc, GP(m, GPT2_QKVW, l), NULL, a.dqkv, la.ln1, P(m, W, GPT2_QKVW, l), NULL,
                            (int)BT, (int)C, (int)(3 * C));
        /* dres becomes the gradient of res_in, the previous layer's res3 */
        NEED_G(l, GPT2_LN1W, GPT2_LN1B);
        be->layernorm_backward(be, a.dres, GP(m, GPT2_LN1W, l), GP(m, GPT2_LN1B, l),
                               fcproj_bias_grad_below(m, j - 1), a.dbtc, la.res_in, P(m, W, GPT2_LN1W, l),
                               la.ln1_mean, la.ln1_rstd, (int)BT, (int)C);
        mark_layer(m, l, ready, ctx);
    }
    /* dres is now the gradient of the part's input (the pipeline sends it back) */
    if (pt->has_embed || pt->has_head) embeddings_backward(m, &a, ready, ctx);
}

void gpt2_logits_row(GPT2* m, int b, int t, float* out) {
    if (!m->part.has_head) fatal("internal: gpt2_logits_row on a model chunk without the head");
    Acts a;
    acts_get(m, &a);
    size_t row = (size_t)b * m->cur_T + t;
    size_t Vp = (size_t)m->cfg.padded_vocab_size, V = (size_t)m->cfg.vocab_size;
    const void* src = X(m, a.logits, row * Vp);
    if (m->be->dtype == DTYPE_FP32) {
        m->be->to_host(m->be, out, src, V * sizeof(float));
    } else {
        uint16_t* tmp = xmalloc(V * 2);
        m->be->to_host(m->be, tmp, src, V * 2);
        for (size_t i = 0; i < V; i++) out[i] = bf16_to_f32(tmp[i]);
        free(tmp);
    }
}

double gpt2_flops_per_token(const GPT2* m, int T) {
    const GPT2Config* c = &m->cfg;
    double C = c->channels, L = c->num_layers;
    double matmul_params = 12.0 * L * C * C + (double)c->padded_vocab_size * C; /* layers + lm head */
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

void gpt2_free(GPT2* m) {
    Backend* be = m->be;
    if (be) {
        size_t bytes = m->layout->total * dtype_size(be->dtype);
        be->release(be, m->params, bytes, MEM_PARAMS);
        if (m->grads) be->release(be, m->grads, bytes, MEM_GRADS);
        if (m->acts) be->release(be, m->acts, m->acts_bytes, MEM_ACTIVATIONS);
    }
    free(m->losses_host);
    free(m->tensors);
    free(m->layout_to_tensor);
    free(m->grad_ptr);
    memset(m, 0, sizeof *m);
}
