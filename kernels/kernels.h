/* kernels/kernels.h — the one kernel interface the model calls.
 *
 * A Backend is a table of functions plus its private context. The CPU backend
 * (kernels/cpu.c: fp32, OpenMP) is the reference; the CUDA backend
 * (kernels/cuda/: bf16 or fp32) implements the same table. The model, the
 * optimizer and the DDP code call only through this table, so the same binary
 * picks its backend at run time (--device auto|cpu|cuda).
 *
 * Conventions (both backends must follow them exactly):
 *  - "X" tensors (params, grads, activations) have the backend's dtype
 *    (be->dtype: fp32 on CPU; bf16 or fp32 on CUDA) and are passed as void*.
 *    Statistics (layernorm mean/rstd, attention logsumexp, losses), the
 *    optimizer state and the token ids are always float / int32.
 *  - All pointers are device pointers of that backend (host pointers on CPU).
 *  - Parameter gradients (dw, db, dwte, dwpe) ACCUMULATE (+=), so gradient
 *    accumulation over micro-steps needs no extra buffer.
 *  - Activation gradients: layernorm_backward ACCUMULATES into dinp (the
 *    residual stream); matmul_backward and attention_backward OVERWRITE dinp.
 *  - Shapes follow llm.c: B batch, T time, C channels, NH heads, V vocab,
 *    Vp padded vocab; weights are [OC, C] row-major (out = inp @ W^T + b).
 *  - Every kernel is deterministic: the same inputs give the same bits.
 *  - Calls are asynchronous on the backend's compute stream (CPU: synchronous).
 */
#ifndef KERNELS_KERNELS_H
#define KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "../common/util.h"

typedef enum { DTYPE_FP32 = 0, DTYPE_BF16 = 1 } DType;
static inline size_t dtype_size(DType d) { return d == DTYPE_BF16 ? 2 : 4; }
const char* dtype_name(DType d);

/* One contiguous run of a parameter inside the flat buffers, as the optimizer
 * and the grad norm see it (built by ddp/layout.c). */
typedef struct {
    size_t buf_off;   /* element offset in the flat param buffer */
    size_t grad_off;  /* element offset of its gradient in the gradient buffer handed to the
                       * kernel: buf_off in a full flat gradient buffer, or its place in a
                       * ZeRO-2 gradient shard */
    size_t rng_off;   /* the index of its first element for bf16 stochastic rounding (the
                       * rounding of element j hashes rng_off + j): buf_off, except where two
                       * ranks hold copies of one tensor at different offsets and must round
                       * them alike (a tied embedding across pipeline stages) */
    size_t state_off; /* element offset in this rank's optimizer state (master, m, v) */
    size_t len;       /* elements */
    int decay;        /* 1: apply weight decay (matmul weights, embeddings) */
} OptPiece;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* multiplies every gradient first (clipping; 1 = none) */
    int t;            /* 1-based step count for bias correction */
    uint32_t seed;    /* stochastic rounding seed (bf16 params) */
} AdamWArgs;

typedef struct Backend Backend;
struct Backend {
    const char* name; /* "cpu" or "cuda" */
    DType dtype;      /* dtype of X tensors */
    void* ctx;        /* backend-private state */
    MemTracker mem;   /* every allocation below goes through it */

    /* ---- memory ---- */
    void* (*alloc)(Backend* be, size_t bytes, MemCategory cat); /* fatal() on failure */
    void (*release)(Backend* be, void* p, size_t bytes, MemCategory cat);
    void (*zero)(Backend* be, void* p, size_t bytes);
    void (*to_device)(Backend* be, void* dst, const void* host_src, size_t bytes);
    void (*to_host)(Backend* be, void* host_dst, const void* src, size_t bytes); /* synchronous */
    void (*copy)(Backend* be, void* dst, const void* src, size_t bytes);
    void (*synchronize)(Backend* be);
    /* peak bytes the backend reserved from the system (CUDA: the driver's
     * view; CPU: peak RSS). */
    size_t (*peak_reserved)(Backend* be);
    void (*reset_peak)(Backend* be);
    void (*destroy)(Backend* be);

    /* ---- dtype conversion between X tensors and fp32 ---- */
    void (*x_to_f32)(Backend* be, float* dst, const void* src, size_t n);
    void (*f32_to_x)(Backend* be, void* dst, const float* src, size_t n);

    /* ---- forward ---- */
    /* out[B,T,C] = wte[inp[b,t]] + wpe[t] */
    void (*encoder_forward)(Backend* be, void* out, const int* inp, const void* wte, const void* wpe, int B,
                            int T, int C);
    /* out = layernorm(inp) * w + b over the last dim; mean, rstd: [N] fp32 */
    void (*layernorm_forward)(Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w,
                              const void* b, int N, int C);
    /* residual = inp1 + inp2; out = layernorm(residual) (fused) */
    void (*residual_layernorm_forward)(Backend* be, void* residual, void* out, float* mean, float* rstd,
                                       const void* inp1, const void* inp2, const void* w, const void* b, int N,
                                       int C);
    /* out = inp1 + inp2 */
    void (*residual_forward)(Backend* be, void* out, const void* inp1, const void* inp2, size_t n);
    /* pre = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL).
     * If pre_gelu != NULL: pre_gelu = pre and out = gelu(pre); else out = pre. */
    void (*matmul_forward)(Backend* be, void* out, void* pre_gelu, const void* inp, const void* w,
                           const void* bias, int N, int C, int OC);
    /* causal self-attention. qkv[B,T,3C] (q | k | v, heads of C/NH inside each);
     * out[B,T,C]; lse[B,NH,T] fp32 logsumexp of the scaled scores per query. */
    void (*attention_forward)(Backend* be, void* out, float* lse, const void* qkv, int B, int T, int C, int NH);
    /* tanh-approximated GELU, elementwise */
    void (*gelu_forward)(Backend* be, void* out, const void* inp, size_t n);
    /* losses[N] = -log softmax(logits[n, :V])[targets[n]]; logits rows are Vp
     * long. If dloss != 0, logits is overwritten by its gradient
     * (softmax - onehot) * dloss, with the padded columns V..Vp-1 set to 0. */
    void (*fused_classifier)(Backend* be, void* logits, float* losses, const int* targets, float dloss, int N,
                             int V, int Vp);

    /* ---- backward ---- */
    /* dwte[inp[b,t]] += dout[b,t], dwpe[t] += dout[b,t] (every row of wte;
     * encoder_backward_range below restricts it to some rows) */
    void (*encoder_backward)(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B,
                             int T, int C);
    /* dinp += ..., dw += ..., db += ... If dsum != NULL, also dsum[c] += the
     * column sums of dinp as it is stored after the update, over its N rows,
     * deterministic: the bias gradient of the linear layer whose output
     * gradient dinp is (the residual stream's gradient is the attproj and
     * fcproj outputs' gradient), without reading dinp again. */
    void (*layernorm_backward)(Backend* be, void* dinp, void* dw, void* db, void* dsum, const void* dout,
                               const void* inp, const void* w, const float* mean, const float* rstd, int N,
                               int C);
    /* dinp = dout @ w (overwrite); dw += dout^T @ inp; dbias += column sums
     * of dout (if dbias != NULL). If pre_gelu != NULL, the GELU backward is
     * fused: dinp = (dout @ w) * gelu'(pre_gelu). That serves the
     * fc -> gelu -> fcproj chain, where inp = gelu(pre_gelu): the result is
     * the gradient of the fc pre-activation. dinp == NULL skips dX (and the
     * GELU); dw == NULL skips dW (the lm head computes dX first and its dW at
     * the end of backward, through matmul_backward_weight). dW is computed
     * before dinp is written, so dinp may be the same buffer as inp (the
     * model writes the fc gradient over the GELU output it came from). */
    void (*matmul_backward)(Backend* be, void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                            const void* w, const void* pre_gelu, int N, int C, int OC);
    /* dqkv = gradient of attention (overwrite). dbias (NULL: skipped) is the
     * [3C] gradient of the qkv matmul's bias: dbias += the column sums of
     * dqkv over its B*T rows, deterministic (the qkv matmul_backward then
     * gets dbias NULL: computed here, dqkv is not read again for it). */
    void (*attention_backward)(Backend* be, void* dqkv, void* dbias, const void* dout, const void* qkv,
                               const void* out, const float* lse, int B, int T, int C, int NH);
    /* dinp = dout * gelu'(inp) (overwrite) */
    void (*gelu_backward)(Backend* be, void* dinp, const void* inp, const void* dout, size_t n);

    /* ---- optimizer ---- */
    /* Sum of squares (in double where the backend can) of the gradients of
     * the pieces (grads + grad_off), deterministic; returned on the host. */
    double (*grad_sumsq)(Backend* be, const void* grads, const OptPiece* pieces, int npieces);
    /* AdamW on every piece: g = grads[grad_off..] * grad_scale; m, v, master updated at
     * state_off; weight decay decoupled (master -= lr * wd * master) only when
     * piece.decay; then params[buf_off..] = master (stochastically rounded when
     * X is bf16). master/m/v are fp32 arrays of this rank's optimizer state. */
    void (*adamw)(Backend* be, void* params, const void* grads, float* master, float* m, float* v,
                  const OptPiece* pieces, int npieces, const AdamWArgs* a);

    /* streams for the communicator (CUDA: cudaStream_t; CPU: NULL) */
    void* compute_stream;
    void* comm_stream;

    /* ---- slices of the embedding's gradient (ZeRO-2's row chunks) ---- */
    /* dw[OC,C] += dout[:, 0:OC]^T @ inp[N,C], the rows of dout ld_dout (>= OC)
     * elements apart: matmul_backward's dW alone, for a column slice of a
     * wider dout (pass dout + the slice's first column; dw is then the
     * matching rows of the weight gradient). Each element gets the same sum
     * in the same order as from matmul_backward's dW (CPU: the same bits as
     * the full-width call, whatever the slice). */
    void (*matmul_backward_weight)(Backend* be, void* dw, const void* dout, int ld_dout, const void* inp, int N,
                                   int C, int OC);
    /* encoder_backward restricted to the vocabulary rows [v0, v1): only
     * tokens with v0 <= id < v1 contribute, into dwte, which points at row
     * v0's gradient (rows v0..v1-1 follow it). dwte == NULL skips the token
     * rows, dwpe == NULL the position rows (v0, v1 then do not matter). Each
     * row gets the same terms in the same order as from encoder_backward, so
     * calls over disjoint ranges give encoder_backward's bits. */
    void (*encoder_backward_range)(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B,
                                   int T, int C, int v0, int v1);
};

/* Constructors: fatal() with a clear message when the backend is not available. */
Backend* backend_cpu_create(void);
/* The CPU backend with a given GEMM micro-kernel (kernels/cpu_gemm.h; NULL:
 * the fastest this CPU runs); the tests use it to compare the kernels. */
struct GemmKernel;
Backend* backend_cpu_create_gemm(const struct GemmKernel* gemm);
/* Defined in kernels/cuda/ when built with CUDA; the stub in
 * kernels/backend.c says "built without CUDA" otherwise. */
Backend* backend_cuda_create(DType dtype, int device_index, int allow_tf32);
/* (device_index is the local rank, taken modulo the number of visible GPUs:
 * ranks beyond the GPU count share GPUs round-robin.) */
int backend_cuda_available(void); /* 1 if built with CUDA and a GPU is visible */

#endif
