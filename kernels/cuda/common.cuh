/* kernels/cuda/common.cuh — what every CUDA kernel file of the backend shares:
 * the checked-call macros, the backend's private context (CudaCtx), the
 * scratch allocator, element conversions between X types (float, bf16) and
 * fp32, 16-byte vector loads, warp reductions, and the prototypes of the
 * per-concept entry points that backend.cu puts into the Backend table. */
#ifndef KERNELS_CUDA_COMMON_CUH
#define KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <stdint.h>
#include <type_traits>

extern "C" {
#include "../kernels.h"
}

typedef __nv_bfloat16 bf16;

/* ---- checked calls: fatal() with file, line and the error string ---- */
#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            fatal("%s:%d: CUDA error: %s (%s)", __FILE__, __LINE__, cudaGetErrorString(e_), #call); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                                   \
    do {                                                                                                     \
        cublasStatus_t s_ = (call);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                     \
            fatal("%s:%d: cuBLASLt error: %s (%s)", __FILE__, __LINE__, cublasLtGetStatusString(s_), #call); \
    } while (0)
/* after every kernel launch */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* one cached cuBLASLt configuration (matmul.cu) */
struct LtPlan;

/* The backend's private state, be->ctx. */
struct CudaCtx {
    int device;
    int num_sms;
    int allow_tf32;
    cudaStream_t stream;      /* compute */
    cudaStream_t comm_stream; /* communicator */
    /* driver's view of memory for peak_reserved: device bytes in use when the
     * backend was created (context, other processes) and the peak since. */
    size_t base_used;
    size_t peak_used;
    /* cuBLASLt */
    cublasLtHandle_t lt;
    void* lt_workspace;
    size_t lt_workspace_bytes;
    LtPlan* plans; /* linked list of cached (shape -> descriptors + algorithm) */
    int gemm_tune; /* GPT2_CUDA_GEMM_TUNE: 0 the heuristic's first algorithm; 1 the fastest candidate
                    * with its bits (default); 2 the same, printing each choice and candidate (matmul.cu) */
    /* one scratch buffer reused by the kernels that need temporary memory
     * (only the compute stream touches it, so successive users are ordered) */
    void* scratch;
    size_t scratch_bytes;
    /* optimizer piece table: cached host copy, device chunk table */
    OptPiece* host_pieces;
    int host_npieces;
    void* dev_chunks;
    size_t dev_chunks_bytes;
    int nchunks;
    double* dev_sumsq; /* partial sums [nchunks] + result */
    size_t dev_sumsq_bytes;
    /* compute capability 9.0 (H100, H200): the sm_90a machine code runs */
    int sm90;
    /* attention tensor-core kernels for the forward, dK/dV and dQ: warps a
     * block (4 or 8) of the mma.sync kernels, or 0 for the wgmma kernels of
     * attention_sm90.cu (head size 64 on sm90; attention.cu) */
    int attn_nw[3];
    /* the driver's cuTensorMapEncodeTiled (attention_sm90.cu's backward) */
    void* tmap_encode;
};

static inline CudaCtx* cuda_ctx(Backend* be) { return (CudaCtx*)be->ctx; }

/* ---- helpers implemented in backend.cu ---- */
void* cuda_scratch(Backend* be, size_t bytes); /* at least bytes, valid until the next call */
void* cuda_alloc_tracked(Backend* be, size_t bytes, MemCategory cat);
void cuda_release_tracked(Backend* be, void* p, size_t bytes, MemCategory cat);

/* ---- element conversions ---- */
template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<bf16>(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

/* elements of T in 16 bytes */
template <typename T> struct Vec16 { static constexpr int N = 16 / (int)sizeof(T); };

/* V elements of T kept as they were loaded (one 16-byte register quad when
 * V * sizeof(T) == 16, else V scalars) and converted to float at each use:
 * a row prefetched a row ahead costs half the registers of its floats (bf16) */
template <int V, typename T, bool W = (V * sizeof(T) == 16)> struct RawVec;
template <int V, typename T> struct RawVec<V, T, true> {
    int4 q;
    __device__ __forceinline__ void load(const T* p) { q = *reinterpret_cast<const int4*>(p); }
    __device__ __forceinline__ void load_cs(const T* p) { q = __ldcs(reinterpret_cast<const int4*>(p)); }
    __device__ __forceinline__ float operator[](int k) const {
        return to_f<T>(reinterpret_cast<const T*>(&q)[k]);
    }
};
template <int V, typename T> struct RawVec<V, T, false> {
    T s[V];
    __device__ __forceinline__ void load(const T* p) {
#pragma unroll
        for (int k = 0; k < V; k++) s[k] = p[k];
    }
    __device__ __forceinline__ void load_cs(const T* p) { load(p); }
    __device__ __forceinline__ float operator[](int k) const { return to_f<T>(s[k]); }
};

/* load / store V elements as floats (V*sizeof(T) == 16: one 16-byte access; else scalars) */
template <int V, typename T> __device__ __forceinline__ void load_vec(float* dst, const T* src) {
    RawVec<V, T> r;
    r.load(src);
#pragma unroll
    for (int i = 0; i < V; i++) dst[i] = r[i];
}
/* streaming variant for data read once */
template <int V, typename T> __device__ __forceinline__ void load_vec_cs(float* dst, const T* src) {
    RawVec<V, T> r;
    r.load_cs(src);
#pragma unroll
    for (int i = 0; i < V; i++) dst[i] = r[i];
}
template <int V, typename T> __device__ __forceinline__ void store_vec(T* dst, const float* src) {
    if constexpr (V * sizeof(T) == 16) {
        int4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < V; i++) e[i] = from_f<T>(src[i]);
        *reinterpret_cast<int4*>(dst) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) dst[i] = from_f<T>(src[i]);
    }
}

/* 16 bytes global -> shared (L2 only, no registers held); pred false
 * writes 16 zero bytes instead of reading gmem. Commit groups them; the
 * copies of all but the last N committed groups of this thread are complete
 * and visible to it after cp_async_wait<N> (a compiler barrier too, so that
 * shared-memory reads are not moved above it) */
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- warp reductions (fixed butterfly order: deterministic) ---- */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The attention backward's D = rowsum(dO * O) of one row (query t of
 * sequence b, head h; rows of NH heads of 8 L bf16, 16-byte aligned) over L
 * lanes of a warp: lane c reads 16 bytes of each, the lanes' sums meet by
 * xor shuffles (a fixed order). Every lane of the warp calls it; a lane with
 * valid false adds 0. Each lane returns the row's D. */
template <int L>
__device__ __forceinline__ float attn_row_dot(const bf16* dout, const bf16* out, int b, int t, int h, int T,
                                              int NH, int c, bool valid) {
    float s = 0.0f;
    if (valid) {
        const size_t off = ((size_t)b * T + t) * NH * 8 * L + (size_t)h * 8 * L + c * 8;
        float a[8], o[8];
        load_vec<8>(a, dout + off);
        load_vec<8>(o, out + off);
#pragma unroll
        for (int k = 0; k < 8; k++) s += a[k] * o[k];
    }
#pragma unroll
    for (int m = L / 2; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    return s;
}

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* Row kernels keep a row in registers: lane l of a warp owns the V-element
 * vectors (j*32 + l) for j < NCH. dispatch_nch calls f with the smallest NCH
 * from a fixed set that covers C; f returns false when NCH*V is too large for
 * registers (more than 64 floats a lane), and so does dispatch_nch. */
template <int V, typename F> static bool dispatch_nch(int C, F&& f) {
    int need = (C + 32 * V - 1) / (32 * V);
    if (need <= 1) return f(std::integral_constant<int, 1>{});
    if (need <= 2) return f(std::integral_constant<int, 2>{});
    if (need <= 3) return f(std::integral_constant<int, 3>{});
    if (need <= 4) return f(std::integral_constant<int, 4>{});
    if (need <= 8) return f(std::integral_constant<int, 8>{});
    if (need <= 16) return f(std::integral_constant<int, 16>{});
    if (need <= 32) return f(std::integral_constant<int, 32>{});
    if (need <= 64) return f(std::integral_constant<int, 64>{});
    return false;
}

/* ---- per-concept entry points (each .cu defines its own) ---- */
/* misc.cu */
void cuda_x_to_f32(Backend* be, float* dst, const void* src, size_t n);
void cuda_f32_to_x(Backend* be, void* dst, const float* src, size_t n);
void cuda_residual_forward(Backend* be, void* out, const void* inp1, const void* inp2, size_t n);
void cuda_gelu_forward(Backend* be, void* out, const void* inp, size_t n);
void cuda_gelu_backward(Backend* be, void* dinp, const void* inp, const void* dout, size_t n);
/* encoder.cu */
void cuda_encoder_forward(Backend* be, void* out, const int* inp, const void* wte, const void* wpe, int B,
                          int T, int C);
void cuda_encoder_backward(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B, int T,
                           int C);
void cuda_encoder_backward_range(Backend* be, void* dwte, void* dwpe, const void* dout, const int* inp, int B,
                                 int T, int C, int v0, int v1);
/* layernorm.cu */
void cuda_layernorm_forward(Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w,
                            const void* b, int N, int C);
void cuda_residual_layernorm_forward(Backend* be, void* residual, void* out, float* mean, float* rstd,
                                     const void* inp1, const void* inp2, const void* w, const void* b, int N,
                                     int C);
void cuda_layernorm_backward(Backend* be, void* dinp, void* dw, void* db, void* dsum, const void* dout,
                             const void* inp, const void* w, const float* mean, const float* rstd, int N,
                             int C);
/* matmul.cu */
void cuda_matmul_init(Backend* be);
void cuda_matmul_destroy(Backend* be);
void cuda_matmul_forward(Backend* be, void* out, void* pre_gelu, const void* inp, const void* w,
                         const void* bias, int N, int C, int OC);
void cuda_matmul_backward(Backend* be, void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                          const void* w, const void* pre_gelu, int N, int C, int OC);
void cuda_matmul_backward_weight(Backend* be, void* dw, const void* dout, int ld_dout, const void* inp, int N,
                                 int C, int OC);
/* dbias[OC] += the column sums of dout[N, OC] (deterministic: fp32 partial
 * sums of fixed row chunks, then a fixed-order sum) */
void cuda_bias_colsum_add(Backend* be, void* dbias, const void* dout, int N, int OC);
/* dbias[c] += sum over g in [0, chunks) of partial[g * OC + c], in that
 * order (for kernels that leave column sums of their output per block) */
void cuda_bias_partials_add(Backend* be, void* dbias, const float* partial, int chunks, int OC);
/* attention.cu */
void cuda_attention_init(Backend* be);
/* attention_sm90.cu: bf16, head size 64, compute capability 9.0 only.
 * init: false when this build has no sm_90a machine code for them or the
 * driver no tensor-map encoder (the backward loads through the copy engine). */
bool attn_sm90_init(Backend* be);
void attn_sm90_forward(cudaStream_t st, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                       float sl2);
/* dK, dV and dQ in one kernel (D = rowsum(dO * O) computed here too).
 * partial (NULL: none) gets the column sums of what each block writes of
 * dqkv: [B * cdiv(T, 128)][3C] fp32, row b * cdiv(T, 128) + (the block's 128
 * keys of T), every element written once. ld ([B*NH][T rounded up to 64][2]
 * fp32), dqacc ([B*NH][T][64] fp32) and turn ([B*NH*cdiv(T, 64) + 1] ints,
 * zeroed here) are its scratch; dout, out and qkv 16-byte aligned. */
void attn_sm90_backward(Backend* be, bf16* dqkv, float* partial, float* dqacc, int* turn, float* ld,
                        const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, int B, int T,
                        int NH, float sl2, float scale);
void cuda_attention_forward(Backend* be, void* out, float* lse, const void* qkv, int B, int T, int C, int NH);
void cuda_attention_backward(Backend* be, void* dqkv, void* dbias, const void* dout, const void* qkv,
                             const void* out, const float* lse, int B, int T, int C, int NH);
/* classifier.cu */
void cuda_fused_classifier(Backend* be, void* logits, float* losses, const int* targets, float dloss, int N,
                           int V, int Vp);
/* adamw.cu */
double cuda_grad_sumsq(Backend* be, const void* grads, const OptPiece* pieces, int npieces);
void cuda_adamw(Backend* be, void* params, const void* grads, float* master, float* m, float* v,
                const OptPiece* pieces, int npieces, const AdamWArgs* a);
void cuda_adamw_destroy(Backend* be);

#endif
