/* model/gpt2.h — GPT-2 itself: configuration, parameter tensors, weight
 * init, llm.c model files, forward and backward over the kernel interface.
 *
 * A model goes through these calls, in this order (tools and tests that only
 * read files stop after the first):
 *   gpt2_describe        tensors and layout specs (no backend, no buffers)
 *   layout_build         the caller's layout from those specs (ddp/layout.h)
 *   gpt2_bind            backend, layout, flat param (and grad) buffers
 *   gpt2_init_random or gpt2_load       parameter values
 *   gpt2_alloc_activations              the activation block for (B, T)
 *   gpt2_forward [gpt2_backward], ...   one micro-step each
 *   gpt2_free
 * The model-file header codec, gpt2_num_parameters, gpt2_read_header and
 * gpt2_tensor_index need no model.
 *
 * The model owns no parameter storage layout of its own: its tensors are
 * views into the flat param/grad buffers whose layout (ddp/layout.h) the
 * caller builds from gpt2_describe()'s specs.
 *
 * The token embedding wte (the tied lm head) is described with row_len = C:
 * when it holds more than a bucket, the layout cuts it into row chunks, a
 * bucket each, so wte is then several consecutive layout parameters (one
 * contiguous range of the flat buffers, still one tensor to the model).
 * Backward computes the lm head's weight gradient at the end, next to the
 * encoder's, so that under ZeRO-2 each chunk's gradient is written, and
 * reduced, one chunk after the other instead of living through the whole
 * backward (docs/ZERO.md). */
#ifndef MODEL_GPT2_H
#define MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>
#include "../kernels/kernels.h"
#include "../ddp/layout.h"

typedef struct {
    int max_seq_len;       /* maxT */
    int vocab_size;        /* V: 50257 */
    int padded_vocab_size; /* Vp: 50304 */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C */
} GPT2Config;

/* The 16 kinds of parameter tensor, in llm.c's file order. */
/* clang-format off */
enum {
    GPT2_WTE, GPT2_WPE, GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB, GPT2_ATTPROJW,
    GPT2_ATTPROJB, GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB, GPT2_FCPROJW, GPT2_FCPROJB,
    GPT2_LNFW, GPT2_LNFB, GPT2_NUM_KINDS
};
/* clang-format on */

/* The part of the model one GPT2 object holds. A zeroed part is the whole
 * model; a pipeline's model chunk holds layers [layer_first, layer_first +
 * layer_count) and, on the first chunk, the embeddings (wte, wpe: the
 * encoder), on the last, the final layernorm and the LM head (lnf, and wte
 * again: the head is tied to the token embedding). */
typedef struct {
    int layer_first, layer_count; /* layer_count 0: every layer, embeddings and head */
    int has_embed;                /* wte and wpe; the forward starts from token ids */
    int has_head;                 /* lnf and the tied wte; the forward ends in the loss */
} GPT2Part;

typedef struct {
    int kind, layer; /* layer = -1 for the non-layer tensors */
    int present;     /* held by this model (its part); the others are described but
                      * have no place in the layout */
    size_t numel;
    size_t file_off;  /* element offset in llm.c's file order */
    size_t buf_off;   /* element offset in the flat buffers (from the layout) */
    int layout_index; /* index in the layout's parameter list */
    int decay;        /* weight decay applies: matmul weights and embeddings */
    char name[32];
    int nchunks; /* layout parameters of this tensor, set by gpt2_bind: layout
                  * indices [layout_index, layout_index + nchunks) (wte: its row
                  * chunks when the layout cut it; every other tensor: 1) */
} GPT2Tensor;

/* Called by backward as soon as a tensor's gradient is final for this
 * micro-step (layout_index as in the layout). */
typedef void (*gpt2_ready_fn)(void* ctx, int layout_index);
/* Called just before a kernel first touches some tensors (n layout indices):
 * need_params before forward reads their params (the overlapped ZeRO
 * all-gather waits here for the buckets that hold them), need_grads before
 * backward accumulates into their gradients (ZeRO-2 points grad_ptr at a
 * working buffer here). A hook may be called again for tensors it has seen. */
typedef void (*gpt2_need_fn)(void* ctx, const int* layout_indices, int n);

/* A model. The caller zeroes it before gpt2_describe and sets the fields marked "set before"
 * itself. The model owns tensors, layout_to_tensor, grad_ptr, the flat buffers and the
 * activations (gpt2_free releases them); be and layout are borrowed and must outlive it. */
typedef struct {
    GPT2Config cfg;
    GPT2Part part;          /* set before gpt2_describe (zeroed: the whole model); describe fills it in */
    Backend* be;            /* borrowed, set by gpt2_bind */
    int ntensors;           /* 12 L + 4, present or not */
    int npresent;           /* tensors of this part: the layout's specs */
    GPT2Tensor* tensors;    /* in llm.c file order */
    int* layout_to_tensor;  /* layout index -> tensor index (gpt2_describe: one entry per
                             * spec; gpt2_bind: one per layout parameter, nlayout) */
    size_t num_parameters;  /* of the whole model: sum of numel (padded vocab rows included) */
    size_t part_parameters; /* of the tensors present */
    const Layout* layout;   /* borrowed, set by gpt2_bind (gpt2_free reads its total) */
    void* params;           /* flat buffers, layout->total elements of be->dtype */
    void* grads;            /* NULL when shard_grads */
    int shard_grads;        /* set before gpt2_bind: allocate no full-size gradient buffer
                             * (ZeRO-2: the need_grads hook fills grad_ptr) */
    void** grad_ptr;        /* [nlayout], by LAYOUT index: where backward accumulates each
                             * layout parameter's gradient; gpt2_bind sets grads + offset
                             * (NULL when shard_grads) */
    gpt2_need_fn need_params, need_grads; /* optional hooks (NULL = none) */
    void *need_params_ctx, *need_grads_ctx;
    /* activations, allocated for (B, T) by gpt2_alloc_activations: nslots blocks of what
     * forward keeps for backward (a pipeline keeps several micro-batches in flight; slot
     * `slot` is the one forward and backward use, gpt2_use_slot) and one scratch block */
    int B, T;
    int nslots; /* set before gpt2_alloc_activations (0 means 1) */
    int slot;
    int recompute; /* activation recomputation, set before gpt2_alloc_activations:
                    * 0 none; 1 GELU outputs recomputed in backward (one shared
                    * [B,T,4C] buffer instead of L); 2 also the layernorm outputs
                    * ln1, ln2 (one shared [B,T,C] each) */
    void* acts;    /* nslots blocks of slot_bytes, then the scratch block */
    size_t acts_bytes, slot_bytes;
    float* losses_host;
    int cur_B, cur_T; /* shape of the last forward */
    int nlayout;      /* layout parameters (gpt2_bind): ntensors + the extra row chunks */
} GPT2;

/* Preset "dN": N layers, 64*N channels, N heads, maxT 1024 (d12 = GPT-2
 * 124M). Returns 0, or -1 if name is not a preset. */
int gpt2_preset(const char* name, GPT2Config* cfg);

/* llm.c model files: a header of GPT2_HEADER_INTS int32 (magic, version, maxT, V, L, NH, C, Vp, then
 * zeros), then every parameter tensor in file order, fp32 (version 3) or bf16 (version 5), padded
 * vocabulary rows included. The header is read and written as host int32 (this code runs on
 * little-endian hosts only). */
#define GPT2_MODEL_MAGIC 20240326
#define GPT2_HEADER_INTS 256
/* Decodes and checks an llm.c model-file header (256 little-endian int32): magic, version 3 (fp32)
 * or 5 (bf16), a sane shape (the checks gpt2_read_header makes). Returns 0, or -1 with a
 * one-line reason in err (errlen bytes) that does not name a file (the caller prefixes it).
 * On -1, cfg and version are left as they were. A sane shape bounds the parameter count, so the
 * file size it describes fits in a long long. */
int gpt2_header_decode(const int32_t h[GPT2_HEADER_INTS], GPT2Config* cfg, int* version, char* err,
                       size_t errlen);
/* The header of a model file of this shape and version (3 or 5); other slots 0. */
void gpt2_header_encode(const GPT2Config* cfg, int version, int32_t h[GPT2_HEADER_INTS]);
/* Parameter count of the model of this shape (padded vocab rows included), with no model built. */
size_t gpt2_num_parameters(const GPT2Config* cfg);
/* Reads the config from an llm.c model file's header: fatal, naming the file, when the file is
 * shorter than the header, when gpt2_header_decode refuses the header, or when the file's size is
 * not the header plus the parameters it describes. */
void gpt2_read_header(const char* path, GPT2Config* cfg, int* file_dtype_version);
/* The position of tensor (kind, layer) in llm.c's file order, which is its index in m->tensors:
 * the one place that knows that order (wte, wpe, each layer kind for layers 0..L-1, lnfw, lnfb).
 * layer is 0..L-1 for the layer kinds (GPT2_LN1W..GPT2_FCPROJB) and -1 for the others; any other
 * combination is fatal (internal). */
int gpt2_tensor_index(const GPT2Config* cfg, int kind, int layer);
/* &m->tensors[gpt2_tensor_index(&m->cfg, kind, layer)]; m described (gpt2_describe). */
GPT2Tensor* gpt2_tensor(const GPT2* m, int kind, int layer);
/* The model's tensors (sets m->cfg, m->tensors, m->num_parameters, and
 * fills in m->part) and the layout specs of the tensors of its part, in
 * backward-finish order: lnf (head), the layers from the last down, wpe, wte
 * (embed or head); *n = npresent. wte's spec has row_len = C (the layout may
 * cut it into row chunks); in a model chunk (not the whole model) wte also
 * starts a bucket of its own, so that the first and the last chunk, each
 * holding a copy of the tied embedding, lay it out alike: the same buckets
 * and, at every data-parallel size, the same slices. m zeroed but for
 * m->part (fatal, one line, on a part outside the model); cfg checked
 * (a decoded header or a preset). The caller frees the specs, whose names
 * point into m->tensors; gpt2_free frees what this allocates in m (a model
 * only described can be freed with it too). */
LayoutParamSpec* gpt2_describe(GPT2* m, const GPT2Config* cfg, int* n);
/* Binds the model to a backend and a layout built from gpt2_describe's specs
 * (maps its parameters, row chunks included, to the tensors); allocates the
 * flat buffers (zeroed, so padding is 0): params, and grads unless
 * m->shard_grads. Once, after gpt2_describe; fatal (internal) when the layout
 * does not come from the model's specs. */
void gpt2_bind(GPT2* m, Backend* be, const Layout* L);
/* GPT-2 init (normal 0.02, residual projections 0.02/sqrt(2L), biases 0,
 * layernorm weights 1; padded vocab rows 0), from seed, after gpt2_bind. Each
 * tensor has its own stream, so the values depend on neither the layout nor
 * the thread count. */
void gpt2_init_random(GPT2* m, uint64_t seed);
/* llm.c model files, after gpt2_bind. load: the present tensors, from their
 * places in the file; fatal on a bad file (gpt2_read_header's checks), a
 * shape that differs from m->cfg or a non-finite value. save (the whole
 * model only): version 3 (fp32) or 5 (bf16), written to path.tmp, then
 * renamed over path. */
void gpt2_load(GPT2* m, const char* path);
void gpt2_save(GPT2* m, const char* path, int version);
/* The present tensors (but wte when skip_wte), in the format of version
 * (3 or 5), written with pwrite at their places in an open model file fd:
 * byte GPT2_HEADER_INTS*4 + file_off * element size. Several processes
 * holding different parts write one file this way. 0, or -1 with a one-line
 * reason in err. */
int gpt2_write_tensors(GPT2* m, int fd, int version, int skip_wte, char* err, size_t errlen);
/* Parameters as fp32 in llm.c file order (host array of num_parameters; the
 * present tensors only), after gpt2_bind. */
void gpt2_params_to_host(GPT2* m, float* out);
void gpt2_grads_to_host(GPT2* m, float* out); /* fatal when shard_grads */
void gpt2_params_from_host(GPT2* m, const float* in);

/* The activations for batches of up to B x T tokens (m->recompute and
 * m->nslots set before), after gpt2_bind; once per model. */
void gpt2_alloc_activations(GPT2* m, int B, int T);
/* The slot (0 .. nslots-1) the next forward fills and the next backward
 * reads: the activations of one micro-batch in flight. */
void gpt2_use_slot(GPT2* m, int slot);
/* [B, T, C] buffers of the current slot, for the pipeline's transfers:
 *   gpt2_input   the chunk's input activations (no embeddings: written by the
 *                caller before forward; with embeddings: the encoder's output);
 *   gpt2_output  the chunk's output, the residual stream after its last layer
 *                (no head: valid after forward until the slot is reused).
 * gpt2_dres: the backward's residual-gradient buffer, shared by the slots: no
 * head: written by the caller before backward with the gradient of the
 * output; no embeddings: after backward, the gradient of the input, valid
 * until the next backward. */
void* gpt2_input(GPT2* m);
void* gpt2_output(GPT2* m);
void* gpt2_dres(GPT2* m);
/* Forward over the current slot. With embeddings, from inputs[B*T] (host
 * ids); without, from gpt2_input (inputs unused). With the head and targets
 * (host ids), returns the mean loss, and if also dloss != 0 the logits are
 * replaced by their gradient times dloss, ready for gpt2_backward; otherwise
 * returns 0. B, T may be smaller than allocated. Calls need_params (if set)
 * before each kernel that reads parameters, with the tensors that kernel
 * reads; every present tensor is read, so after a forward every hook-guarded
 * parameter has been asked for. */
float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T, float dloss);
/* Backward of the current slot's forward (which, with the head, had dloss != 0; without,
 * gpt2_dres holds the gradient of the output): grads += ... through
 * grad_ptr, calling need_grads (if set) before each kernel that accumulates
 * into parameter gradients, and ready(ctx, layout_index) for each layout
 * parameter as its gradient becomes final. The lm head's weight gradient
 * (into wte's) is computed at the end, before the encoder's rows are added:
 * with a full gradient buffer (!shard_grads) one dW GEMM per wte chunk, then
 * one encoder backward, then every chunk is ready; with shard_grads
 * (ZeRO-2) wpe's encoder backward first, then chunk by chunk: need_grads,
 * the dW GEMM of its vocabulary rows, the encoder backward of the tokens in
 * those rows, ready. Either way each element of wte's gradient gets the
 * GEMM's terms and then the encoder's, in the same order. */
void gpt2_backward(GPT2* m, gpt2_ready_fn ready, void* ctx);
/* Logits (the head) of position (b, t) of the last forward, first V columns, as fp32 on
 * the host (out has V floats). Only after a forward with dloss = 0 (with
 * dloss != 0 the logits hold their gradient). */
void gpt2_logits_row(GPT2* m, int b, int t, float* out);
/* Training FLOPs per token: 6 * (params in matmuls) + 12 * L * C * T. */
double gpt2_flops_per_token(const GPT2* m, int T);
/* Releases what the model owns, at whatever point of its life it is (described, bound, with
 * activations), and zeroes m. The backend and the layout stay the caller's. */
void gpt2_free(GPT2* m);

#endif
